"""Qwen3 decoders as embedders on packed tokens (Qwen3-Embedding, pplx-embed).

One forward pass takes every sequence of a batch end to end: input_ids [T], positions [T]
(restarting at 0 for each sequence), and returns the final-norm hidden states [T, H]. Whether
attention is causal (Qwen3-Embedding, last-token pooling) or bidirectional (pplx-embed, mean
pooling) is cfg.causal; the backend applies it per sequence, so the module itself is the same.

Per layer: RMSNorm (fused with the residual add from the second norm on), fused QKV projection,
per-head q/k RMSNorm, RoPE from positions, grouped-query attention, output projection,
add + RMSNorm, fused gate/up projection, SiLU-and-mul, down projection.

On CUDA in bf16/fp16, with flashinfer installed, the residual norms and SiLU-and-mul run as
flashinfer kernels (fused_add_rmsnorm, silu_and_mul) and the per-head q/k norms with RoPE as one
kernel of ours (layers/qk_norm_rope.py, in place on the QKV output); elsewhere they are plain torch
with Hugging Face's float32 numerics. Both paths are pure
device work with fixed shapes: the forward can be captured in a CUDA graph.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from rose_backend.config import ModelConfig
from rose_backend.layers import fused
from rose_backend.layers.attention import AttentionBackend
from rose_backend.layers.norm import AddRMSNorm, RMSNorm
from rose_backend.layers.projection import project, project_for_norm
from rose_backend.layers.rotary import RotaryEmbedding
from rose_backend.models.decoder_weights import load_decoder
from rose_backend.models.packed import PackedModel


class Qwen3Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, rotary: RotaryEmbedding):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, d
        self.q_size, self.kv_size = cfg.num_heads * d, cfg.num_kv_heads * d
        bias = bool(cfg.raw.get("attention_bias", False))
        self.qkv_proj = nn.Linear(h, self.q_size + 2 * self.kv_size, bias=bias)
        self.o_proj = nn.Linear(self.q_size, h, bias=bias)
        self.q_norm = RMSNorm(d, eps=cfg.norm_eps)      # per head, over D
        self.k_norm = RMSNorm(d, eps=cfg.norm_eps)
        self.rotary = [rotary]              # shared with the other layers; a list keeps it out of state_dict
        self.attn: AttentionBackend | None = None

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[0]
        qkv = self.qkv_proj(x)                                                          # [T, (Hq + 2 Hkv) D]
        rope, fuse = self.rotary[0], fused.half_kernels(qkv)
        if fuse:              # q/k norms and RoPE in one kernel, in place on qkv's q and k columns
            from rose_backend.layers.qk_norm_rope import qk_norm_rope_     # Triton: CUDA hosts only
            qk_norm_rope_(qkv, positions, self.q_norm.weight, self.k_norm.weight, rope.cos_sin_cache,
                          self.num_heads, self.num_kv_heads, self.q_norm.eps)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(t, self.num_heads, self.head_dim)                                    # [T, Hq, D]
        k = k.view(t, self.num_kv_heads, self.head_dim)                                 # [T, Hkv, D]
        v = v.view(t, self.num_kv_heads, self.head_dim)                                 # [T, Hkv, D]
        if not fuse:
            q, k = rope(positions, self.q_norm(q), self.k_norm(k))
        return project_for_norm(self.attn.run(q, k, v).reshape(t, self.q_size), self.o_proj)  # [T, H] (or Partials)


class Qwen3MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.hidden_act != "silu":
            raise ValueError(f"Qwen3 MLP expects hidden_act 'silu', got {cfg.hidden_act!r}")
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return project_for_norm(project(x, self.gate_up_proj, "swiglu"), self.down_proj)   # [T, F] -> [T, H] (or Partials)


class Qwen3Layer(nn.Module):
    def __init__(self, cfg: ModelConfig, rotary: RotaryEmbedding):
        super().__init__()
        self.input_layernorm = AddRMSNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.self_attn = Qwen3Attention(cfg, rotary)
        self.post_attention_layernorm = AddRMSNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.mlp = Qwen3MLP(cfg)

    def forward(self, positions: torch.Tensor, x: torch.Tensor,
                residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        x, residual = self.input_layernorm(x, residual)
        x, residual = self.post_attention_layernorm(self.self_attn(positions, x), residual)
        return self.mlp(x), residual


class Qwen3Decoder(PackedModel):
    """Qwen3Model on packed tokens: forward(input_ids [T], positions [T]) -> hidden [T, H]."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.rotary = RotaryEmbedding(cfg.head_dim, max(cfg.max_position_embeddings, cfg.max_seq_length),
                                      cfg.rope_theta)
        self.layers = nn.ModuleList(Qwen3Layer(cfg, self.rotary) for _ in range(cfg.num_layers))
        self.norm = AddRMSNorm(cfg.hidden_size, eps=cfg.norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x, residual = self.embed_tokens(input_ids), None                                 # [T, H]
        for layer in self.layers:
            x, residual = layer(positions, x, residual)
        return self.norm(x, residual)[0]

    def load_from_folder(self, model_dir: Path) -> None:
        """Copy a Hugging Face Qwen3Model / Qwen3ForCausalLM checkpoint in, fusing q/k/v and
        gate/up on the way. Strict: unknown or missing weights raise KeyError naming them."""
        self.rotary.init_cache()            # a computed buffer, not a weight (meta construction leaves it empty)
        load_decoder(self, model_dir)
