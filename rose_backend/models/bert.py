"""BERT / RoBERTa / XLM-RoBERTa / CamemBERT encoders on packed tokens (DistilBERT and MPNet, same
layers under other weight names, subclass BertEncoder in distilbert.py and mpnet.py).

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

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.qkv(x).view(t, 3, self.num_heads, self.head_dim).unbind(1)   # 3 x [T, nh, hd]
        a = self.attn.run(q, k, v, bias=bias).reshape(t, -1)                          # [T, H]
        x = self.attn_norm(project_for_norm(a, self.o_proj), x)
        h = project(x, self.ffn_up, self.act_name)                                     # [T, F]
        return self.ffn_norm(project_for_norm(h, self.ffn_down), x)


class BertEncoder(PackedModel):
    """Post-norm encoder: embeddings + LayerNorm, then BertLayers. Subclasses name the checkpoint's
    weights (PREFIXES, SKIPPED, EMBEDDINGS, LAYER_PREFIX, PER_LAYER, QKV)."""

    PREFIXES = ("bert.", "roberta.", "model.", "0.auto_model.")     # the base model's, stripped
    SKIPPED = ("pooler.", "lm_head", "cls.", "classifier.")         # heads (models/heads.py loads them)
    # checkpoint embedding names: words, positions, token types, the norm's prefix
    EMBEDDINGS = ("embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight",
                  "embeddings.token_type_embeddings.weight", "embeddings.LayerNorm.")
    LAYER_PREFIX = "encoder.layer."
    PER_LAYER = {"attention.output.dense": "o_proj", "attention.output.LayerNorm": "attn_norm",
                 "intermediate.dense": "ffn_up", "output.dense": "ffn_down", "output.LayerNorm": "ffn_norm"}
    QKV = {"attention.self.query": "q", "attention.self.key": "k", "attention.self.value": "v"}

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

    def target(self, name: str) -> tuple[str, str | None] | None:
        """This module's parameter (and fused part) for a checkpoint name with PREFIXES stripped; None
        when it has none."""
        word, _, _, norm = self.EMBEDDINGS
        if name == word:
            return "embed_tokens.weight", None
        if name.startswith(norm):
            return "embed_norm." + name[len(norm):], None
        if not name.startswith(self.LAYER_PREFIX):
            return None
        i, _, rest = name[len(self.LAYER_PREFIX):].partition(".")
        module, _, kind = rest.rpartition(".")
        if module in self.QKV:
            return f"layers.{i}.qkv.{kind}", self.QKV[module]
        if module in self.PER_LAYER:
            return f"layers.{i}.{self.PER_LAYER[module]}.{kind}", None
        return None

    @torch.no_grad()
    def load_from_folder(self, model_dir: Path) -> None:
        cfg = self.cfg
        h = cfg.hidden_size
        loader = PackedLoader(self, model_dir, lambda n: (
            {"q": (0, h), "k": (h, h), "v": (2 * h, h)} if ".qkv." in n else {None: (0, 0)}))
        _, positions, token_types, _ = self.EMBEDDINGS
        types = None
        for raw_name, w in iter_safetensors(model_dir):
            name = strip_prefix(raw_name, self.PREFIXES)
            if name.startswith(self.SKIPPED) or name.endswith("position_ids"):
                continue
            if name == token_types:
                types = w
                continue
            if name == positions:
                self.load_positions(loader, w[cfg.position_offset:], raw_name)
                continue
            target = self.target(name)
            if target is None:
                raise KeyError(f"{model_dir}: unexpected weight {raw_name!r} for a {cfg.model_type} model")
            loader.copy(target[0], w, target[1], raw_name)
        if types is not None:             # token type t's embedding folded into block t of the table
            table = loader.params["embed_positions.weight"]
            for block, start in enumerate(range(0, table.shape[0], cfg.max_positions)):
                table[start:start + cfg.max_positions].add_(types[block].to(table.device))
        self.finish_loading(loader)

    def load_positions(self, loader: PackedLoader, pos: torch.Tensor, raw_name: str) -> None:
        """The position table (offset taken off) into every token type's block of embed_positions."""
        table = loader.target("embed_positions.weight", raw_name)
        for start in range(0, table.shape[0], self.cfg.max_positions):
            table[start:start + pos.shape[0]].copy_(pos)

    def finish_loading(self, loader: PackedLoader) -> None:
        loader.finish()
