"""The switches of the fused GPU kernels: module attributes, for float32 references and for
experiments that patch them in their own process (before an engine captures its graphs).

    from rose_backend.layers import fused
    fused.enabled = False      # every layer takes its plain torch path (Hugging Face numerics)
    fused.flashinfer_pdl       # enable_pdl for flashinfer's norms and SiLU-and-mul: None (flashinfer's
                               # default: on from sm_90), True or False; read at each launch / capture

Covered: the Triton-language kernels (add + LayerNorm, embeddings + LayerNorm, q/k norm + RoPE),
flashinfer's norms and SiLU-and-mul, and the cuBLASLt GELU epilogue. The flashinfer and q/k-norm
kernels also need bf16 / fp16 (`half_kernels`).
"""
from __future__ import annotations

import torch

enabled = True
flashinfer_pdl: bool | None = None

try:                                        # optional GPU kernels; the CPU path never needs them
    import flashinfer
except ImportError:                         # pragma: no cover - depends on the machine
    flashinfer = None


def on(x: torch.Tensor) -> bool:
    """Fused kernels for a tensor on CUDA (any dtype the kernel takes)."""
    return enabled and x.is_cuda


def half_kernels(x: torch.Tensor) -> bool:
    """flashinfer / q/k-norm kernels: CUDA, bf16 or fp16, flashinfer installed."""
    return enabled and flashinfer is not None and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16)
