"""Gemma 3 text decoders on packed tokens (EmbeddingGemma-300m: bidirectional, mean pooling).

Per layer: RMSNorm with weight (1 + w), fused QKV projection, per-head q/k RMSNorm, RoPE (the
full-attention layers' rope_theta, possibly "linear"-scaled; the sliding layers' rope_local_base_freq),
grouped-query attention scaled by query_pre_attn_scalar ** -0.5, output projection, RMSNorm, residual add + RMSNorm, fused gate/up projection with tanh-GELU
(GeGLU), down projection, RMSNorm; the embeddings are scaled by sqrt(hidden) (rounded to the weights'
dtype, as transformers does) and the last hidden state normed.

Sliding layers (layer_types, else every layer but each sliding_window_pattern-th) see a window of
config.json's sliding_window W: keys i - W + 1 .. i when causal; |i - j| <= W // 2 with
use_bidirectional_attention (transformers halves W for the bidirectional window); |i - j| <= W for a
decoder made bidirectional by is_causal false (transformers' bidirectional sliding mask).
config.json's attn_logit_softcapping is not applied: transformers' Gemma 3 attention does not apply it
either (Gemma 3 has q/k norms in its place; its checkpoints set it to null).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
from torch import nn

from rose_backend.config import ModelConfig
from rose_backend.layers.activation import gated_name
from rose_backend.layers.attention import AttentionBackend, AttentionShape, Window
from rose_backend.layers.norm import AddGemmaRMSNorm, GemmaRMSNorm
from rose_backend.layers.projection import project
from rose_backend.layers.rotary import RotaryEmbedding
from rose_backend.models.decoder_weights import load_decoder
from rose_backend.models.packed import PackedModel
from rose_backend.models.rope_config import rope_parameters


@dataclass(frozen=True)
class Gemma3Spec:
    """What a gemma3_text config.json says beyond ModelConfig's generic fields."""
    sliding: tuple[bool, ...]              # per layer
    window: Window | None                   # of the sliding layers
    scale: float
    bias: bool
    rope_full: dict
    rope_local: dict

    @classmethod
    def of(cls, cfg: ModelConfig) -> "Gemma3Spec":
        raw, n = cfg.raw, cfg.num_layers
        pattern = raw.get("sliding_window_pattern") or raw.get("_sliding_window_pattern") or 6
        types = raw.get("layer_types") or ["sliding_attention" if (i + 1) % pattern else "full_attention"
                                           for i in range(n)]
        width = raw.get("sliding_window")
        if not width:
            window = None
        elif raw.get("use_bidirectional_attention"):
            window = (width // 2, width // 2)
        else:
            window = (width - 1, 0) if cfg.causal else (width, width)
        return cls(sliding=tuple(t == "sliding_attention" and window is not None for t in types[:n]), window=window,
                   scale=float(raw.get("query_pre_attn_scalar") or cfg.head_dim) ** -0.5,
                   bias=bool(raw.get("attention_bias", False)),
                   rope_full=rope_parameters(raw, "full_attention", default_theta=1_000_000.0),
                   rope_local=rope_parameters(raw, "sliding_attention", "rope_local_base_freq", 10_000.0,
                                              scaled=False))


class Gemma3Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, spec: Gemma3Spec, window: Window | None, rotary: RotaryEmbedding):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, d
        self.q_size, self.kv_size = cfg.num_heads * d, cfg.num_kv_heads * d
        self.qkv_proj = nn.Linear(h, self.q_size + 2 * self.kv_size, bias=spec.bias)
        self.o_proj = nn.Linear(self.q_size, h, bias=spec.bias)
        self.q_norm = GemmaRMSNorm(d, eps=cfg.norm_eps)      # per head, over D
        self.k_norm = GemmaRMSNorm(d, eps=cfg.norm_eps)
        self.window = window
        self.rotary = [rotary]              # shared with the layers of its kind; a list keeps it out of state_dict
        self.attn: AttentionBackend | None = None

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = self.q_norm(q.view(t, self.num_heads, self.head_dim))                           # [T, Hq, D]
        k = self.k_norm(k.view(t, self.num_kv_heads, self.head_dim))                        # [T, Hkv, D]
        q, k = self.rotary[0](positions, q, k)
        a = self.attn.run(q, k, v.view(t, self.num_kv_heads, self.head_dim), window=self.window)
        return self.o_proj(a.reshape(t, self.q_size))                                       # [T, H]


class Gemma3MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.act = gated_name(cfg.hidden_act)                  # gelu_pytorch_tanh -> "geglu_tanh"
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(project(x, self.gate_up_proj, self.act))                      # [T, F] -> [T, H]


class Gemma3Layer(nn.Module):
    def __init__(self, cfg: ModelConfig, spec: Gemma3Spec, sliding: bool, rotary: RotaryEmbedding):
        super().__init__()
        h, eps = cfg.hidden_size, cfg.norm_eps
        self.input_layernorm = AddGemmaRMSNorm(h, eps)
        self.self_attn = Gemma3Attention(cfg, spec, spec.window if sliding else None, rotary)
        self.post_attention_layernorm = GemmaRMSNorm(h, eps)
        self.pre_feedforward_layernorm = AddGemmaRMSNorm(h, eps)
        self.mlp = Gemma3MLP(cfg)
        self.post_feedforward_layernorm = GemmaRMSNorm(h, eps)

    def forward(self, positions, x, residual):
        """x: the previous layer's MLP output (the embeddings, residual None, for the first)."""
        h, residual = self.input_layernorm(x, residual)
        h, residual = self.pre_feedforward_layernorm(self.post_attention_layernorm(self.self_attn(positions, h)), residual)
        return self.post_feedforward_layernorm(self.mlp(h)), residual


class Gemma3Decoder(PackedModel):
    """Gemma3TextModel on packed tokens: forward(input_ids [T], positions [T]) -> hidden [T, H]."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg, spec = cfg, Gemma3Spec.of(cfg)
        n = max(cfg.max_position_embeddings, cfg.max_seq_length)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.rotary_full = RotaryEmbedding(cfg.head_dim, n, spec.rope_full["rope_theta"], spec.rope_full)
        self.rotary_local = RotaryEmbedding(cfg.head_dim, n, spec.rope_local["rope_theta"], spec.rope_local)
        self.layers = nn.ModuleList(Gemma3Layer(cfg, spec, s, self.rotary_local if s else self.rotary_full)
                                    for s in spec.sliding)
        self.norm = AddGemmaRMSNorm(cfg.hidden_size, eps=cfg.norm_eps)

    @classmethod
    def attention_shape(cls, cfg: ModelConfig, dtype: torch.dtype) -> AttentionShape:
        spec = Gemma3Spec.of(cfg)
        windows = tuple(dict.fromkeys(spec.window if s else None for s in spec.sliding))
        return AttentionShape(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, dtype, causal=cfg.causal, windows=windows,
                              scale=spec.scale)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)                                                       # [T, H]
        x, residual = x * _rounded(self.cfg.hidden_size ** 0.5, x.dtype), None
        for layer in self.layers:
            x, residual = layer(positions, x, residual)
        return self.norm(x, residual)[0]

    def load_from_folder(self, model_dir: Path) -> None:
        self.rotary_full.init_cache()       # computed buffers, not weights
        self.rotary_local.init_cache()
        load_decoder(self, model_dir)


@lru_cache(maxsize=None)
def _rounded(value: float, dtype: torch.dtype) -> float:
    """value as `dtype` holds it (Gemma3TextScaledWordEmbedding casts its scale to the weights' dtype)."""
    return float(torch.tensor(value, dtype=torch.float32).to(dtype))
