"""Activations as Hugging Face names them in config.json."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from rose_backend.layers import fused

_ACT = {
    "gelu": lambda x: F.gelu(x),                         # exact (erf) GELU, BERT / XLM-R
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
}


def activation_name(name: str) -> str:
    """`name` if this module has it; else ValueError naming the supported ones."""
    if name not in _ACT:
        raise ValueError(f"activation {name!r} is not supported; supported: {sorted(_ACT)}")
    return name


def activation(name: str):
    return _ACT[activation_name(name)]


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU on a fused gate/up projection: [T, 2F] -> [T, F] (flashinfer's kernel on CUDA)."""
    if fused.half_kernels(x):
        return fused.flashinfer.activation.silu_and_mul(x, enable_pdl=fused.flashinfer_pdl)
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


# Gated activations of a fused gate/up projection [T, 2F] -> act(gate) * up [T, F], by the name
# project() takes, with the activation of the gate and flashinfer's kernel for it.
GATED = {"swiglu": ("silu", "silu_and_mul"), "geglu": ("gelu", "gelu_and_mul"),
         "geglu_tanh": ("gelu_pytorch_tanh", "gelu_tanh_and_mul")}


def gated_name(hidden_act: str) -> str:
    """The gated form ("swiglu", "geglu", "geglu_tanh") of a config.json activation."""
    for name, (act, _) in GATED.items():
        if activation_name(hidden_act) == act or (act == "gelu_pytorch_tanh" and hidden_act == "gelu_new"):
            return name
    raise ValueError(f"no gated form of activation {hidden_act!r}; supported: silu, gelu, gelu_pytorch_tanh")


def gated(x: torch.Tensor, name: str) -> torch.Tensor:
    """GATED[name] on x [T, 2F] (gate columns, then up) -> [T, F] (flashinfer's kernel on CUDA)."""
    act, kernel = GATED[name]
    if fused.half_kernels(x):
        return getattr(fused.flashinfer.activation, kernel)(x, enable_pdl=fused.flashinfer_pdl)
    gate, up = x.chunk(2, dim=-1)
    return activation(act)(gate) * up


def linear_act(x: torch.Tensor, linear: torch.nn.Module, name: str) -> torch.Tensor:
    """act(linear(x)): [T, K] -> [T, N], for an nn.Linear or an Fp8Linear (layers/fp8.py; its FP8
    batches run the GEMM, then the activation).

    On CUDA a GELU ("gelu", "gelu_new", "gelu_pytorch_tanh") runs in the cuBLASLt epilogue of the
    GEMM (torch._addmm_activation with use_gelu): one kernel instead of two. That epilogue is the
    tanh approximation of GELU; against the exact erf form it differs by < 3e-4 absolute per
    element, below bf16 rounding of the activations (checked against the float32 HF reference).
    """
    uses_fp8 = getattr(linear, "uses_fp8", None)
    if uses_fp8 is not None and uses_fp8(x):
        return activation(name)(linear(x))
    if fused.on(x) and name in _GELU_EPILOGUE and x.dim() == 2 and x.shape[0] > 1:
        return torch._addmm_activation(linear.bias, x, linear.weight.t(), use_gelu=True)
    return activation(name)(F.linear(x, linear.weight, linear.bias))


_GELU_EPILOGUE = ("gelu", "gelu_new", "gelu_pytorch_tanh")
