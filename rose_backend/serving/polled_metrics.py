"""Custom Prometheus metrics of a Python model (served on Triton's metrics port), read from the
model's own counters once a second by a thread, so that the request path never pays for them.

Each update is a round trip to tritonserver, and one made after the server died does not return.
With gauges sent every second, an idle `tokenize_batched` stub outlived its killed server in 1 of
3 runs of test_launcher_killed_takes_its_servers_with_it (its parent watchdog, parent_watch.py,
did not end it: presumably the blocked call holds the GIL); sending a value only when it changed,
and nothing once the stub's parent is gone: 0 of 5.

The round trip does hold the GIL (python_backend's Metric::SendIncrementRequest does not release
it), so the stub's other threads stop while it lasts. The metrics are therefore refreshed one at a
time, spread over the period (one every period / N seconds), never all in one burst: under a load,
a burst of ten round trips once a second stalled the scheduler thread for a whole batch.

    metrics = PolledMetrics(args, model, {"name_total": ("what it counts", lambda m: m.stats.x)},
                            gauges={"name": ("what it measures", lambda m: m.queued)})
    metrics.stop()          # in finalize()
"""
from __future__ import annotations

import logging
import os
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
        self._parent = os.getppid()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{labels['model']}-metrics", daemon=True)
        self._thread.start()

    def _run(self):
        tick, i = self.period_s / max(1, len(self.metrics)), 0
        while self.metrics and not self._stop.wait(tick):
            if os.getppid() != self._parent:        # the server is gone: no more round trips
                return
            try:
                self._refresh_one(*self.metrics[i][1:])
            except Exception:
                log.exception("refreshing metrics failed")
            i = (i + 1) % len(self.metrics)

    def _refresh_one(self, metric, read, is_counter: bool) -> None:
        value = read(self.model)
        last = self.last[id(metric)]
        if is_counter and value > last:
            metric.increment(value - last)
        elif not is_counter and value != last:
            metric.set(value)
        else:
            return
        self.last[id(metric)] = value

    def stop(self):
        self._stop.set()
        self._thread.join(2.0)
