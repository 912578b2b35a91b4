"""EmbeddingService: the scheduler thread and the completion side, independent of Triton.

    submit(request) -> the pool                       (any thread; returns at once; an idle service
                                                       launches the request on the calling thread)
    loop thread:  form the next FCFS batch and launch it: engine.step(batch) -> LazyTensor
                  collect finished batches (in launch order, never blocking)
                  with nothing left to launch, block on the oldest batch in flight
    on_complete(request) is called once per request when all of its sequences are computed
    (request.output filled) or it failed (request.error set).

Up to `max_inflight` batches are in flight, and a batch formed is launched before finished ones
are collected and answered, so the device never waits for the host between batches. Two lanes
(lanes.py): each batch takes interactive sequences first, and while interactive traffic is recent
the LanePolicy caps the bulk tokens of a batch and the bulk batches in flight; with bulk held back
the loop thread waits for the oldest batch or a new request, whichever comes first. A finished
batch's requests are answered by `response_threads` responder threads side by side (responders.py)
while the loop thread goes on; the loop thread answers itself a lone request on an idle service
(no hand-over on the latency path) and requests with token-level outputs (their rows may be views
of buffers the engine reuses), and every request when response_threads is 0.

Inline launch (`inline=True`; the pattern: inline_worker.py): a request that arrives while the service
is idle (nothing queued, nothing in flight, nothing being launched) and fits in one batch is launched
by the submitting thread itself, so its forward pass starts without waiting for the loop thread to wake.
- A lone interactive request (the previous submit() returned at least `backlog_us` ago) is run whole
  there: launched, waited for, sliced and answered on the submitting thread, with no hand-over at
  all (`stats.whole_inline` counts them).
- A request that comes within `backlog_us` of the previous submit() returning is part of a backlog
  (Triton hands a decoupled Python model the next request only when execute() returns): it is
  launched and submit() returns at once, so the requests behind it queue in the pool and batch as
  usual; the loop thread collects and answers it as any batch. Such a backlog, or a request that
  finds the service busy, means concurrent traffic: no request is run whole for BATCH_HOLD_S after
  the last sign of it. (Running requests of a concurrent load whole on the caller made them
  batches of one: pplx-embed's 16 clients of 512-word texts took 44 ms p50 instead of 18-28.)
- run_lone(): the same for one sequence whose graph is captured, shorter still: the caller hands over
  the ids alone (no Request, no batch), the engine replays its graph (Engine.launch_lone) and the
  row is answered through the caller's `answer` on the calling thread (`stats.lone` counts them).
  (Handing the wait and the answer to the loop thread, so that execute() returns before the answer
  is sent, measured the same on the H200: RESULTS-host-path.md.)

Stage timing: with a StageClock (serving/stage_clock.py) each request is marked at every stage of
its host path, and the engine's step is split into its own stages. Failure handling (overload,
cancellation, out of memory, other errors, shutdown): outcomes.py.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

import numpy as np

from rose_backend.serving.inline_worker import IdleInlineWorker
from rose_backend.serving.lanes import BULK, INTERACTIVE, LanePolicy, LaneSettings
from rose_backend.serving.memory import HostMemoryTrimmer
from rose_backend.serving.oom_retry import retry_in_halves
from rose_backend.serving.outcomes import (CANCELLED, SHUTTING_DOWN, Overloaded, ServiceStats, ShuttingDown,
                                           drop_caller_objects, is_out_of_memory)
from rose_backend.serving.query_lane import QueryLane, bulk_in_flight
from rose_backend.serving.query_lane import next_batch as next_of_two
from rose_backend.serving.responders import Responders
from rose_backend.serving.scheduler import Piece, Request, ScheduledBatch, Scheduler

log = logging.getLogger(__name__)
BATCH_HOLD_S = 0.1          # after a sign of concurrent traffic, this long without whole inline runs


class EmbeddingService(IdleInlineWorker):
    def __init__(self, engine, on_complete: Callable[[Request], None], *, max_batch_tokens: int = 16384,
                 max_batch_seqs: int = 64, max_inflight: int = 2, max_queued_tokens: int = 1 << 20,
                 inline: bool = True, clock=None, on_piece: Callable | None = None, response_threads: int = 4,
                 host_memory_trim: str = "idle", lane_settings: LaneSettings = LaneSettings(),
                 release: Callable[[Request], None] | None = None, query_engine=None, backlog_us: int | None = 250):
        """Limits as the `rose` parameters of the same names, with their defaults (RoseSettings;
        tests/triton/test_settings.py holds the two together); lane_settings: a LaneSettings, or any settings
        with its fields (RoseSettings), steering the lanes; inline: run a lone request on the submitting
        thread (the resolved `inline_execute`); clock: a StageClock; on_piece(request, first seq, last
        seq, {name: rows}): takes a piece's sparse / ColBERT rows as its batch is collected (views of
        reused buffers: valid in the call and the on_complete it leads to); response_threads,
        host_memory_trim: as the `rose` parameters (responders.py, memory.py); release(request): lets
        go of the caller's objects once the request is answered (default drop_caller_objects);
        query_engine: an Engine on the same weights for interactive batches (query_lane.py), or None;
        backlog_us: an inline request is run whole unless it came this soon after the previous
        submit() returned (None: never whole; the resolved `inline_backlog_us`)."""
        super().__init__("rose-scheduler")
        self.engine = engine
        self.on_complete = on_complete
        self.on_piece = on_piece
        self.release = release or drop_caller_objects
        self.inline = inline
        self.clock = clock                                   # a StageClock, or None
        self._busy = False                                   # a thread is running the engine's step
        self._backlog_ns = None if backlog_us is None else int(backlog_us * 1000)
        self._returned_ns: int | None = None                 # when submit() last returned
        self._batch_until_ns = 0                             # no whole inline run before this (concurrent traffic)
        self._whole = False                                  # the inline request is run whole (submit's thread)
        self.scheduler = Scheduler(max_batch_tokens, max_batch_seqs, bulk_threshold_tokens=lane_settings.bulk_threshold_tokens,
                                   bulk_min_share=lane_settings.bulk_min_share)
        self.lanes = LanePolicy(lane_settings.bulk_batch_tokens, lane_settings.bulk_max_inflight,
                                lane_settings.interactive_recent_ms / 1e3)
        self.max_inflight = max(1, max_inflight)
        self.max_queued_tokens = max_queued_tokens          # 0: unbounded
        self.stats = ServiceStats()
        self._inflight: deque[tuple[ScheduledBatch, object]] = deque()
        self.query = None if query_engine is None else QueryLane(query_engine)
        self._host_memory = HostMemoryTrimmer(host_memory_trim)
        self._responders = Responders(response_threads, self._answer, clock=clock)
        self._thread.start()

    # ---- any thread -------------------------------------------------------------------------
    def submit(self, request: Request) -> None:
        if request.num_seqs == 0 or (request.token_outputs and self.on_piece is None):
            raise ValueError("a request needs at least one sequence" if request.num_seqs == 0 else
                             "this service takes no token-level outputs (no on_piece handler)")
        try:
            super().submit(request)
        finally:
            self._returned_ns = time.perf_counter_ns()

    def run_lone(self, input_ids: np.ndarray, answer: Callable[[np.ndarray], None], marks: list | None = None) -> bool:
        """One sequence of token ids (int32 [T], checked) on an idle service: the engine's lone run,
        then answer(row) with its [1, D] row (a reused buffer, valid in the call), or answer(error)
        if the forward pass failed. False, with nothing done, where submit() is the way: the service
        is not idle, the request is part of a backlog or bulk, or its configuration has no graph
        yet. `marks`: the stage clock's list, which the engine's stages join."""
        tokens = input_ids.shape[0]
        with self._cond:
            if self._stopping:
                raise ShuttingDown(SHUTTING_DOWN)
            lane = BULK if tokens > self.scheduler.bulk_threshold_tokens else INTERACTIVE
            if not (self._idle() and self._runs_whole(lane)):
                return False
            run = self.engine.lone_run(tokens)
            if run is None:
                return False
            self._busy = True
            self.stats.requests += 1
            self.lanes.seen(INTERACTIVE, time.monotonic())
            lane_stats = self.scheduler.stats
            lane_stats.waited(INTERACTIVE, 0.0)
            lane_stats.batches[INTERACTIVE] += 1
        try:
            self.engine.launch_lone(run, input_ids, marks)
        except Exception:
            self.stats.failed += 1
            self._end_lone()
            raise
        self._answer_lone(answer, tokens)
        return True

    def _answer_lone(self, answer: Callable[[np.ndarray], None], tokens: int) -> None:
        """Wait for the lone launch's row, answer it, give the engine back."""
        try:
            try:
                row = self.engine.wait_lone()
            except Exception as e:
                self.stats.failed += 1
                log.exception("a lone forward pass failed")
                answer(e)
                return
            self.stats.batches += 1
            self.stats.batch_tokens += tokens
            self.stats.lone += 1
            self.stats.completed += 1
            answer(row)
        except Exception:
            log.exception("sending a response failed")
        finally:
            self._end_lone()

    def _end_lone(self) -> None:
        with self._cond:
            self._busy = False
            self._cond.notify()
        self._returned_ns = time.perf_counter_ns()

    def _admit(self, request: Request) -> bool:
        lane = self.scheduler.classify(request)     # bulk queued counts against bulk only
        queued = self.scheduler.lane_tokens[INTERACTIVE] if lane == INTERACTIVE else self.scheduler.queued_tokens
        if self.max_queued_tokens and queued + request.num_tokens > self.max_queued_tokens and queued > 0:
            raise Overloaded(f"overloaded: {queued} tokens already queued "
                             f"(limit max_queued_tokens={self.max_queued_tokens}); retry later")
        self.stats.requests += 1
        self.lanes.seen(lane, time.monotonic())
        inline = (self._idle() and request.num_tokens <= self.scheduler.max_batch_tokens
                  and request.num_seqs <= self.scheduler.max_batch_seqs)
        if inline:
            self._busy = True
            self._whole = self._runs_whole(lane)
        else:
            self.scheduler.add(request)
            self._batch_until_ns = time.perf_counter_ns() + int(BATCH_HOLD_S * 1e9)    # it found the service busy
        return inline

    def _idle(self) -> bool:
        """With the lock held: a request now may run on the submitting thread (inline launch)."""
        return self.inline and not self._busy and not self._running() and not self.scheduler.has_work()

    def _runs_whole(self, lane: str) -> bool:
        """With the lock held: an inline request of `lane` is also waited for and answered there: no
        backlog (the previous submit() returned at least backlog_us ago) and no concurrent traffic
        for BATCH_HOLD_S."""
        if self._backlog_ns is None or lane != INTERACTIVE:
            return False
        now = time.perf_counter_ns()
        if self._returned_ns is not None and now - self._returned_ns < self._backlog_ns:
            self._batch_until_ns = now + int(BATCH_HOLD_S * 1e9)
            return False
        return now >= self._batch_until_ns

    def _end_inline(self, request: Request) -> None:
        with self._cond:
            self._busy = False
            self._cond.notify()

    @property
    def queued_tokens(self) -> int:
        return self.scheduler.queued_tokens

    def stop(self, timeout: float = 30.0) -> None:
        """Refuse new requests and finish everything admitted so far; after `timeout` seconds,
        answer whatever is still waiting with a "shutting down" error (batches already running
        are collected and delivered), then stop the loop thread."""
        super().stop(timeout)
        self._responders.stop()

    def _time_up(self, timeout: float) -> None:
        log.error("the pool did not drain within %.0f s; failing the %d tokens still queued",
                  timeout, self.scheduler.queued_tokens)

    # ---- loop thread ------------------------------------------------------------------------
    def _loop(self) -> None:
        bind = getattr(self.engine, "bind_thread", None)        # this thread's CUDA device = the engine's
        if bind is not None:
            bind()
        while True:
            batch = None
            with self._cond:
                while not self._abort and not self._running() and (
                        self._busy or (not self._stopping and not self.scheduler.has_work())):
                    self._cond.wait()             # idle, or an inline request owns the engine
                if self._stopping and not self.scheduler.has_work() and not self._running():
                    return
                if self._abort:
                    self._abort_all()
                    return
                held, engine = False, None        # held: bulk held back (LanePolicy), or two engines running
                if self.query is not None and not self._busy:
                    batch, engine = next_of_two(self)
                    held = batch is None and bulk_in_flight(self)
                elif len(self._inflight) < self.max_inflight and not self._busy:
                    batch = self.scheduler.next_batch(self._bulk_room())
                    held = batch is None and bool(self._inflight) and self.scheduler.has_work(BULK)
                self._busy = batch is not None         # no inline step until this one is launched
                if held:                          # an interactive request may come before the oldest is done
                    self._wait_oldest_or_interactive()
                gone = self.scheduler.take_cancelled()
            try:
                for r in gone:
                    self._finish_cancelled(r)
                if batch is not None:             # the device first: launch, then answer what finished
                    try:
                        self._launch(batch, engine)
                    finally:
                        with self._cond:
                            self._busy = False
                    self._collect(block=False)
                elif self._running():
                    self._collect(block=not held)
            except Exception:  # never let the loop die: that would strand every request
                log.exception("scheduler loop error")
            del batch, gone                   # hold no finished request while waiting (see release)
            self._host_memory.maybe_trim(idle=not self._running() and not self.scheduler.has_work())

    def _abort_all(self) -> None:
        """Called with the lock held when stop()'s time is up: answer everything still waiting."""
        left = self.scheduler.waiting() + self.scheduler.take_cancelled()
        for r in left:
            self.scheduler.remove(r)
        self._cond.release()
        try:
            try:
                while self._running():
                    self._collect(block=True)
            except Exception:
                log.exception("collecting a batch during shutdown failed")
            for r in left:
                if not r.finished:
                    r.error, r.error_kind = SHUTTING_DOWN, "unavailable"
                    self._finish(r)
        finally:
            self._cond.acquire()

    def _bulk_room(self) -> int | None:
        """Bulk tokens the next batch may take (LanePolicy); called with the lock held."""
        if self._stopping:
            return None                           # draining: no batch is held back
        bulk_in_flight = sum(1 for b, _ in self._inflight if BULK in b.lanes())
        return self.lanes.bulk_room(time.monotonic(), self.scheduler.has_work(INTERACTIVE), bulk_in_flight)

    def _wait_oldest_or_interactive(self, poll_s: float = 0.0002) -> None:
        """With the lock held: wait until the oldest batch in flight is done, an interactive request
        is admitted (submit() notifies) or the service stops; the oldest batch is polled."""
        oldest = [q[0][1] for q in self._queues() if q]
        while not (any(h.ready() for h in oldest) or self._stopping or (
                self.scheduler.has_work(INTERACTIVE) and (self.query is None or self.query.free()))):
            self._cond.wait(poll_s)

    def _queues(self) -> list:            # the batches in flight, per engine: the main one's, the query one's
        return [self._inflight] if self.query is None else [self._inflight, self.query.inflight]

    def _running(self) -> bool:
        return any(self._queues())

    def _run_inline(self, r: Request) -> None:
        """Launch one whole request now, from the calling thread (the service is idle and owns no
        batch). Run whole (_admit decided): wait for it and answer it here too. Otherwise the loop
        thread collects and answers it, so the caller (Triton's execute) returns at once and requests
        arriving meanwhile queue in the pool and batch as usual."""
        r.next_seq = r.num_seqs
        self.scheduler.stats.waited(r.lane, time.monotonic() - r.admitted_at)
        batch = ScheduledBatch([Piece(r, 0, r.num_seqs, 0)], r.num_tokens, r.num_seqs)
        if not self._whole:
            self._launch(batch)
            return
        handle = self._start(batch)
        if handle is None:                    # answered already (failed), or split after running out of memory
            return
        with self._cond:
            self._count_launch(batch)
            self.stats.whole_inline += 1
        self._collect_one(batch, handle)      # nothing else is queued or in flight: answered on this thread

    def _mark(self, batch: ScheduledBatch, stage: str | None = None, engine=None) -> None:
        """Stage timing: `stage` now, or (None) the engine's own stages of the step just launched."""
        if self.clock is not None:
            marks = [(stage, time.perf_counter_ns())] if stage else getattr(engine or self.engine, "last_marks", None) or ()
            for name, t in marks:
                for p in batch.pieces:
                    self.clock.mark(p.request, name, t)

    def _launch(self, batch: ScheduledBatch, engine=None) -> None:
        batch = batch.live()                  # a request may have failed since it was scheduled
        if batch is None:
            return
        handle = self._start(batch, engine)
        if handle is None:
            return
        with self._cond:
            self._count_launch(batch)
            on_query = self.query is not None and engine is self.query.engine
            (self.query.inflight if on_query else self._inflight).append((batch, handle))   # an inline launch wakes the loop

    def _start(self, batch: ScheduledBatch, engine=None):
        """engine.step(batch): its handle, or None when the batch was answered with an error (or split
        and retried after running out of memory) instead."""
        self._mark(batch, "scheduled")
        try:
            handle = (engine or self.engine).step(batch.pack())
        except Exception as e:
            if is_out_of_memory(e):
                retry_in_halves(self, batch, e)
                return None
            log.exception("forward pass failed for a batch of %d sequences / %d tokens",
                          batch.num_seqs, batch.num_tokens)
            self._fail(batch, f"the forward pass failed: {type(e).__name__}: {e}")
            return None
        self._mark(batch, engine=engine)
        return handle

    def _count_launch(self, batch: ScheduledBatch) -> None:
        self.stats.batches += 1
        self.stats.batch_tokens += batch.num_tokens
        for lane in batch.lanes():
            self.scheduler.stats.batches[lane] += 1

    def _collect(self, block: bool) -> None:
        q = self.query.inflight if self.query is not None else ()   # the query engine's batch when done
        while q and (q[0][1].ready() or (block and not self._inflight)):   # (blocks only if nothing else runs)
            self._collect_one(*q[0])
            with self._cond:
                q.popleft()
        while self._inflight and (block or self._inflight[0][1].ready()):
            batch, handle = self._inflight[0]
            self._collect_one(batch, handle)
            with self._cond:            # popped only once delivered: an inline step waits for it
                self._inflight.popleft()
            block = False                                       # block for the oldest one only

    def _collect_one(self, batch: ScheduledBatch, handle) -> None:
        try:
            emb = handle.synchronize()                          # [S, D] float32
        except Exception as e:
            log.exception("collecting a batch failed")
            self._fail(batch, f"the forward pass failed: {type(e).__name__}: {e}")
        else:
            self._mark(batch, "result_on_host")
            self._deliver(batch, emb, getattr(handle, "extras", None))

    def _deliver(self, batch: ScheduledBatch, emb: np.ndarray, extras: dict | None = None) -> None:
        token = 0                                                # first token of the piece in the batch
        # Hand answers to the responders unless this is a lone request on an idle service.
        hand_off = bool(self._responders) and (len(batch.pieces) > 1 or sum(map(len, self._queues())) > 1
                                              or self.scheduler.has_work())
        for p in batch.pieces:
            r = p.request
            t0, t1 = int(r.offsets[p.first]), int(r.offsets[p.last])
            token += t1 - t0
            if r.finished:
                continue
            n = p.last - p.first
            if r.output is None and n == r.num_seqs:           # the whole request: its rows of the handle's own copy
                r.output = emb[p.row:p.row + n]
            else:
                if r.output is None:
                    r.output = np.empty((r.num_seqs, emb.shape[1]), dtype=np.float32)
                r.output[p.first:p.last] = emb[p.row:p.row + n]
            if r.token_outputs:      # token rows taken now (the buffers are reused); a failure fails r only
                try:
                    self.on_piece(r, p.first, p.last, {k: extras[k][token - (t1 - t0):token] for k in r.token_outputs})
                except Exception as e:
                    log.exception("taking the token-level outputs of a request failed")
                    r.error = r.error or f"taking the token-level outputs failed: {type(e).__name__}: {e}"
            r.remaining -= n
            if r.remaining == 0:
                self._finish(r, hand_off and not r.token_outputs)

    def _fail(self, batch: ScheduledBatch, message: str) -> None:
        failed = [r for r in {id(p.request): p.request for p in batch.pieces}.values() if not r.finished]
        with self._cond:   # the failed request's later sequences must not be computed
            for r in failed:
                r.error = message
                self.scheduler.remove(r)
        for r in failed:
            self._finish(r)

    def _finish_cancelled(self, r: Request) -> None:
        # Not computed further; the response sender still gets its FINAL flag (with an error) so
        # that Triton releases the request, though the caller is no longer listening.
        if r.finished:
            return
        self.stats.cancelled += 1
        r.error, r.error_kind = CANCELLED, "cancelled"
        r.finished = True
        self._answer(r)

    def _finish(self, r: Request, hand_off: bool = False) -> None:
        if r.finished:                    # exactly one response per request
            return
        r.finished = True
        if r.error is None:
            self.stats.completed += 1
        else:
            self.stats.failed += 1
        if self.clock is not None:
            self.clock.mark(r, "sliced")
        if hand_off:
            self._responders.hand(r)
        else:
            self._answer(r)

    def _answer(self, r: Request) -> None:
        try:
            self.on_complete(r)
        except Exception:
            log.exception("sending a response failed")
        if self.clock is not None and r.error is None:
            self.clock.finish(r, "+".join(sorted(r.token_outputs)))   # dense-only: ungrouped
        self.release(r)

