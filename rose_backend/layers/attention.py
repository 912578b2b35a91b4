"""Ragged attention behind one interface.

A backend is planned once per batch (outside any CUDA graph; it may write into fixed buffers) and
run once per layer. Inputs are packed: every sequence of the batch end to end on one token axis,
sequence i owning rows cu_seqlens[i]:cu_seqlens[i+1]; no padding and no mask.

    backend.plan(meta)                 # once per batch
    out = backend.run(q, k, v)         # per layer; q [T, Hq, D], k/v [T, Hkv, D] -> [T, Hq, D]
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(slots=True)
class AttentionMetadata:
    """Per-batch layout of a packed batch, set by the engine before the forward pass."""
    cu_seqlens: torch.Tensor          # [S + 1] int32, on the model's device
    max_seqlen: int
    seq_lens: list[int]               # host copy of the lengths (for paths that loop on the host)
    causal: bool = False


@dataclass(slots=True)
class AttentionShape:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    causal: bool = False


class AttentionBackend:
    """Base class. Subclasses set `name` and implement `plan` and `run`."""
    name = "base"
    supports_cuda_graphs = False

    def __init__(self, shape: AttentionShape, device: torch.device):
        self.shape, self.device = shape, device
        self.meta: AttentionMetadata | None = None

    def plan(self, meta: AttentionMetadata) -> None:
        self.meta = meta

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class SdpaLoopBackend(AttentionBackend):
    """Reference path for any device: one scaled_dot_product_attention call per sequence.

    The loop runs on the host over `meta.seq_lens`, so it cannot be captured in a CUDA graph;
    it is the CPU path and the numerical reference for the fused backends.
    """
    name = "sdpa_loop"

    def run(self, q, k, v):
        meta = self.meta
        out = torch.empty_like(q)
        groups = self.shape.num_heads // self.shape.num_kv_heads
        start = 0
        for n in meta.seq_lens:
            end = start + n
            # [L, H, D] -> [H, L, D]
            qs, ks, vs = (t[start:end].transpose(0, 1) for t in (q, k, v))
            if groups > 1:
                ks = ks.repeat_interleave(groups, dim=0)
                vs = vs.repeat_interleave(groups, dim=0)
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=meta.causal)
            out[start:end] = o.transpose(0, 1)
            start = end
        return out


BACKENDS: dict[str, type[AttentionBackend]] = {SdpaLoopBackend.name: SdpaLoopBackend}


def register_backend(cls: type[AttentionBackend]) -> type[AttentionBackend]:
    BACKENDS[cls.name] = cls
    return cls


def make_backend(name: str, shape: AttentionShape, device: torch.device) -> AttentionBackend:
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; available: {sorted(BACKENDS)}")
    return BACKENDS[name](shape, device)
