"""BERT / RoBERTa / XLM-RoBERTa encoders on packed tokens.

One forward pass takes every sequence of a batch end to end: input_ids [T], positions [T]
(restarting at 0 for each sequence), and returns hidden states [T, H]. The attention backend holds
the per-batch layout (cu_seqlens), planned by the engine before the pass.

Per layer, seven kernels on CUDA: fused QKV projection (GEMM with bias epilogue), ragged attention
(one kernel), output projection, add+LayerNorm (one Triton kernel), up projection with the GELU in
its epilogue, down projection, add+LayerNorm. The embedding gathers, their add and the LayerNorm are
one more kernel per forward pass. Up to 256 tokens the output and down projections run split-K and
their add+LayerNorm sums the partials; up to 128 those kernels launch with programmatic dependent
launch (layers/projection.py, layers/small_gemm.py).
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from rose_backend.config import ModelConfig
from rose_backend.layers.activation import activation_name
from rose_backend.layers.attention import AttentionBackend
from rose_backend.layers.norm import AddLayerNorm
from rose_backend.layers.projection import project, project_for_norm
from rose_backend.loading import PackedLoader, iter_safetensors, strip_prefix
from rose_backend.models.packed import PackedModel

_PREFIXES = ("bert.", "roberta.", "model.", "0.auto_model.")


class BertLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h, f = cfg.hidden_size, cfg.intermediate_size
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.qkv = nn.Linear(h, 3 * h)
        self.o_proj = nn.Linear(h, h)
        self.attn_norm = AddLayerNorm(h, eps=cfg.norm_eps)
        self.ffn_up = nn.Linear(h, f)
        self.ffn_down = nn.Linear(f, h)
        self.ffn_norm = AddLayerNorm(h, eps=cfg.norm_eps)
        self.act_name = activation_name(cfg.hidden_act)
        self.attn: AttentionBackend | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.qkv(x).view(t, 3, self.num_heads, self.head_dim).unbind(1)   # 3 x [T, nh, hd]
        a = self.attn.run(q, k, v).reshape(t, -1)                                     # [T, H]
        x = self.attn_norm(project_for_norm(a, self.o_proj), x)
        h = project(x, self.ffn_up, self.act_name)                                     # [T, F]
        return self.ffn_norm(project_for_norm(h, self.ffn_down), x)


class BertEncoder(PackedModel):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h)
        # Position table starting at position 0 of a sequence; XLM-R's pad offset and the
        # token-type-0 embedding are folded in at load time (one add instead of two, no gather).
        # Models that read segment ids (BERT cross-encoders) get one block of rows per token type:
        # row t * max_positions + p = position p + type t; the engine offsets positions to match.
        self.embed_positions = nn.Embedding(cfg.max_positions * (cfg.type_vocab_size if cfg.uses_token_types else 1), h)
        self.embed_norm = AddLayerNorm(h, eps=cfg.norm_eps)
        self.layers = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_layers))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.embed_norm.embed(input_ids, positions, self.embed_tokens, self.embed_positions)  # [T, H]
        for layer in self.layers:
            x = layer(x)
        return x

    @torch.no_grad()
    def load_from_folder(self, model_dir: Path) -> None:
        cfg = self.cfg
        h = cfg.hidden_size
        loader = PackedLoader(self, model_dir, lambda n: (
            {"q": (0, h), "k": (h, h), "v": (2 * h, h)} if ".qkv." in n else {None: (0, 0)}))
        types = None
        for raw_name, w in iter_safetensors(model_dir):
            name = strip_prefix(raw_name, _PREFIXES)
            # heads (pooler, classifier) are loaded by models/heads.py
            if name.startswith(("pooler.", "lm_head", "cls.", "classifier.")) or name.endswith("position_ids"):
                continue
            if name == "embeddings.token_type_embeddings.weight":
                types = w
                continue
            if name == "embeddings.position_embeddings.weight":
                table, pos = loader.target("embed_positions.weight", raw_name), w[cfg.position_offset:]
                for start in range(0, table.shape[0], cfg.max_positions):    # one block per token type
                    table[start:start + pos.shape[0]].copy_(pos)
                continue
            parts = name.split(".")
            if parts[0] == "encoder" and parts[3:5] == ["attention", "self"]:   # encoder.layer.<i>.attention.self.<q|k|v>.<w|b>
                loader.copy(f"layers.{parts[2]}.qkv.{parts[6]}", w, _QKV[parts[5]], raw_name)
                continue
            target = _map_name(name)
            if target is None:
                raise KeyError(f"{model_dir}: unexpected weight {raw_name!r} for a {cfg.model_type} model")
            loader.copy(target, w, None, raw_name)
        if types is not None:             # token type t's embedding folded into block t of the table
            table = loader.params["embed_positions.weight"]
            for block, start in enumerate(range(0, table.shape[0], cfg.max_positions)):
                table[start:start + cfg.max_positions].add_(types[block].to(table.device))
        loader.finish()


_QKV = {"query": "q", "key": "k", "value": "v"}


def _map_name(name: str) -> str | None:
    """Hugging Face BERT parameter name -> this module's name (None if unknown)."""
    fixed = {
        "embeddings.word_embeddings.weight": "embed_tokens.weight",
        "embeddings.LayerNorm.weight": "embed_norm.weight",
        "embeddings.LayerNorm.bias": "embed_norm.bias",
    }
    if name in fixed:
        return fixed[name]
    parts = name.split(".")
    if parts[0] != "encoder" or len(parts) < 5:
        return None
    i, rest = parts[2], ".".join(parts[3:])
    per_layer = {
        "attention.output.dense": "o_proj",
        "attention.output.LayerNorm": "attn_norm",
        "intermediate.dense": "ffn_up",
        "output.dense": "ffn_down",
        "output.LayerNorm": "ffn_norm",
    }
    module, _, kind = rest.rpartition(".")
    if module not in per_layer:
        return None
    return f"layers.{i}.{per_layer[module]}.{kind}"
