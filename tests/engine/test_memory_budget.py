"""The engine's memory budget (engine/memory_budget.py) against what the engine really holds and
allocates on the CPU: weights against the loaded model's tensors, activations against the peak of
the CPU allocator during a forward pass (torch.profiler's memory events), the refusal's message."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from rose_backend.config import ModelConfig
from rose_backend.engine.batch import PackedBatch
from rose_backend.engine.engine import Engine
from rose_backend.engine.memory_budget import (MIB, MemoryBudget, MemoryBudgetExceeded, activation_bytes,
                                               check_fits, device_limit, engine_budget, weight_bytes)
from rose_backend.engine.options import EngineOptions
from rose_testing.folders import make_folder
from rose_testing.m3_folders import make_m3_folder
from rose_testing.qwen3 import write_qwen3_folder
from rose_testing.reranker_folders import write_reranker_folder

FOLDERS = {
    "default": lambda p: None,
    "tiny-bert": lambda p: make_folder("tiny-bert", p),
    "tiny-xlm-roberta": lambda p: make_folder("tiny-xlm-roberta", p),
    "qwen3-embedding": lambda p: write_qwen3_folder(p, style="qwen3-embedding"),
    "pplx-embed": lambda p: write_qwen3_folder(p, style="pplx-embed", hidden_size=128, num_heads=8,
                                               num_kv_heads=2, head_dim=32, intermediate_size=384),
    "qwen3-causal-lm": lambda p: write_qwen3_folder(p, causal_lm=True),
    "m3-pt-heads": lambda p: make_m3_folder(p, colbert_dim=48, max_positions=512),
    "m3-safetensors-heads": lambda p: make_m3_folder(p, head_format="safetensors"),
    "bert-cross-encoder": lambda p: write_reranker_folder("tiny-bert-ce", p),
    "qwen3-reranker": lambda p: write_reranker_folder("tiny-qwen3-reranker", p),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("budget")
    return {name: make(root / name) for name, make in FOLDERS.items()}


def held_bytes(engine: Engine) -> int:
    """Bytes of every tensor the engine's model and heads hold (parameters and buffers)."""
    tensors = [*engine.model.parameters(), *engine.model.buffers()]
    if engine.head is not None:
        tensors += [*engine.head.parameters(), *engine.head.buffers()]
    if engine.heads is not None:
        h = engine.heads
        tensors += [h.sparse_w, h.sparse_b, h.colbert_w, h.colbert_b]
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("name", sorted(FOLDERS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weights_are_the_bytes_the_loaded_model_holds(folders, name, dtype):
    cfg = ModelConfig.from_folder(folders[name])
    engine = Engine(cfg, options=EngineOptions(dtype=dtype, max_tokens=256, max_seqs=4))
    assert weight_bytes(cfg, torch.empty(0, dtype=dtype).element_size()) == held_bytes(engine)
    assert engine.budget.weights == held_bytes(engine)


def allocator_peak(fn) -> int:
    """The most bytes the CPU allocator held at once while fn ran, above what it held before."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    import tempfile
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = [e["args"] for e in json.load(open(f.name))["traceEvents"] if e.get("name") == "[memory]"]
    live = peak = 0
    for e in sorted(events, key=lambda a: a["Ev Idx"]):
        live += e["Bytes"]
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize("name", ["tiny-bert", "pplx-embed", "qwen3-embedding", "m3-pt-heads"])
@pytest.mark.parametrize("seqs,length", [(1, 256), (8, 64), (32, 16)])
def test_activations_bound_a_forward_pass_tightly(folders, name, seqs, length):
    """An upper bound on what an eager forward pass allocates, and not a loose one (within 1.5x)."""
    cfg = ModelConfig.from_folder(folders[name])
    engine = Engine(cfg, options=EngineOptions(graphs=False))
    rng = np.random.default_rng(0)
    batch = PackedBatch(rng.integers(4, cfg.vocab_size, seqs * length, dtype=np.int32),
                        np.full(seqs, length, dtype=np.int32),
                        token_outputs=frozenset({"sparse", "colbert"}) if engine.heads is not None else frozenset())
    engine.step(batch).synchronize()                 # first run: lazily made tables and caches
    measured = allocator_peak(lambda: engine.step(batch).synchronize())
    estimate = activation_bytes(cfg, 4, seqs * length, length)
    assert measured <= estimate <= 1.5 * measured, (measured, estimate)


def test_the_budget_is_computed_before_the_engine_loads_and_matches_its_sizes(folders):
    cfg = ModelConfig.from_folder(folders["tiny-bert"])
    options = EngineOptions(max_tokens=1024, max_seqs=8, max_inflight=3)
    engine = Engine(cfg, options=options)
    b = engine_budget(cfg, "cpu", options)
    assert engine.budget == b
    words = engine._static.numel() * 4
    ring = sum(s.staging.numel() * 4 + s.out.numel() * 4 for s in engine._slots)
    assert b.buffers == words + ring and len(engine._slots) == 4
    assert b.graphs == 0 and b.workspace == 0            # graphs off and no attention workspace on the CPU
    assert b.activations == activation_bytes(cfg, 4, 1024, cfg.max_positions)
    on = engine_budget(cfg, "cpu", EngineOptions(max_tokens=1024, graphs=True, graph_memory_cap_bytes=5 * MIB))
    assert on.graphs == 5 * MIB
    assert engine_budget(cfg, "cpu", EngineOptions(max_tokens=1024, graphs=True)).graphs == on.activations


def test_an_engine_over_its_limit_refuses_to_load_naming_every_part(folders):
    cfg = ModelConfig.from_folder(folders["tiny-bert"])
    b = engine_budget(cfg, "cpu", EngineOptions(max_tokens=1024, max_seqs=8))
    with pytest.raises(MemoryBudgetExceeded) as e:
        Engine(cfg, options=EngineOptions(max_tokens=1024, max_seqs=8, memory_limit_bytes=b.total - 1))
    msg = str(e.value)
    for part, mib in b.parts_mib().items():
        assert f"{part} {mib:.0f} MiB" in msg
    assert f"= {b.total / MIB:.0f} MiB" in msg and f"limit of {(b.total - 1) / MIB:.0f} MiB" in msg
    Engine(cfg, options=EngineOptions(max_tokens=1024, max_seqs=8, memory_limit_bytes=b.total))   # exactly enough loads


def test_limits_and_totals():
    b = MemoryBudget(weights=3 * MIB, graphs=4 * MIB, workspace=0, buffers=MIB, activations=2 * MIB)
    assert b.total == 10 * MIB
    assert b.describe() == "weights 3 MiB, graphs 4 MiB, workspace 0 MiB, buffers 1 MiB, activations 2 MiB = 10 MiB"
    check_fits(b, None)
    check_fits(b, 10 * MIB)
    with pytest.raises(MemoryBudgetExceeded, match="over the limit of 9 MiB"):
        check_fits(b, 9 * MIB)
    assert device_limit("cpu") is None               # no check on the CPU unless a limit is given
    assert device_limit("cpu", 64 * MIB) == 64 * MIB
