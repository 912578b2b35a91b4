"""Prometheus metrics as the tests read them: a tritonserver's metrics port (the `rose` and
`tokenize` models' series, labelled by Triton) or any /metrics URL (the gateway's).

    metric(server, "rose_sequences_total")                       # summed over every series of that name
    metric(server, "rose_lane_batches_total", lane="bulk")       # only the series with these labels
    series(server, "rose_memory_budget_bytes")                   # [(labels, value), ...]
"""
from __future__ import annotations

import re
import time
import urllib.request

_LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{([^}]*)\})? (\S+)$", re.M)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def scrape(target) -> str:
    """The metrics text of `target`: a server (TritonProcess, LauncherRun: its ports.metrics) or a URL."""
    url = target if isinstance(target, str) else f"http://127.0.0.1:{target.ports.metrics}/metrics"
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def series(target, name: str) -> list[tuple[dict[str, str], float]]:
    """Every series of metric `name`: (its labels, its value)."""
    return [(dict(_LABEL.findall(labels or "")), float(value))
            for found, labels, value in _LINE.findall(scrape(target)) if found == name]


def metric(target, name: str, **labels: str) -> float:
    """The sum of the series of `name` that carry all of `labels` (0.0 where there is none)."""
    return sum(v for have, v in series(target, name) if all(have.get(k) == str(w) for k, w in labels.items()))


def rose_metric(server, name: str) -> float:
    """A metric of the server's `rose` model, summed over its instances."""
    return metric(server, name)


def wait_idle(server, timeout: float = 120.0) -> None:
    """Until the server has nothing queued and computed no sequence for a second (the metrics are
    refreshed about once a second, so a second without change is the shortest proof)."""
    deadline = time.monotonic() + timeout
    while True:
        seqs = rose_metric(server, "rose_sequences_total")
        time.sleep(1.0)
        if rose_metric(server, "rose_queue_tokens") == 0 and rose_metric(server, "rose_sequences_total") == seqs:
            return
        assert time.monotonic() < deadline, "the server did not go idle"


def wait_for_backlog(server, timeout: float = 30.0, min_tokens: int = 1) -> None:
    """Until the server's `rose` has at least `min_tokens` waiting in its pool (the gauge is polled
    about once a second), e.g. before a test gives up on requests it sent, so that some are still queued."""
    deadline = time.monotonic() + timeout
    while rose_metric(server, "rose_queue_tokens") < min_tokens:
        assert time.monotonic() < deadline, "rose never had a backlog of the requests sent"
        time.sleep(0.05)
