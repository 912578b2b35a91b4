"""BGE-M3's token-level heads: sparse lexical weights and ColBERT vectors from the final hidden states.

    heads = M3Heads.from_folder(model_dir, device)     # None when the folder ships no heads
    sparse, colbert = heads(hidden)                   # hidden [T, H] -> [T] f32 (ReLU), [T, Dc] f32 (unit rows)

BGE-M3 ships `sparse_linear.pt` (Linear H -> 1) and `colbert_linear.pt` (Linear H -> Dc) beside its
encoder; `.safetensors` files of the same names are accepted too. The .pt files are read with
torch.load(weights_only=True) and must hold a plain state dict {"weight", "bias"} of tensors:
anything else is refused, nothing else is unpickled.

As FlagEmbedding's BGEM3FlagModel computes them (finetune/embedder/encoder_only/m3/modeling.py):
sparse weight of a token = relu(sparse_linear(h)); ColBERT vector = colbert_linear(h), normalized
(the first token is dropped later, per sequence, by the serving layer). Both run in float32 on
whatever dtype the encoder ran in.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from rose_backend.loading import HEAD_FILES


class HeadsMissing(ValueError):
    """The model folder has no BGE-M3 heads, and a request asked for their outputs."""


def head_files(model_dir: str | Path) -> dict[str, Path]:
    """{"sparse_linear": path, "colbert_linear": path} for the head files present in the folder."""
    out = {}
    for name in HEAD_FILES:
        for ext in (".safetensors", ".pt"):
            p = Path(model_dir) / f"{name}{ext}"
            if p.exists():
                out[name] = p
                break
    return out


def load_linear(path: Path, hidden: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight [out, hidden], bias [out]) float32 from a head file; refuses anything unexpected."""
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file
        state = load_file(str(path))
    else:
        try:
            state = torch.load(str(path), map_location="cpu", weights_only=True)
        except Exception as e:
            raise ValueError(f"{path}: not a plain tensor file ({type(e).__name__}: {e})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{path}: expected a state dict of tensors, got {type(state).__name__}")
    if set(state) != {"weight", "bias"}:
        raise ValueError(f"{path}: expected the tensors 'weight' and 'bias', got {sorted(state)}")
    w, b = state["weight"].float(), state["bias"].float()
    if w.ndim != 2 or w.shape[1] != hidden or b.shape != (w.shape[0],):
        raise ValueError(f"{path}: weight {tuple(w.shape)} / bias {tuple(b.shape)} do not fit hidden size {hidden}")
    return w, b


class M3Heads:
    """The two heads on one device, float32."""

    def __init__(self, sparse: tuple[torch.Tensor, torch.Tensor], colbert: tuple[torch.Tensor, torch.Tensor],
                 device: torch.device | str):
        self.sparse_w, self.sparse_b = (t.to(device) for t in sparse)        # [1, H], [1]
        self.colbert_w, self.colbert_b = (t.to(device) for t in colbert)     # [Dc, H], [Dc]
        if self.sparse_w.shape[0] != 1:
            raise ValueError(f"sparse_linear must map to 1 value per token, not {self.sparse_w.shape[0]}")

    @property
    def colbert_dim(self) -> int:
        return int(self.colbert_w.shape[0])

    @classmethod
    def from_folder(cls, model_dir: str | Path, hidden: int, device: torch.device | str) -> "M3Heads | None":
        files = head_files(model_dir)
        if not files:
            return None
        missing = [n for n in HEAD_FILES if n not in files]
        if missing:
            raise ValueError(f"{model_dir}: has {', '.join(files)} but not {', '.join(missing)} "
                             "(BGE-M3 ships both heads)")
        return cls(load_linear(files["sparse_linear"], hidden), load_linear(files["colbert_linear"], hidden), device)

    def __call__(self, hidden: torch.Tensor, sparse: bool = True, colbert: bool = True):
        """hidden [T, H] (any float dtype) -> (sparse [T] f32 or None, colbert [T, Dc] f32 or None).
        Fixed shapes, no host sync: it may run inside a CUDA graph."""
        h = hidden.float()
        s = torch.relu(F.linear(h, self.sparse_w, self.sparse_b)).squeeze(-1) if sparse else None
        c = F.normalize(F.linear(h, self.colbert_w, self.colbert_b), dim=-1) if colbert else None
        return s, c
