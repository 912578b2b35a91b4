"""Memory hygiene of the service: host heap handed back to the OS, device cache freed before a retry."""
from __future__ import annotations

import sys
import time


class HostMemoryTrimmer:
    """Hands freed heap memory back to the OS (glibc's malloc_trim; elsewhere nothing), when:

        "idle"      the service has nothing queued or in flight, at most once per `interval`
                    seconds, and under a load that never pauses once per 30 x `interval` (default)
        "periodic"  once per `interval` seconds, whatever the load
        "off"       never

    glibc keeps the host buffers that batches of ever-changing shapes free in fragmented heaps;
    malloc_trim(0) returns them (what that saves: docs/OPERATIONS.md, "Soak"). It walks every heap
    with their locks held, so a trim in the middle of a load delays the batch behind it; when idle it
    delays nobody.
    """
    MODES = ("idle", "periodic", "off")

    def __init__(self, mode: str = "idle", interval: float = 1.0, busy_factor: int = 30):
        if mode not in self.MODES:
            raise ValueError(f"host memory trim mode must be one of {', '.join(self.MODES)}, got {mode!r}")
        self.mode, self.interval, self.busy_interval = mode, interval, interval * busy_factor
        self._last = time.monotonic()
        self.trims = 0
        self._trim = None
        if mode != "off":
            try:
                import ctypes
                self._trim = ctypes.CDLL("libc.so.6").malloc_trim
            except (OSError, AttributeError):   # not glibc: nothing to do
                pass

    def maybe_trim(self, idle: bool = True) -> None:
        if self._trim is None:
            return
        since = time.monotonic() - self._last
        if since >= self.busy_interval or (since >= self.interval and (idle or self.mode == "periodic")):
            self._trim(0)
            self._last = time.monotonic()
            self.trims += 1


def free_device_cache() -> None:
    """Hand cached CUDA blocks back before a retry (torch only if the engine already loaded it)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
