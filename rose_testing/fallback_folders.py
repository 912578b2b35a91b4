"""Tiny random-weight folders of families rose has no native model file for (the fallback engine's
tests), written by transformers' own save_pretrained, with rose_testing.folders' WordLevel tokenizer;
and a folder with a small modeling file of its own (auto_map), for the remote-code setting.

    folder = fallback_folder("electra", tmp_path / "electra")      # then st_folders.chain_folder(transformer=folder)
    folder = remote_code_folder(tmp_path / "custom")               # config.json auto_map -> modeling_tiny.py
"""
from __future__ import annotations

import json
from pathlib import Path

from rose_testing.folders import write_tokenizer

VOCAB, MAX_LEN = 1000, 128
# model_type -> (transformers config class, model class saved, config keywords)
FAMILIES = {
    "electra": ("ElectraConfig", "ElectraModel",
                dict(embedding_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=96, max_position_embeddings=MAX_LEN)),
    "deberta-v2": ("DebertaV2Config", "DebertaV2Model",
                   dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
                        max_position_embeddings=MAX_LEN, relative_attention=True, position_buckets=32,
                        pos_att_type=["p2c", "c2p"])),
    "t5": ("T5Config", "T5EncoderModel",          # sentence-t5: the encoder alone
           dict(d_model=64, d_kv=16, d_ff=96, num_layers=2, num_heads=4, feed_forward_proj="gated-gelu")),
    "gpt2": ("GPT2Config", "GPT2Model",            # a causal decoder (last-token pooling)
             dict(n_embd=64, n_layer=2, n_head=4, n_positions=MAX_LEN, bos_token_id=0, eos_token_id=2)),
}


def fallback_folder(model_type: str, path: str | Path, seed: int = 0) -> Path:
    """config.json, model.safetensors (transformers' random init), tokenizer.json and its config."""
    import torch
    import transformers

    path = Path(path)
    config_cls, model_cls, kwargs = FAMILIES[model_type]
    config = getattr(transformers, config_cls)(vocab_size=VOCAB, pad_token_id=1, **kwargs)
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).eval()
    model.save_pretrained(str(path), safe_serialization=True)
    write_tokenizer(path, VOCAB, MAX_LEN)
    return path


MODELING = '''"""A tiny model of its own: embeddings, one tanh layer mixing each token with the mean of the
sequence's tokens (so that padding and the mask matter), as a remote-code folder ships it."""
import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput


class TinyConfig(PretrainedConfig):
    model_type = "tiny_custom"

    def __init__(self, vocab_size=1000, hidden_size=32, **kwargs):
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        super().__init__(**kwargs)


class TinyModel(PreTrainedModel):
    config_class = TinyConfig
    base_model_prefix = "tiny"

    def __init__(self, config):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.mix = nn.Linear(2 * config.hidden_size, config.hidden_size)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, **kwargs):
        x = self.embed(input_ids)
        m = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        m = m.unsqueeze(-1).to(x.dtype)
        mean = (x * m).sum(1, keepdim=True) / m.sum(1, keepdim=True).clamp(min=1)
        h = torch.tanh(self.mix(torch.cat([x, mean.expand_as(x)], dim=-1)))
        return BaseModelOutput(last_hidden_state=h)
'''


def remote_code_folder(path: str | Path, seed: int = 0) -> Path:
    """A folder whose model is its own code: modeling_tiny.py, named by config.json's auto_map."""
    import torch
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "modeling_tiny.py").write_text(MODELING)
    hidden = 32
    (path / "config.json").write_text(json.dumps({
        "model_type": "tiny_custom", "architectures": ["TinyModel"], "vocab_size": VOCAB, "hidden_size": hidden,
        "pad_token_id": 1, "auto_map": {"AutoConfig": "modeling_tiny.TinyConfig", "AutoModel": "modeling_tiny.TinyModel"}},
        indent=2))
    g = torch.Generator().manual_seed(seed)
    save_file({"embed.weight": torch.randn(VOCAB, hidden, generator=g),
               "mix.weight": torch.randn(hidden, 2 * hidden, generator=g) / (2 * hidden) ** 0.5,
               "mix.bias": 0.1 * torch.randn(hidden, generator=g)}, str(path / "model.safetensors"))
    write_tokenizer(path, VOCAB, MAX_LEN)
    return path
