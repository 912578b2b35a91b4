"""Projections that feed a residual add + norm (`o` and `down`): split-K at small token counts.

At 128-256 tokens cuBLAS leaves most SMs idle on these narrow GEMMs (N = hidden size, K up to
4096); the split-K kernel (layers/splitk_gemm.py) measured 8.5 -> 5.1 us for BGE-M3's `down` and
5.6 -> 4.0 us for pplx-embed's `o` at 128 tokens on the H200 (benchmarks/results/
gemm-sweep-splitk/bge-m3-pplx-embed-h200.json), and was slower from 512 tokens on. It returns fp32 partial products; the
add + norm that follows (layers/norm.py) sums them with the bias and the residual in one pass, so
the split adds no kernel, and the projection's output is never rounded to bf16.

    y = project_for_norm(x, linear)     # linear(x), or Partials on CUDA at <= max_tokens tokens
    x = add_norm(y, residual)           # AddLayerNorm / AddRMSNorm take either

`max_tokens` (module attribute; from $ROSE_SPLITK_MAX_TOKENS, layers/switches.py) bounds the
token count; the fused-kernel switch (layers/fused.py) turns it off with the other kernels.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from rose_backend.layers import fused, switches

max_tokens = switches.splitk_max_tokens()
_BK = 128


class Partials(NamedTuple):
    """linear(x) not yet summed: parts [splits, T, N] float32 (their sum is x @ W.T), bias [N] or None."""
    parts: torch.Tensor
    bias: torch.Tensor | None


def splits_for(tokens: int, k: int) -> int:
    """The split count the H200 sweep preferred: 4 for K >= 3072 (and K >= 2048 up to 128 tokens), else 2."""
    return 4 if k >= 3072 or (tokens <= 128 and k >= 2048) else 2


def project_for_norm(x: torch.Tensor, linear: nn.Linear) -> torch.Tensor | Partials:
    """linear(x) for x [T, K]; as Partials when the split-K kernel serves this shape here."""
    t, k = x.shape
    if 0 < t <= max_tokens and fused.half_kernels(x) and x.stride(-1) == 1:
        s = splits_for(t, k)
        if k % (s * _BK) == 0:
            from rose_backend.layers.splitk_gemm import splitk_matmul     # triton: CUDA hosts only
            return Partials(splitk_matmul(x, linear.weight, s, bm=64, bn=64, bk=_BK, stages=3), linear.bias)
    return linear(x)
