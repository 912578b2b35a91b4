"""The projections at small token counts: split-K for those that feed a residual add + norm (`o`
and `down`), and gate/up with the SwiGLU in the GEMM's epilogue.

At a few hundred tokens cuBLAS leaves most SMs idle on these narrow GEMMs (N = hidden size, K up
to 4096); the split-K kernel (layers/small_gemm.py) spreads K over more blocks, which pays up to
`max_tokens` tokens and loses beyond. It returns fp32 partial products; the add + norm that follows
(layers/norm.py) sums them with the bias and the residual in one pass, so the split adds no kernel,
and the projection's output is never rounded to bf16.

    y = project_for_norm(x, linear)     # linear(x), or Partials on CUDA at <= max_tokens tokens
    x = add_norm(y, residual)           # AddLayerNorm / AddRMSNorm take either
    h = project(x, linear, "gelu")      # act(linear(x)): "none", "swiglu" or a config.json activation

`max_tokens` and `gemm_max_tokens` (module attributes, read at each call: an experiment may patch
them before an engine captures its graphs; 0 turns a kernel off) bound the token counts; the
fused-kernel switch (layers/fused.py) turns both off with the other kernels.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from rose_backend.layers import fused
from rose_backend.layers.activation import GATED, gated, linear_act, silu_and_mul

max_tokens = 256           # the largest token count whose `o` and `down` run split-K
gemm_max_tokens = 128      # the largest whose gate/up runs the small-GEMM kernel with its SwiGLU epilogue
_BK = 128


class Partials(NamedTuple):
    """linear(x) not yet summed: parts [splits, T, N] float32 (their sum is x @ W.T), bias [N] or None."""
    parts: torch.Tensor
    bias: torch.Tensor | None


def splits_for(tokens: int, k: int) -> int:
    """The split count: 4 for K >= 3072 (and K >= 2048 up to 128 tokens), else 2 (the fastest for
    the served models' shapes on Hopper)."""
    return 4 if k >= 3072 or (tokens <= 128 and k >= 2048) else 2


def project_for_norm(x: torch.Tensor, linear: nn.Linear) -> torch.Tensor | Partials:
    """linear(x) for x [T, K]; as Partials when the split-K kernel serves this shape here."""
    t, k = x.shape
    if 0 < t <= max_tokens and fused.half_kernels(x) and x.stride(-1) == 1:
        s = splits_for(t, k)
        if k % (s * _BK) == 0:
            from rose_backend.layers.small_gemm import splitk_matmul     # triton: CUDA hosts only
            return Partials(splitk_matmul(x, linear.weight, s, bm=64, bn=64, bk=_BK, stages=3), linear.bias)
    return linear(x)


def project(x: torch.Tensor, linear: nn.Module, act: str = "none") -> torch.Tensor:
    """act(linear(x)) for x [T, K] -> [T, N] ([T, N / 2] for the gated "swiglu", "geglu", "geglu_tanh":
    gate rows, then up rows); act is "none", a gated name or a config.json activation name. SwiGLU at <= gemm_max_tokens tokens on CUDA
    in bf16 / fp16 is one small-GEMM kernel with it in the epilogue (cuBLAS has no such epilogue: GEMM
    then SiLU-and-mul); everything else is cuBLAS (a GELU in its epilogue), which beats the small-GEMM
    kernel on QKV and on up + GELU."""
    t, k = x.shape
    if (act == "swiglu" and 0 < t <= gemm_max_tokens and fused.half_kernels(x) and x.stride(-1) == 1
            and k % 64 == 0 and type(linear) is nn.Linear and linear.weight.dtype == x.dtype):
        from rose_backend.layers.small_gemm import gemm_act                # triton: CUDA hosts only
        return gemm_act(x, linear.weight, linear.bias, "swiglu")
    if act == "swiglu":
        return silu_and_mul(linear(x))
    if act in GATED:                                                    # GeGLU (ModernBERT, Gemma 3)
        return gated(linear(x), act)
    return linear(x) if act == "none" else linear_act(x, linear, act)
