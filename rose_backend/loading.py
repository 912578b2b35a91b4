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


class PackedLoader:
    """Copies checkpoint tensors into a module's parameters, a fused parameter's parts into their
    rows (nano-vllm's packed_modules_mapping + weight_loader), and says what is missing at the end.

        loader = PackedLoader(model, model_dir, shards)   # shards(name) -> {part: (row, rows)}
        loader.copy("layers.0.qkv.weight", w, "k")         # rows of part "k"; shape checked
        loader.finish()                                    # KeyError naming what never came

    `shards(name)` gives the row ranges of each part of a fused parameter, {None: (0, 0)} for a
    plain one. A name the module does not have raises KeyError naming the checkpoint's tensor.
    """

    def __init__(self, module: torch.nn.Module, model_dir: Path, shards):
        self.params = dict(module.named_parameters())
        self.model_dir, self.shards = model_dir, shards
        self.expected = {(n, s) for n in self.params for s in shards(n)}
        self.loaded: set[tuple[str, str | None]] = set()

    def target(self, name: str, raw_name: str, shard: str | None = None) -> torch.Tensor:
        """The parameter (or its part's rows) that `raw_name` fills; marked as loaded."""
        if name not in self.params:
            raise KeyError(f"{self.model_dir}: unexpected weight {raw_name!r} (no parameter {name!r})")
        t = self.params[name]
        if shard is not None:
            start, size = self.shards(name)[shard]
            t = t.narrow(0, start, size)
        self.loaded.add((name, shard))
        return t

    def copy(self, name: str, w: torch.Tensor, shard: str | None = None, raw_name: str | None = None) -> None:
        t = self.target(name, raw_name or name, shard)
        if t.shape != w.shape:
            raise ValueError(f"{self.model_dir}: weight {raw_name or name!r} has shape {tuple(w.shape)}, "
                             f"expected {tuple(t.shape)} from config.json")
        t.copy_(w)

    def finish(self) -> None:
        missing = sorted(f"{n}[{s}]" if s else n for n, s in self.expected - self.loaded)
        if missing:
            raise KeyError(f"{self.model_dir}: weights missing from the safetensors files: {missing[:8]}")
