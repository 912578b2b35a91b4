"""LayerNorm / RMSNorm with the residual add folded in: norm(x + residual).

On CUDA, AddLayerNorm runs one Triton kernel (layers/fused_kernels.py): the add, the statistics
in float32 and the affine in one pass. On the CPU it is torch's own add + layer_norm.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _triton():
    from rose_backend.layers import fused_kernels
    return fused_kernels


class AddLayerNorm(nn.LayerNorm):
    """y = LayerNorm(x + residual); with residual None, plain LayerNorm. x, residual [T, H]."""

    fused = True        # class switch: False forces the unfused torch path (for A/B measurements)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if self.fused and x.is_cuda and x.dim() == 2 and x.stride(-1) == 1:
            r = residual if residual is not None else torch.zeros_like(x)
            return _triton().add_layernorm(x, r, self.weight, self.bias, self.eps)
        if residual is not None:
            x = x + residual
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def embed(self, ids: torch.Tensor, positions: torch.Tensor, tok: nn.Embedding,
              pos: nn.Embedding) -> torch.Tensor:
        """LayerNorm(tok[ids] + pos[positions]): one kernel on CUDA (gathers folded in)."""
        if self.fused and ids.is_cuda:
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
