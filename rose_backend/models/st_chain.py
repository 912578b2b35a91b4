"""The sentence-transformers chain after pooling, run on the device: pooled [S, k x H] float32 ->
Dense modules -> Normalize -> embeddings [S, D] float32 (st_folder.py reads what a folder declares).

    chain = SentenceHead.from_chain(cfg.chain, device)     # weights from each Dense folder's model.safetensors
    emb = chain(pool(hidden, ...))                          # inside the engine's forward, so in its CUDA graph

Dense is sentence-transformers' (base/modules/dense.py): activation(linear(x)), plus x (or a second,
bias-free linear of x where the widths differ) with use_residual. The activation is the torch.nn
module its class path names, made with no arguments as sentence-transformers makes it, with its own
weights where it has any (PReLU). Weights stay float32 whatever the model's dtype: the chain is a few
small matrix products on pooled rows.
"""
from __future__ import annotations

import importlib
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from rose_backend.st_folder import NORMALIZE, DenseSpec, SentenceChain


class DenseModule(nn.Module):
    """sentence-transformers' Dense: the same parameter names (linear.weight, linear.bias,
    residual.weight, activation_function.*), so its model.safetensors loads as saved."""

    def __init__(self, spec: DenseSpec):
        super().__init__()
        self.linear = nn.Linear(spec.in_features, spec.out_features, bias=spec.bias)
        self.activation_function = activation(spec.activation, spec.folder)
        self.use_residual = spec.residual
        if spec.residual and spec.in_features != spec.out_features:
            self.residual = nn.Linear(spec.in_features, spec.out_features, bias=False)
        else:
            self.residual = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.activation_function(self.linear(x))
        if self.use_residual:
            out = out + (x if self.residual is None else self.residual(x))
        return out


def activation(path: str, where: Path) -> nn.Module:
    """The torch.nn module class at `path` (e.g. torch.nn.modules.activation.Tanh), made with no arguments."""
    module, _, name = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        raise ValueError(f"{where / 'config.json'}: activation function {path!r} is not found in torch") from None
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise ValueError(f"{where / 'config.json'}: activation function {path!r} is not a torch.nn module class")
    return cls()


class SentenceHead(nn.Module):
    """The chain's steps after pooling, in the folder's order."""

    def __init__(self, chain: SentenceChain):
        super().__init__()
        self.steps = nn.ModuleList(DenseModule(s) for s in chain.steps if isinstance(s, DenseSpec))
        self.order = tuple("normalize" if s == NORMALIZE else "dense" for s in chain.steps)

    @classmethod
    def from_chain(cls, chain: SentenceChain, device: torch.device | str = "cpu") -> "SentenceHead":
        from safetensors.torch import load_file
        head = cls(chain)
        for module, spec in zip(head.steps, chain.dense):
            state = load_file(str(spec.folder / "model.safetensors"))
            missing, unexpected = module.load_state_dict(state, strict=False)
            if missing or unexpected:
                raise ValueError(f"{spec.folder / 'model.safetensors'} does not match its config.json "
                                 f"(missing: {sorted(missing)}, unexpected: {sorted(unexpected)})")
        return head.to(device=device, dtype=torch.float32).eval().requires_grad_(False)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        x, dense = pooled, iter(self.steps)
        for step in self.order:
            x = F.normalize(x, p=2.0, dim=-1) if step == "normalize" else next(dense)(x)
        return x
