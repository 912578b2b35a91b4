"""The CUDA stream an Engine launches its work on.

- The query lane's engine (serving/query_lane.py): a stream of higher priority, so that its
  kernels' blocks are dispatched before the bulk batches' waiting ones.
- The main engine: the thread's current stream, or, under $ROSE_MAIN_ENGINE_SMS=N
  (rose_backend/env_vars.py), a stream of a CUDA green context of N SMs. Its eager passes and its graphs'
  captures then run there, so its kernels never take the other SMs, which stay free for the query
  lane's engine (on the whole device).
"""
from __future__ import annotations

import ctypes

import torch

from rose_backend import env_vars


class EngineStream:
    def __init__(self, device: torch.device, query_lane: bool):
        self.stream: torch.cuda.Stream | None = None      # None: the calling thread's current stream
        self.green = None                                 # the green context (kept alive with its stream)
        self.sms = 0                                      # the green context's SMs (0: no partition)
        if device.type != "cuda":
            return
        if query_lane:
            self.stream = torch.cuda.Stream(device, priority=-1)
            return
        self.sms = env_vars.ROSE_MAIN_ENGINE_SMS.integer()
        if self.sms:
            from torch.cuda.green_contexts import GreenContext
            self.green = GreenContext.create(num_sms=self.sms, device_id=device.index)
            self.stream = self.green.Stream()
            _outlive_every_tensor(self.green)

    @property
    def capture_stream(self) -> torch.cuda.Stream | None:
        """Where this engine's graphs are captured (None: the graph cache's own side stream): a
        green context's stream, since a graph's kernels run in the context they were captured in."""
        return self.stream if self.green is not None else None


def _outlive_every_tensor(green) -> None:
    """Keep a green context until the process ends (one reference never given back). A tensor used on
    its stream and freed after it was destroyed (at interpreter exit, in whatever order objects go)
    makes the caching allocator record an event on a destroyed context, and the process aborts."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(green))
