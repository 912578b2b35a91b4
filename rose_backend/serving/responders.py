"""Responder threads: a finished batch's requests answered side by side, off the scheduler thread.

Answering a request (the service's on_complete: Triton's `send`) takes a few hundred microseconds,
most of it waiting on the server with the GIL released. Answered one after the other on the
scheduler thread, the last request of a batch of n would wait for n - 1 sends, and the next batch
would be launched only after all of them. `Responders(n, answer)` runs `answer(request)` on n threads:

    responders.hand(request)        # any thread; answered by one of the n threads, soon
    responders.stop()               # every request handed over so far is answered first

The `rose` parameter `response_threads` sets n.
"""
from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Responders:
    def __init__(self, count: int, answer: Callable, name: str = "rose-responder", clock=None):
        """count threads calling answer(request); clock: a StageClock, marking "responder_picked_up"."""
        self.answer, self.clock = answer, clock
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.threads = [threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True) for i in range(count)]
        for t in self.threads:
            t.start()

    def __bool__(self) -> bool:
        return bool(self.threads)

    def hand(self, request) -> None:
        self._queue.put(request)

    def stop(self, timeout: float = 10.0) -> None:
        for _ in self.threads:
            self._queue.put(None)                 # after every request handed over: they go first
        for t in self.threads:
            t.join(timeout)
            if t.is_alive():
                log.error("a responder thread did not stop")

    def _run(self) -> None:
        while (r := self._queue.get()) is not None:
            if self.clock is not None:
                self.clock.mark(r, "responder_picked_up")
            self.answer(r)
