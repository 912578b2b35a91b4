"""Two lanes of requests, so that a query never waits behind re-indexing.

A request says its lane with the request parameter `lane` = `interactive` | `bulk`; one that names
none is interactive unless it carries more than `bulk_threshold_tokens` tokens. The scheduler
(scheduler.py) keeps each lane first come, first served and fills every batch with interactive
sequences first; bulk keeps at least `bulk_min_share` of a batch's tokens and sequences while
interactive work waits beyond the batch, so it is never starved.

What an interactive request waits for is the batches already in flight (up to `max_inflight`) and
its own batch. With bulk traffic those are the batches bulk filled, so while interactive traffic
is present or recent (within `interactive_recent_ms`), LanePolicy makes them small and few:
    - bulk tokens in one batch at most `bulk_batch_tokens`;
    - batches holding bulk sequences in flight at most `bulk_max_inflight` (the other slots are kept
      for interactive batches, which then launch at once, ahead of the bulk waiting in the pool).
With no interactive traffic for `interactive_recent_ms`, bulk batches fill the whole budget, as
with one lane.

Why small batches rather than one bulk batch in flight: a query then waits for the rest of one
batch, one more and its own (about 3 x `bulk_batch_tokens` of device time), while two batches in
flight keep the device busy. With one bulk batch in flight, the device idles while the host forms
and launches the next (flashinfer's plan alone is 0.5-1.8 ms on the H200 host). On a modelled H200
(BGE-M3 graph replays, 4 clients of 100 x 512 beside 50 queries a second of 1 x 128;
`python -m rose_bench lanes --modelled-device`): 6144 tokens, query p99 about 25 ms and bulk at
94.6-95.7% of its rate alone; 7168, 28 ms and 96%; one lane, 273 ms.

LaneStats counts, per lane, the batches holding its sequences and each request's wait from
admission to its first batch (a histogram of cumulative bucket counts, for Prometheus).
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

INTERACTIVE, BULK = "interactive", "bulk"
LANES = (INTERACTIVE, BULK)

# upper bounds (seconds) of the wait histogram's buckets; a last one, +Inf, holds everything
WAIT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def parse_lane(value) -> str | None:
    """A request's `lane` parameter: None (not given) or one of LANES; anything else a ValueError
    naming the parameter and the allowed values."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lower() in LANES:
        return value.strip().lower()
    raise ValueError(f"request parameter 'lane' must be one of {', '.join(LANES)}, got {value!r}")


class LaneStats:
    """Per lane: batches holding its sequences, and admission-to-first-batch waits (read by the
    metrics thread without a lock: plain integers and floats, each written by one thread)."""

    def __init__(self):
        self.batches = {lane: 0 for lane in LANES}
        self.waits = {lane: 0 for lane in LANES}
        self.wait_sum_s = {lane: 0.0 for lane in LANES}
        self.wait_counts = {lane: [0] * (len(WAIT_BUCKETS_S) + 1) for lane in LANES}

    def waited(self, lane: str, seconds: float) -> None:
        self.wait_counts[lane][bisect.bisect_left(WAIT_BUCKETS_S, seconds)] += 1
        self.wait_sum_s[lane] += seconds
        self.waits[lane] += 1

    def waits_at_most(self, lane: str, bound_s: float) -> int:
        """Requests of `lane` that waited at most `bound_s` (a bucket bound, or math.inf): the
        cumulative count of a Prometheus histogram bucket."""
        i = len(WAIT_BUCKETS_S) if math.isinf(bound_s) else WAIT_BUCKETS_S.index(bound_s)
        return sum(self.wait_counts[lane][:i + 1])


@dataclass(frozen=True)
class LaneSettings:
    """The lanes' parameters, as `rose`'s parameters of the same names (their meaning and defaults:
    RoseSettings in rose_backend/triton/model_settings.py, which carries these fields too)."""
    bulk_threshold_tokens: int = 8192
    bulk_min_share: float = 0.25
    bulk_batch_tokens: int = 6144
    bulk_max_inflight: int = 2
    interactive_recent_ms: int = 1000


class LanePolicy:
    """How many bulk tokens the next batch may take, from how recent interactive traffic is.

    bulk_batch_tokens      bulk tokens in one batch while interactive traffic is recent
    bulk_max_inflight      batches holding bulk in flight while interactive traffic is recent
    interactive_recent_s   how long after the last interactive request traffic counts as recent
    """

    def __init__(self, bulk_batch_tokens: int, bulk_max_inflight: int, interactive_recent_s: float):
        self.bulk_batch_tokens = bulk_batch_tokens
        self.bulk_max_inflight = max(1, bulk_max_inflight)
        self.interactive_recent_s = interactive_recent_s
        self.last_interactive = -math.inf          # time.monotonic() of the last interactive admission

    def seen(self, lane: str, now: float) -> None:
        if lane == INTERACTIVE:
            self.last_interactive = now

    def bulk_room(self, now: float, interactive_waiting: bool, bulk_in_flight: int) -> int | None:
        """Bulk tokens the next batch may take: None (the whole budget) without recent interactive
        traffic; else 0 with `bulk_max_inflight` bulk batches in flight, or `bulk_batch_tokens`."""
        if not interactive_waiting and now - self.last_interactive > self.interactive_recent_s:
            return None
        return 0 if bulk_in_flight >= self.bulk_max_inflight else self.bulk_batch_tokens
