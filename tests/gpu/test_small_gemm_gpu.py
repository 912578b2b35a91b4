"""The small-token projections (layers/projection.py, small_gemm.py and the partials norms of
fused_kernels.py): the kernels against float32 torch, with and without programmatic dependent launch,
a chain of them captured in a CUDA graph against the same chain run eagerly one kernel at a time, and
whole models through the engine (eager, capture, replay) with the kernels on and off against the
float32 CPU engine."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rose_backend.config import ModelConfig
from rose_backend.engine.engine import Engine
from rose_backend.layers import projection
from rose_testing.compare import cos_dist
from rose_testing.folders import make_folder

TOL = 1e-3


def _small_gemm():
    # imported in the tests, not at collection: on the CPU suite's workers the module would
    # define its triton kernels before test_qk_norm_rope switches triton to its interpreter
    from rose_backend.layers import small_gemm
    return small_gemm


@pytest.fixture(params=[0, 4096], ids=["plain", "pdl"])
def pdl(request, monkeypatch):
    monkeypatch.setattr(_small_gemm(), "pdl", request.param)
    return request.param


@pytest.mark.parametrize("m,n,k,act", [(128, 3072, 1024, "none"), (128, 4096, 1024, "gelu"), (200, 4096, 1024, "gelu_tanh"),
                                       (128, 6144, 1024, "swiglu"), (7, 512, 256, "swiglu"), (256, 4096, 1024, "none")])
def test_gemm_act_matches_float32(m, n, k, act, pdl):
    g = torch.Generator(device="cuda").manual_seed(m + n)
    x = torch.randn(m, k, device="cuda", generator=g).bfloat16()
    w = (torch.randn(n, k, device="cuda", generator=g) / k ** 0.5).bfloat16()
    b = torch.randn(n, device="cuda", generator=g).bfloat16()
    y = x.float() @ w.float().t() + b.float()
    if act == "swiglu":
        gate, up = y.chunk(2, dim=-1)
        want = F.silu(gate) * up
    else:
        want = {"none": y, "gelu": F.gelu(y), "gelu_tanh": F.gelu(y, approximate="tanh")}[act]
    got = _small_gemm().gemm_act(x, w, b, act)
    assert float((got.float() - want).abs().max() / want.abs().max()) < 1e-2       # one bf16 rounding


def test_a_pdl_chain_in_a_graph_matches_eager(monkeypatch):
    """QKV-like GEMM -> split-K -> add + LayerNorm -> up + GELU -> split-K -> add + LayerNorm, four
    times over, each kernel reading the one before's output: captured with PDL, replayed, against the
    same chain launched eagerly without PDL."""
    from rose_backend.layers import fused_kernels as fk
    sg = _small_gemm()
    g = torch.Generator(device="cuda").manual_seed(3)
    h, f, t = 1024, 4096, 128
    ws = [[(torch.randn(n, k, device="cuda", generator=g) / k ** 0.5).bfloat16() for n, k in ((h, h), (h, h), (f, h), (h, f))]
          for _ in range(4)]
    ln_w, ln_b = torch.ones(h, device="cuda", dtype=torch.bfloat16), torch.zeros(h, device="cuda", dtype=torch.bfloat16)
    x0 = torch.randn(t, h, device="cuda", generator=g).bfloat16()

    def chain(x):
        for w_a, w_o, w_up, w_down in ws:
            a = sg.gemm_act(x, w_a, None)
            x = fk.parts_add_layernorm(sg.splitk_matmul(a, w_o, 2), None, x, ln_w, ln_b, 1e-5)
            u = sg.gemm_act(x, w_up, None, "gelu")
            x = fk.parts_add_layernorm(sg.splitk_matmul(u, w_down, 4), None, x, ln_w, ln_b, 1e-5)
        return x
    monkeypatch.setattr(sg, "pdl", 0)
    want = chain(x0)
    monkeypatch.setattr(sg, "pdl", 4096)
    static_x = x0.clone()
    chain(static_x)                                   # compile the PDL variants outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain(static_x)
    for _ in range(3):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want)


@pytest.mark.parametrize("m,n,k,splits", [(128, 1024, 4096, 4), (200, 1024, 1024, 2), (64, 1024, 2048, 4), (7, 256, 512, 2)])
def test_splitk_matmul_matches_float32(m, n, k, splits, pdl):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, k, device="cuda", generator=g).bfloat16()
    w = (torch.randn(n, k, device="cuda", generator=g) / k ** 0.5).bfloat16()
    parts = _small_gemm().splitk_matmul(x, w, splits)
    assert parts.shape == (splits, m, n) and parts.dtype == torch.float32
    ref = x.float() @ w.float().t()
    assert float((parts.sum(0) - ref).abs().max() / ref.abs().max()) < 1e-4


def test_partials_norms_match_torch():
    from rose_backend.layers import fused_kernels as fk
    g = torch.Generator(device="cuda").manual_seed(1)
    parts = torch.randn(4, 50, 1024, device="cuda", generator=g)
    bias = torch.randn(1024, device="cuda", generator=g).bfloat16()
    res = torch.randn(50, 1024, device="cuda", generator=g).bfloat16()
    w = (1 + 0.1 * torch.randn(1024, device="cuda", generator=g)).bfloat16()
    b = (0.1 * torch.randn(1024, device="cuda", generator=g)).bfloat16()
    total = parts.sum(0) + bias.float() + res.float()
    want_ln = F.layer_norm(total, (1024,), w.float(), b.float(), 1e-5)
    got_ln = fk.parts_add_layernorm(parts, bias, res, w, b, 1e-5)
    assert float((got_ln.float() - want_ln).abs().max()) < 3e-2          # bf16 output rounding
    r = res.clone()
    got_rms = fk.parts_add_rmsnorm_(parts, None, r, w, 1e-6)
    total = parts.sum(0) + res.float()
    want_rms = total * torch.rsqrt(total.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
    assert float((r.float() - total).abs().max()) < 5e-2                 # the residual keeps the sum (bf16)
    assert float((got_rms.float() - want_rms).abs().max()) < 3e-2


def _folders(tmp):
    from rose_testing.qwen3 import write_qwen3_folder
    bert = make_folder("tiny-xlm-roberta", tmp / "xlmr", hidden_size=256, intermediate_size=1024, num_attention_heads=4)
    qwen = write_qwen3_folder(tmp / "qwen3", style="pplx-embed", num_layers=2, num_heads=4, num_kv_heads=2,
                              head_dim=128, hidden_size=256, intermediate_size=512)
    return {"xlm-roberta": bert, "qwen3": qwen}


@pytest.mark.parametrize("kind", ["xlm-roberta", "qwen3"])
def test_models_with_small_gemm_projections_match_float32(tmp_path, kind, monkeypatch):
    cfg = ModelConfig.from_folder(_folders(tmp_path)[kind])
    rng = np.random.default_rng(0)
    small = [rng.integers(3, cfg.vocab_size, size=n).tolist() for n in (100, 1, 37)]     # 138 tokens: split
    large = [rng.integers(3, cfg.vocab_size, size=n).tolist() for n in (300, 200)]       # 500 tokens: cuBLAS
    want = {id(s): Engine(cfg).embed(s) for s in (small, large)}                         # float32, CPU
    calls, gemms = [], []
    small_gemm = _small_gemm()
    real, real_gemm = small_gemm.splitk_matmul, small_gemm.gemm_act
    monkeypatch.setattr(small_gemm, "splitk_matmul", lambda *a, **k: calls.append(a[0].shape[0]) or real(*a, **k))
    monkeypatch.setattr(small_gemm, "gemm_act", lambda *a, **k: gemms.append(a[0].shape[0]) or real_gemm(*a, **k))
    for limit in (projection.max_tokens, 0):
        monkeypatch.setattr(projection, "max_tokens", limit)
        monkeypatch.setattr(projection, "gemm_max_tokens", limit)
        eng = Engine(cfg, "cuda")
        calls.clear()
        gemms.clear()
        for seqs in (small, large):
            for _ in range(3):                                           # eager, capture, replay
                got = eng.embed(seqs)
                assert cos_dist(got, want[id(seqs)]).max() <= TOL, (kind, limit, len(seqs))
        # two projections a layer ran split (and Qwen3's gate/up as a small GEMM), in the eager and
        # the capturing pass of the small batch only
        assert len(calls) == (2 * cfg.num_layers * 2 if limit else 0), calls
        assert len(gemms) == (len(calls) // 2 if kind == "qwen3" else 0), gemms
        assert all(t <= limit for t in calls + gemms)
        del eng
        torch.cuda.empty_cache()
