"""LayerNorm / RMSNorm with the residual add folded in: norm(x + residual).

On CUDA, AddLayerNorm runs one Triton kernel (layers/fused_kernels.py): the add, the statistics
in float32 and the affine in one pass; AddRMSNorm runs flashinfer's fused_add_rmsnorm (bf16/fp16),
AddGemmaRMSNorm (weight 1 + w) its gemma_fused_add_rmsnorm. PreLayerNorm (pre-norm LayerNorm with
the residual stream, ModernBERT) is plain torch.
On the CPU (or with layers.fused.enabled False) both are plain torch. Either also takes a split-K
projection's Partials (layers/projection.py) as x and sums them in the same kernel (CUDA only).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from rose_backend.layers import fused
from rose_backend.layers.projection import Partials


def _triton():
    from rose_backend.layers import fused_kernels
    return fused_kernels


class AddLayerNorm(nn.LayerNorm):
    """y = LayerNorm(x + residual); with residual None, plain LayerNorm. x, residual [T, H]."""

    def forward(self, x: torch.Tensor | Partials, residual: torch.Tensor | None = None) -> torch.Tensor:
        if isinstance(x, Partials):       # a split-K projection's partial products: summed here
            return _triton().parts_add_layernorm(x.parts, x.bias, residual, self.weight, self.bias, self.eps)
        if fused.on(x) and x.dim() == 2 and x.stride(-1) == 1:
            r = residual if residual is not None else torch.zeros_like(x)
            return _triton().add_layernorm(x, r, self.weight, self.bias, self.eps)
        if residual is not None:
            x = x + residual
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def embed(self, ids: torch.Tensor, positions: torch.Tensor, tok: nn.Embedding,
              pos: nn.Embedding) -> torch.Tensor:
        """LayerNorm(tok[ids] + pos[positions]): one kernel on CUDA (gathers folded in)."""
        if fused.on(ids):
            return _triton().embed_layernorm(ids, positions, tok.weight, pos.weight,
                                             self.weight, self.bias, self.eps)
        return self(tok(ids), pos(positions))


class RMSNorm(nn.Module):
    """y = x / rms(x) * weight, computed in float32 as Hugging Face's Qwen3RMSNorm does."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


class AddRMSNorm(RMSNorm):
    """(RMSNorm(x + residual), x + residual); with residual None, (RMSNorm(x), x).

    The flashinfer path works in place: `residual` becomes x + residual and `x` its norm.
    Both are scratch tensors of the forward pass, so that is safe and saves two round trips.
    """

    def forward(self, x: torch.Tensor | Partials, residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(x, Partials):       # a split-K projection's partial products: summed here
            return _triton().parts_add_rmsnorm_(x.parts, x.bias, residual, self.weight, self.eps), residual
        if fused.half_kernels(x):
            if residual is None:
                return fused.flashinfer.norm.rmsnorm(x, self.weight, self.eps, enable_pdl=fused.flashinfer_pdl), x
            fused.flashinfer.norm.fused_add_rmsnorm(x, residual, self.weight, self.eps, enable_pdl=fused.flashinfer_pdl)
            return x, residual
        if residual is not None:
            x = x + residual
        return super().forward(x), x


class GemmaRMSNorm(nn.Module):
    """y = x / rms(x) * (1 + weight), in float32 and rounded once, as Hugging Face's Gemma3RMSNorm
    (flashinfer's gemma_rmsnorm on CUDA in bf16 / fp16 for [T, H] rows)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if fused.half_kernels(x) and x.dim() == 2 and x.is_contiguous():
            return fused.flashinfer.norm.gemma_rmsnorm(x, self.weight, self.eps, enable_pdl=fused.flashinfer_pdl)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + self.weight.float())).to(x.dtype)


class AddGemmaRMSNorm(GemmaRMSNorm):
    """(GemmaRMSNorm(x + residual), x + residual); in place on CUDA as AddRMSNorm (flashinfer's
    gemma_fused_add_rmsnorm)."""

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return super().forward(x), x
        if fused.half_kernels(x):
            fused.flashinfer.norm.gemma_fused_add_rmsnorm(x, residual, self.weight, self.eps,
                                                          enable_pdl=fused.flashinfer_pdl)
            return x, residual
        x = x + residual
        return super().forward(x), x


class PreLayerNorm(nn.LayerNorm):
    """(LayerNorm(x + residual), x + residual), the residual stream of a pre-norm encoder; with
    residual None, (LayerNorm(x), x). Bias optional (nn.LayerNorm's bias=False)."""

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is not None:
            x = x + residual
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps), x
