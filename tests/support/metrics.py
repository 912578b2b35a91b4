"""A tritonserver's Prometheus metrics (its metrics port), for tests that count the server's work."""
from __future__ import annotations

import re
import time
import urllib.request


def rose_metric(server, name: str) -> float:
    """A metric of the server's `rose` model (Triton labels it), summed over its instances."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.ports.metrics}/metrics", timeout=10).read().decode()
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M))


def wait_idle(server, timeout: float = 120.0) -> None:
    """Until the server has nothing queued and computed no sequence for a second."""
    deadline = time.monotonic() + timeout
    while True:
        seqs = rose_metric(server, "rose_sequences_total")
        time.sleep(1.0)
        if rose_metric(server, "rose_queue_tokens") == 0 and rose_metric(server, "rose_sequences_total") == seqs:
            return
        assert time.monotonic() < deadline, "the server did not go idle"
