"""Rotary position embeddings on packed tokens (GPT-NeoX / Hugging Face "rotate_half" layout).

Positions are per token ([T] int64, restarting at 0 for every sequence of a ragged batch), so one
call rotates a whole packed batch. The cos/sin table is a buffer indexed by position: one gather
and a few elementwise ops with fixed shapes, nothing on the host, so it lives inside a CUDA graph.

    rope = RotaryEmbedding(head_dim=128, max_positions=32768, base=1e6)
    q, k = rope(positions, q, k)          # q [T, Hq, D], k [T, Hkv, D] -> same shapes
"""
from __future__ import annotations

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    """cos_sin_cache [max_positions, D] float32 holds cos(p * f) in the first D/2 columns and sin in
    the last (the vLLM / flashinfer `cos_sin_cache` layout).

    The table stays float32 when the model is cast to bf16 (rounding it would move positions far
    from 0); the rotation is computed in float32 and rounded once. It is not a weight: after
    meta-device construction and `to_empty`, call `init_cache()` to fill it.
    """

    def __init__(self, head_dim: int, max_positions: int, base: float):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary head_dim must be even, got {head_dim}")
        self.head_dim, self.max_positions, self.base = head_dim, max_positions, base
        self.register_buffer("cos_sin_cache", torch.empty(max_positions, head_dim), persistent=False)
        if not self.cos_sin_cache.is_meta:
            self.init_cache()

    @torch.no_grad()
    def init_cache(self) -> None:
        d, dev = self.head_dim, self.cos_sin_cache.device
        inv_freq = 1.0 / (self.base ** (torch.arange(0, d, 2, dtype=torch.float32, device=dev) / d))   # [D/2]
        t = torch.arange(self.max_positions, dtype=torch.float32, device=dev)
        freqs = torch.outer(t, inv_freq)                                                               # [P, D/2]
        self.cos_sin_cache.copy_(torch.cat([freqs.cos(), freqs.sin()], dim=-1))

    def _apply(self, fn, recurse=True):
        # model.to(dtype) casts every floating buffer; move this one but keep it float32.
        cache = self.cos_sin_cache
        super()._apply(fn, recurse)
        if self.cos_sin_cache.dtype != torch.float32:
            self.cos_sin_cache = cache.to(self.cos_sin_cache.device)
        return self

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.cos_sin_cache[positions].unsqueeze(1).chunk(2, dim=-1)     # 2 x [T, 1, D/2] float32
        return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin on [T, H, D] in float32, halves kept apart (no [T, H, D] cos)."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
