"""The query lane: interactive batches on an engine of their own, beside the bulk batches.

With the `rose` parameter `interactive_stream` = `on` the service holds two engines on one set of
weights (Engine(weights_from=...)): the main engine, and a query engine with buckets, static
buffers, CUDA graphs and attention workspaces of its own, on a CUDA stream of higher priority. While
bulk work is in flight on the main engine, interactive batches go to the query engine, one at a
time, so a query runs beside the bulk batches already on the GPU instead of behind them, and the
bulk batches need not be kept small for its sake (the LanePolicy's caps do not apply): each takes
the whole batch budget. With no bulk in flight, interactive batches use only the main engine's
slots, as without the lane (the concurrent online load keeps its pipelining).

The one-stream lanes bound a query's wait by the bulk batches in flight ahead of it; this lane
removes that wait, at the price of the query engine's memory (its graph pool and buffers) and of
sharing the GPU's SMs with the bulk batch while they overlap.
"""
from __future__ import annotations

from collections import deque

from rose_backend.serving.lanes import BULK, INTERACTIVE


class QueryLane:
    def __init__(self, engine):
        self.engine = engine
        self.inflight: deque = deque()            # (batch, handle) on the query engine, at most one

    def free(self) -> bool:
        return not self.inflight


def bulk_in_flight(service) -> bool:
    """Whether a batch holding bulk sequences is in flight on the main engine."""
    return any(BULK in b.lanes() for b, _ in service.inflight)


def next_batch(service):
    """With the service's lock held: the next batch and the engine to run it, or (None, None).
    Interactive batches go to the query engine only while bulk is in flight; otherwise they wait for
    the main engine's slots, as without the lane."""
    sched, q = service.scheduler, service.query
    main_has_room = len(service.inflight) < service.max_inflight
    bulk_running = bulk_in_flight(service)
    if sched.has_work(INTERACTIVE):
        if bulk_running and q.free():
            return sched.next_batch(lane=INTERACTIVE), q.engine
        if main_has_room and not bulk_running:
            return sched.next_batch(lane=INTERACTIVE), service.engine
    if main_has_room and sched.has_work(BULK):
        return sched.next_batch(lane=BULK, bulk_cap=service.lanes.bulk_cap()), service.engine
    return None, None
