"""DistilBERT encoders on packed tokens: BERT's post-norm layers under DistilBERT's weight names, no
token types, learned or sinusoidal positions (`sinusoidal_pos_embds`; the table is in the checkpoint
either way, and computed as transformers does where a checkpoint leaves it out). LayerNorm eps is 1e-12
whatever config.json says (DistilBertModel hard-codes it)."""
from __future__ import annotations

import numpy as np
import torch

from rose_backend.loading import PackedLoader
from rose_backend.models.bert import BertEncoder


class DistilBertEncoder(BertEncoder):
    PREFIXES = ("distilbert.", "0.auto_model.")
    SKIPPED = ("pre_classifier.", "classifier.", "vocab_transform.", "vocab_layer_norm.", "vocab_projector.")
    LAYER_PREFIX = "transformer.layer."
    PER_LAYER = {"attention.out_lin": "o_proj", "sa_layer_norm": "attn_norm", "ffn.lin1": "ffn_up",
                 "ffn.lin2": "ffn_down", "output_layer_norm": "ffn_norm"}
    QKV = {"attention.q_lin": "q", "attention.k_lin": "k", "attention.v_lin": "v"}

    def finish_loading(self, loader: PackedLoader) -> None:
        if ("embed_positions.weight", None) not in loader.loaded and self.cfg.raw.get("sinusoidal_pos_embds"):
            table = sinusoidal_positions(self.cfg.max_positions, self.cfg.hidden_size)
            self.load_positions(loader, table, "embeddings.position_embeddings.weight (sinusoidal)")
        loader.finish()


def sinusoidal_positions(n: int, dim: int) -> torch.Tensor:
    """transformers' create_sinusoidal_embeddings: [n, dim] float32, sin on even columns, cos on odd."""
    pos = np.arange(n)[:, None] / np.power(10000, 2 * (np.arange(dim)[None, :] // 2) / dim)
    out = torch.empty(n, dim)
    out[:, 0::2] = torch.FloatTensor(np.sin(pos[:, 0::2]))
    out[:, 1::2] = torch.FloatTensor(np.cos(pos[:, 1::2]))
    return out
