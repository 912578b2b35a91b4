"""Small fused GPU kernels, written in OpenAI's triton language (elsewhere in this repository
"Triton" means the inference server), where no maintained kernel exists (flashinfer has LayerNorm, but none with
the residual add or the embedding gathers folded in). Imported only on CUDA.

    add_layernorm(x, residual, w, b, eps)            y = LN(x + residual)          [T, H]
    embed_layernorm(ids, pos, tok_w, pos_w, w, b, eps)  y = LN(tok_w[ids] + pos_w[pos])  [T, H]
One program per row, float32 statistics, one read of each input and one write.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _add_ln_kernel(x_ptr, r_ptr, ids_ptr, pos_ptr, w_ptr, b_ptr, y_ptr, stride_x, stride_r, stride_y,
                   n_cols, eps, GATHER: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
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
                            GATHER=gather, BLOCK=block, num_warps=warps)
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
