"""The query lane's two engines on one GPU (Engine(weights_from=...), serving/query_lane.py): a
small batch on the query engine's high-priority stream launched while a large batch runs on the main
engine's stream, both through CUDA graphs (eager, capture, replay), each equal to what the main
engine gives alone and within the bf16 gate of the float32 Hugging Face reference."""
from __future__ import annotations

import numpy as np
import torch

from rose_backend.config import ModelConfig
from rose_backend.engine.batch import PackedBatch
from rose_backend.engine.engine import Engine
from rose_backend.engine.options import EngineOptions
from rose_testing.compare import cos_dist
from rose_testing.folders import make_folder
from rose_testing.reference import Reference


def side_by_side(main: Engine, query: Engine, want: Engine, seed: int, big_len: int, small_len: int):
    """A big batch on `main` and a small one on `query` launched while it may still run, three times
    (eager, capture, replay on each engine), each equal to what `want` gives alone; (big, small) lists."""
    rng = np.random.default_rng(seed)
    vocab = main.cfg.vocab_size
    big = [rng.integers(5, vocab - 1, size=big_len).tolist() for _ in range(20)]
    small = [rng.integers(5, vocab - 1, size=small_len).tolist()]
    want_big, want_small = want.embed(big), want.embed(small)
    for _ in range(3):
        h_big = main.step(PackedBatch.of_lists(big))
        h_small = query.step(PackedBatch.of_lists(small))
        np.testing.assert_allclose(h_small.synchronize(), want_small, atol=2e-3)
        np.testing.assert_allclose(h_big.synchronize(), want_big, atol=2e-3)
    assert query.stats.graph_replays >= 1 and main.stats.graph_replays >= 1
    return big, small


def test_two_engines_on_one_set_of_weights_run_side_by_side(gpu_tmp):
    folder = make_folder("tiny-xlm-roberta", gpu_tmp / "query-lane-xlmr", device="cuda")
    cfg = ModelConfig.from_folder(folder)
    main = Engine(cfg, "cuda", EngineOptions(attention="torch_varlen"))
    query = Engine(cfg, "cuda", EngineOptions(attention="torch_varlen", max_inflight=1), weights_from=main)
    assert query.model is main.model and query.stream is not None and query.stream.priority < 0
    big, small = side_by_side(main, query, main, seed=5, big_len=400, small_len=33)
    ref = Reference(folder, device="cuda")
    assert float(cos_dist(query.embed(small), ref.embed(small)).max()) < 1e-3
    assert float(cos_dist(main.embed(big[:3]), ref.embed(big[:3])).max()) < 1e-3
    torch.cuda.synchronize()


def test_the_main_engine_on_a_green_context_leaves_the_other_sms_to_the_query_engine(gpu_tmp, monkeypatch):
    """ROSE_MAIN_ENGINE_SMS (engine/streams.py): the main engine's passes, eager and captured, on a
    stream of a green context of that many SMs; the query engine on the whole device; both as before."""
    from torch.cuda import green_contexts
    if not green_contexts.SUPPORTED:
        import pytest
        pytest.skip("this torch has no CUDA green contexts")
    folder = make_folder("tiny-xlm-roberta", gpu_tmp / "query-lane-xlmr", device="cuda")
    cfg = ModelConfig.from_folder(folder)
    plain = Engine(cfg, "cuda", EngineOptions(attention="torch_varlen"))
    monkeypatch.setenv("ROSE_MAIN_ENGINE_SMS", "64")
    main = Engine(cfg, "cuda", EngineOptions(attention="torch_varlen"))
    query = Engine(cfg, "cuda", EngineOptions(attention="torch_varlen", max_inflight=1), weights_from=main)
    assert main.streams.sms == 64 and main.stream is not None and main.graphs.capture_stream is main.stream
    assert query.streams.sms == 0 and query.stream.priority < 0
    side_by_side(main, query, plain, seed=6, big_len=300, small_len=40)
    torch.cuda.synchronize()


def test_auto_builds_the_lane_on_a_gpu_and_leaves_it_out_with_a_warning_where_it_does_not_fit(gpu_tmp):
    import dataclasses
    from rose_backend.triton.engine_options import query_engine_for
    cfg = ModelConfig.from_folder(make_folder("tiny-xlm-roberta", gpu_tmp / "query-lane-xlmr", device="cuda"))
    main, warned = Engine(cfg, "cuda", EngineOptions(attention="torch_varlen")), []
    tight = dataclasses.replace(main.options, memory_limit_bytes=main.budget.total + 1)     # nothing left for it
    assert query_engine_for("auto", main, tight, warned.append) is None
    assert len(warned) == 1 and "no query lane (interactive_stream=auto)" in warned[0] and "does not fit" in warned[0]
    lane = query_engine_for("auto", main, main.options, warned.append)
    assert lane is not None and lane.stream.priority < 0 and len(warned) == 1
