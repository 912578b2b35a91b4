"""What every packed-token model shares: one attention backend, planned per batch by the engine and
run by each layer (nano-vllm's per-batch attention context, held as the backend object)."""
from __future__ import annotations

from torch import nn

from rose_backend.layers.attention import AttentionBackend, AttentionShape, make_backend


class PackedModel(nn.Module):
    """Base class: subclasses have `cfg`, `embed_tokens` and layers whose attention modules have an
    `attn` attribute; forward(input_ids [T], positions [T]) -> hidden [T, H]."""

    attn: AttentionBackend | None = None

    def set_attention_backend(self, name_or_backend: str | AttentionBackend) -> AttentionBackend:
        """Give every layer the backend (made here from a name, for this model's heads and dtype)."""
        if isinstance(name_or_backend, str):
            w = self.embed_tokens.weight
            shape = AttentionShape(self.cfg.num_heads, self.cfg.num_kv_heads, self.cfg.head_dim, w.dtype,
                                   causal=self.cfg.causal)
            name_or_backend = make_backend(name_or_backend, shape, w.device)
        self.attn = name_or_backend
        for module in self.modules():
            if module is not self and "attn" in vars(module):
                module.attn = name_or_backend
        return name_or_backend
