"""EmbeddingService: the scheduler thread and the request pool, independent of Triton.

    submit(request) -> the pool                       (any thread; returns at once)
    loop thread:  form the next FCFS batch and launch it: engine.step(batch) -> LazyTensor
                  collect finished batches (in launch order, never blocking)
                  with nothing left to launch, block on the oldest batch in flight
    on_complete(request): once per request, its rows computed (request.output) or failed
                  (request.error); completion.py answers, beside the loop thread (responders.py)

Up to `max_inflight` batches are in flight; a batch formed is launched before finished ones are
collected. Lanes (lanes.py): interactive sequences first; bulk capped (on the CPU, in time).

Inline (`inline=True`, inline_worker.py): a request arriving at an idle service that fits in one
batch is launched by the submitting thread. One without signs of concurrent traffic (whole_runs.py)
is also waited for and answered there (`stats.whole_inline`); run_lone() does so for one sequence
whose graph is captured, with no Request or batch (engine/lone.py, `stats.lone`). Otherwise the
loop thread answers it, so the requests behind it batch. An arrival after every request was
answered, while the loop thread still finishes the last, waits up to IDLE_WAIT_S for it.
Failures (overload, cancellation, out of memory, shutdown): outcomes.py.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

import numpy as np

from rose_backend.serving.completion import Completion
from rose_backend.serving.inline_worker import IdleInlineWorker
from rose_backend.serving.lanes import BULK, INTERACTIVE, LanePolicy
from rose_backend.serving.memory import HostMemoryTrimmer
from rose_backend.serving.oom_retry import retry_in_halves
from rose_backend.serving.outcomes import (SHUTTING_DOWN, Overloaded, ServiceStats, ShuttingDown, abort_all,
                                           drop_caller_objects, is_out_of_memory)
from rose_backend.serving.query_lane import QueryLane, bulk_in_flight
from rose_backend.serving.query_lane import next_batch as next_of_two
from rose_backend.serving.scheduler import Piece, Request, ScheduledBatch, Scheduler
from rose_backend.serving.service_settings import ServiceSettings
from rose_backend.serving.whole_runs import WholeRuns

log = logging.getLogger(__name__)
IDLE_WAIT_S = 0.002         # the longest an arrival waits for the loop thread to finish an answered request


class EmbeddingService(IdleInlineWorker):
    def __init__(self, engine, on_complete: Callable[[Request], None], settings: ServiceSettings = ServiceSettings(), *,
                 clock=None, on_piece: Callable | None = None, release: Callable[[Request], None] | None = None,
                 query_engine=None):
        """settings: the limits and lanes (service_settings.py); clock: a StageClock; query_engine: an
        Engine on the same weights for interactive batches (query_lane.py); on_piece and release:
        completion.py."""
        super().__init__("rose-scheduler")
        self.engine, self.on_piece, self.inline = engine, on_piece, settings.inline
        self.clock = clock                                   # a StageClock, or None
        self._busy = False                                   # a thread is running the engine's step
        self.whole_runs, self._whole = WholeRuns(settings.backlog_us), False     # _whole: the inline request runs whole
        self._admitted = 0                                   # requests admitted by submit() (done.finished: answered)
        self.scheduler = Scheduler(settings.max_batch_tokens, settings.max_batch_seqs,
                                   bulk_threshold_tokens=settings.bulk_threshold_tokens, bulk_min_share=settings.bulk_min_share)
        self.lanes = LanePolicy.of(settings, engine)
        self.max_inflight, self.max_queued_tokens = max(1, settings.max_inflight), settings.max_queued_tokens
        self.stats = ServiceStats()
        self.inflight: deque[tuple[ScheduledBatch, object]] = deque()     # on the main engine, oldest first
        self.query = None if query_engine is None else QueryLane(query_engine)
        self._host_memory = HostMemoryTrimmer(settings.host_memory_trim)
        self.done = Completion(on_complete, on_piece, release or drop_caller_objects, clock, self.stats,
                               settings.response_threads)
        self._thread.start()

    # ---- any thread -------------------------------------------------------------------------
    def submit(self, request: Request) -> None:
        if request.num_seqs == 0 or (request.token_outputs and self.on_piece is None):
            raise ValueError("a request needs at least one sequence" if request.num_seqs == 0 else
                             "this service takes no token-level outputs (no on_piece handler)")
        try:
            super().submit(request)
        finally:
            self.whole_runs.returned()

    def run_lone(self, input_ids: np.ndarray, answer: Callable[[np.ndarray], None], marks: list | None = None) -> bool:
        """One sequence of token ids (int32 [T], checked) on an idle service, whole on this thread
        (engine/lone.py), answered by answer(row [1, D], a reused buffer valid in the call) or
        answer(the error). False, with nothing done, where submit() is the way: the service is not
        idle, the request is part of a backlog or bulk, or its configuration has no graph yet.
        `marks`: the stage clock's list, which the engine's stages join."""
        tokens = input_ids.shape[0]
        with self._cond:
            if self._stopping:
                raise ShuttingDown(SHUTTING_DOWN)
            whole = tokens <= self.scheduler.bulk_threshold_tokens and self._idle_soon() and self.whole_runs.allowed(INTERACTIVE)
            run = self.engine.lone.run_for(tokens) if whole else None
            if run is None:
                return False
            self._busy = True
            self.stats.requests += 1
            self.lanes.seen(INTERACTIVE, time.monotonic())
            self.scheduler.stats.waited(INTERACTIVE, 0.0)
            self.scheduler.stats.batches[INTERACTIVE] += 1
        try:
            self.engine.lone.launch(run, input_ids, marks)
            row = self.engine.lone.wait()
        except Exception as e:
            log.exception("a lone forward pass failed")
            self.stats.failed += 1
            row = e
        else:
            self.stats.batches, self.stats.batch_tokens = self.stats.batches + 1, self.stats.batch_tokens + tokens
            self.stats.lone, self.stats.completed = self.stats.lone + 1, self.stats.completed + 1
        try:
            answer(row)
        except Exception:
            log.exception("sending a response failed")
        finally:
            self._end_inline(None)
            self.whole_runs.returned()
        return True

    def _admit(self, request: Request) -> bool:
        lane = self.scheduler.classify(request)     # bulk queued counts against bulk only
        queued = self.scheduler.lane_tokens[INTERACTIVE] if lane == INTERACTIVE else self.scheduler.queued_tokens
        if self.max_queued_tokens and queued + request.num_tokens > self.max_queued_tokens and queued > 0:
            raise Overloaded(f"overloaded: {queued} tokens already queued "
                             f"(limit max_queued_tokens={self.max_queued_tokens}); retry later")
        self.stats.requests += 1
        self.lanes.seen(lane, time.monotonic())
        concurrent = not self._all_answered()                     # another request is still unanswered
        inline = (request.num_tokens <= self.scheduler.max_batch_tokens and request.num_seqs <= self.scheduler.max_batch_seqs
                  and self.lanes.runs_alone(lane, request.num_tokens) and self._idle_soon())
        self._admitted += 1
        if inline:
            self._busy = True
            self._whole = self.whole_runs.allowed(lane)
        else:
            self.scheduler.add(request)
            if concurrent:
                self.whole_runs.concurrent()
        return inline

    def _idle(self) -> bool:
        """Lock held: a request now may be launched on the submitting thread."""
        return self.inline and not self._busy and not self.running() and not self.scheduler.has_work()

    def _all_answered(self) -> bool:
        return self._admitted == self.done.finished

    def _idle_soon(self) -> bool:
        """Lock held: _idle(), or so within IDLE_WAIT_S where every request admitted is answered
        (what runs is the loop thread's end of the last one, not concurrent traffic)."""
        if self._idle():
            return True
        if not self.inline or not self._all_answered():
            return False
        deadline = time.perf_counter() + IDLE_WAIT_S
        while not self._idle():
            left = deadline - time.perf_counter()
            if left <= 0 or self._stopping:
                return False
            self._cond.wait(left)
        return True

    def _end_inline(self, request: Request | None) -> None:
        with self._cond:
            self._busy = False
            self._cond.notify_all()

    @property
    def queued_tokens(self) -> int:
        return self.scheduler.queued_tokens

    def stop(self, timeout: float = 30.0) -> None:
        """Refuse new requests, finish what was admitted; after `timeout` seconds answer what still
        waits with "shutting down" (batches running are delivered), then stop the loop thread."""
        super().stop(timeout)
        self.done.responders.stop()

    def _time_up(self, timeout: float) -> None:
        log.error("the pool did not drain within %.0f s; failing the %d tokens queued", timeout, self.scheduler.queued_tokens)

    # ---- loop thread ------------------------------------------------------------------------
    def _loop(self) -> None:
        bind = getattr(self.engine, "bind_thread", None)        # this thread's CUDA device = the engine's
        if bind is not None:
            bind()
        while True:
            batch = None
            with self._cond:
                while not self._abort and not self.running() and (
                        self._busy or (not self._stopping and not self.scheduler.has_work())):
                    self._cond.wait()             # idle, or an inline request owns the engine
                if self._stopping and not self.scheduler.has_work() and not self.running():
                    return
                if self._abort:
                    abort_all(self, self._cond)
                    return
                held, engine = False, None        # held: bulk held back (LanePolicy), or two engines running
                if self.query is not None and not self._busy:
                    batch, engine = next_of_two(self)
                    held = batch is None and bulk_in_flight(self)
                elif len(self.inflight) < self.max_inflight and not self._busy:
                    batch = self.scheduler.next_batch(**self._bulk_limits())
                    held = batch is None and bool(self.inflight) and self.scheduler.has_work(BULK)
                self._busy = batch is not None         # no inline step until this one is launched
                if held:                          # an interactive request may come before the oldest is done
                    self._wait_oldest_or_interactive()
                gone = self.scheduler.take_cancelled()
            try:
                for r in gone:
                    self.done.finish_cancelled(r)
                if batch is not None:             # the device first: launch, then answer what finished
                    try:
                        self._launch(batch, engine)
                    finally:
                        with self._cond:
                            self._busy = False
                            self._cond.notify_all()
                    self.collect(block=False)
                elif self.running():
                    self.collect(block=not held)
            except Exception:  # never let the loop die: that would strand every request
                log.exception("scheduler loop error")
            del batch, gone                   # hold no finished request while waiting (see release)
            self._host_memory.maybe_trim(idle=not self.running() and not self.scheduler.has_work())

    def _bulk_limits(self) -> dict:
        """next_batch's bulk_tokens and bulk_cap (LanePolicy; none while draining); lock held."""
        return {} if self._stopping else {"bulk_cap": self.lanes.bulk_cap(), "bulk_tokens": self.lanes.bulk_room(
            time.monotonic(), self.scheduler.has_work(INTERACTIVE), sum(BULK in b.lanes() for b, _ in self.inflight))}

    def _wait_oldest_or_interactive(self, poll_s: float = 0.0002) -> None:
        """Lock held: wait until the oldest batch in flight is done (polled), an interactive request is
        admitted (submit() notifies) or the service stops."""
        oldest = [q[0][1] for q in self._queues() if q]
        while not (any(h.ready() for h in oldest) or self._stopping or (
                self.scheduler.has_work(INTERACTIVE) and (self.query is None or self.query.free()))):
            self._cond.wait(poll_s)

    def _queues(self) -> list:            # the batches in flight, per engine: the main one's, the query one's
        return [self.inflight] if self.query is None else [self.inflight, self.query.inflight]

    def running(self) -> bool:
        return any(self._queues())

    def _run_inline(self, r: Request) -> None:
        """Launch a whole request from the calling thread (the service is idle); run whole (_admit
        decided), wait for and answer it here too, else the loop thread does (requests batch meanwhile)."""
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
            self.clock.mark_all([p.request for p in batch.pieces], marks)

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
            (self.query.inflight if on_query else self.inflight).append((batch, handle))   # an inline launch wakes the loop

    def _start(self, batch: ScheduledBatch, engine=None):
        """engine.step(batch): its handle, or None (answered with an error, or split after an OOM)."""
        self._mark(batch, "scheduled")
        t0 = time.perf_counter()
        try:
            handle = (engine or self.engine).step(batch.pack())
            self.lanes.ran(batch.num_tokens, t0)
        except Exception as e:
            if is_out_of_memory(e):
                retry_in_halves(self, batch, e)
                return None
            log.exception("forward pass failed for a batch of %d sequences / %d tokens",
                          batch.num_seqs, batch.num_tokens)
            self.fail(batch, f"the forward pass failed: {type(e).__name__}: {e}")
            return None
        self._mark(batch, engine=engine)
        return handle

    def _count_launch(self, batch: ScheduledBatch) -> None:
        self.stats.batches, self.stats.batch_tokens = self.stats.batches + 1, self.stats.batch_tokens + batch.num_tokens
        for lane in batch.lanes():
            self.scheduler.stats.batches[lane] += 1

    def collect(self, block: bool) -> None:
        """Deliver the finished batches in flight (block: wait for the oldest)."""
        q = self.query.inflight if self.query is not None else ()   # the query engine's batch when done
        while q and (q[0][1].ready() or (block and not self.inflight)):   # (blocks only if nothing else runs)
            self._collect_one(*q[0])
            with self._cond:
                q.popleft()
                self._cond.notify_all()                         # an arrival may wait for idle (_idle_soon)
        while self.inflight and (block or self.inflight[0][1].ready()):
            batch, handle = self.inflight[0]
            self._collect_one(batch, handle)
            with self._cond:            # popped only once delivered: an inline step waits for it
                self.inflight.popleft()
                self._cond.notify_all()
            block = False                                       # block for the oldest one only

    def _collect_one(self, batch: ScheduledBatch, handle) -> None:
        try:
            emb = handle.synchronize()                          # [S, D] float32
        except Exception as e:
            log.exception("collecting a batch failed")
            self.fail(batch, f"the forward pass failed: {type(e).__name__}: {e}")
        else:
            self._mark(batch, "result_on_host")
            self.deliver(batch, emb, getattr(handle, "extras", None))

    def deliver(self, batch: ScheduledBatch, emb: np.ndarray, extras: dict | None = None) -> None:
        # answers go to the responders unless this is a lone request on an idle service
        hand_off = len(batch.pieces) > 1 or sum(map(len, self._queues())) > 1 or self.scheduler.has_work()
        self.done.deliver(batch, emb, extras, hand_off)

    def fail(self, batch: ScheduledBatch, message: str) -> None:
        """Every unfinished request of `batch` answered with `message`; their later sequences dropped."""
        failed = [r for r in {id(p.request): p.request for p in batch.pieces}.values() if not r.finished]
        with self._cond:   # the failed request's later sequences must not be computed
            for r in failed:
                r.error = message
                self.scheduler.remove(r)
        for r in failed:
            self.done.finish(r)
