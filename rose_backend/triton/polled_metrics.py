"""Custom Prometheus metrics of a Python model (served on Triton's metrics port), read from the
model's own counters once a second by a thread, so that the request path never pays for them.

Each update is a round trip to tritonserver, and one in flight when the server dies never
returns, with the GIL held: no other thread of the stub runs again, its parent-watch thread
included; the stub's watcher process (parent_watch.py) kills it. Values are sent only when they
changed, and nothing once the stub's parent is gone, so that such a round trip is rare.

The round trip does hold the GIL (python_backend's Metric::SendIncrementRequest does not release
it), so the stub's other threads stop while it lasts. The metrics are therefore refreshed one at a
time, spread over the period (one every period / N seconds), never all in one burst: under a load,
a burst of ten round trips once a second stalled the scheduler thread for a whole batch.

    metrics = PolledMetrics(args, model, {"name_total": ("what it counts", lambda m: m.stats.x)},
                            gauges={"name": ("what it measures", lambda m: m.queued)},
                            labelled=[Series("name_total", "counter", "what it counts", {"lane": "bulk"}, read)])
    metrics.stop()          # in finalize()

A labelled series carries labels beside the model's own (model, version); the series of one name
form one family and must agree on its kind and description. A histogram is served as Prometheus
lays one out, from counters: NAME_bucket{le="..."} (cumulative), NAME_sum and NAME_count
(histogram_series), so that histogram_quantile() works and the request path only adds to numbers.
"""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable
from typing import NamedTuple

import triton_python_backend_utils as pb_utils

log = logging.getLogger(__name__)

Table = dict[str, tuple[str, Callable[[object], float]]]   # metric name -> (description, read(model))


class Series(NamedTuple):
    """One labelled series: kind "counter" or "gauge"; read(model) -> its value."""
    name: str
    kind: str
    description: str
    labels: dict
    read: Callable[[object], float]


def histogram_series(name: str, description: str, labels: dict, bounds: Iterable[float],
                     at_most: Callable[[object, float], int], total: Callable[[object], float],
                     count: Callable[[object], int]) -> list[Series]:
    """A histogram as counters: NAME_bucket per bound (at_most(model, bound): observations <= bound;
    a last +Inf bucket, at_most(model, inf)), NAME_sum (total) and NAME_count (count)."""
    out = [Series(f"{name}_bucket", "counter", description, {**labels, "le": repr(float(b))},
                  lambda m, b=float(b): at_most(m, b)) for b in bounds]
    out.append(Series(f"{name}_bucket", "counter", description, {**labels, "le": "+Inf"},
                      lambda m: at_most(m, float("inf"))))
    out.append(Series(f"{name}_sum", "counter", description, labels, total))
    out.append(Series(f"{name}_count", "counter", description, labels, count))
    return out


class PolledMetrics:
    def __init__(self, args: dict, model, counters: Table, gauges: Table | None = None, period_s: float = 1.0,
                 labelled: Iterable[Series] = ()):
        labels = {"model": args["model_name"], "version": str(args.get("model_version", "1"))}
        self.model, self.period_s = model, period_s
        kinds = {"counter": pb_utils.MetricFamily.COUNTER, "gauge": pb_utils.MetricFamily.GAUGE}
        series = [Series(n, "counter", d, {}, r) for n, (d, r) in counters.items()]
        series += [Series(n, "gauge", d, {}, r) for n, (d, r) in (gauges or {}).items()]
        families: dict[str, object] = {}
        self.metrics = []
        for s in [*series, *labelled]:
            fam = families.get(s.name)
            if fam is None:
                fam = families[s.name] = pb_utils.MetricFamily(name=s.name, description=s.description,
                                                               kind=kinds[s.kind])
            self.metrics.append((fam, fam.Metric(labels={**labels, **s.labels}), s.read, s.kind == "counter"))
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
