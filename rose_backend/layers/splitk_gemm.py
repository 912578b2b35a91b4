"""Split-K GEMM for small token counts, in OpenAI's triton language (CUDA only).

At 128-512 tokens cuBLAS runs the projections that end in a narrow output (BGE-M3's `o` and `down`,
N = 1024) on a few dozen CTAs, each walking the whole K: the H200 profile has the 8 MB `down`
weight at 7.7 us, ~1 TB/s of 4.8. Splitting K over `splits` programs puts every SM to work; each
writes its fp32 partial product and the consumer sums them (the add + norm kernel after the
projection reads the partials instead of one output, so the split costs no extra kernel).

    partials = splitk_matmul(x, w, splits)     # x [M, K], w [N, K] -> [splits, M, N] float32
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _splitk_kernel(x_ptr, w_ptr, out_ptr, M, N, K, stride_xm, stride_wn, k_per_split,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid_m, pid_n, pid_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    k0 = pid_s * k_per_split
    x_ptrs = x_ptr + rm[:, None].to(tl.int64) * stride_xm + (k0 + rk)[None, :]
    w_ptrs = w_ptr + rn[None, :].to(tl.int64) * stride_wn + (k0 + rk)[:, None]
    m_ok, n_ok = rm[:, None] < M, rn[None, :] < N
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for _ in range(0, k_per_split, BK):
        a = tl.load(x_ptrs, mask=m_ok, other=0.0)
        b = tl.load(w_ptrs, mask=n_ok, other=0.0)
        acc = tl.dot(a, b, acc)
        x_ptrs += BK
        w_ptrs += BK
    out = out_ptr + pid_s.to(tl.int64) * M * N + rm[:, None].to(tl.int64) * N + rn[None, :]
    tl.store(out, acc, mask=m_ok & n_ok)


def splitk_matmul(x: torch.Tensor, w: torch.Tensor, splits: int, bm: int = 64, bn: int = 64, bk: int = 128,
                  warps: int = 4, stages: int = 3, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ w[N, K].T as `splits` fp32 partial products [splits, M, N] (their sum is the result)."""
    m, k = x.shape
    n = w.shape[0]
    assert w.shape[1] == k and x.stride(1) == 1 and w.stride(1) == 1
    if k % (splits * bk):
        raise ValueError(f"K={k} is not a multiple of splits x BK = {splits} x {bk}")
    if out is None:
        out = torch.empty((splits, m, n), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn), splits)
    _splitk_kernel[grid](x, w, out, m, n, k, x.stride(0), w.stride(0), k // splits,
                         BM=bm, BN=bn, BK=bk, num_warps=warps, num_stages=stages)
    return out
