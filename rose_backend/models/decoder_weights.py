"""A Hugging Face decoder checkpoint (Qwen3, Qwen2, Llama, Mistral, Gemma 3 names) into a packed
model whose modules keep transformers' names, with q/k/v and gate/up fused.

    load_decoder(model, model_dir)     # strict: unknown or missing weights raise KeyError naming them
"""
from __future__ import annotations

from pathlib import Path

import torch

from rose_backend.loading import PackedLoader, iter_safetensors, strip_prefix

PREFIXES = ("model.", "0.auto_model.")      # *ForCausalLM keeps the decoder under "model."
SKIPPED = ("lm_head.",)                     # the LM head (tied or not) plays no part in embeddings

# Hugging Face projection -> (this module's fused projection, shard). Declared once; the loader
# copies each part into its rows of the fused weight (nano-vllm's packed_modules_mapping).
PACKED_MODULES = {
    "q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", "gate"), "up_proj": ("gate_up_proj", "up"),
}


@torch.no_grad()
def load_decoder(model: torch.nn.Module, model_dir: Path) -> None:
    """Copy the checkpoint in (model.cfg gives the fused parts' sizes)."""
    loader = PackedLoader(model, model_dir, _shards(model.cfg))
    for raw_name, w in iter_safetensors(model_dir):
        name = strip_prefix(raw_name, PREFIXES)
        if name.startswith(SKIPPED):
            continue
        shard = None
        for part, (packed, shard_name) in PACKED_MODULES.items():
            if f".{part}." in name:
                name, shard = name.replace(f".{part}.", f".{packed}."), shard_name
                break
        loader.copy(name, w, shard, raw_name)
    loader.finish()


def _shards(c):
    q, kv, f = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.intermediate_size

    def shards(name: str) -> dict[str | None, tuple[int, int]]:
        """Row ranges (start, size) of each part of a fused parameter; {None: ...} if not fused."""
        if ".qkv_proj." in name:
            return {"q": (0, q), "k": (q, kv), "v": (q + kv, kv)}
        if ".gate_up_proj." in name:
            return {"gate": (0, f), "up": (f, f)}
        return {None: (0, 0)}
    return shards
