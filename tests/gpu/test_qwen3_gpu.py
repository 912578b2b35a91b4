"""GPU suite for the Qwen3 decoder: the 0.6B shape (pplx-embed / Qwen3-Embedding) with random
weights in bf16, eager and CUDA-graph replay, against the same weights in float32 (torch kernels,
per-sequence SDPA), in both attention modes. Skipped without CUDA.

    source .gpu/enter.sh && python3 -m pytest tests/gpu/test_qwen3_gpu.py -q
"""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from rose_backend.layers.attention import available_backends
from rose_backend.layers import fused
from rose_backend.models import qwen3
from tests.qwen3_folders import PackedForward, qwen3_model_config, random_qwen3

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

LENS = [1, 37, 128, 300, 64]                # ragged, with a length-1 sequence
TOL = 2e-3                                  # 1 - cos, bf16 against float32 (observed ~1e-4)


def one_minus_cos(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    return (1 - torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=-1)).cpu().numpy()


@pytest.fixture(scope="module", params=[False, True], ids=["bidirectional-mean", "causal-lasttoken"])
def models(request):
    cfg = qwen3_model_config(causal=request.param)
    ref = random_qwen3(cfg, "cuda", torch.float32, seed=0)
    ref.set_attention_backend("sdpa_loop")
    fast = copy.deepcopy(ref).to(torch.bfloat16)
    yield cfg, ref, fast
    del ref, fast
    torch.cuda.empty_cache()


def _backends(cfg) -> list[str]:
    from rose_backend.layers.attention import AttentionShape
    shape = AttentionShape(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, torch.bfloat16, cfg.causal)
    names = [n for n in available_backends(shape, "cuda") if n != "sdpa_loop"]
    return names or pytest.skip("no CUDA attention backend available")


@pytest.mark.parametrize("kernels", ["torch", "flashinfer"])
def test_0p6b_bf16_eager_and_graph_match_float32(models, kernels, monkeypatch):
    cfg, ref, fast = models
    if kernels == "flashinfer" and qwen3.flashinfer is None:
        pytest.skip("flashinfer is not installed")
    monkeypatch.setattr(fused, "enabled", kernels == "flashinfer")
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (sum(LENS),), generator=gen)

    want_run = PackedForward(ref, LENS, cfg.pooling)
    want_run.ids.copy_(ids)
    want = want_run.eager().clone()                                                  # [S, H] float32

    for name in _backends(cfg):
        fast.set_attention_backend(name)
        run = PackedForward(fast, LENS, cfg.pooling, graph_key=("test", name, kernels))
        run.ids.copy_(ids)
        eager = run.eager().clone()
        run.capture()
        graph = run.replay().clone()
        assert one_minus_cos(eager, want).max() <= TOL, (name, one_minus_cos(eager, want))
        assert one_minus_cos(graph, want).max() <= TOL, (name, one_minus_cos(graph, want))
        # the graph replays new ids through the same buffers
        ids2 = torch.randint(0, cfg.vocab_size, (sum(LENS),), generator=gen)
        run.ids.copy_(ids2)
        want_run.ids.copy_(ids2)
        assert one_minus_cos(run.replay(), want_run.eager()).max() <= TOL
        want_run.ids.copy_(ids)


@pytest.mark.parametrize("style", ["pplx-embed", "qwen3-embedding"])
def test_engine_graph_path_serves_qwen3(tmp_path, style):
    """Through the engine (bucketed static buffers, padding, lazy capture, LazyTensor): a small
    Qwen3 folder with the 0.6B head layout (GQA 2:1, head_dim 128) matches the CPU engine."""
    from rose_backend.config import ModelConfig
    from rose_backend.engine.engine import Engine
    from tests.qwen3_folders import write_qwen3_folder

    folder = write_qwen3_folder(tmp_path / style, style=style, num_layers=2, num_heads=4, num_kv_heads=2,
                                head_dim=128, hidden_size=256, intermediate_size=512)
    cfg = ModelConfig.from_folder(folder)
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, cfg.vocab_size, size=n).tolist() for n in (3, 1, 100, 45)]
    want = torch.from_numpy(Engine(cfg).embed(seqs))
    eng = Engine(cfg, "cuda")
    for _ in range(3):                                     # eager, capture, replay
        got = torch.from_numpy(eng.embed(seqs))
        assert one_minus_cos(got, want).max() <= TOL
    assert (eng.stats.eager_runs, eng.stats.graph_captures, eng.stats.graph_replays) == (1, 1, 1)
