"""Requests that arrive while the tokenizer is busy are tokenized together, in one Rust call.

    batcher = TokenizeBatcher(run_batch, answer)
    batcher.submit(job)        # any thread (Triton's execute); returns once the job is answered
                               # (idle, no backlog), encoded (idle) or queued (busy)
    batcher.stop(timeout)      # finish what was queued, then end the worker; nothing is left unanswered

run_batch(payloads) -> list of results, one per payload, in order (it may raise: then each payload
is retried alone, so one bad job gets its own error and the others their results);
answer(job, result, error) sends the job's one response (result None with an error, or the result
with error None).

When nothing runs and nothing waits, submit() encodes the job on the calling thread at once (no
thread hop before the Rust call: an idle-inline worker, rose_backend/serving/inline_worker.py).
Triton hands a Python model its next request only when execute() returns, so a job encoded *and*
answered there can never meet another one: a call of its own per request, whatever the load. So the
answer depends on the gap since submit() last returned: more than `backlog_gap_us` (no backlog: a
lone request) and the job is answered on the calling thread too, with no thread hop at all; less
(Triton is handing requests over back to back: a backlog) and building and sending its response is
left to the worker, so execute() returns at once and requests arriving meanwhile queue. The worker
takes every waiting job (up to `max_batch_jobs`), encodes those not encoded yet in one run_batch
call, and answers them in arrival order, each exactly once. A queued job whose caller is gone
(job.is_cancelled()) is answered with CANCELLED and not encoded; stop() drains the queue, and jobs
still queued when its time is up get SHUTTING_DOWN.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from rose_backend.serving.inline_worker import IdleInlineWorker
from rose_backend.serving.outcomes import CANCELLED, SHUTTING_DOWN

log = logging.getLogger(__name__)


@dataclass(slots=True)
class BatcherStats:
    calls: int = 0              # run_batch calls (Rust encode calls)
    jobs: int = 0               # jobs those calls held
    largest: int = 0            # most jobs in one call
    answered_inline: int = 0    # jobs encoded and answered on the submitting thread (no backlog)
    cancelled: int = 0
    failed: int = 0


@dataclass(slots=True)
class Job:
    """One request's work: `payload` for run_batch, `handle` for answer (e.g. Triton's sender)."""
    payload: object
    handle: object = None
    is_cancelled: Callable[[], bool] | None = None
    extras: tuple = ()                              # whatever answer() needs beside the result
    result: object = None                           # run_batch's result, an Exception or an outcome string
    encoded: bool = False
    answer_inline: bool = False                     # encoded and answered on the submitting thread
    marks: list = field(default_factory=list)       # StageClock marks (serving/stage_clock.py)


class TokenizeBatcher(IdleInlineWorker):
    def __init__(self, run_batch: Callable[[list], list], answer: Callable[[Job, object, object], None],
                 max_batch_jobs: int = 256, backlog_gap_us: float = 250.0):
        super().__init__("rose-tokenize")
        self.run_batch, self.answer, self.max_batch_jobs = run_batch, answer, max(1, max_batch_jobs)
        self.backlog_gap_ns = int(backlog_gap_us * 1000)
        self._last_return = 0               # when submit() last returned (perf_counter_ns)
        self.stats = BatcherStats()
        self._queue: deque[Job] = deque()
        self._inline = False                # a caller is encoding its job on its own thread
        self._working = False               # the worker is encoding or answering
        self._thread.start()

    # ---- the submitting thread (rose_backend/serving/inline_worker.py) ---------------------------
    def _admit(self, job: Job) -> bool:
        now = time.perf_counter_ns()
        if self._inline or self._working or self._queue:
            self._queue.append(job)
            self._last_return = time.perf_counter_ns()
            return False
        self._inline = True
        job.answer_inline = now - self._last_return > self.backlog_gap_ns
        return True

    def _run_inline(self, job: Job) -> None:
        job.result = self._encode([job])[0]
        job.encoded = True
        if job.answer_inline:                    # no backlog: answer here, no thread hop at all
            self.stats.answered_inline += 1
            self._deliver(job)

    def _end_inline(self, job: Job) -> None:
        with self._cond:
            self._inline = False
            late = self._abort                   # stop()'s time ran out meanwhile: no worker left
            if not job.answer_inline and not late:
                self._queue.appendleft(job)      # it arrived before anything queued meanwhile
            if self._queue:
                self._cond.notify()
        if late and not job.answer_inline:
            self._deliver(job)
        self._last_return = time.perf_counter_ns()

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def busy(self) -> bool:
        return self._inline or self._working

    # ---- the worker ---------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            left = jobs = None
            with self._cond:
                while not self._abort and (self._inline or not self._queue) and not (self._stopping and not self._queue
                                                                                     and not self._inline):
                    self._cond.wait()
                if self._abort:
                    left, self._queue = list(self._queue), deque()
                elif not self._queue:          # stopping, and everything was answered
                    return
                else:
                    jobs = [self._queue.popleft() for _ in range(min(len(self._queue), self.max_batch_jobs))]
                    self._working = True
            if left is not None:
                for job in left:
                    if not job.encoded:
                        job.result, job.encoded = SHUTTING_DOWN, True
                    self._deliver(job)
                return
            try:
                self._work(jobs)
            except Exception:                  # never let the worker die: that would strand every job
                log.exception("tokenize: batch failed")
            finally:
                with self._cond:
                    self._working = False
            del jobs

    def _work(self, jobs: list[Job]) -> None:
        todo = []
        for job in jobs:
            if not job.encoded and job.is_cancelled is not None and job.is_cancelled():
                self.stats.cancelled += 1
                job.result, job.encoded = CANCELLED, True
            elif not job.encoded:
                todo.append(job)
        if todo:
            for job, res in zip(todo, self._encode(todo)):
                job.result, job.encoded = res, True
        for job in jobs:
            self._deliver(job)

    def _encode(self, jobs: list[Job]) -> list:
        """run_batch over the jobs' payloads; on an error, each job alone (its own error or result)."""
        try:
            results = self.run_batch([j.payload for j in jobs])
        except Exception as e:
            if len(jobs) == 1:
                results = [e]
            else:
                results = []
                for j in jobs:
                    try:
                        results.append(self.run_batch([j.payload])[0])
                    except Exception as one:
                        results.append(one)
        done = time.perf_counter_ns()
        for j in jobs:
            if j.marks:                                  # stage timing on (serving/stage_clock.py)
                j.marks.append(("encoded", done))
        self.stats.calls += 1
        self.stats.jobs += len(jobs)
        self.stats.largest = max(self.stats.largest, len(jobs))
        self.stats.failed += sum(isinstance(r, Exception) for r in results)
        return results

    def _deliver(self, job: Job) -> None:
        """Send the job's one response: its result, or its error (an Exception or an outcome string)."""
        res = job.result
        try:
            if isinstance(res, (Exception, str)):
                self.answer(job, None, res)
            else:
                self.answer(job, res, None)
        except Exception:
            log.exception("tokenize: sending a response failed")
        job.handle = job.is_cancelled = job.result = None   # Triton counts the request in flight until released
