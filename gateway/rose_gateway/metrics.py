"""The gateway's Prometheus metrics (GET /metrics), in a registry of its own per app.

rose_gateway_requests_total{endpoint, status}: status 499 counts requests whose client went away
before the answer; endpoint "connection" counts what the HTTP connections refused themselves
(protocol.py: 400 malformed, 408 too slow, 431 headers too large, 503 connection cap).

With several workers (workers.py) every worker's values are kept in the shared folder
$PROMETHEUS_MULTIPROC_DIR (prometheus_client's multiprocess mode) and /metrics, whichever worker
answers it, sums them over all workers, those that have exited included."""
from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

from rose_backend import env_vars

_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


class GatewayMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self):
        self.registry = CollectorRegistry()
        self.requests = Counter("rose_gateway_requests", "HTTP requests answered, by endpoint and status",
                                ["endpoint", "status"], registry=self.registry)
        self.errors = Counter("rose_gateway_errors", "HTTP requests answered with an error (status >= 400)",
                              ["endpoint", "status"], registry=self.registry)
        self.latency = Histogram("rose_gateway_request_duration_seconds", "Time from request to response",
                                 ["endpoint"], buckets=_BUCKETS, registry=self.registry)
        self.inputs = Counter("rose_gateway_inputs", "Inputs (texts or token-id sequences) embedded",
                              registry=self.registry)
        self.tokens = Counter("rose_gateway_prompt_tokens", "Prompt tokens embedded (usage.prompt_tokens)",
                              registry=self.registry)
        self._children: dict[tuple[str, int], tuple] = {}

    def observe(self, endpoint: str, status: int, seconds: float) -> None:
        children = self._children.get((endpoint, status))
        if children is None:                         # each (endpoint, status) looked up once
            children = self._children[endpoint, status] = (
                self.requests.labels(endpoint, str(status)),
                self.errors.labels(endpoint, str(status)) if status >= 400 else None,
                self.latency.labels(endpoint))
        children[0].inc()
        if children[1] is not None:
            children[1].inc()
        children[2].observe(seconds)

    def refused(self, status: int) -> None:
        self.observe("connection", status, 0.0)

    def render(self) -> bytes:
        if env_vars.PROMETHEUS_MULTIPROC_DIR.get():
            from prometheus_client import multiprocess
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            return generate_latest(registry)
        return generate_latest(self.registry)
