"""The fused q/k RMSNorm + RoPE kernel (layers/qk_norm_rope.py) against the torch path of the Qwen3
layer (RMSNorm per head, then rotary), run by Triton's interpreter on the CPU. The GPU suite runs the
same kernel compiled, inside the whole Qwen3 forward (tests/gpu/test_qwen3_gpu.py)."""
import os

import pytest
import torch

if torch.cuda.is_available():     # the interpreter would also take over the GPU tests of this process
    pytest.skip("run compiled by the GPU suite on CUDA hosts", allow_module_level=True)
os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from rose_backend.layers.norm import RMSNorm  # noqa: E402
from rose_backend.layers.qk_norm_rope import qk_norm_rope_  # noqa: E402
from rose_backend.layers.rotary import RotaryEmbedding  # noqa: E402


@pytest.mark.parametrize("hq,hkv,d", [(4, 2, 16), (3, 3, 8), (16, 8, 128)])
def test_matches_norm_then_rope(hq, hkv, d):
    torch.manual_seed(hq * 100 + d)
    t = 9
    qkv = torch.randn(t, (hq + 2 * hkv) * d) * 3
    positions = torch.tensor([0, 1, 2, 3, 0, 1, 7, 30, 31], dtype=torch.int32)
    rope = RotaryEmbedding(d, 32, 1_000_000.0)
    q_norm, k_norm = RMSNorm(d, eps=1e-6), RMSNorm(d, eps=1e-6)
    with torch.no_grad():
        q_norm.weight.copy_(1 + 0.2 * torch.randn(d))
        k_norm.weight.copy_(1 + 0.2 * torch.randn(d))
        q = qkv[:, :hq * d].view(t, hq, d)
        k = qkv[:, hq * d:(hq + hkv) * d].view(t, hkv, d)
        want_q, want_k = rope(positions, q_norm(q), k_norm(k))
        got = qk_norm_rope_(qkv.clone(), positions, q_norm.weight, k_norm.weight, rope.cos_sin_cache, hq, hkv, 1e-6)
    torch.testing.assert_close(got[:, :hq * d].view(t, hq, d), want_q, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(got[:, hq * d:(hq + hkv) * d].view(t, hkv, d), want_k, atol=2e-5, rtol=1e-5)
    assert torch.equal(got[:, (hq + hkv) * d:], qkv[:, (hq + hkv) * d:])      # v untouched


def test_refuses_a_non_contiguous_row():
    x = torch.randn(4, 64)[:, ::2]
    with pytest.raises(ValueError, match="row-contiguous"):
        qk_norm_rope_(x, torch.zeros(4, dtype=torch.int32), torch.ones(4), torch.ones(4),
                      torch.zeros(8, 4), 2, 1, 1e-6)
