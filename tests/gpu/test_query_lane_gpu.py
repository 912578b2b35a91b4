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


def test_two_engines_on_one_set_of_weights_run_side_by_side(gpu_tmp):
    folder = make_folder("tiny-xlm-roberta", gpu_tmp / "query-lane-xlmr", device="cuda")
    cfg = ModelConfig.from_folder(folder)
    main = Engine(cfg, "cuda", EngineOptions(attention="torch_varlen"))
    query = Engine(cfg, "cuda", EngineOptions(attention="torch_varlen", max_inflight=1), weights_from=main)
    assert query.model is main.model and query.stream is not None and query.stream.priority < 0
    rng = np.random.default_rng(5)
    big = [rng.integers(5, cfg.vocab_size - 1, size=400).tolist() for _ in range(20)]
    small = [rng.integers(5, cfg.vocab_size - 1, size=33).tolist()]
    want_big, want_small = main.embed(big), main.embed(small)
    for _ in range(3):                                     # eager, capture, replay on each engine
        h_big = main.step(PackedBatch.of_lists(big))
        h_small = query.step(PackedBatch.of_lists(small))  # launched while the big batch may still run
        got_small, got_big = h_small.synchronize(), h_big.synchronize()
        np.testing.assert_allclose(got_big, want_big, atol=2e-3)
        np.testing.assert_allclose(got_small, want_small, atol=2e-3)
    assert query.stats.graph_replays >= 1 and main.stats.graph_replays >= 1
    ref = Reference(folder, device="cuda")
    assert float(cos_dist(got_small, ref.embed(small)).max()) < 1e-3
    assert float(cos_dist(got_big[:3], ref.embed(big[:3])).max()) < 1e-3
    torch.cuda.synchronize()


def test_the_main_engine_on_a_green_context_leaves_the_other_sms_to_the_query_engine(gpu_tmp, monkeypatch):
    """ROSE_MAIN_ENGINE_SMS (engine/streams.py): the main engine's passes, eager and captured, on a
    stream of a green context of that many SMs; the query engine on the whole device; both as before."""
    from torch.cuda import green_contexts
    if not green_contexts.SUPPORTED:
        import pytest
        pytest.skip("this torch has no CUDA green contexts")
    folder = make_folder("tiny-qwen3", gpu_tmp / "query-lane-qwen3", device="cuda")
    cfg = ModelConfig.from_folder(folder)
    plain = Engine(cfg, "cuda", EngineOptions(attention="torch_varlen"))
    monkeypatch.setenv("ROSE_MAIN_ENGINE_SMS", "64")
    main = Engine(cfg, "cuda", EngineOptions(attention="torch_varlen"))
    query = Engine(cfg, "cuda", EngineOptions(attention="torch_varlen", max_inflight=1), weights_from=main)
    assert main.streams.sms == 64 and main.stream is not None and main.graphs.capture_stream is main.stream
    assert query.streams.sms == 0 and query.stream.priority < 0
    rng = np.random.default_rng(6)
    big = [rng.integers(5, cfg.vocab_size - 1, size=300).tolist() for _ in range(16)]
    small = [rng.integers(5, cfg.vocab_size - 1, size=40).tolist()]
    want_big, want_small = plain.embed(big), plain.embed(small)
    for _ in range(3):                                     # eager, capture, replay on each engine
        h_big = main.step(PackedBatch.of_lists(big))
        h_small = query.step(PackedBatch.of_lists(small))
        np.testing.assert_allclose(h_small.synchronize(), want_small, atol=2e-3)
        np.testing.assert_allclose(h_big.synchronize(), want_big, atol=2e-3)
    assert main.stats.graph_replays >= 1 and query.stats.graph_replays >= 1
    torch.cuda.synchronize()
