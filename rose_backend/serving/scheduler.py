"""The request pool and the first-come-first-served batch former (Tulip's scheduler), in two lanes.

Requests accumulate while the engine is busy, each in its lane (lanes.py): interactive or bulk.
`next_batch()` takes sequences off the front of the interactive lane first, then of the bulk lane,
oldest request first and in each request's own order, until the token budget or the sequence cap
is reached. Within a lane nothing is sorted: a short request that arrives first is never held
behind a long one (latency is proportional to tokens, so packing buys nothing). While interactive
work waits beyond one batch, bulk keeps `bulk_min_share` of the batch (never starved); the caller
may cap the bulk tokens of a batch (`bulk_tokens`: the service's LanePolicy). A request's sequences
may be split across batches; a single sequence longer than the budget goes out alone.
Not thread-safe by itself: the service holds a lock around it.
"""
from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rose_backend.engine.batch import PackedBatch
from rose_backend.serving.lanes import BULK, INTERACTIVE, LANES, LaneSettings, LaneStats


@dataclass(slots=True, eq=False)
class Request:
    """One client request: its sequences, its result rows, and how to answer it."""
    input_ids: np.ndarray                        # [T] int32, the request's sequences end to end
    seq_lens: np.ndarray                         # [S] int32
    handle: Any = None                           # opaque to the pool (the Triton response sender)
    is_cancelled: Callable[[], bool] | None = None
    token_outputs: frozenset = frozenset()       # token-level outputs asked for ("sparse", "colbert")
    options: Any = None                          # opaque to the pool (the serving layer's output options)
    token_type_ids: np.ndarray | None = None     # [T] int32 segment ids (BERT cross-encoders), or None
    lane: str | None = None                      # interactive | bulk; None: the scheduler decides by size
    offsets: np.ndarray = field(init=False)      # [S + 1] start of each sequence in input_ids
    next_seq: int = field(init=False, default=0)     # first sequence not yet scheduled
    remaining: int = field(init=False)               # sequences not yet computed
    output: np.ndarray | None = field(init=False, default=None)   # [S, D] float32, filled as batches finish
    token_results: dict = field(init=False, default_factory=dict)  # name -> [(first token, rows view)]
    error: str | None = field(init=False, default=None)
    error_kind: str = field(init=False, default="internal")   # internal | unavailable | cancelled
    admitted_at: float = field(init=False, default_factory=time.monotonic)
    finished: bool = field(init=False, default=False)
    marks: list = field(init=False, default_factory=list)         # (stage, ns) when stage timing is on

    def __post_init__(self):
        self.offsets = np.zeros(len(self.seq_lens) + 1, dtype=np.int64)
        np.cumsum(self.seq_lens, out=self.offsets[1:])
        self.remaining = len(self.seq_lens)

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    def cancelled(self) -> bool:
        return self.is_cancelled is not None and self.is_cancelled()


@dataclass(slots=True)
class Piece:
    """Sequences [first, last) of one request, placed at rows [row, row + last - first) of a batch."""
    request: Request
    first: int
    last: int
    row: int


@dataclass(slots=True)
class ScheduledBatch:
    pieces: list[Piece]
    num_tokens: int
    num_seqs: int

    def pack(self) -> PackedBatch:
        ids = np.concatenate([p.request.input_ids[p.request.offsets[p.first]:p.request.offsets[p.last]]
                              for p in self.pieces])
        lens = np.concatenate([p.request.seq_lens[p.first:p.last] for p in self.pieces])
        wanted = frozenset().union(*(p.request.token_outputs for p in self.pieces))
        types = None
        if any(p.request.token_type_ids is not None for p in self.pieces):
            types = np.concatenate([_types(p.request)[p.request.offsets[p.first]:p.request.offsets[p.last]]
                                    for p in self.pieces]).astype(np.int32, copy=False)
        return PackedBatch(ids.astype(np.int32, copy=False), lens.astype(np.int32, copy=False), wanted, types)

    def requests(self) -> list[Request]:
        return [p.request for p in self.pieces]

    def lanes(self) -> set[str]:
        return {p.request.lane for p in self.pieces}

    @classmethod
    def of(cls, pieces: list[Piece]) -> "ScheduledBatch":
        """A batch of `pieces` in this order, rows renumbered from 0."""
        out, row, tokens = [], 0, 0
        for p in pieces:
            out.append(Piece(p.request, p.first, p.last, row))
            row += p.last - p.first
            tokens += int(p.request.offsets[p.last] - p.request.offsets[p.first])
        return cls(out, tokens, row)

    def live(self) -> "ScheduledBatch | None":
        """This batch without the pieces of requests already answered (failed or cancelled)."""
        if all(not p.request.finished for p in self.pieces):
            return self
        kept = [p for p in self.pieces if not p.request.finished]
        return ScheduledBatch.of(kept) if kept else None

    def split(self) -> tuple["ScheduledBatch", "ScheduledBatch"]:
        """Two batches holding about half of the tokens each (at least one sequence each), in
        order; for retrying a batch that ran out of memory. Needs num_seqs >= 2."""
        if self.num_seqs < 2:
            raise ValueError("a batch of one sequence cannot be split")
        lens = np.concatenate([p.request.seq_lens[p.first:p.last] for p in self.pieces])
        ends, half = np.cumsum(lens), self.num_tokens / 2
        i = int(np.searchsorted(ends, half))            # rows [0, cut) go first, cut nearest half
        cut = i + 1 if i == 0 or ends[i] - half < half - ends[i - 1] else i
        cut = min(max(cut, 1), self.num_seqs - 1)
        first, second = [], []
        for p in self.pieces:
            n = p.last - p.first
            if p.row + n <= cut:
                first.append(p)
            elif p.row >= cut:
                second.append(p)
            else:
                mid = p.first + cut - p.row
                first.append(Piece(p.request, p.first, mid, p.row))
                second.append(Piece(p.request, mid, p.last, 0))
        return ScheduledBatch.of(first), ScheduledBatch.of(second)


def _types(r: Request) -> np.ndarray:
    return r.token_type_ids if r.token_type_ids is not None else np.zeros(r.num_tokens, dtype=np.int32)


class Scheduler:
    def __init__(self, max_batch_tokens: int, max_batch_seqs: int, cancel_check_after: float = 0.05,
                 bulk_threshold_tokens: int = LaneSettings.bulk_threshold_tokens,
                 bulk_min_share: float = LaneSettings.bulk_min_share):
        if max_batch_tokens <= 0 or max_batch_seqs <= 0:
            raise ValueError(f"max_batch_tokens ({max_batch_tokens}) and max_batch_seqs "
                             f"({max_batch_seqs}) must be positive")
        if not 0.0 <= bulk_min_share <= 1.0:
            raise ValueError(f"bulk_min_share must be between 0 and 1, got {bulk_min_share}")
        self.max_batch_tokens, self.max_batch_seqs = max_batch_tokens, max_batch_seqs
        self.bulk_threshold_tokens, self.bulk_min_share = bulk_threshold_tokens, bulk_min_share
        self.pools: dict[str, deque[Request]] = {lane: deque() for lane in LANES}   # one FCFS pool per lane
        self.queued_tokens = 0                    # tokens admitted but not yet scheduled
        self.lane_tokens = {lane: 0 for lane in LANES}    # the same, per lane
        self.lane_seqs = {lane: 0 for lane in LANES}      # sequences admitted but not yet scheduled
        self.cancel_check_after = cancel_check_after   # seconds in the pool before is_cancelled is asked
        self.cancelled: list[Request] = []
        self.stats = LaneStats()

    def classify(self, request: Request) -> str:
        """The request's lane: its own, else bulk when it carries more than bulk_threshold_tokens."""
        if request.lane is None:
            request.lane = BULK if request.num_tokens > self.bulk_threshold_tokens else INTERACTIVE
        return request.lane

    def add(self, request: Request) -> None:
        lane = self.classify(request)
        self.pools[lane].append(request)
        self._count(lane, request.num_tokens, request.num_seqs)

    def _count(self, lane: str, tokens: int, seqs: int) -> None:
        self.queued_tokens += tokens
        self.lane_tokens[lane] += tokens
        self.lane_seqs[lane] += seqs

    def has_work(self, lane: str | None = None) -> bool:
        return bool(self.pools[lane]) if lane else any(self.pools.values())

    def waiting(self) -> list[Request]:
        """Every request still in the pool, interactive first."""
        return [r for lane in LANES for r in self.pools[lane]]

    def take_cancelled(self) -> list[Request]:
        """Requests that next_batch() found cancelled and removed since the last call."""
        gone, self.cancelled = self.cancelled, []
        return gone

    def remove(self, req: Request) -> None:
        pool = self.pools.get(req.lane)
        if pool is not None and req in pool:
            pool.remove(req)
            self._count(req.lane, -int(req.offsets[-1] - req.offsets[req.next_seq]), req.next_seq - req.num_seqs)

    def next_batch(self, bulk_tokens: int | None = None, lane: str | None = None,
                   bulk_cap: int | None = None) -> ScheduledBatch | None:
        """The next batch: interactive sequences first, then bulk ones, at most `bulk_tokens` of
        them (None: up to the budget; 0: none) unless interactive work waits beyond this batch, when
        bulk keeps its share (bulk_min_share of the tokens and sequences, at least one sequence).
        bulk_cap: at most this many bulk tokens whatever the share (its one sequence excepted).
        lane: one lane's sequences only, up to the whole budget (the query lane's two engines; bulk's
        within bulk_cap)."""
        if lane is not None:
            pieces: list[Piece] = []
            cap = self.max_batch_tokens if lane != BULK or bulk_cap is None else min(bulk_cap, self.max_batch_tokens)
            self._take(lane, pieces, 0, 0, cap, self.max_batch_seqs, time.monotonic())
            return ScheduledBatch.of(pieces) if pieces else None
        inter, bulk = self.pools[INTERACTIVE], self.pools[BULK]
        tokens_for_inter, seqs_for_inter = self.max_batch_tokens, self.max_batch_seqs
        bulk_room = self.max_batch_tokens if bulk_tokens is None else bulk_tokens
        if bulk_cap is not None:
            bulk_room = min(bulk_room, bulk_cap)
        if inter and bulk:
            head = bulk[0]
            share = int(self.bulk_min_share * self.max_batch_tokens)
            share_tokens = min(max(share if bulk_cap is None else min(share, bulk_cap),
                                   int(head.seq_lens[head.next_seq])), self.max_batch_tokens)
            share_seqs = max(1, math.ceil(self.bulk_min_share * self.max_batch_seqs)) if self.bulk_min_share else 0
            if share_tokens and share_seqs and (self.lane_tokens[INTERACTIVE] > self.max_batch_tokens - share_tokens or
                                                self.lane_seqs[INTERACTIVE] > self.max_batch_seqs - share_seqs):
                tokens_for_inter = self.max_batch_tokens - share_tokens     # interactive waits beyond this batch
                seqs_for_inter = self.max_batch_seqs - share_seqs
                bulk_room = max(bulk_room, share_tokens)
        pieces: list[Piece] = []
        now = time.monotonic()
        tokens, seqs = self._take(INTERACTIVE, pieces, 0, 0, tokens_for_inter, seqs_for_inter, now)
        if bulk_room > 0:
            self._take(BULK, pieces, tokens, seqs, min(self.max_batch_tokens, tokens + bulk_room),
                       self.max_batch_seqs, now)
        return ScheduledBatch.of(pieces) if pieces else None

    def _take(self, lane: str, pieces: list[Piece], tokens: int, seqs: int, token_cap: int, seq_cap: int,
              now: float) -> tuple[int, int]:
        """Append pieces of `lane`'s requests, in order, while the batch stays within token_cap
        tokens and seq_cap sequences (the first sequence of an empty batch goes whatever its length)."""
        pool = self.pools[lane]
        while pool and seqs < seq_cap:
            req = pool[0]
            # Asking whether a caller has gone costs a round trip to the server, so only
            # requests that have waited a while are asked; fresh ones are simply computed.
            if now - req.admitted_at > self.cancel_check_after and req.cancelled():
                self.remove(req)
                self.cancelled.append(req)
                continue
            first = i = req.next_seq
            taken = 0
            while i < req.num_seqs and seqs < seq_cap:
                n = int(req.seq_lens[i])
                if seqs and tokens + n > token_cap:
                    break                         # this sequence waits for the next batch
                tokens += n
                taken += n
                seqs += 1
                i += 1
            if i > first:
                if first == 0:
                    self.stats.waited(lane, now - req.admitted_at)
                pieces.append(Piece(req, first, i, 0))
                req.next_seq = i
                self._count(lane, -taken, first - i)
            if req.next_seq < req.num_seqs:
                break                             # the batch is full; the rest of req goes next
            pool.popleft()
        return tokens, seqs
