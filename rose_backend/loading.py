"""Weights from a model folder's *.safetensors files (never pickle)."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open


# Files beside the encoder's weights that are not part of it: BGE-M3's heads (models/m3_heads.py).
HEAD_FILES = ("sparse_linear", "colbert_linear")


def iter_safetensors(model_dir: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) for every tensor of every *.safetensors file in the folder
    (the encoder's; head files such as sparse_linear.safetensors are skipped)."""
    files = sorted(p for p in Path(model_dir).glob("*.safetensors") if p.stem not in HEAD_FILES)
    if not files:
        raise FileNotFoundError(f"no *.safetensors file in {model_dir}")
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def strip_prefix(name: str, prefixes: tuple[str, ...]) -> str:
    for p in prefixes:
        if name.startswith(p):
            return name[len(p):]
    return name
