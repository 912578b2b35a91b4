"""GPU suite for the Qwen3 decoder: the 0.6B shape (pplx-embed / Qwen3-Embedding) with random
weights through the real Engine in bf16 (eager, CUDA-graph capture, replay; every attention
backend; torch and flashinfer kernels), against transformers' Qwen3Model in float32 on the same
weights (rose_testing.reference), in both attention modes. Skipped without CUDA.

    source .gpu/enter.sh && python3 -m pytest tests/gpu/test_qwen3_gpu.py -q
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rose_backend.config import ModelConfig
from rose_backend.engine.engine import Engine
from rose_backend.engine.options import EngineOptions
from rose_backend.layers import fused
from rose_backend.layers.attention import AttentionShape, available_backends
from rose_testing.compare import cos_dist
from rose_testing.folders import make_folder, random_ids
from rose_testing.reference import Reference

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

LENS = [1, 37, 128, 300, 64]                # ragged, with a length-1 sequence
TOL = 2e-3                                  # 1 - cos, bf16 against float32 (observed ~1e-4)


@pytest.fixture(scope="module", params=[False, True], ids=["bidirectional-mean", "causal-lasttoken"])
def folder(request, gpu_tmp):
    """A 0.6B-shaped folder, two sets of sequences with the same lengths and their float32 reference."""
    causal = request.param
    path = make_folder("pplx-embed", gpu_tmp / f"qwen3-0p6b-{'causal' if causal else 'bidirectional'}",
                       device="cuda", pooling="lasttoken" if causal else "mean", normalize=causal,
                       use_bidirectional_attention=not causal)
    cfg = ModelConfig.from_folder(path)
    assert cfg.causal == causal
    rng = np.random.default_rng(1)
    runs = [[random_ids(rng, cfg.vocab_size, n).tolist() for n in LENS] for _ in range(2)]
    ref = Reference(path, device="cuda")
    wants = [ref.embed(seqs) for seqs in runs]
    ref.close()
    yield cfg, runs, wants
    torch.cuda.empty_cache()


def _backends(cfg) -> list[str]:
    shape = AttentionShape(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, torch.bfloat16, cfg.causal)
    names = [n for n in available_backends(shape, "cuda") if n != "sdpa_loop"]
    return names or pytest.skip("no CUDA attention backend available")


@pytest.mark.parametrize("kernels", ["torch", "flashinfer"])
def test_0p6b_bf16_eager_and_graph_match_float32(folder, kernels, monkeypatch):
    cfg, runs, wants = folder
    if kernels == "flashinfer" and fused.flashinfer is None:
        pytest.skip("flashinfer is not installed")
    monkeypatch.setattr(fused, "enabled", kernels == "flashinfer")
    for name in _backends(cfg):
        eng = Engine(cfg, "cuda", EngineOptions(attention=name))
        for _ in range(3):                                 # eager, capture, replay
            got = eng.embed(runs[0])
            assert cos_dist(got, wants[0]).max() <= TOL, (name, cos_dist(got, wants[0]))
        # the captured graph replays new ids of the same lengths through the same buffers
        got = eng.embed(runs[1])
        assert cos_dist(got, wants[1]).max() <= TOL, (name, cos_dist(got, wants[1]))
        assert (eng.stats.eager_runs, eng.stats.graph_captures, eng.stats.graph_replays) == (1, 1, 2), eng.stats
        del eng
        torch.cuda.empty_cache()


@pytest.mark.parametrize("style", ["pplx-embed", "qwen3-embedding"])
def test_engine_graph_path_serves_qwen3(tmp_path, style):
    """Through the engine (bucketed static buffers, padding, lazy capture, LazyTensor): a small
    Qwen3 folder with the 0.6B head layout (GQA 2:1, head_dim 128) matches the CPU engine."""
    from rose_testing.qwen3 import write_qwen3_folder

    folder = write_qwen3_folder(tmp_path / style, style=style, num_layers=2, num_heads=4, num_kv_heads=2,
                                head_dim=128, hidden_size=256, intermediate_size=512)
    cfg = ModelConfig.from_folder(folder)
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, cfg.vocab_size, size=n).tolist() for n in (3, 1, 100, 45)]
    want = Engine(cfg).embed(seqs)
    eng = Engine(cfg, "cuda")
    for _ in range(3):                                     # eager, capture, replay
        got = eng.embed(seqs)
        assert cos_dist(got, want).max() <= TOL
    assert (eng.stats.eager_runs, eng.stats.graph_captures, eng.stats.graph_replays) == (1, 1, 1)
