"""Whether an inline request is also waited for and answered on the submitting thread ("run whole").

Triton hands a decoupled Python model its next request only when execute() returns, so a request
run whole holds back every request queued behind it. Two signs of that are watched:
- a backlog: the request came within `backlog_us` of the previous submit() returning (Triton had it
  queued);
- concurrent traffic: a request arrived while another was still unanswered.
After concurrent traffic no request runs whole for BATCH_HOLD_S, after a backlog for BACKLOG_HOLD_S,
and the requests batch. A caller that sends its next request once it has its answer (one client at
a time) shows neither, though on a fast host its next request and one Triton had queued come about
as soon after the previous answer (a few hundred microseconds after `send` returned): the window is
set below both, and the short hold keeps a rare early request from taking the next BATCH_HOLD_S of
requests off the lone path. Under a real backlog, a request soon comes inside the window, and
once requests are batched, concurrent traffic shows at every arrival.
"""
from __future__ import annotations

import time

from rose_backend.serving.lanes import INTERACTIVE

BATCH_HOLD_S = 0.1          # after concurrent traffic, this long without whole runs
BACKLOG_HOLD_S = 0.01       # after a backlog


class WholeRuns:
    def __init__(self, backlog_us: int | None):
        """backlog_us: the resolved `inline_backlog_us` (None: never run whole)."""
        self._backlog_ns = None if backlog_us is None else int(backlog_us * 1000)
        self._returned_ns, self._until_ns = None, 0      # submit() last returned; no whole run before
        self.backlogs = self.concurrent_arrivals = 0     # the signs seen, counted

    def returned(self) -> None:
        """submit() or run_lone() returns now."""
        self._returned_ns = time.perf_counter_ns()

    def concurrent(self) -> None:
        """A request arrived while another was unanswered."""
        self.concurrent_arrivals += 1
        self._hold(time.perf_counter_ns(), BATCH_HOLD_S)

    def _hold(self, now_ns: int, seconds: float) -> None:
        self._until_ns = max(self._until_ns, now_ns + int(seconds * 1e9))     # a hold never shortens another

    def allowed(self, lane: str) -> bool:
        """An inline request of `lane` arriving now runs whole (a backlog starts the hold)."""
        if self._backlog_ns is None or lane != INTERACTIVE:
            return False
        now = time.perf_counter_ns()
        if self._returned_ns is not None and now - self._returned_ns < self._backlog_ns:
            self._hold(now, BACKLOG_HOLD_S)
            self.backlogs += 1
            return False
        return now >= self._until_ns
