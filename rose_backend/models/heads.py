"""Reranker heads: pooled hidden state [S, H] -> score [S, 1], run after pooling in the same graph.

    head = build_head(cfg, device)        # None for embedding models
    scores = head(pooled)                 # [S, 1] float32, what the client gets

- ClassifierHead (cross-encoders): dense -> activation [-> LayerNorm] -> out_proj on the pooled
  first token (ModernBERT: mean, with classifier_pooling "mean"), then the activation
  sentence-transformers' CrossEncoder applies by default (sigmoid for one label). The layouts
  (_CLASSIFIER_LAYOUTS): (XLM-)RoBERTa, CamemBERT and MPNet name it classifier.dense / classifier.out_proj
  (tanh); BERT bert.pooler.dense / classifier (tanh); DistilBERT pre_classifier / classifier (ReLU);
  ModernBERT head.dense / head.norm / classifier (classifier_activation, LayerNorm, biases optional).
- YesNoHead (Qwen3-Reranker): the lm_head rows of "no" and "yes" at the last token,
  p(yes) = softmax([no, yes])[1] as the model card computes it. Only those two rows are read from
  the safetensors (lm_head.weight, or the embedding table when the embeddings are tied).

Heads run in float32 on the float32 pooled vector (a few hundred FLOPs per sequence).
"""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from rose_backend.config import ModelConfig
from rose_backend.layers.activation import activation as layer_activation

# Hugging Face names of the classifier parts, per layout: (dense, out_proj, activation between them
# (None: config.json's classifier_activation), LayerNorm after it or None); the first whose dense and
# out_proj weights the folder holds is its layout
_CLASSIFIER_LAYOUTS = (
    ("classifier.dense", "classifier.out_proj", "tanh", None),     # (XLM-)RoBERTa, CamemBERT, MPNet
    ("bert.pooler.dense", "classifier", "tanh", None),             # BertForSequenceClassification
    ("pre_classifier", "classifier", "relu", None),                # DistilBertForSequenceClassification
    ("head.dense", "classifier", None, "head.norm"),               # ModernBertForSequenceClassification
)


class ClassifierHead(nn.Module):
    def __init__(self, hidden: int, activation: str, inner: str = "tanh", norm_eps: float | None = None):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden, eps=norm_eps) if norm_eps is not None else None
        self.out_proj = nn.Linear(hidden, 1)
        self.inner = torch.tanh if inner == "tanh" else layer_activation(inner)
        self.activation = activation

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:          # [S, H] -> [S, 1]
        x = self.inner(self.dense(pooled))
        if self.norm is not None:
            x = self.norm(x)
        logit = self.out_proj(x)
        return torch.sigmoid(logit) if self.activation == "sigmoid" else logit


class YesNoHead(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.rows = nn.Linear(hidden, 2, bias=False)                    # lm_head rows [no, yes]

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:          # [S, H] -> [S, 1]
        return torch.softmax(self.rows(pooled), dim=-1)[:, 1:]


def build_head(cfg: ModelConfig, device: torch.device | str = "cpu") -> nn.Module | None:
    """The head for cfg.kind with its weights loaded (float32), or None for embedding models."""
    if cfg.kind == "embedding":
        return None
    tensors = _TensorIndex(cfg.model_dir)
    if cfg.kind == "cross-encoder":
        head = _classifier(cfg, tensors)
    elif cfg.kind == "qwen3-reranker":
        head = YesNoHead(cfg.hidden_size)
        no_id, yes_id = yes_no_token_ids(cfg.model_dir)
        name = next((n for n in ("lm_head.weight", "model.embed_tokens.weight", "embed_tokens.weight")
                     if tensors.has(n)), None)
        if name is None:
            raise KeyError(f"{cfg.model_dir}: neither lm_head.weight nor the (tied) embed_tokens.weight found")
        with torch.no_grad():
            head.rows.weight.copy_(torch.cat([tensors.get(name, no_id), tensors.get(name, yes_id)]))
    else:
        raise ValueError(f"no head for model kind {cfg.kind!r}")
    return head.to(device).eval().requires_grad_(False)


def _classifier(cfg: ModelConfig, tensors: "_TensorIndex") -> ClassifierHead:
    """The ClassifierHead of the folder's layout (_CLASSIFIER_LAYOUTS) with its weights; a part a
    layout may leave out (ModernBERT's biases) keeps zeros."""
    for dense, out, inner, norm in _CLASSIFIER_LAYOUTS:
        if tensors.has(f"{dense}.weight") and tensors.has(f"{out}.weight"):
            break
    else:
        raise KeyError(f"{cfg.model_dir}: no classifier weights (looked for "
                       f"{', '.join(d + ' / ' + o for d, o, _, _ in _CLASSIFIER_LAYOUTS)})")
    head = ClassifierHead(cfg.hidden_size, cfg.score_activation, inner or cfg.raw.get("classifier_activation", "gelu"),
                          cfg.norm_eps if norm else None)
    with torch.no_grad():
        for part, name in ((head.dense, dense), (head.norm, norm), (head.out_proj, out)):
            if part is None:
                continue
            part.weight.copy_(tensors.get(f"{name}.weight"))
            if tensors.has(f"{name}.bias"):
                part.bias.copy_(tensors.get(f"{name}.bias"))
            else:
                part.bias.zero_()
    return head


def yes_no_token_ids(model_dir: Path) -> tuple[int, int]:
    """Vocabulary ids of "no" and "yes" (the model card's convert_tokens_to_ids)."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    ids = tok.token_to_id("no"), tok.token_to_id("yes")
    if None in ids:
        raise KeyError(f"{model_dir}: the tokenizer has no 'yes' / 'no' token; not a Qwen3-Reranker")
    return ids


class _TensorIndex:
    """Which safetensors file holds each tensor; reads whole tensors or single rows lazily."""

    def __init__(self, model_dir: Path):
        self.where: dict[str, Path] = {}
        for path in sorted(Path(model_dir).glob("*.safetensors")):
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    self.where[name] = path

    def has(self, name: str) -> bool:
        return name in self.where

    def get(self, name: str, row: int | None = None) -> torch.Tensor:
        with safe_open(str(self.where[name]), framework="pt") as f:
            if row is None:
                return f.get_tensor(name).float()
            return f.get_slice(name)[row:row + 1].float()                # [1, H]
