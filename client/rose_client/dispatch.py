"""One call's chunks in flight over the replicas of an EmbeddingClient: what a chunk is, one attempt
of it on one replica, and the Job that places, times out, retries and collects them (client.py
explains the policy). Job.step() does the work; the sync and the asyncio client only wait; Job.finish()
gives the call's streams back, or cancels those with requests still pending.
"""
from __future__ import annotations

import queue
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from rose_client.contract import LANES
from rose_client.encoded import Ask, Encoded
from rose_client.replica import Replica
from rose_client.transport import AccessDenied, Channel, ServerError, StreamConnection

NEVER = float("inf")


class AllReplicasDown(ConnectionError):
    """Every replica failed `retries` times in a row while a call still had chunks to place."""


def check_lane(lane: str | None) -> str | None:
    """A call's lane (the request parameter "lane": rose schedules "interactive" before "bulk";
    None: by size); ValueError naming the choices."""
    if lane is not None and lane not in LANES:
        raise ValueError(f"lane must be one of {', '.join(map(repr, LANES))} or None, got {lane!r}")
    return lane


@dataclass
class Chunk:
    start: int                        # input positions [start, end)
    end: int
    tokens: int
    inputs: list
    attempts: int = 0
    not_before: float = 0.0
    result: np.ndarray | None = None
    failed_on: set = field(default_factory=set)


@dataclass(eq=False)
class Attempt:
    chunk: Chunk
    replica: Replica
    conn: StreamConnection
    sent_at: float
    released: bool = False            # its tokens no longer count against the replica
    abandoned: bool = False           # timed out: a late answer is ignored
    fut: Future | None = None


class Job:
    """One call's chunks in flight. `step()` does all the work and returns how long to wait for the
    next event (None: finished); the sync and the asyncio client only differ in how they wait."""

    def __init__(self, client, model: str, chunks: list[Chunk], n: int, wake, ask: Ask = Ask(),
                 lane: str | None = None):
        self.client, self.model, self.n, self.wake, self.ask = client, model, n, wake, ask
        params, lane = ask.parameters(), check_lane(lane)
        self.parameters = {**(params or {}), "lane": lane} if lane else params     # request parameters
        self.todo: list[Chunk] = list(chunks)           # waiting to be sent, in input order
        self.chunks = chunks
        self.inflight: set[Attempt] = set()
        self.done: queue.SimpleQueue = queue.SimpleQueue()
        self.remaining = len(chunks)
        self.streams: dict[str, tuple[Replica, StreamConnection]] = {}    # url -> this call's stream there
        now = time.monotonic()
        self.deadline = NEVER if client.timeout is None else now + client.timeout
        self.stall_at = NEVER if client.progress_timeout is None else now + client.progress_timeout
        with client.pool.lock:
            if client.pool.closed:
                raise RuntimeError("the client is closed")

    def step(self) -> float | None:
        c, pool = self.client, self.client.pool
        while True:                                      # 1. answers that came in
            try:
                att = self.done.get_nowait()
            except queue.Empty:
                break
            self._handle(att)
        if self.remaining == 0:
            return None
        now = time.monotonic()
        if now > self.deadline:
            raise TimeoutError(f"embedding call timed out after {c.timeout:.0f} s with {self.remaining} of "
                               f"{len(self.chunks)} chunks unanswered ({self._replica_summary()})")
        if now > self.stall_at:
            raise TimeoutError(f"no chunk of this embedding call was answered for {c.progress_timeout:g} s; "
                               f"{self.remaining} of {len(self.chunks)} chunks unanswered ({self._replica_summary()})")
        to_close = []
        with pool.lock:                                  # 2. attempts past their deadline
            for att in [a for a in self.inflight if now > self._expiry(a)]:
                to_close.append(self._abandon(att, f"no answer for {c.chunk_timeout:g} s"))
            sent = []
            for chunk in list(self.todo):                # 3. place what can go, in input order
                if chunk.not_before > now:
                    continue
                r = pool.pick(chunk, now)
                if r is None:
                    break
                att = Attempt(chunk, r, self._stream(r), now)
                r.inflight_tokens += chunk.tokens
                chunk.attempts += 1
                self.todo.remove(chunk)
                self.inflight.add(att)
                sent.append(att)
            if self.todo:                                # woken when any call's chunk frees capacity
                pool.waiters.add(self.wake)
            else:                                        # woken by its own answers only
                pool.waiters.discard(self.wake)
            if self.todo and all(r.failures >= c.retries for r in pool.replicas):
                raise AllReplicasDown(f"all {len(pool.replicas)} replicas are down: {self._replica_summary()}")
            wakes = [self._expiry(a) for a in self.inflight] + \
                [ch.not_before for ch in self.todo if ch.not_before > now]
            if self.todo:
                wakes += [r.down_until for r in pool.replicas if r.down_until > now]
        for channel in to_close:                         # outside the lock: pending chunks fail over
            if channel is not None:
                channel.close()
        for att in sent:                                 # outside the lock: callbacks may run inline
            att.fut = att.conn.infer(self.model, att.chunk.inputs, self.ask.outputs(), self.parameters)
            att.fut.add_done_callback(lambda f, a=att: self._answered(a))
        if sent:
            return 0.0                                   # look at the queue again right away
        return min(max(0.0, min(wakes + [self.deadline, self.stall_at]) - time.monotonic()) + 1e-3, 3600.0)

    def _answered(self, att: Attempt) -> None:
        """An attempt's future is done (any thread): queue it for step(), and wake this call and every
        call waiting for the room it freed."""
        waiters = self.client.pool.answered(att, self.wake)
        self.done.put(att)
        self.wake()
        for wake in waiters:
            wake()

    def _expiry(self, att: Attempt) -> float:
        """When an attempt is given up: chunk_timeout after it was sent, or after its replica's last
        answer to this client if that is later (a replica working through a queue is not stuck)."""
        return max(att.sent_at, att.replica.last_answer) + self.client.chunk_timeout

    def _stream(self, r: Replica) -> StreamConnection:
        """This call's stream to r (caller holds the lock): leased on first use, again once broken."""
        held = self.streams.get(r.url)
        if held is not None and held[1].broken is None and held[1].channel is r.channel:
            return held[1]
        conn = r.lease()
        self.streams[r.url] = (r, conn)
        return conn

    def _handle(self, att: Attempt) -> None:
        c = self.client
        self.inflight.discard(att)
        if att.abandoned or att.chunk.result is not None:
            return                                        # a late answer of an abandoned attempt
        chunk, r = att.chunk, att.replica
        exc = att.fut.exception()
        if exc is None:
            out = att.fut.result()
            self.ask.check(out, chunk.end - chunk.start, r.url)
            chunk.result = out
            self.remaining -= 1
            if c.progress_timeout is not None:
                self.stall_at = time.monotonic() + c.progress_timeout
            with c.pool.lock:
                r.failures = 0
                r.tokens_done += chunk.tokens
                r.chunks_done += 1
            if c.on_rows is not None:
                c.on_rows(chunk.end - chunk.start)
            return
        if isinstance(exc, AccessDenied):
            raise AccessDenied(str(exc)) from exc
        if isinstance(exc, ServerError) and not exc.retryable:
            where = f" (inputs {chunk.start}..{chunk.end - 1} of this call)" if chunk.end > chunk.start else ""
            raise ServerError(f"{exc}{where}") from exc
        broken = None
        with c.pool.lock:
            if isinstance(exc, ServerError) and not exc.server_leaving:   # overloaded: back off, retry anywhere
                r.last_error = str(exc)
                chunk.not_before = time.monotonic() + min(c.backoff * 2 ** min(chunk.attempts, 10), c.max_backoff)
            else:                                         # ConnectionLost, a server leaving, anything else: replica failed
                broken = c.pool.failed(r, att.conn, str(exc))
                chunk.failed_on.add(r.url)
            self._requeue(chunk)
        if broken is not None:
            broken.close()

    def _abandon(self, att: Attempt, why: str) -> Channel | None:
        """Caller holds the lock. Give up on an attempt; its chunk goes back to the queue.
        Returns the replica's channel to close (see Replica.failed)."""
        c = self.client
        att.abandoned = True
        self.inflight.discard(att)
        if not att.released:
            att.released = True
            att.replica.inflight_tokens -= att.chunk.tokens
        att.chunk.failed_on.add(att.replica.url)
        self._requeue(att.chunk)
        return c.pool.failed(att.replica, att.conn, f"{att.replica.url}: {why}")

    def _requeue(self, chunk: Chunk) -> None:
        self.todo.append(chunk)
        self.todo.sort(key=lambda ch: ch.start)

    def _replica_summary(self) -> str:
        now = time.monotonic()
        return "; ".join(f"{r.url} ({'down: ' + r.last_error if r.down_until > now or r.failures else 'up'})"
                         for r in self.client.pool.replicas)

    def output(self) -> Encoded:
        return self.ask.assemble([ch.result for ch in self.chunks], self.client.urls)

    def finish(self) -> None:
        """The call is over, answered or not: nothing more is sent. Streams with nothing pending go
        back to their replica; a stream with requests still pending (the call failed, timed out or
        was cancelled) is cancelled, so that the server drops that work."""
        cancel, close = [], []
        with self.client.pool.lock:
            self.client.pool.waiters.discard(self.wake)
            self.todo.clear()
            for r, conn in self.streams.values():
                if conn.outstanding:
                    cancel.append(conn)
                elif not r.give_back(conn):
                    close.append(conn)
            self.streams.clear()
        for conn in cancel:
            conn.cancel()
        for conn in close:
            conn.close(wait=False)
