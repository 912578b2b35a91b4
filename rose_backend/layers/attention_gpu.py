"""CUDA attention backends (see attention.py for the interface). Imported only when one is made,
so nothing here runs on a machine without the packages; each backend says why it cannot run.
"""
from __future__ import annotations

import importlib.util
import inspect

import torch

from rose_backend import env_vars
from rose_backend.layers.attention import AttentionBackend, AttentionMetadata, AttentionShape

_HALF = (torch.bfloat16, torch.float16)


def installed(module: str) -> bool:
    """Whether `module` can be imported here (False also for a submodule of a missing package)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def _cuda_reason(cls, shape: AttentionShape, device: torch.device, module: str, missing: str) -> str | None:
    """Why `cls` cannot run here: no CUDA device, not bf16/fp16, or `module` not importable."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return f"{cls.name} needs a CUDA device"
    if shape.dtype not in _HALF:
        return f"{cls.name} needs bf16 or fp16, got {shape.dtype}"
    return None if installed(module) else missing


class TorchVarlenBackend(AttentionBackend):
    """torch.nn.attention.varlen.varlen_attn: FlashAttention-2 inside torch, one kernel per layer.

    Graph note: `max_seqlen` is baked into a captured launch (it sets the grid), so a graph
    configuration plans with an upper bound (the engine passes min(token bucket, model limit)).
    """
    name = "torch_varlen"
    supports_cuda_graphs = True
    graph_max_seqlen = True
    device_types = ("cuda",)

    @classmethod
    def unavailable_reason(cls, shape, device):
        why = _cuda_reason(cls, shape, device, "torch.nn.attention.varlen",
                           f"torch {torch.__version__} has no torch.nn.attention.varlen")
        if why:
            return why
        if shape.head_dim % 8 or shape.head_dim > 256:
            return f"FlashAttention-2 needs head_dim a multiple of 8 up to 256, got {shape.head_dim}"
        if shape.position_bias:
            return "torch's varlen_attn takes no score bias"
        params = inspect.signature(_varlen_attn()).parameters
        if (shape.sliding or shape.scale is not None) and not {"window_size", "scale"} <= set(params):
            return f"torch {torch.__version__}'s varlen_attn takes no window_size / scale"
        return None

    def __init__(self, shape, device):
        super().__init__(shape, device)
        self._fn = _varlen_attn()
        params = inspect.signature(self._fn).parameters
        self._kw: dict = {}
        if "scale" in params:
            self._kw["scale"] = self.scale
        # per window: the keyword that makes it (window_size (left, right), -1 unbounded; or is_causal)
        self._window_kw = {w: self._window_arg(w, params) for w in shape.windows}
        self._expand_kv = shape.num_heads // shape.num_kv_heads if shape.num_kv_heads != shape.num_heads else 1
        if self._expand_kv > 1 and "enable_gqa" in params:
            self._kw["enable_gqa"], self._expand_kv = True, 1

    def _window_arg(self, window, params) -> dict:
        causal = self.shape.causal
        if window is None:
            if not causal:
                return {}
            return {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
        return {"window_size": (window[0], 0 if causal else window[1])}

    def run(self, q, k, v, window=None, bias=None):
        m = self.meta
        if self._expand_kv > 1:
            k = k.repeat_interleave(self._expand_kv, dim=1)
            v = v.repeat_interleave(self._expand_kv, dim=1)
        return self._fn(q, k, v, m.cu_seqlens, m.cu_seqlens, m.max_seqlen, m.max_seqlen, **self._kw,
                        **self._window_kw[window])


def _varlen_attn():
    from torch.nn.attention.varlen import varlen_attn
    return varlen_attn


class FlashAttn4Backend(AttentionBackend):
    """FlashAttention 4 (the flash-attn-4 package): flash_attn.cute.flash_attn_varlen_func, kernels
    written in CUTLASS's CuTe DSL and compiled on first use of each head configuration (a JIT cache
    in the process). Ragged cu_seqlens, causal or not, GQA without repeating k/v; sm_80 and newer
    (Hopper has its own sm_90 kernel). Graph note as torch varlen: max_seqlen is baked into a capture.
    """
    name = "flash_attn4"
    supports_cuda_graphs = True
    graph_max_seqlen = True
    device_types = ("cuda",)

    @classmethod
    def unavailable_reason(cls, shape, device):
        why = _cuda_reason(cls, shape, device, "flash_attn.cute",
                           "FlashAttention 4 is not installed (pip install flash-attn-4)")
        if why:
            return why
        if torch.cuda.get_device_capability(device)[0] < 8:
            return "FlashAttention 4 needs compute capability 8.0 or newer"
        if shape.head_dim % 8 or not 8 <= shape.head_dim <= 256:
            return f"FlashAttention 4 needs head_dim a multiple of 8 from 8 to 256, got {shape.head_dim}"
        if shape.position_bias:
            return "FlashAttention 4's varlen kernels take no score bias table"
        return None

    def __init__(self, shape, device):
        super().__init__(shape, device)
        from flash_attn.cute import flash_attn_varlen_func
        self._fn = flash_attn_varlen_func

    def run(self, q, k, v, window=None, bias=None):
        m = self.meta
        kw = {}
        if window is not None:        # (left, right); the kernel keeps right at 0 when causal
            kw["window_size"] = (window[0], 0 if self.shape.causal else window[1])
        out, _ = self._fn(q, k, v, cu_seqlens_q=m.cu_seqlens, cu_seqlens_k=m.cu_seqlens, max_seqlen_q=m.max_seqlen,
                          max_seqlen_k=m.max_seqlen, softmax_scale=self.scale, causal=self.shape.causal, **kw)
        return out


class FlashInferBackend(AttentionBackend):
    """flashinfer's BatchPrefillWithRaggedKVCacheWrapper (fa2 kernels), one kernel per layer.

    Eager batches use one plain wrapper. Each graph configuration (`meta.graph_key`) gets its own
    wrapper in CUDA-graph mode whose indptr buffers are the configuration's fixed cu_seqlens buffer;
    its plan runs before every replay (outside the graph) and rewrites the schedule in place.
    All wrappers of a backend share one float workspace (see float_workspace_bytes) and one int workspace with its
    pinned mirror; before a plan overwrites the pinned mirror, we wait for the event recorded
    after the previous plan's host-to-device copy (that copy may still be queued on the stream).
    A model with sliding-window layers gets that set of wrappers once per window (window_left, a
    one-sided window: causal models only), each with an int workspace of its own (_Schedule).
    Split-KV is off for eager batches (no KV cache: the query tiles fill the GPU, and no merge
    kernel). In CUDA-graph mode it stays on: flashinfer pads the grid to a fixed size there and only
    the split-KV schedule writes the mask that retires the padding blocks (with it off, those
    blocks read stale schedule entries and fault with an illegal address).
    """
    name = "flashinfer"
    flashinfer_backend = "fa2"
    supports_cuda_graphs = True
    device_types = ("cuda",)
    # Graph mode's split-KV scratch grows with the batch: each 256 MiB of float workspace serves
    # 8192 tokens, and a larger batch overflows it. The workspace is sized from
    # $ROSE_FLASHINFER_WORKSPACE_MB (default 512: the 16384-token batches of the default budget) and
    # the token limit scales with it.
    float_workspace_bytes = env_vars.ROSE_FLASHINFER_WORKSPACE_MB.integer() << 20
    max_tokens = 8192 * max(1, float_workspace_bytes // (256 << 20))
    int_workspace_bytes = (8 << 20) * max(1, float_workspace_bytes // (256 << 20))
    # plan() schedules the batch in Python and copies the schedule to the device before the forward
    # pass: the host time a lone request waits for besides the device time, which the backend choice
    # adds to this backend's estimate (BackendTable.choose's plan_us)
    host_plan_us = 330.0

    @classmethod
    def unavailable_reason(cls, shape, device):
        why = _cuda_reason(cls, shape, device, "flashinfer",
                           "flashinfer is not installed (pip install flashinfer-python)")
        if why:
            return why
        if shape.head_dim not in (64, 128, 256):
            return f"flashinfer prefill kernels are built for head_dim 64/128/256, got {shape.head_dim}"
        if cls.flashinfer_backend == "fa3" and torch.cuda.get_device_capability(device)[0] != 9:
            return "flashinfer's fa3 kernels need a Hopper GPU (sm_90)"
        if shape.position_bias:
            return "flashinfer's ragged prefill takes no score bias table"
        if not shape.causal and shape.sliding:
            return "flashinfer's sliding window is one-sided (window_left); this model's windows are two-sided"
        return None

    def __init__(self, shape, device):
        super().__init__(shape, device)
        import flashinfer
        self._fi = flashinfer
        self._float_ws = torch.empty(self.float_workspace_bytes, dtype=torch.uint8, device=self.device)
        self._schedules = {w: _Schedule(self, w) for w in shape.windows}
        self._active = {w: sched.eager for w, sched in self._schedules.items()}

    def plan(self, meta: AttentionMetadata) -> None:
        self.meta = meta
        for w, sched in self._schedules.items():
            self._active[w] = sched.plan(meta)

    def run(self, q, k, v, window=None, bias=None):
        return self._active[window].run(q, k, v)


class _Schedule:
    """The wrappers of one window of a FlashInferBackend (None: full attention): an eager one and one
    per graph configuration, sharing an int workspace and its pinned mirror (a plan's schedule lives
    there, so each window has its own) and the backend's float workspace (scratch of a run)."""

    def __init__(self, backend: FlashInferBackend, window):
        self.backend, self.window = backend, window
        n, dev = backend.int_workspace_bytes, backend.device
        self.int_ws = torch.empty(n, dtype=torch.uint8, device=dev)
        self.pinned_ws = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        self.plan_done: torch.cuda.Event | None = None
        self.eager = self._wrapper(graph=False)
        self.graphs: dict = {}
        self.last_plan: tuple | None = None    # (graph key, cu_seqlens bytes) of the last graph plan
        self.extra = {} if window is None else {"window_left": window[0]}    # plan() keywords

    def _wrapper(self, graph: bool, cu: torch.Tensor | None = None):
        b = self.backend
        w = b._fi.BatchPrefillWithRaggedKVCacheWrapper(
            b._float_ws, "NHD", use_cuda_graph=graph, qo_indptr_buf=cu, kv_indptr_buf=cu,
            backend=b.flashinfer_backend)
        # share the int workspace and its pinned mirror (8 MB each per wrapper otherwise)
        w._int_workspace_buffer, w._pin_memory_int_workspace_buffer = self.int_ws, self.pinned_ws
        return w

    def plan(self, meta: AttentionMetadata):
        """Plan the batch on this window's wrapper for meta.graph_key; returns that wrapper."""
        if meta.graph_key is None:
            w = self.eager
        else:
            w = self.graphs.get(meta.graph_key)
            if w is None:
                w = self.graphs[meta.graph_key] = self._wrapper(graph=True, cu=meta.cu_seqlens)
        cu = meta.host_cu()
        layout = cu.numpy().tobytes() if meta.graph_key is not None else None
        if layout is not None and self.last_plan == (meta.graph_key, layout):
            return w                            # the same layout as the last plan (the schedule lives
                                                # in the int workspace all wrappers share): keep it
        if self.plan_done is not None:
            self.plan_done.synchronize()        # the pinned mirror's previous copy has left
        s, b = self.backend.shape, self.backend
        w.plan(cu, cu, s.num_heads, s.num_kv_heads, s.head_dim, causal=s.causal,
               sm_scale=b.scale, q_data_type=s.dtype, kv_data_type=s.dtype,
               disable_split_kv=meta.graph_key is None, **self.extra)
        if self.plan_done is None:
            self.plan_done = torch.cuda.Event()
        self.plan_done.record()
        self.last_plan = (meta.graph_key, layout) if layout is not None else None
        return w


class FlashInferFa3Backend(FlashInferBackend):
    """The same wrapper on flashinfer's Hopper (fa3) kernels."""
    name = "flashinfer_fa3"
    flashinfer_backend = "fa3"
