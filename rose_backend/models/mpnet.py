"""MPNet encoders on packed tokens (all-mpnet-base-v2, multi-qa-mpnet): BERT's post-norm layers
under MPNet's weight names, positions numbered from 2 (config.py's POSITION_OFFSETS), and a
relative position bias added to every layer's attention scores.

The bias is T5's: the distance j - i of key j from query i falls in one of 32 buckets (16 per
direction: exact up to 7, then log-spaced up to 128), each bucket holds one learned value per head
(`encoder.relative_attention_bias`, shared by all layers). One forward pass turns the table into a
per-distance row bias [H, 2P - 1] once, and every layer's attention adds bias[h, P - 1 + j - i]
(layers/attention.py, `bias=`); only the per-sequence SDPA backend takes it, so on CUDA this family
runs eagerly (attention backends with a bias table are future work).
"""
from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from rose_backend.config import ModelConfig
from rose_backend.layers.attention import AttentionShape
from rose_backend.models.bert import BertEncoder

NUM_BUCKETS, MAX_DISTANCE = 32, 128     # MPNetEncoder.compute_position_bias's (config's bucket count unused)


class MPNetEncoder(BertEncoder):
    PREFIXES = ("mpnet.", "0.auto_model.")
    SKIPPED = ("pooler.", "lm_head.", "classifier.")
    LAYER_PREFIX = "encoder.layer."
    PER_LAYER = {"attention.attn.o": "o_proj", "attention.LayerNorm": "attn_norm", "intermediate.dense": "ffn_up",
                 "output.dense": "ffn_down", "output.LayerNorm": "ffn_norm"}
    QKV = {"attention.attn.q": "q", "attention.attn.k": "k", "attention.attn.v": "v"}

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.relative_attention_bias = nn.Embedding(cfg.raw.get("relative_attention_num_buckets", NUM_BUCKETS),
                                                    cfg.num_heads)
        # bucket of each distance j - i = d - (P - 1), d in [0, 2P - 1): not a weight, filled at load time
        self.register_buffer("buckets", torch.empty(2 * cfg.max_positions - 1, dtype=torch.long), persistent=False)

    @classmethod
    def attention_shape(cls, cfg: ModelConfig, dtype: torch.dtype) -> AttentionShape:
        return AttentionShape(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, dtype, position_bias=True)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.embed_norm.embed(input_ids, positions, self.embed_tokens, self.embed_positions)  # [T, H]
        bias = self.relative_attention_bias.weight[self.buckets].t().float()                     # [nh, 2P - 1]
        for layer in self.layers:
            x = layer(x, bias)
        return x

    def target(self, name: str) -> tuple[str, str | None] | None:
        if name == "encoder.relative_attention_bias.weight":
            return "relative_attention_bias.weight", None
        return super().target(name)

    @torch.no_grad()
    def load_from_folder(self, model_dir: Path) -> None:
        p = self.cfg.max_positions
        self.buckets.copy_(relative_position_bucket(torch.arange(-(p - 1), p, device=self.buckets.device)))
        super().load_from_folder(model_dir)


def relative_position_bucket(relative: torch.Tensor) -> torch.Tensor:
    """transformers' MPNetEncoder.relative_position_bucket of distances j - i (int64) -> buckets."""
    n = -relative
    half = NUM_BUCKETS // 2
    ret = (n < 0).long() * half
    n = n.abs()
    max_exact = half // 2
    large = max_exact + (torch.log(n.float() / max_exact) / math.log(MAX_DISTANCE / max_exact)
                         * (half - max_exact)).long()
    large = large.clamp(max=half - 1)
    return ret + torch.where(n < max_exact, n, large)
