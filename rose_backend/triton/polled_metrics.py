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
                            labelled=[Series("name_total", "counter", "what it counts", {"lane": "bulk"}, read)],
                            histograms=[Histogram("name_seconds", "what it times", {"lane": "bulk"}, bounds, read)])
    metrics.stop()          # in finalize()

A labelled series carries labels beside the model's own (model, version); the series of one name
form one family and must agree on its kind and description. A histogram (Histogram) is one of
Triton's histogram metrics, whose scrape is one snapshot (each bucket, _sum and _count agree): the
request path counts each observation and adds its value into its bucket's sum; the metrics thread
replays what came since its last look, each bucket's new observations at their mean (which lies
in that bucket), at every refresh of a series (so in small steps), at most MAX_REPLAYED a step.
"""
from __future__ import annotations

import functools
import logging
import math
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


MAX_REPLAYED = 256           # observations a histogram replays at most in one step (each a round trip)


class Histogram(NamedTuple):
    """One labelled histogram: bounds of its buckets (a last +Inf one follows); read(model) ->
    (count per bucket, sum of values per bucket), len(bounds) + 1 each, not cumulative."""
    name: str
    description: str
    labels: dict
    bounds: tuple[float, ...]
    read: Callable[[object], tuple[list[int], list[float]]]


class _Replay:
    """What of a Histogram's observations were replayed into its Triton metric."""

    def __init__(self, metric, h: Histogram):
        self.metric, self.read = metric, h.read
        edges = (-math.inf, *map(float, h.bounds), math.inf)
        self.ranges = list(zip(edges[:-1], edges[1:]))        # bucket i holds (lo, hi]
        self.counts = [0] * len(self.ranges)
        self.sums = [0.0] * len(self.ranges)

    def __call__(self, model) -> None:
        counts, sums = self.read(model)
        budget = MAX_REPLAYED
        for i, (lo, hi) in enumerate(self.ranges):
            n = min(counts[i] - self.counts[i], budget)
            if n <= 0:
                continue
            # the mean of what came into this bucket; kept inside it (a read between the request
            # path's two additions sees a count without its value)
            mean = (sums[i] - self.sums[i]) / (counts[i] - self.counts[i])
            value = min(max(mean, math.nextafter(lo, math.inf)), hi)
            for _ in range(n):
                self.metric.observe(value)
            self.counts[i] += n
            self.sums[i] += n * mean
            budget -= n


class PolledMetrics:
    def __init__(self, args: dict, model, counters: Table, gauges: Table | None = None, period_s: float = 1.0,
                 labelled: Iterable[Series] = (), histograms: Iterable[Histogram] = ()):
        labels = {"model": args["model_name"], "version": str(args.get("model_version", "1"))}
        self.model, self.period_s = model, period_s
        kinds = {"counter": pb_utils.MetricFamily.COUNTER, "gauge": pb_utils.MetricFamily.GAUGE,
                 "histogram": pb_utils.MetricFamily.HISTOGRAM}
        series = [Series(n, "counter", d, {}, r) for n, (d, r) in counters.items()]
        series += [Series(n, "gauge", d, {}, r) for n, (d, r) in (gauges or {}).items()]
        families: dict[str, object] = {}

        def family(name: str, description: str, kind: str):
            fam = families.get(name)
            if fam is None:
                fam = families[name] = pb_utils.MetricFamily(name=name, description=description, kind=kinds[kind])
            return fam

        self.metrics = []                 # one refreshed per tick, in turn
        for s in [*series, *labelled]:
            metric = family(s.name, s.description, s.kind).Metric(labels={**labels, **s.labels})
            self.metrics.append(functools.partial(self._refresh_one, metric, s.read, s.kind == "counter"))
        self.histograms = [_Replay(family(h.name, h.description, "histogram").Metric(
            labels={**labels, **h.labels}, buckets=list(h.bounds)), h) for h in histograms]   # each, every tick
        self._families = families         # a family dropped would drop its metrics from the page
        self.last: dict[int, float] = {}
        self._parent = os.getppid()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{labels['model']}-metrics", daemon=True)
        self._thread.start()

    def _run(self):
        slots = len(self.metrics) or 1
        tick, i = self.period_s / slots, 0
        while (self.metrics or self.histograms) and not self._stop.wait(tick):
            if os.getppid() != self._parent:        # the server is gone: no more round trips
                return
            try:
                if self.metrics:
                    self.metrics[i](self.model)
                for h in self.histograms:
                    h(self.model)
            except Exception:
                log.exception("refreshing metrics failed")
            i = (i + 1) % slots

    def _refresh_one(self, metric, read, is_counter: bool, model) -> None:
        value = read(model)
        last = self.last.get(id(metric), 0)
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
