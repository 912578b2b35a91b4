"""Ragged attention behind one interface.

A backend is planned once per batch (outside any CUDA graph; it may write into fixed buffers) and
run once per layer. Inputs are packed: every sequence of the batch end to end on one token axis,
sequence i owning rows cu_seqlens[i]:cu_seqlens[i+1]; no padding and no mask. Empty sequences
(length 0) are allowed: the engine pads a graph configuration with them.

    backend.plan(meta)                 # once per batch, outside any graph
    out = backend.run(q, k, v)         # per layer; q [T, Hq, D], k/v [T, Hkv, D] -> [T, Hq, D]
    out = backend.run(q, k, v, window=(64, 64))   # a sliding-window layer (one of shape.windows)
    out = backend.run(q, k, v, bias=rel)          # + rel [Hq, 2P - 1] by relative distance (MPNet)

What a model's layers ask beyond plain attention is in its AttentionShape: sliding windows per layer
(query i of a sequence sees its keys i - left .. i + right; causal keeps j <= i too), a score scale other
than head_dim ** -0.5, and an additive per-head score bias by relative distance, the same for every
sequence (`bias[h, P - 1 + j - i]` for P = (bias.shape[1] + 1) // 2). Each backend says in
`unavailable_reason` which of these it cannot do.

Backends (the registry names; GPU ones are imported only when first made):
    sdpa_loop        any device, one SDPA call per sequence on the host; the CPU path and reference
    torch_varlen     torch.nn.attention.varlen.varlen_attn (FlashAttention-2 inside torch), CUDA
    flash_attn4      FlashAttention 4 (flash_attn.cute.flash_attn_varlen_func), when flash-attn-4 is installed
    flashinfer       flashinfer BatchPrefillWithRaggedKVCacheWrapper, fa2 kernels, CUDA-graph mode
    flashinfer_fa3   the same wrapper with the Hopper fa3 kernels
Graph limits: a backend with `supports_cuda_graphs` may be captured once `plan` has run for a
configuration (`meta.graph_key`); replays must be preceded by a `plan` of the same key.
"""
from __future__ import annotations

import abc
import importlib
from dataclasses import dataclass
from typing import Hashable

import torch
import torch.nn.functional as F

from rose_backend import env_vars


@dataclass(slots=True)
class AttentionMetadata:
    """Per-batch layout of a packed batch, set by the engine before the forward pass."""
    cu_seqlens: torch.Tensor          # [S + 1] int32, on the model's device
    max_seqlen: int                   # an upper bound on the longest sequence (exact when eager)
    seq_lens: list[int] | None        # host copy of the lengths; None: computed from the host cu_seqlens on use
    causal: bool = False
    graph_key: Hashable | None = None  # set when cu_seqlens is a graph configuration's fixed buffer
    cu_seqlens_host: torch.Tensor | None = None   # [S + 1] int32 on the CPU (planning without a sync)

    def host_cu(self) -> torch.Tensor:
        if self.cu_seqlens_host is None:
            self.cu_seqlens_host = self.cu_seqlens.to("cpu")
        return self.cu_seqlens_host

    def lens(self) -> list[int]:
        """The sequence lengths (only the paths that loop on the host need them as a list)."""
        if self.seq_lens is None:
            self.seq_lens = self.host_cu().diff().tolist()
        return self.seq_lens


Window = tuple[int, int]      # (left, right): query i sees keys i - left .. i + right of its sequence


@dataclass(slots=True, frozen=True)
class AttentionShape:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    causal: bool = False
    windows: tuple[Window | None, ...] = (None,)    # the layers' distinct windows; None: full attention
    scale: float | None = None                      # score scale; None: head_dim ** -0.5
    position_bias: bool = False                     # layers pass run(..., bias=) (relative distance)

    @property
    def key(self) -> str:
        """Short name of the shape for the backend table, e.g. 'h16kv16d64' (+ 'c' when causal, and
        the windows and position bias where a model has them)."""
        extra = "".join(f"-w{w[0]}_{w[1]}" for w in self.windows if w is not None)
        extra += "-bias" if self.position_bias else ""
        return f"h{self.num_heads}kv{self.num_kv_heads}d{self.head_dim}" + ("c" if self.causal else "") + extra

    @property
    def score_scale(self) -> float:
        return self.scale if self.scale is not None else self.head_dim ** -0.5

    @property
    def sliding(self) -> list[Window]:
        """The sliding windows some layer uses."""
        return [w for w in self.windows if w is not None]


class AttentionBackend(abc.ABC):
    """Base class. Subclasses set `name` and implement `run` (and `plan` when they precompute)."""
    name = "base"
    supports_cuda_graphs = False
    graph_max_seqlen = False      # True: the launch grid follows meta.max_seqlen (the engine keys graphs on it)
    host_plan_us = 0.0            # host time of plan() per batch (the engine weighs it against device time)
    device_types: tuple[str, ...] = ("cpu", "cuda")

    def __init__(self, shape: AttentionShape, device: torch.device):
        self.shape, self.device = shape, torch.device(device)
        self.meta: AttentionMetadata | None = None
        self.scale = shape.score_scale

    @classmethod
    def unavailable_reason(cls, shape: AttentionShape, device: torch.device) -> str | None:
        """None if this backend can run `shape` on `device`, else why not (for errors and the sweep)."""
        if torch.device(device).type not in cls.device_types:
            return f"{cls.name} runs on {cls.device_types}, not {torch.device(device).type}"
        return None

    def plan(self, meta: AttentionMetadata) -> None:
        self.meta = meta

    @abc.abstractmethod
    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: Window | None = None,
            bias: torch.Tensor | None = None) -> torch.Tensor:
        """q [T, Hq, D], k / v [T, Hkv, D] for the planned batch -> [T, Hq, D]; window: this layer's
        (one of shape.windows), bias [Hq, 2P - 1] float32 (shape.position_bias; module docstring)."""


class SdpaLoopBackend(AttentionBackend):
    """Reference path for any device: one scaled_dot_product_attention call per sequence.

    The loop runs on the host over `meta.lens()`, so it cannot be captured in a CUDA graph;
    it is the CPU path and the numerical reference for the fused backends. Windows and the position
    bias become a mask per sequence.
    """
    name = "sdpa_loop"

    def run(self, q, k, v, window=None, bias=None):
        meta = self.meta
        out = torch.empty_like(q)
        groups = self.shape.num_heads // self.shape.num_kv_heads
        start = 0
        for n in meta.lens():
            end = start + n
            if n == 0:
                continue
            # [L, H, D] -> [H, L, D]
            qs, ks, vs = (t[start:end].transpose(0, 1) for t in (q, k, v))
            if groups > 1:
                ks = ks.repeat_interleave(groups, dim=0)
                vs = vs.repeat_interleave(groups, dim=0)
            if window is None and bias is None:
                o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=meta.causal, scale=self.scale)
            else:
                mask = _score_mask(n, window, meta.causal, bias, q.device)
                o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask.to(qs.dtype) if bias is not None
                                                   else mask, scale=self.scale)
            out[start:end] = o.transpose(0, 1)
            start = end
        if start < q.shape[0]:              # rows no sequence owns: keep them finite
            out[start:].zero_()
        return out


def _score_mask(n: int, window: Window | None, causal: bool, bias: torch.Tensor | None,
                device: torch.device) -> torch.Tensor:
    """What one sequence of n tokens adds to its scores: [H, n, n] float32 (the bias, -inf where a key
    is not visible), or [n, n] bool (True: visible) without a bias."""
    pos = torch.arange(n, device=device)
    rel = pos[None, :] - pos[:, None]                                       # [n, n]: j - i
    visible = torch.ones(n, n, dtype=torch.bool, device=device)
    if window is not None:
        visible = (rel >= -window[0]) & (rel <= window[1])
    if causal:
        visible &= rel <= 0
    if bias is None:
        return visible
    p = (bias.shape[1] + 1) // 2          # distances past the table take its end rows (a graph's padding)
    return bias.float()[:, (rel + (p - 1)).clamp(0, 2 * p - 2)].masked_fill(~visible, float("-inf"))


# name -> class, or "module:Class" for backends whose module imports GPU packages (made lazily)
BACKENDS: dict[str, type[AttentionBackend] | str] = {
    SdpaLoopBackend.name: SdpaLoopBackend,
    "torch_varlen": "rose_backend.layers.attention_gpu:TorchVarlenBackend",
    "flash_attn4": "rose_backend.layers.attention_gpu:FlashAttn4Backend",
    "flashinfer": "rose_backend.layers.attention_gpu:FlashInferBackend",
    "flashinfer_fa3": "rose_backend.layers.attention_gpu:FlashInferFa3Backend",
}


def register_backend(cls: type[AttentionBackend]) -> type[AttentionBackend]:
    BACKENDS[cls.name] = cls
    return cls


def backend_class(name: str) -> type[AttentionBackend]:
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; available: {sorted(BACKENDS)}")
    entry = BACKENDS[name]
    if isinstance(entry, str):
        module, _, cls_name = entry.partition(":")
        entry = BACKENDS[name] = getattr(importlib.import_module(module), cls_name)
    return entry


def unavailable_reason(name: str, shape: AttentionShape, device: torch.device | str) -> str | None:
    """None if backend `name` can run `shape` on `device` here, else a message saying why not."""
    try:
        cls = backend_class(name)
    except ValueError as e:
        return str(e)
    return cls.unavailable_reason(shape, torch.device(device))


def available_backends(shape: AttentionShape, device: torch.device | str) -> list[str]:
    """Backends that can run `shape` here, less those named in $ROSE_ATTENTION_EXCLUDE (comma list)."""
    excluded = env_vars.ROSE_ATTENTION_EXCLUDE.names()
    return [n for n in BACKENDS if n not in excluded and unavailable_reason(n, shape, device) is None]


def make_backend(name: str, shape: AttentionShape, device: torch.device | str) -> AttentionBackend:
    why = unavailable_reason(name, shape, device)
    if why is not None:
        raise ValueError(f"attention backend {name!r} cannot run here: {why}")
    return backend_class(name)(shape, torch.device(device))
