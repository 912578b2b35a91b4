"""LazyTensor: a handle on a result that may still be on its way from the device.

On CUDA, `launch(src)` queues an async copy of `src` into a page-locked host buffer on the current
stream, behind the forward pass that produced it, and records an event after the copy. The event
firing therefore means both "the forward pass is done" and "the bytes are on the host".
`ready()` polls the event and never blocks; `synchronize()` is the only blocking call.
On the CPU the copy is immediate and the handle is ready at once; the interface is the same.

The host buffer may belong to a ring the engine reuses: before reusing it, the engine calls
`detach()` on a handle that was never synchronized, which waits and moves the rows into memory
of the handle's own (a slow path that a caller holding at most `max_inflight` handles never takes).
"""
from __future__ import annotations

import numpy as np
import torch


class LazyTensor:
    __slots__ = ("_host", "_event", "_rows", "done", "_extras", "extras")

    def __init__(self, host: torch.Tensor, event: "torch.cuda.Event | None", rows: int,
                 extras: dict[str, torch.Tensor] | None = None):
        self._host, self._event, self._rows = host, event, rows
        self._extras = extras or {}
        self.extras: dict[str, np.ndarray] = {}
        self.done = event is None

    @classmethod
    def launch(cls, src: torch.Tensor, rows: int | None = None, host: torch.Tensor | None = None,
               event: "torch.cuda.Event | None" = None,
               extras: dict[str, torch.Tensor] | None = None,
               extras_host: dict[str, torch.Tensor] | None = None, static: bool = True) -> "LazyTensor":
        """Queue src -> host (`rows`: how many of its rows are results). `host`, if given, is a
        (pinned) buffer of src's shape that nothing else writes until this handle is synchronized or
        detached; `event`, if given, is recorded after the copy (the owner of a buffer ring reuses
        one per buffer). `extras`:
        named device tensors (already cut to their real rows) copied back behind the same event,
        into `extras_host` (pinned buffers of their shapes, reused by the ring as `host` is) or new
        pinned memory. On the CPU, `static=False` hands src and the extras over without a copy (for
        tensors that nothing overwrites: an eager pass's own outputs, not a graph's static ones)."""
        rows = src.shape[0] if rows is None else rows
        if src.device.type != "cuda":
            # A graph's static outputs are overwritten by its next replay, while the serving layer
            # keeps these rows until their request is answered: a static src is copied, always.
            lt = cls(src[:rows].detach().to("cpu", torch.float32, copy=static).contiguous(), None, rows)
            lt.extras = {k: v.detach().to("cpu", torch.float32, copy=static).numpy()
                         for k, v in (extras or {}).items()}
            return lt
        if host is None:
            host = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
        host.copy_(src, non_blocking=True)                    # cudaMemcpyAsync behind the forward pass
        copies = {}
        for k, v in (extras or {}).items():
            dst = extras_host[k] if extras_host else torch.empty(v.shape, dtype=v.dtype, pin_memory=True)
            copies[k] = dst
            dst.copy_(v, non_blocking=True)
        event = event or torch.cuda.Event()
        event.record()
        return cls(host, event, rows, copies)

    def ready(self) -> bool:
        """True once the result is on the host. Never blocks."""
        return self.done or self._event.query()

    def synchronize(self) -> np.ndarray:
        """Block until the result is on the host; return it as float32 [rows, ...] (a copy)."""
        if self._event is not None:
            self._event.synchronize()
        host = self._host if self._host.dtype == torch.float32 else self._host.float()
        out = host.numpy()[: self._rows].copy()
        self._host, self._event, self.done = torch.from_numpy(out), None, True   # the ring may reuse the buffer now
        if self._extras:                            # float32 already (the heads' outputs): no copy
            self.extras = {k: v.numpy() for k, v in self._extras.items()}
            self._extras = {}
        return out.copy()

    def detach(self) -> None:
        """Wait for the copy and keep the rows in memory of our own, freeing the shared buffer."""
        if self._event is not None:
            self._event.synchronize()
            self._host = self._host[: self._rows].clone()
            self._extras = {k: v.clone() for k, v in self._extras.items()}
            self._event = None
        self.done = True
