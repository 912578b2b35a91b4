"""EmbeddingService: the scheduler thread and the completion side, independent of Triton.

    submit(request) -> the pool                       (any thread; returns at once)
    loop thread:  collect finished batches (in launch order, never blocking)
                  form the next FCFS batch and launch it: engine.step(batch) -> LazyTensor
                  with nothing left to launch, block on the oldest batch in flight
    on_complete(request) is called once per request, from the loop thread, when all of its
    sequences are computed (request.output filled) or it failed (request.error set).

The next batch is launched before the previous one is collected (up to `max_inflight` in flight),
so the device never waits for the host between batches.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rose_backend.serving.scheduler import Request, ScheduledBatch, Scheduler

log = logging.getLogger(__name__)


class Overloaded(RuntimeError):
    """The pool holds more queued tokens than allowed; the caller should retry later."""


@dataclass(slots=True)
class ServiceStats:
    requests: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    batches: int = 0
    batch_tokens: int = 0


class EmbeddingService:
    def __init__(self, engine, on_complete: Callable[[Request], None], *, max_batch_tokens: int = 8192,
                 max_batch_seqs: int = 64, max_inflight: int = 2, max_queued_tokens: int = 0):
        self.engine = engine
        self.on_complete = on_complete
        self.scheduler = Scheduler(max_batch_tokens, max_batch_seqs)
        self.max_inflight = max(1, max_inflight)
        self.max_queued_tokens = max_queued_tokens          # 0: unbounded
        self.stats = ServiceStats()
        self._cond = threading.Condition()
        self._stopping = False
        self._inflight: deque[tuple[ScheduledBatch, object]] = deque()
        self._thread = threading.Thread(target=self._loop, name="rose-scheduler", daemon=True)
        self._thread.start()

    # ---- any thread -------------------------------------------------------------------------
    def submit(self, request: Request) -> None:
        if request.num_seqs == 0:
            raise ValueError("a request needs at least one sequence")
        with self._cond:
            if self._stopping:
                raise RuntimeError("the embedding service is shutting down")
            if self.max_queued_tokens and self.scheduler.queued_tokens + request.num_tokens > self.max_queued_tokens \
                    and self.scheduler.queued_tokens > 0:
                raise Overloaded(f"overloaded: {self.scheduler.queued_tokens} tokens already queued "
                                 f"(limit max_queued_tokens={self.max_queued_tokens}); retry later")
            self.scheduler.add(request)
            self.stats.requests += 1
            self._cond.notify()

    @property
    def queued_tokens(self) -> int:
        return self.scheduler.queued_tokens

    def stop(self, timeout: float = 30.0) -> None:
        """Finish everything admitted so far, then stop the loop thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.error("the scheduler thread did not drain within %.0f s", timeout)

    # ---- loop thread ------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            batch = None
            with self._cond:
                while not self._stopping and not self.scheduler.has_work() and not self._inflight:
                    self._cond.wait()
                if self._stopping and not self.scheduler.has_work() and not self._inflight:
                    return
                if len(self._inflight) < self.max_inflight:
                    batch = self.scheduler.next_batch()
                gone = self.scheduler.take_cancelled()
            try:
                for r in gone:
                    self._finish_cancelled(r)
                self._collect(block=False)
                if batch is not None:
                    self._launch(batch)
                elif self._inflight:
                    self._collect(block=True)
            except Exception:  # never let the loop die: that would strand every request
                log.exception("scheduler loop error")

    def _launch(self, batch: ScheduledBatch) -> None:
        live = [p for p in batch.pieces if p.request.error is None]
        if not live:
            return
        try:
            handle = self.engine.step(batch.pack())
        except Exception as e:  # e.g. out of memory: fail this batch's requests, keep serving
            log.exception("forward pass failed for a batch of %d sequences / %d tokens",
                          batch.num_seqs, batch.num_tokens)
            self._fail(batch, f"the forward pass failed: {type(e).__name__}: {e}")
            return
        self.stats.batches += 1
        self.stats.batch_tokens += batch.num_tokens
        self._inflight.append((batch, handle))

    def _collect(self, block: bool) -> None:
        while self._inflight and (block or self._inflight[0][1].ready()):
            batch, handle = self._inflight.popleft()
            try:
                emb = handle.synchronize()                      # [S, D] float32
            except Exception as e:
                log.exception("collecting a batch failed")
                self._fail(batch, f"the forward pass failed: {type(e).__name__}: {e}")
            else:
                self._deliver(batch, emb)
            block = False                                       # block for the oldest one only

    def _deliver(self, batch: ScheduledBatch, emb: np.ndarray) -> None:
        for p in batch.pieces:
            r = p.request
            if r.finished:
                continue
            if r.output is None:
                r.output = np.empty((r.num_seqs, emb.shape[1]), dtype=np.float32)
            n = p.last - p.first
            r.output[p.first:p.last] = emb[p.row:p.row + n]
            r.remaining -= n
            if r.remaining == 0:
                self._finish(r)

    def _fail(self, batch: ScheduledBatch, message: str) -> None:
        with self._cond:   # the failed request's later sequences must not be computed
            for r in {id(p.request): p.request for p in batch.pieces}.values():
                if r.finished:
                    continue
                r.error = message
                self.scheduler.remove(r)
        for r in {id(p.request): p.request for p in batch.pieces}.values():
            if not r.finished:
                self._finish(r)

    def _finish_cancelled(self, r: Request) -> None:
        # Not computed further; the response sender still gets its FINAL flag (with an error) so
        # that Triton releases the request, though the caller is no longer listening.
        self.stats.cancelled += 1
        r.error = "the request was cancelled"
        r.finished = True
        try:
            self.on_complete(r)
        except Exception:
            log.exception("closing a cancelled request failed")

    def _finish(self, r: Request) -> None:
        r.finished = True
        if r.error is None:
            self.stats.completed += 1
        else:
            self.stats.failed += 1
        try:
            self.on_complete(r)
        except Exception:
            log.exception("sending a response failed")


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.001) -> bool:
    """Poll `predicate` until it holds or `timeout` seconds pass (tests and shutdown use it)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
