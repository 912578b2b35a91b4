"""The small-GEMM kernel (layers/small_gemm.py) against float32 torch, run by Triton's interpreter on
the CPU in float16 (its bfloat16 is not numpy's): each epilogue (bias, exact and tanh GELU, SwiGLU) and the split-K partials, at token counts
that fill and that do not fill a tile. The GPU suite runs it compiled, with programmatic dependent
launch, inside CUDA graphs and whole models (tests/gpu/test_splitk_gpu.py)."""
import os

import pytest
import torch
import torch.nn.functional as F

if torch.cuda.is_available():     # the interpreter would also take over the GPU tests of this process
    pytest.skip("run compiled by the GPU suite on CUDA hosts", allow_module_level=True)
os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from rose_backend.layers import small_gemm  # noqa: E402

WANT = {
    "none": lambda y: y,
    "gelu": F.gelu,
    "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"),
}


@pytest.mark.parametrize("m", [5, 64, 130])
@pytest.mark.parametrize("act", ["none", "gelu", "gelu_tanh", "swiglu"])
def test_epilogues_match_float32(m, act):
    torch.manual_seed(m)
    k, n = 128, 96
    x = torch.randn(m, k).half()
    w = (torch.randn(n, k) / k ** 0.5).half()
    b = torch.randn(n).half()
    y = x.float() @ w.float().t() + b.float()
    if act == "swiglu":
        gate, up = y.chunk(2, dim=-1)
        want = F.silu(gate) * up
    else:
        want = WANT[act](y)
    got = small_gemm.gemm_act(x, w, b, act)
    assert got.dtype == torch.float16 and got.shape == want.shape
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)      # one fp16 rounding


def test_no_bias_and_explicit_config():
    torch.manual_seed(1)
    x, w = torch.randn(40, 192).half(), torch.randn(70, 192).half()
    got = small_gemm.gemm_act(x, w, None, "none", config=(32, 32, 64, 4))
    torch.testing.assert_close(got.float(), x.float() @ w.float().t(), atol=5e-2, rtol=2e-2)


@pytest.mark.parametrize("m,splits", [(7, 2), (100, 4)])
def test_splitk_partials_sum_to_the_product(m, splits):
    torch.manual_seed(m)
    x, w = torch.randn(m, 512).half(), (torch.randn(64, 512) / 512 ** 0.5).half()
    parts = small_gemm.splitk_matmul(x, w, splits, bm=32, bn=32, bk=64)
    assert parts.shape == (splits, m, 64) and parts.dtype == torch.float32
    torch.testing.assert_close(parts.sum(0), x.float() @ w.float().t(), atol=1e-4, rtol=1e-4)


def test_refuses_a_k_that_is_not_whole_blocks():
    with pytest.raises(ValueError, match="K=100"):
        small_gemm.gemm_act(torch.zeros(4, 100).half(), torch.zeros(8, 100).half(), None)
