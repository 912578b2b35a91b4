"""Small fused GPU kernels, written in OpenAI's triton language (elsewhere in this repository
"Triton" means the inference server), where no maintained kernel exists (flashinfer has LayerNorm, but none with
the residual add or the embedding gathers folded in). Imported only on CUDA.

    add_layernorm(x, residual, w, b, eps)            y = LN(x + residual)          [T, H]
    embed_layernorm(ids, pos, tok_w, pos_w, w, b, eps)  y = LN(tok_w[ids] + pos_w[pos])  [T, H]
    parts_add_layernorm(parts, bias, residual, w, b, eps)  y = LN(sum(parts) + bias + residual)
    parts_add_rmsnorm_(parts, bias, residual, w, eps)   residual += sum(parts) + bias; y = RMSNorm(residual)
One program per row, float32 statistics, one read of each input and one write; each takes part in
programmatic dependent launch as layers/small_gemm.py says. `parts` are a
split-K projection's fp32 partial products [S, T, H] (layers/projection.py).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from rose_backend.layers import small_gemm
from rose_backend.layers.small_gemm import pdl_wait


@triton.jit
def _add_ln_kernel(x_ptr, r_ptr, ids_ptr, pos_ptr, w_ptr, b_ptr, y_ptr, stride_x, stride_r, stride_y,
                   n_cols, eps, GATHER: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    pdl_wait(PDL)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    if GATHER:
        xrow = tl.load(ids_ptr + row).to(tl.int64)
        rrow = tl.load(pos_ptr + row).to(tl.int64)
    else:
        xrow = row
        rrow = row
    x = tl.load(x_ptr + xrow * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    x += tl.load(r_ptr + rrow * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    d = tl.where(mask, x - mean, 0.0)
    var = tl.sum(d * d, axis=0) / n_cols
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = d * rstd * w + b
    tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def _launch(x, r, ids, pos, w, b, eps, rows, gather):
    n = x.shape[-1]
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if rows == 0:
        return y
    block = triton.next_power_of_2(n)
    warps = 4 if block <= 1024 else 8
    _add_ln_kernel[(rows,)](x, r, ids if gather else x, pos if gather else x, w, b, y,
                            x.stride(0), r.stride(0), y.stride(0), n, eps,
                            GATHER=gather, BLOCK=block, num_warps=warps,
                            **small_gemm.launch_options(small_gemm.use_pdl(x, rows)))
    return y


def add_layernorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                  eps: float) -> torch.Tensor:
    """LN(x + residual) for x, residual [T, H] (last dim contiguous) -> [T, H] in x's dtype."""
    assert x.stride(-1) == 1 and residual.stride(-1) == 1 and x.shape == residual.shape
    return _launch(x, residual, None, None, weight, bias, eps, x.shape[0], gather=False)


def embed_layernorm(ids: torch.Tensor, positions: torch.Tensor, tok_w: torch.Tensor, pos_w: torch.Tensor,
                    weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """LN(tok_w[ids] + pos_w[positions]) for ids, positions [T] -> [T, H] in tok_w's dtype."""
    return _launch(tok_w, pos_w, ids, positions, weight, bias, eps, ids.shape[0], gather=True)


@triton.jit
def _parts_norm_kernel(p_ptr, bias_ptr, r_ptr, w_ptr, b_ptr, y_ptr, part_stride, stride_r, stride_y,
                       n_cols, eps, PARTS: tl.constexpr, HAS_BIAS: tl.constexpr, RMS: tl.constexpr,
                       BLOCK: tl.constexpr, PDL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    pdl_wait(PDL)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(r_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
    for s in tl.static_range(PARTS):
        x += tl.load(p_ptr + s * part_stride + row * n_cols + cols, mask=mask, other=0.0)
    if HAS_BIAS:
        x += tl.load(bias_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if RMS:           # as flashinfer's fused_add_rmsnorm: the residual keeps the sum, the norm reads it unrounded
        tl.store(r_ptr + row * stride_r + cols, x.to(r_ptr.dtype.element_ty), mask=mask)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
        y = x * rstd * w
    else:
        mean = tl.sum(x, axis=0) / n_cols
        d = tl.where(mask, x - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=0) / n_cols + eps)
        y = d * rstd * w + tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def _parts_norm(parts, bias, residual, weight, norm_bias, eps, rms):
    s, rows, n = parts.shape
    assert parts.is_contiguous() and residual.stride(-1) == 1 and residual.shape == (rows, n)
    y = torch.empty_like(residual)
    if rows == 0:
        return y
    block = triton.next_power_of_2(n)
    _parts_norm_kernel[(rows,)](parts, bias if bias is not None else weight, residual, weight,
                                norm_bias if norm_bias is not None else weight, y, rows * n,
                                residual.stride(0), y.stride(0), n, eps, PARTS=s, HAS_BIAS=bias is not None,
                                RMS=rms, BLOCK=block, num_warps=4 if block <= 1024 else 8,
                                **small_gemm.launch_options(small_gemm.use_pdl(parts, rows)))
    return y


def parts_add_layernorm(parts: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor,
                        weight: torch.Tensor, norm_bias: torch.Tensor, eps: float) -> torch.Tensor:
    """LN(sum(parts) + bias + residual) for parts [S, T, H] fp32, residual [T, H] -> [T, H] in residual's dtype."""
    return _parts_norm(parts, bias, residual, weight, norm_bias, eps, rms=False)


def parts_add_rmsnorm_(parts: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor,
                       weight: torch.Tensor, eps: float) -> torch.Tensor:
    """residual += sum(parts) + bias (in place); return RMSNorm(residual) * weight [T, H]."""
    return _parts_norm(parts, bias, residual, weight, None, eps, rms=True)
