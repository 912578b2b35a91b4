"""The lanes' Prometheus series (lanes.py), labelled lane="interactive" | "bulk", beside rose's own:

    rose_lane_queue_tokens{lane}            gauge: tokens of the lane waiting in the pool
    rose_lane_batches_total{lane}           counter: batches launched holding the lane's sequences
    rose_lane_wait_seconds{lane}            histogram: admission to first batch, seconds
                                            (_bucket{le}, _sum, _count: one snapshot per scrape)

e.g. histogram_quantile(0.99, rate(rose_lane_wait_seconds_bucket{lane="interactive"}[1m])).
`model` is the served model object (m.service: its EmbeddingService).
"""
from __future__ import annotations

from rose_backend.serving.lanes import LANES, WAIT_BUCKETS_S
from rose_backend.triton.polled_metrics import Histogram, Series


def lane_series() -> list[Series]:
    out: list[Series] = []
    for lane in LANES:
        labels = {"lane": lane}
        out.append(Series("rose_lane_queue_tokens", "gauge", "tokens waiting in the request pool, per lane", labels,
                          lambda m, lane=lane: m.service.scheduler.lane_tokens[lane]))
        out.append(Series("rose_lane_batches_total", "counter", "forward passes launched holding the lane's sequences",
                          labels, lambda m, lane=lane: m.service.scheduler.stats.batches[lane]))
    return out


def lane_histograms() -> list[Histogram]:
    return [Histogram("rose_lane_wait_seconds", "seconds from a request's admission to its first batch, per lane",
                      {"lane": lane}, tuple(WAIT_BUCKETS_S),
                      lambda m, lane=lane: m.service.scheduler.stats.wait_histogram(lane)) for lane in LANES]
