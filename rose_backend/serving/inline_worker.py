"""A worker thread fed by submit(), whose place the submitting thread takes while the worker is idle.

Triton hands a Python model its next request only when execute() returns. A job that arrives while
nothing is queued or running is therefore run on the submitting thread (execute's) at once, with no
hand-over to the worker on the latency path; jobs that arrive while one runs queue, and the worker
takes them, together. EmbeddingService (service.py) and the tokenizer's TokenizeBatcher
(rose_ensemble/tokenize_batcher.py) are such workers:

    class Worker(IdleInlineWorker):
        def _admit(self, job) -> bool: ...   # lock held: queue the job (False: the worker is woken)
                                             # or claim the idle worker's place for it (True)
        def _run_inline(self, job): ...      # a claimed job, on the submitting thread (lock not held)
        def _end_inline(self, job): ...      # after it, even if it raised: give the place back
                                             # (taking self._cond) and wake the worker if need be
        def _loop(self): ...                 # the worker thread: wait on self._cond, work, until
                                             # self._stopping with nothing left, or self._abort

submit(job) (any thread) is refused with ShuttingDown once stop() has begun. stop(timeout): refuse
new jobs and let the worker finish what was admitted; when `timeout` is up, _time_up() (the
subclass may log what is left), then _abort: the worker answers whatever still waits with
SHUTTING_DOWN and ends; after max(5 s, timeout / 4) more a worker still running is logged. A
subclass starts self._thread once its own state is set.
"""
from __future__ import annotations

import abc
import logging
import threading

from rose_backend.serving.outcomes import SHUTTING_DOWN, ShuttingDown

log = logging.getLogger(__name__)


class IdleInlineWorker(abc.ABC):
    def __init__(self, thread_name: str):
        self._cond = threading.Condition()
        self._stopping = False
        self._abort = False                      # stop(): the time to finish is up
        self._thread = threading.Thread(target=self._loop, name=thread_name, daemon=True)

    def submit(self, job) -> None:
        with self._cond:
            if self._stopping:
                raise ShuttingDown(SHUTTING_DOWN)
            if not self._admit(job):
                self._cond.notify_all()
                return
        try:
            self._run_inline(job)
        finally:
            self._end_inline(job)

    def stop(self, timeout: float = 30.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._time_up(timeout)
            with self._cond:
                self._abort = True
                self._cond.notify_all()
            self._thread.join(max(5.0, timeout / 4))
            if self._thread.is_alive():
                log.error("the %s thread did not stop", self._thread.name)

    def _time_up(self, timeout: float) -> None:
        """stop()'s time ran out with the worker still busy (before _abort is set)."""

    @abc.abstractmethod
    def _admit(self, job) -> bool:
        ...

    @abc.abstractmethod
    def _run_inline(self, job) -> None:
        ...

    @abc.abstractmethod
    def _end_inline(self, job) -> None:
        ...

    @abc.abstractmethod
    def _loop(self) -> None:
        ...
