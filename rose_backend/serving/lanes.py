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

On the CPU (an engine whose step() runs the batch before it returns: one batch at a time, nothing
in flight while the next is formed), a query arriving during a bulk batch waits for all of it,
however many tokens it holds. So where `bulk_batch_ms` is on (auto: CPU_BULK_BATCH_MS on the CPU,
off on a GPU, where batches overlap the host and it is refused):
    - a batch holds at most the bulk tokens that BatchCost, the engine's measured seconds per token,
      says fit in `bulk_batch_ms` (at least one sequence), whether or not queries are recent, the
      share of `bulk_min_share` included; and at most `bulk_batch_tokens` while queries are recent;
    - a batch formed while interactive sequences wait carries no bulk beyond that share (on one
      device running one batch at a time, bulk beside a query only delays its answer).
A query then waits for the rest of one bulk batch and its own: one caller's share of the server is
about `bulk_batch_ms` at a time, however large its request.

Why small batches rather than one bulk batch in flight: a query then waits for the rest of one
batch, one more and its own (about 3 x `bulk_batch_tokens` of device time), while two batches in
flight keep the device busy. With one bulk batch in flight, the device idles while the host forms
and launches the next (flashinfer's plan of a batch alone is host work). `bulk_batch_tokens`
trades the two: smaller batches shorten a query's wait, larger ones keep more of bulk's rate.

LaneStats counts, per lane, the batches holding its sequences and each request's wait from
admission to its first batch (a histogram of cumulative bucket counts, for Prometheus).
"""
from __future__ import annotations

import bisect
import math
import time
from dataclasses import dataclass

from rose_client.contract import BULK, INTERACTIVE, LANES  # noqa: F401 (the lane names, as clients send them)

CPU_BULK_BATCH_MS = 100          # bulk_batch_ms=auto on the CPU

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
        self.wait_sums_s = {lane: [0.0] * (len(WAIT_BUCKETS_S) + 1) for lane in LANES}   # per bucket

    def waited(self, lane: str, seconds: float) -> None:
        i = bisect.bisect_left(WAIT_BUCKETS_S, seconds)
        self.wait_counts[lane][i] += 1
        self.wait_sums_s[lane][i] += seconds
        self.wait_sum_s[lane] += seconds
        self.waits[lane] += 1

    def wait_histogram(self, lane: str) -> tuple[list[int], list[float]]:
        """(count, sum of seconds) per bucket of WAIT_BUCKETS_S and a last +Inf one, not cumulative."""
        return list(self.wait_counts[lane]), list(self.wait_sums_s[lane])


@dataclass(frozen=True)
class LaneSettings:
    """The lanes' parameters and their defaults, as `rose`'s parameters of the same names (their
    meaning: docs/OPERATIONS.md); ServiceSettings extends it, and RoseSettings takes these defaults."""
    bulk_threshold_tokens: int = 8192
    bulk_min_share: float = 0.25
    bulk_batch_tokens: int = 6144
    bulk_max_inflight: int = 2
    interactive_recent_ms: int = 1000
    bulk_batch_ms: str = "auto"


def parse_bulk_batch_ms(value) -> int | None:
    """`bulk_batch_ms`: None for auto (the device's default), else the milliseconds (0: off);
    ValueError naming the parameter for anything but auto or an integer >= 0."""
    text = str(value).strip().lower()
    if text in ("", "auto"):
        return None
    if not text.isdigit():
        raise ValueError(f"model 'rose': parameter 'bulk_batch_ms' must be auto or an integer >= 0 "
                         f"(milliseconds; 0 = off), got {value!r}")
    return int(text)


def runs_in_step(engine) -> bool:
    """Whether engine.step() runs the batch before it returns (an Engine on the CPU): batches run one
    at a time, and none is in flight while the next is formed."""
    return getattr(getattr(engine, "device", None), "type", None) == "cpu"


def bulk_batch_seconds(value, serial: bool) -> float:
    """`bulk_batch_ms` resolved for an engine (serial: runs_in_step) in seconds, 0.0 = no time cap;
    a time cap on a GPU's engine is refused (ValueError), since its batch times are not measured."""
    ms = parse_bulk_batch_ms(value)
    if ms is None:
        ms = CPU_BULK_BATCH_MS if serial else 0
    if ms and not serial:
        raise ValueError(f"parameter 'bulk_batch_ms' ({ms}) applies to an instance on the CPU, whose "
                         f"batches run one at a time; on a GPU bulk is capped by bulk_batch_tokens "
                         f"and bulk_max_inflight (set bulk_batch_ms to 0 or auto)")
    return ms / 1e3


class BatchCost:
    """The engine's seconds per token, from the batches it ran (their time and tokens summed, each
    new batch discounting the sums before it by DECAY, so the estimate follows the sequences' lengths
    and the machine's load)."""
    DECAY = 0.8

    def __init__(self):
        self.seconds = self.tokens = 0.0

    def observe(self, tokens: int, seconds: float) -> None:
        self.seconds = self.seconds * self.DECAY + seconds
        self.tokens = self.tokens * self.DECAY + tokens

    def tokens_within(self, seconds: float) -> int:
        """Tokens of a batch that takes about `seconds`; 1 (one sequence) before any batch is measured."""
        if self.seconds <= 0.0:
            return 1
        return max(1, int(seconds * self.tokens / self.seconds))


class LanePolicy:
    """How many bulk tokens the next batch may take, from how recent interactive traffic is.

    bulk_batch_tokens      bulk tokens in one batch while interactive traffic is recent
    bulk_max_inflight      batches holding bulk in flight while interactive traffic is recent
    interactive_recent_s   how long after the last interactive request traffic counts as recent
    bulk_batch_s           > 0: the time cap of an engine that runs one batch at a time (bulk_batch_ms),
                           turned into tokens by `cost` (the service observes each batch)
    """

    def __init__(self, bulk_batch_tokens: int, bulk_max_inflight: int, interactive_recent_s: float,
                 bulk_batch_s: float = 0.0):
        self.bulk_batch_tokens = bulk_batch_tokens
        self.bulk_max_inflight = max(1, bulk_max_inflight)
        self.interactive_recent_s = interactive_recent_s
        self.last_interactive = -math.inf          # time.monotonic() of the last interactive admission
        self.bulk_batch_s = bulk_batch_s
        self.cost = BatchCost()

    @classmethod
    def of(cls, settings, engine) -> "LanePolicy":
        """The policy of `settings` (LaneSettings' fields), bulk_batch_ms resolved for `engine`."""
        return cls(settings.bulk_batch_tokens, settings.bulk_max_inflight, settings.interactive_recent_ms / 1e3,
                   bulk_batch_seconds(settings.bulk_batch_ms, runs_in_step(engine)))

    def runs_alone(self, lane: str, tokens: int) -> bool:
        """Whether a request may run as one batch of its own (inline): interactive, or bulk within the cap."""
        cap = self.bulk_cap()
        return lane == INTERACTIVE or cap is None or tokens <= cap

    def ran(self, tokens: int, started: float) -> None:
        """A batch of `tokens` whose step() began at time.perf_counter() `started` has returned: under a
        time cap (an engine that runs the batch inside step()) its time is its cost."""
        if self.bulk_batch_s:
            self.cost.observe(tokens, time.perf_counter() - started)

    def seen(self, lane: str, now: float) -> None:
        if lane == INTERACTIVE:
            self.last_interactive = now

    def bulk_room(self, now: float, interactive_waiting: bool, bulk_in_flight: int) -> int | None:
        """Bulk tokens the next batch may take: None (the whole budget) without recent interactive
        traffic; else 0 with `bulk_max_inflight` bulk batches in flight, or `bulk_batch_tokens`.
        With a time cap: 0 while interactive sequences wait (their batch carries bulk's share only),
        else the cap, and at most `bulk_batch_tokens` while interactive traffic is recent."""
        recent = interactive_waiting or now - self.last_interactive <= self.interactive_recent_s
        if self.bulk_batch_s:
            if interactive_waiting:
                return 0
            cap = self.bulk_cap()
            return min(cap, self.bulk_batch_tokens) if recent else cap
        if not recent:
            return None
        return 0 if bulk_in_flight >= self.bulk_max_inflight else self.bulk_batch_tokens

    def bulk_cap(self) -> int | None:
        """The most bulk tokens any batch may take, bulk_min_share's included (at least one
        sequence): those of `bulk_batch_s` at the measured cost; None without a time cap."""
        return self.cost.tokens_within(self.bulk_batch_s) if self.bulk_batch_s else None
