"""The completion side of EmbeddingService: a finished batch's rows to its requests, each request
answered exactly once (by the calling thread, or handed to the responder threads: responders.py).

    done = Completion(on_complete, on_piece, release, clock, stats, response_threads)
    done.deliver(batch, emb, extras, hand_off)     # rows [S, D] of a batch into its requests
    done.finish(request)                           # answer a request now (its error set, or done)
    done.finish_cancelled(request)                 # answered CANCELLED, not computed further

on_complete(request) sends; release(request) lets go of the caller's objects once it is sent;
on_piece(request, first seq, last seq, {name: rows}) takes a piece's token-level rows (views of
buffers the engine reuses: valid in the call only).
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import numpy as np

from rose_backend.serving.outcomes import CANCELLED, ServiceStats
from rose_backend.serving.responders import Responders
from rose_backend.serving.scheduler import Request, ScheduledBatch

log = logging.getLogger(__name__)


class Completion:
    def __init__(self, on_complete: Callable[[Request], None], on_piece: Callable | None,
                 release: Callable[[Request], None], clock, stats: ServiceStats, response_threads: int):
        self.on_complete, self.on_piece, self.release, self.clock, self.stats = on_complete, on_piece, release, clock, stats
        self.responders = Responders(response_threads, self.answer, clock=clock)
        self.finished = 0                # requests finished (answered, or handed to the responders)
        self._finished_lock = threading.Lock()

    def _count_finished(self) -> None:
        with self._finished_lock:        # finish() runs on the loop, inline and responder threads
            self.finished += 1

    def deliver(self, batch: ScheduledBatch, emb: np.ndarray, extras: dict | None, hand_off: bool) -> None:
        """emb [S, D]: the batch's rows. A request whose last rows these are is answered (handed to
        the responders when `hand_off` and it has no token-level outputs)."""
        token = 0                                                # first token of the piece in the batch
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
                self.finish(r, hand_off and bool(self.responders) and not r.token_outputs)

    def finish(self, r: Request, hand_off: bool = False) -> None:
        if r.finished:                    # exactly one response per request
            return
        r.finished = True
        self._count_finished()
        if r.error is None:
            self.stats.completed += 1
        else:
            self.stats.failed += 1
        if self.clock is not None:
            self.clock.mark(r, "sliced")
        if hand_off:
            self.responders.hand(r)
        else:
            self.answer(r)

    def finish_cancelled(self, r: Request) -> None:
        """Not computed further; the caller's response still gets its FINAL flag (with an error), so
        that Triton releases the request, though the caller is no longer listening."""
        if r.finished:
            return
        self.stats.cancelled += 1
        r.error, r.error_kind = CANCELLED, "cancelled"
        r.finished = True
        self._count_finished()
        self.answer(r)

    def answer(self, r: Request) -> None:
        try:
            self.on_complete(r)
        except Exception:
            log.exception("sending a response failed")
        if self.clock is not None and r.error is None:
            self.clock.finish(r, "+".join(sorted(r.token_outputs)))   # dense-only: ungrouped
        self.release(r)
