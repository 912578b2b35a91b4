"""Rotary position embeddings on packed tokens (GPT-NeoX / Hugging Face "rotate_half" layout).

Positions are per token ([T] int64, restarting at 0 for every sequence of a ragged batch), so one
call rotates a whole packed batch. The cos/sin table is a buffer indexed by position: one gather
and a few elementwise ops with fixed shapes, nothing on the host, so it lives inside a CUDA graph.

    rope = RotaryEmbedding(head_dim=128, max_positions=32768, base=1e6)
    q, k = rope(positions, q, k)          # q [T, Hq, D], k [T, Hkv, D] -> same shapes

Scaled RoPE as transformers computes it (`rope` = config.json's rope_parameters / rope_scaling
entry): "default", "linear" (frequencies / factor) and "llama3" (Llama 3.1's banded rescaling);
other types are refused by name (rope_inv_freq).
"""
from __future__ import annotations

import math

import torch
from torch import nn

ROPE_TYPES = ("default", "linear", "llama3")


def rope_inv_freq(head_dim: int, base: float, rope: dict | None = None, device=None) -> torch.Tensor:
    """The inverse frequencies [D/2] float32 of RoPE type rope["rope_type"] (ROPE_TYPES; ValueError
    naming the type otherwise), as transformers' modeling_rope_utils computes them."""
    kind = (rope or {}).get("rope_type", (rope or {}).get("type", "default"))
    if kind not in ROPE_TYPES:
        raise ValueError(f"rope type {kind!r} is not supported (supported: {', '.join(ROPE_TYPES)})")
    if (rope or {}).get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("partial rotary embeddings (partial_rotary_factor < 1) are not supported")
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    if kind == "linear":
        return inv_freq / rope["factor"]
    if kind == "llama3":
        factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
        old = rope["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old / low, inv_freq / factor, inv_freq)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / high) & ~(wavelen > old / low)
        return torch.where(medium, smoothed, scaled)
    return inv_freq


class RotaryEmbedding(nn.Module):
    """cos_sin_cache [max_positions, D] float32 holds cos(p * f) in the first D/2 columns and sin in
    the last (the vLLM / flashinfer `cos_sin_cache` layout).

    The table stays float32 when the model is cast to bf16 (rounding it would move positions far
    from 0); the rotation is computed in float32 and rounded once. It is not a weight: after
    meta-device construction and `to_empty`, call `init_cache()` to fill it.
    """

    def __init__(self, head_dim: int, max_positions: int, base: float, rope: dict | None = None):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary head_dim must be even, got {head_dim}")
        self.head_dim, self.max_positions, self.base, self.rope = head_dim, max_positions, base, rope
        rope_inv_freq(2, base, rope)                     # refuse an unsupported type at construction
        self.register_buffer("cos_sin_cache", torch.empty(max_positions, head_dim), persistent=False)
        if not self.cos_sin_cache.is_meta:
            self.init_cache()

    @torch.no_grad()
    def init_cache(self) -> None:
        dev = self.cos_sin_cache.device
        inv_freq = rope_inv_freq(self.head_dim, self.base, self.rope, dev)                           # [D/2]
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
