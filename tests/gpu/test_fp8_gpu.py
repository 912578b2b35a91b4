"""dtype=fp8 on the GPU (layers/fp8.py, fp8_kernels.py): the one-kernel row quantization against the
torch arithmetic the CPU runs, the FP8 GEMM with its bias inside against float32, and whole models of
both families through the engine's CUDA graphs (eager, capture, replay) against the float32 Hugging
Face reference within the fp8 gate (max 1 - cos <= 5e-3)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rose_backend.config import ModelConfig
from rose_backend.engine.engine import Engine
from rose_backend.engine.options import EngineOptions
from rose_backend.layers.fp8 import FP8_MAX, fp8_matmul, quantize_rows, unavailable_reason
from rose_testing.compare import cos_dist
from rose_testing.folders import make_folder
from rose_testing.reference import Reference

FP8_GATE = 5e-3
pytestmark = pytest.mark.skipif(torch.cuda.is_available() and unavailable_reason("cuda") is not None,
                                reason="this GPU has no FP8 tensor cores")


@pytest.mark.parametrize("rows,cols", [(1, 1024), (37, 4096), (5000, 3072), (3, 100)])
def test_row_quantization_kernel_matches_the_torch_arithmetic(rows, cols):
    from rose_backend.layers.fp8_kernels import quantize_rows_fp8
    g = torch.Generator(device="cuda").manual_seed(rows)
    x = (torch.randn(rows, cols, device="cuda", generator=g) * torch.logspace(-3, 2, rows, device="cuda")[:, None]).bfloat16()
    q, scale = quantize_rows_fp8(x)
    want_scale = x.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / FP8_MAX
    want_q = (x.float() / want_scale).to(torch.float8_e4m3fn)
    torch.testing.assert_close(scale, want_scale, rtol=1e-6, atol=0)
    assert (q.float() - want_q.float()).abs().max().item() == 0          # the same e4m3 values
    assert q.float().abs().amax().item() == FP8_MAX                     # each row's max is exact


def test_fp8_gemm_with_bias_matches_float32():
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(4096, 1024, device="cuda", generator=g).bfloat16()
    w = (torch.randn(3072, 1024, device="cuda", generator=g) / 32).bfloat16()
    bias = torch.randn(3072, device="cuda", generator=g).bfloat16()
    wq, ws = quantize_rows(w)
    y = fp8_matmul(x, wq.t(), ws[None, :].contiguous(), bias)
    ref = x.float() @ w.float().t() + bias.float()
    assert y.dtype == torch.bfloat16
    assert float(cos_dist(y.float().cpu(), ref.cpu()).max()) < 2e-3


@pytest.mark.parametrize("shape", ["tiny-bert", "tiny-xlm-roberta", "tiny-qwen3"])
def test_fp8_engine_through_graphs_matches_the_float32_reference(gpu_tmp, shape):
    folder = make_folder(shape, gpu_tmp / f"fp8-{shape}", device="cuda")
    cfg = ModelConfig.from_folder(folder)
    rng = np.random.default_rng(7)
    seqs = [rng.integers(5, cfg.vocab_size - 1, size=n).tolist() for n in (300, 17, 64, 128, 9)]
    want = Reference(folder, device="cuda").embed(seqs)
    eng = Engine(cfg, "cuda", EngineOptions(fp8_min_tokens=256))                     # this batch: FP8; 1 x 64: bf16
    runs = [eng.embed(seqs) for _ in range(3)]                         # eager, capture, replay
    assert eng.stats.graph_captures >= 1 and eng.stats.graph_replays >= 1
    for got in runs:
        assert float(cos_dist(got, want).max()) < FP8_GATE
    np.testing.assert_array_equal(runs[1], runs[2])
    bf16 = Engine(cfg, "cuda").embed(seqs)
    assert not np.array_equal(runs[2], bf16)                          # the FP8 path ran
    # 64 tokens: below the threshold, no FP8 GEMM runs (the configuration's first sight is eager, so
    # its Python runs) and the row is the bf16 engine's up to kernel order (the bf16 engine's small
    # batches take the split-K / small-GEMM kernels, an Fp8Linear below its threshold F.linear)
    import rose_backend.layers.fp8 as fp8
    calls, real = [], fp8.fp8_matmul
    fp8.fp8_matmul = lambda *a, **k: (calls.append(1), real(*a, **k))[1]
    try:
        small = eng.embed([seqs[2]])
    finally:
        fp8.fp8_matmul = real
    assert not calls
    assert float(cos_dist(small, Engine(cfg, "cuda").embed([seqs[2]])).max()) < 1e-4
