"""Qwen3's per-head q/k RMSNorm and NeoX rotary embedding as one kernel, in place on the fused QKV
projection's output. Imported only on CUDA (or under TRITON_INTERPRET=1 for the CPU test).

    qk_norm_rope_(qkv, positions, q_weight, k_weight, cos_sin_cache, num_q_heads, num_kv_heads, eps)
    # qkv [T, (Hq + 2 * Hkv) * D]: q and k columns normalised per head and rotated; v untouched

Unfused, this is four kernels a layer (q norm, k norm, RoPE on q and k; flashinfer's), each reading
and writing q or k once more. Here each token's q and k heads are read once and written once.
Numerics: float32 statistics, normalised value times the weight and rotated in float32 (the cos /
sin table is float32), rounded once to the input dtype.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from rose_backend.layers import small_gemm
from rose_backend.layers.small_gemm import pdl_wait


@triton.jit
def _qk_norm_rope_kernel(qkv_ptr, pos_ptr, qw_ptr, kw_ptr, cs_ptr, stride_t, eps,
                         HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
                         BLOCK_H: tl.constexpr, PDL: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    pdl_wait(PDL)
    half: tl.constexpr = D // 2
    heads = tl.arange(0, BLOCK_H)                        # q heads then k heads: HQ + HKV <= BLOCK_H
    cols = tl.arange(0, half)
    valid = heads < HQ + HKV
    is_q = heads < HQ
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    cos = tl.load(cs_ptr + pos * D + cols)              # [D/2] float32
    sin = tl.load(cs_ptr + pos * D + half + cols)
    base = qkv_ptr + tok * stride_t + heads[:, None] * D + cols[None, :]   # k heads follow q's columns
    m = valid[:, None]
    x1 = tl.load(base, mask=m, other=0.0).to(tl.float32)                   # [BLOCK_H, D/2]
    x2 = tl.load(base + half, mask=m, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / D + eps)   # [BLOCK_H]
    wq1 = tl.load(qw_ptr + cols).to(tl.float32)
    wq2 = tl.load(qw_ptr + half + cols).to(tl.float32)
    wk1 = tl.load(kw_ptr + cols).to(tl.float32)
    wk2 = tl.load(kw_ptr + half + cols).to(tl.float32)
    q_row = is_q[:, None]
    w1 = tl.where(q_row, wq1[None, :], wk1[None, :])
    w2 = tl.where(q_row, wq2[None, :], wk2[None, :])
    y1 = x1 * rstd[:, None] * w1
    y2 = x2 * rstd[:, None] * w2
    out1 = y1 * cos[None, :] - y2 * sin[None, :]
    out2 = y2 * cos[None, :] + y1 * sin[None, :]
    tl.store(base, out1.to(qkv_ptr.dtype.element_ty), mask=m)
    tl.store(base + half, out2.to(qkv_ptr.dtype.element_ty), mask=m)


def qk_norm_rope_(qkv: torch.Tensor, positions: torch.Tensor, q_weight: torch.Tensor,
                  k_weight: torch.Tensor, cos_sin_cache: torch.Tensor, num_q_heads: int,
                  num_kv_heads: int, eps: float) -> torch.Tensor:
    """In place on qkv [T, (Hq + 2 Hkv) * D] (last dim contiguous); positions [T] int;
    q_weight / k_weight [D]; cos_sin_cache [P, D] float32 (cos | sin halves). Returns qkv."""
    t = qkv.shape[0]
    d = q_weight.shape[0]
    if qkv.stride(-1) != 1 or cos_sin_cache.dtype != torch.float32 or d % 2 or d & (d - 1):
        raise ValueError("qk_norm_rope_ needs a row-contiguous qkv, a float32 cos/sin cache and a "
                         f"power-of-two head_dim; got strides {qkv.stride()}, {cos_sin_cache.dtype}, D={d}")
    if t:
        block_h = triton.next_power_of_2(num_q_heads + num_kv_heads)
        _qk_norm_rope_kernel[(t,)](qkv, positions, q_weight, k_weight, cos_sin_cache.contiguous(),
                                   qkv.stride(0), eps, HQ=num_q_heads, HKV=num_kv_heads, D=d,
                                   BLOCK_H=block_h, num_warps=4, **small_gemm.launch_options(small_gemm.use_pdl(qkv, t)))
    return qkv
