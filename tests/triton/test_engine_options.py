"""The `rose` model's engines' options from its settings (triton/engine_options.py): the main engine's
follow every engine parameter, and the query lane's differ from them only in what is in flight and
the memory left to it."""
from __future__ import annotations

import dataclasses

import torch

from rose_backend.config import ModelConfig
from rose_backend.engine.memory_budget import MIB
from rose_backend.engine.options import EngineOptions
from rose_backend.layers.fp8 import default_min_tokens
from rose_backend.triton.engine_options import engine_options, query_options
from rose_backend.triton.model_settings import RoseSettings


def test_the_defaults_leave_the_engine_its_own():
    s, cfg = RoseSettings(), ModelConfig.from_folder(None)
    o = engine_options(s, cfg, "cpu")
    assert o == EngineOptions(max_tokens=max(16384, cfg.max_positions), max_seqs=64, max_inflight=2,
                              graph_memory_cap_bytes=4096 * MIB)


def test_every_engine_parameter_reaches_the_options():
    s = RoseSettings.from_values({"dtype": "fp16", "attention": "sdpa_loop", "cuda_graphs": "on",
                                  "max_batch_tokens": "4096", "max_batch_seqs": "16", "max_inflight": "3",
                                  "graph_memory_mb": "0", "memory_limit_mb": "2048"})
    cfg = ModelConfig.from_folder(None)
    o = engine_options(s, cfg, "cpu")
    assert o == EngineOptions(dtype=torch.float16, attention="sdpa_loop", graphs=True,
                              max_tokens=max(4096, cfg.max_positions), max_seqs=16, max_inflight=3,
                              graph_memory_cap_bytes=None, memory_limit_bytes=2048 * MIB)
    fp8 = engine_options(RoseSettings(dtype="fp8"), cfg, "cpu")        # default activations, FP8 GEMMs
    assert fp8.dtype is None and fp8.fp8_min_tokens == default_min_tokens(cfg)


def test_the_query_lane_takes_the_main_options_less_what_the_main_engine_holds():
    main = EngineOptions(attention="sdpa_loop", max_tokens=4096, memory_limit_bytes=100 * MIB)
    q = query_options(main, 60 * MIB)
    assert q == dataclasses.replace(main, max_inflight=1, memory_limit_bytes=40 * MIB)
    assert query_options(dataclasses.replace(main, memory_limit_bytes=None), 60 * MIB).memory_limit_bytes is None


def test_the_query_engine_is_built_for_on_and_auto_on_a_gpu_and_refused_by_on_where_it_does_not_fit():
    import pytest
    from rose_backend.engine.engine import Engine
    from rose_backend.engine.memory_budget import MemoryBudgetExceeded
    from rose_backend.triton.engine_options import query_engine_for
    cfg, warned = ModelConfig.from_folder(None), []
    main = Engine(cfg, "cpu", EngineOptions())
    assert query_engine_for("off", main, main.options, warned.append) is None
    assert query_engine_for("auto", main, main.options, warned.append) is None          # the CPU: no lane
    lane = query_engine_for("on", main, main.options, warned.append)
    assert lane is not None and lane.model is main.model and lane.options.max_inflight == 1 and not warned
    tight = dataclasses.replace(main.options, memory_limit_bytes=main.budget.total + 1)  # nothing left for it
    with pytest.raises(MemoryBudgetExceeded, match="does not fit"):
        query_engine_for("on", main, tight, warned.append)
    assert not warned
