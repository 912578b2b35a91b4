"""Llama, Mistral and Qwen2 decoders as embedders on packed tokens (e5-mistral-7b-instruct,
SFR-Embedding-Mistral, Linq-Embed-Mistral, gte-Qwen2, stella; bidirectional ones with is_causal false).

The three share Llama's layer: RMSNorm (fused with the residual add from the second norm on), fused
QKV projection, RoPE (plain, linear or Llama 3.1's "llama3" scaling), grouped-query attention, output
projection, add + RMSNorm, fused gate/up projection, SiLU-and-mul, down projection. They differ in
what their config.json reads into LlamaSpec: biases (Qwen2: q/k/v always; Llama: attention_bias,
mlp_bias), sliding windows (Mistral: every layer when sliding_window is set; Qwen2: the layers
layer_types / max_window_layers name when use_sliding_window), as transformers' classes read them.
A sliding window of W keeps keys i - W + 1 .. i when causal, i - W .. i + W when bidirectional.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from rose_backend.config import ModelConfig
from rose_backend.layers.attention import AttentionBackend, AttentionShape, Window
from rose_backend.layers.norm import AddRMSNorm
from rose_backend.layers.projection import project, project_for_norm
from rose_backend.layers.rotary import RotaryEmbedding
from rose_backend.models.decoder_weights import load_decoder
from rose_backend.models.packed import PackedModel
from rose_backend.models.rope_config import rope_parameters


@dataclass(frozen=True)
class LlamaSpec:
    """What a llama / mistral / qwen2 config.json says beyond ModelConfig's generic fields."""
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    windows: tuple[Window | None, ...]     # per layer
    rope: dict                             # layers/rotary.py's rope_parameters

    @classmethod
    def of(cls, cfg: ModelConfig) -> "LlamaSpec":
        raw, kind = cfg.raw, cfg.model_type
        if cfg.hidden_act != "silu":
            raise ValueError(f"{cfg.model_dir}: a {kind} MLP is SwiGLU; hidden_act {cfg.hidden_act!r} is not")
        n, width = cfg.num_layers, raw.get("sliding_window")
        if kind == "mistral":
            sliding = [width is not None] * n
        elif kind == "qwen2" and raw.get("use_sliding_window") and width is not None:
            types = raw.get("layer_types") or ["sliding_attention" if i >= raw.get("max_window_layers", 28)
                                               else "full_attention" for i in range(n)]
            sliding = [t == "sliding_attention" for t in types]
        else:
            sliding = [False] * n
        window = ((width - 1, 0) if cfg.causal else (width, width)) if width else None
        bias = bool(raw.get("attention_bias", False))
        return cls(qkv_bias=kind == "qwen2" or bias, o_bias=bias and kind != "qwen2",
                   mlp_bias=bool(raw.get("mlp_bias", False)), windows=tuple(window if s else None for s in sliding),
                   rope=rope_parameters(raw, default_theta=10_000.0))


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, spec: LlamaSpec, window: Window | None, rotary: RotaryEmbedding):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, d
        self.q_size, self.kv_size = cfg.num_heads * d, cfg.num_kv_heads * d
        self.qkv_proj = nn.Linear(h, self.q_size + 2 * self.kv_size, bias=spec.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, h, bias=spec.o_bias)
        self.window = window
        self.rotary = [rotary]              # shared with the other layers; a list keeps it out of state_dict
        self.attn: AttentionBackend | None = None

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.rotary[0](positions, q.view(t, self.num_heads, self.head_dim),             # [T, Hq, D]
                              k.view(t, self.num_kv_heads, self.head_dim))                     # [T, Hkv, D]
        v = v.view(t, self.num_kv_heads, self.head_dim)
        a = self.attn.run(q, k, v, window=self.window).reshape(t, self.q_size)
        return project_for_norm(a, self.o_proj)                                               # [T, H] (or Partials)


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ModelConfig, spec: LlamaSpec):
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=spec.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=spec.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return project_for_norm(project(x, self.gate_up_proj, "swiglu"), self.down_proj)   # [T, F] -> [T, H]


class LlamaLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, spec: LlamaSpec, window: Window | None, rotary: RotaryEmbedding):
        super().__init__()
        self.input_layernorm = AddRMSNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.self_attn = LlamaAttention(cfg, spec, window, rotary)
        self.post_attention_layernorm = AddRMSNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.mlp = LlamaMLP(cfg, spec)

    def forward(self, positions, x, residual):
        x, residual = self.input_layernorm(x, residual)
        x, residual = self.post_attention_layernorm(self.self_attn(positions, x), residual)
        return self.mlp(x), residual


class LlamaDecoder(PackedModel):
    """LlamaModel / MistralModel / Qwen2Model on packed tokens: forward(input_ids [T], positions [T])
    -> hidden [T, H] (final norm)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg, spec = cfg, LlamaSpec.of(cfg)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.rotary = RotaryEmbedding(cfg.head_dim, max(cfg.max_position_embeddings, cfg.max_seq_length),
                                      spec.rope["rope_theta"], spec.rope)
        self.layers = nn.ModuleList(LlamaLayer(cfg, spec, w, self.rotary) for w in spec.windows)
        self.norm = AddRMSNorm(cfg.hidden_size, eps=cfg.norm_eps)

    @classmethod
    def attention_shape(cls, cfg: ModelConfig, dtype: torch.dtype) -> AttentionShape:
        windows = tuple(dict.fromkeys(LlamaSpec.of(cfg).windows))
        return AttentionShape(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, dtype, causal=cfg.causal, windows=windows)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x, residual = self.embed_tokens(input_ids), None                                 # [T, H]
        for layer in self.layers:
            x, residual = layer(positions, x, residual)
        return self.norm(x, residual)[0]

    def load_from_folder(self, model_dir: Path) -> None:
        self.rotary.init_cache()            # a computed buffer, not a weight
        load_decoder(self, model_dir)
