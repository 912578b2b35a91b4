"""One server as an EmbeddingClient sees it (Replica: its gRPC channel, the streams that calls lease
on it, and its load and failure state), and a client's replicas with the lock every call takes
(ReplicaSet). Replica's methods are called with that lock held.

A call leases one stream per replica for its chunks, used by no other call, and gives it back when
it ends; a call that ends with requests still pending (cancelled, failed, timed out) cancels its
streams instead, which makes the server cancel those requests (client.py, dispatch.py). Up to
MAX_IDLE streams with nothing pending wait for the next call, so a steady load opens none.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from rose_client.transport import Channel, StreamConnection

MAX_IDLE = 64         # streams kept open per replica between calls


@dataclass(eq=False)
class Replica:
    url: str
    headers: dict[str, str] | None = field(default=None, repr=False)   # gRPC metadata: the API key
    channel: Channel | None = None
    channel_type: type | None = None  # what a channel is made of (None: transport.Channel; or AioChannel)
    idle: list = field(default_factory=list)
    inflight_tokens: int = 0          # tokens sent and not yet answered (all calls of this client)
    failures: int = 0                 # consecutive failures; 0 after any success
    down_until: float = 0.0
    last_error: str = ""
    last_answer: float = 0.0          # monotonic time of its last answer (success or error)
    tokens_done: int = 0              # stats: tokens / chunks answered successfully
    chunks_done: int = 0
    failures_total: int = 0

    def lease(self) -> StreamConnection:
        """A stream no call is using: an idle one, else a new one on the current channel."""
        while self.idle:
            conn = self.idle.pop()
            if conn.broken is None and conn.channel is self.channel:
                return conn
        if self.channel is None:
            self.channel = (self.channel_type or Channel)(self.url, self.headers)
        return self.channel.stream()

    def give_back(self, conn: StreamConnection) -> bool:
        """Keep a stream with nothing pending for a later call. False: the caller closes it."""
        if conn.broken is None and conn.channel is self.channel and conn.outstanding == 0 \
                and len(self.idle) < MAX_IDLE:
            self.idle.append(conn)
            return True
        return False

    def failed(self, conn: StreamConnection, error: str, backoff: float, max_backoff: float) -> Channel | None:
        """Count one failure per broken channel, not per stream or chunk on it: the replica is down
        for a backoff (`backoff` doubling up to `max_backoff`) and its next stream opens a new
        channel. Returns the old channel for the caller to close once it has let go of the lock
        (closing fails the chunks still pending on it, whose callbacks take the lock)."""
        if conn.channel is not self.channel or self.channel is None:
            return None                   # this channel was already counted and dropped
        self.failures += 1
        self.failures_total += 1
        self.last_error = error
        self.down_until = time.monotonic() + min(backoff * 2 ** (self.failures - 1), max_backoff)
        return self.drop_channel()

    def drop_channel(self) -> Channel | None:
        channel, self.channel, self.idle = self.channel, None, []
        return channel


class ReplicaSet:
    """An EmbeddingClient's replicas, shared by all its calls: `lock` guards them; `waiters` holds the
    wake() of every call waiting for a replica with room (dispatch.Job); `closed` once closed."""

    def __init__(self, urls: list[str], headers: dict[str, str] | None, channel_type: type | None,
                 max_inflight_tokens: int, backoff: float, max_backoff: float):
        self.replicas = [Replica(u, headers, channel_type=channel_type) for u in urls]
        self.max_inflight_tokens, self.backoff, self.max_backoff = max_inflight_tokens, backoff, max_backoff
        self.lock = threading.Lock()
        self.waiters: set = set()
        self.closed = False
        with self.lock:
            for r in self.replicas:                      # connect now: the first call finds a stream open
                r.give_back(r.lease())

    def pick(self, chunk, now: float) -> Replica | None:
        """The live replica with the fewest outstanding tokens that can take `chunk` (lock held)."""
        live = [r for r in self.replicas if r.down_until <= now and (
            r.inflight_tokens == 0 or r.inflight_tokens + chunk.tokens <= self.max_inflight_tokens)]
        fresh = [r for r in live if r.url not in chunk.failed_on] or live
        if not fresh:
            return None
        return min(fresh, key=lambda r: (r.inflight_tokens, r.tokens_done))

    def answered(self, att, wake) -> list:
        """An attempt's answer (or error) came: its tokens no longer count. Returns the wake() of the
        other calls waiting for room, to call outside the lock."""
        with self.lock:
            att.replica.last_answer = time.monotonic()
            if not att.released:
                att.released = True
                att.replica.inflight_tokens -= att.chunk.tokens
            return [w for w in self.waiters if w is not wake]

    def failed(self, r: Replica, conn: StreamConnection, error: str) -> Channel | None:
        """Lock held: Replica.failed with this set's backoff (close the channel it returns outside the lock)."""
        return r.failed(conn, error, self.backoff, self.max_backoff)

    def stats(self) -> dict[str, dict[str, int]]:
        with self.lock:
            return {r.url: {"tokens": r.tokens_done, "chunks": r.chunks_done, "failures": r.failures_total,
                            "inflight_tokens": r.inflight_tokens, "down": r.down_until > time.monotonic()}
                    for r in self.replicas}

    def close(self) -> list:
        """Every replica's channel dropped; returns them for the caller to close."""
        with self.lock:
            self.closed = True
            return [ch for ch in (r.drop_channel() for r in self.replicas) if ch is not None]
