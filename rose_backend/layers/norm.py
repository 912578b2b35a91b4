"""LayerNorm / RMSNorm with the residual add folded in: norm(x + residual)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class AddLayerNorm(nn.LayerNorm):
    """y = LayerNorm(x + residual); with residual None, plain LayerNorm."""

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if residual is not None:
            x = x + residual
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


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
