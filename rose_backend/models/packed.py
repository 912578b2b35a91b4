"""What every packed-token model shares: one attention backend, planned per batch by the engine and
run by each layer (nano-vllm's per-batch attention context, held as the backend object)."""
from __future__ import annotations

import torch
from torch import nn

from rose_backend.config import ModelConfig
from rose_backend.layers.attention import AttentionBackend, AttentionShape, make_backend


class PackedModel(nn.Module):
    """Base class: subclasses have `cfg`, `embed_tokens` and layers whose attention modules have an
    `attn` attribute; forward(input_ids [T], positions [T]) -> hidden [T, H]."""

    attn: AttentionBackend | None = None

    @classmethod
    def attention_shape(cls, cfg: ModelConfig, dtype: torch.dtype) -> AttentionShape:
        """What this family's layers ask of attention (families with sliding windows, a score scale, a
        soft cap or a position bias say so here)."""
        return AttentionShape(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, dtype, causal=cfg.causal)

    def set_attention_backend(self, name_or_backend: str | AttentionBackend) -> AttentionBackend:
        """Give every layer the backend (made here from a name, for this model's heads and dtype)."""
        if isinstance(name_or_backend, str):
            w = self.embed_tokens.weight
            name_or_backend = make_backend(name_or_backend, self.attention_shape(self.cfg, w.dtype), w.device)
        self.attn = name_or_backend
        for module in self.modules():
            if module is not self and "attn" in vars(module):
                module.attn = name_or_backend
        return name_or_backend
