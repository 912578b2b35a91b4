"""Activations as Hugging Face names them in config.json."""
from __future__ import annotations

import torch
import torch.nn.functional as F

_ACT = {
    "gelu": lambda x: F.gelu(x),                         # exact (erf) GELU, BERT / XLM-R
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
}


def activation(name: str):
    if name not in _ACT:
        raise ValueError(f"activation {name!r} is not supported; supported: {sorted(_ACT)}")
    return _ACT[name]


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU on a fused gate/up projection: [T, 2F] -> [T, F]."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
