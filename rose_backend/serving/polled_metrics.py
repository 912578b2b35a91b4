"""Custom Prometheus metrics of a Python model (served on Triton's metrics port), read from the
model's own counters once a second by a thread, so that the request path never pays for them.

    metrics = PolledMetrics(args, model, {"name_total": ("what it counts", lambda m: m.stats.x)},
                            gauges={"name": ("what it measures", lambda m: m.queued)})
    metrics.stop()          # in finalize()
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import triton_python_backend_utils as pb_utils

log = logging.getLogger(__name__)

Table = dict[str, tuple[str, Callable[[object], float]]]   # metric name -> (description, read(model))


class PolledMetrics:
    def __init__(self, args: dict, model, counters: Table, gauges: Table | None = None, period_s: float = 1.0):
        labels = {"model": args["model_name"], "version": str(args.get("model_version", "1"))}
        self.model, self.period_s = model, period_s
        self.metrics = []
        for table, kind, is_counter in ((counters, pb_utils.MetricFamily.COUNTER, True),
                                        (gauges or {}, pb_utils.MetricFamily.GAUGE, False)):
            for name, (desc, read) in table.items():
                fam = pb_utils.MetricFamily(name=name, description=desc, kind=kind)
                self.metrics.append((fam, fam.Metric(labels=labels), read, is_counter))
        self.last = {id(m): 0 for _, m, _, _ in self.metrics}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{labels['model']}-metrics", daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(self.period_s):
            try:
                self.refresh()
            except Exception:
                log.exception("refreshing metrics failed")

    def refresh(self):
        for _, metric, read, is_counter in self.metrics:
            value = read(self.model)
            if is_counter:
                delta = value - self.last[id(metric)]
                if delta > 0:
                    metric.increment(delta)
                    self.last[id(metric)] = value
            else:
                metric.set(value)

    def stop(self):
        self._stop.set()
        self._thread.join(2.0)
