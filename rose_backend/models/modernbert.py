"""ModernBERT encoders on packed tokens (gte-modernbert-base, nomic-modernbert-embed).

Pre-norm: token embeddings + LayerNorm, then per layer LayerNorm (none on the first layer), fused
QKV projection, RoPE (global_rope_theta on full-attention layers, local_rope_theta on the others),
attention, output projection, residual add, LayerNorm, fused Wi projection with GeGLU (the first half
activated, times the second), Wo projection, residual add; a final LayerNorm. Biases (attention_bias,
mlp_bias, norm_bias) are off by default. Every global_attn_every_n_layers-th layer (layer_types where
config.json lists them) attends to the whole sequence; the others see |i - j| <= local_attention // 2.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from rose_backend.config import ModelConfig
from rose_backend.layers.activation import gated_name
from rose_backend.layers.attention import AttentionBackend, AttentionShape, Window
from rose_backend.layers.norm import PreLayerNorm
from rose_backend.layers.projection import project
from rose_backend.layers.rotary import RotaryEmbedding
from rose_backend.loading import PackedLoader, iter_safetensors, strip_prefix
from rose_backend.models.packed import PackedModel
from rose_backend.models.rope_config import rope_parameters

PREFIXES = ("model.", "0.auto_model.")
SKIPPED = ("head.", "decoder.", "classifier.")       # MLM / classification heads (models/heads.py reads theirs)
# checkpoint name part -> this module's
RENAMES = {"embeddings.tok_embeddings.": "embed_tokens.", "embeddings.norm.": "embed_norm.",
           ".attn.Wqkv.": ".qkv.", ".attn.Wo.": ".o_proj.", ".mlp.Wi.": ".ffn_up.", ".mlp.Wo.": ".ffn_down."}


@dataclass(frozen=True)
class ModernBertSpec:
    sliding: tuple[bool, ...]          # per layer
    window: Window
    attention_bias: bool
    mlp_bias: bool
    norm_bias: bool
    rope_full: dict
    rope_local: dict

    @classmethod
    def of(cls, cfg: ModelConfig) -> "ModernBertSpec":
        raw, n = cfg.raw, cfg.num_layers
        every = raw.get("global_attn_every_n_layers") or 3
        types = raw.get("layer_types") or ["sliding_attention" if i % every else "full_attention" for i in range(n)]
        half = (raw.get("local_attention") or 128) // 2
        return cls(sliding=tuple(t == "sliding_attention" for t in types[:n]), window=(half, half),
                   attention_bias=bool(raw.get("attention_bias", False)), mlp_bias=bool(raw.get("mlp_bias", False)),
                   norm_bias=bool(raw.get("norm_bias", False)),
                   rope_full=rope_parameters(raw, "full_attention", "global_rope_theta", 160_000.0),
                   rope_local=rope_parameters(raw, "sliding_attention", "local_rope_theta", 10_000.0))


class ModernBertLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, spec: ModernBertSpec, first: bool, sliding: bool, rotary: RotaryEmbedding):
        super().__init__()
        h, f = cfg.hidden_size, cfg.intermediate_size
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        norm = dict(eps=cfg.norm_eps, bias=spec.norm_bias)
        self.attn_norm = None if first else PreLayerNorm(h, **norm)
        self.qkv = nn.Linear(h, 3 * h, bias=spec.attention_bias)
        self.o_proj = nn.Linear(h, h, bias=spec.attention_bias)
        self.mlp_norm = PreLayerNorm(h, **norm)
        self.ffn_up = nn.Linear(h, 2 * f, bias=spec.mlp_bias)
        self.ffn_down = nn.Linear(f, h, bias=spec.mlp_bias)
        self.act = gated_name(cfg.hidden_act)                     # gelu -> "geglu"
        self.window = spec.window if sliding else None
        self.rotary = [rotary]              # shared with the layers of its kind; a list keeps it out of state_dict
        self.attn: AttentionBackend | None = None

    def forward(self, positions, x, residual):
        """x: the previous layer's MLP output (the normed embeddings, also the residual, for the first)."""
        if self.attn_norm is None:
            h = x
        else:
            h, residual = self.attn_norm(x, residual)
        t = h.shape[0]
        q, k, v = self.qkv(h).view(t, 3, self.num_heads, self.head_dim).unbind(1)          # 3 x [T, nh, hd]
        q, k = self.rotary[0](positions, q, k)
        a = self.attn.run(q, k, v, window=self.window).reshape(t, -1)                       # [T, H]
        h, residual = self.mlp_norm(self.o_proj(a), residual)
        return self.ffn_down(project(h, self.ffn_up, self.act)), residual


class ModernBertEncoder(PackedModel):
    """ModernBertModel on packed tokens: forward(input_ids [T], positions [T]) -> hidden [T, H]."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg, spec = cfg, ModernBertSpec.of(cfg)
        h, n = cfg.hidden_size, max(cfg.max_position_embeddings, cfg.max_seq_length)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h)
        self.embed_norm = nn.LayerNorm(h, eps=cfg.norm_eps, bias=spec.norm_bias)
        self.rotary_full = RotaryEmbedding(cfg.head_dim, n, spec.rope_full["rope_theta"], spec.rope_full)
        self.rotary_local = RotaryEmbedding(cfg.head_dim, n, spec.rope_local["rope_theta"], spec.rope_local)
        self.layers = nn.ModuleList(
            ModernBertLayer(cfg, spec, i == 0, s, self.rotary_local if s else self.rotary_full)
            for i, s in enumerate(spec.sliding))
        self.final_norm = PreLayerNorm(h, eps=cfg.norm_eps, bias=spec.norm_bias)

    @classmethod
    def attention_shape(cls, cfg: ModelConfig, dtype: torch.dtype) -> AttentionShape:
        spec = ModernBertSpec.of(cfg)
        windows = tuple(dict.fromkeys(spec.window if s else None for s in spec.sliding))
        return AttentionShape(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, dtype, windows=windows)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.embed_norm(self.embed_tokens(input_ids))                                     # [T, H]
        residual = x
        for layer in self.layers:
            x, residual = layer(positions, x, residual)
        return self.final_norm(x, residual)[0]

    @torch.no_grad()
    def load_from_folder(self, model_dir: Path) -> None:
        """Copy a ModernBertModel / ModernBertFor* checkpoint in (strict, as PackedLoader)."""
        self.rotary_full.init_cache()       # computed buffers, not weights
        self.rotary_local.init_cache()
        loader = PackedLoader(self, model_dir, lambda n: {None: (0, 0)})
        for raw_name, w in iter_safetensors(model_dir):
            name = strip_prefix(raw_name, PREFIXES)
            if name.startswith(SKIPPED):
                continue
            for old, new in RENAMES.items():
                name = name.replace(old, new)
            loader.copy(name, w, None, raw_name)
        loader.finish()
