"""The gateway's HTTP/1.1 connections: uvicorn's httptools protocol (uvicorn 0.35, httptools 0.6,
both pinned) with the limits a server open to any client needs. Every refusal is an answer in
OpenAI's JSON error format with `Connection: close`:

    503  the connection cap is reached (after closing one idle keep-alive connection, if any)
    400  the request is not HTTP the parser accepts (e.g. `Content-Length: abc`)
    431  the request line and headers are over max_header_bytes, or over max_headers fields
    408  the headers did not arrive within header_timeout seconds of the connection (or of the
         request's first byte on a kept-alive one), or the body not within body_timeout seconds
         plus one second per min_body_rate bytes received (a connection that sent nothing is
         just closed)

After a refusal the connection reads and drops what the client still sends for up to LINGER
seconds, so that the client sees the answer rather than a reset. Beyond the cap plus `overflow`
more connections a new one is closed at once (a flood must not take the process's last file
descriptors). A client that goes away while its request is being served has the callbacks in its
scope's DISCONNECT list called (app.py cancels the request's work with them); one that only
half-closes after sending its request whole is answered, then closed.
POST /v1/embeddings (and /embeddings) goes to the `direct` handler without the ASGI app (direct.py).
Costs per request: two timer handles and a few counters, no extra task.
"""
from __future__ import annotations

import asyncio
import logging
import resource
from dataclasses import dataclass
from typing import Callable

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from rose_gateway.direct import DIRECT_PATHS, DirectCycle
from rose_gateway.errors import raw_error_response

log = logging.getLogger("rose_gateway")
DISCONNECT = "rose.on_disconnect"       # scope key: callbacks for a client gone mid-request
ANSWERED = "rose.answered"              # scope key: the status the connection answered itself
LINGER = 1.0                            # seconds a refused connection drains its input
FD_RESERVE = 256                        # file descriptors kept for everything but client connections


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int
    header_timeout: float = 5.0
    body_timeout: float = 10.0
    min_body_rate: int = 65536
    max_header_bytes: int = 32768
    max_headers: int = 100
    retry_after: int = 1

    @property
    def overflow(self) -> int:
        """Connections over the cap that still get their 503 answer."""
        return max(64, self.max_connections // 8)


def default_max_connections(wanted: int | None) -> int:
    """`wanted`, or 1024, lowered to what RLIMIT_NOFILE leaves (the soft limit raised to the hard
    one first): the cap plus its overflow plus FD_RESERVE must fit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > 1 << 20:
        hard = 1 << 20
    if soft != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    room = max(1, (min(soft, hard) - FD_RESERVE) * 8 // 9)
    if wanted is not None and wanted > room:
        log.warning("max_connections %d does not fit the file limit (%d); using %d", wanted, soft, room)
    return min(wanted or 1024, room)


class _Refused(Exception):
    """Raised in a parser callback to stop parsing; the refusal is in LimitedHttpProtocol._refusal."""


class LimitedHttpProtocol(HttpToolsProtocol):
    """Set by protocol_class(): the limits, the count of admitted connections, the metrics hook."""
    limits: ConnectionLimits
    admitted: int = 0
    on_refused: Callable[[int], None] = staticmethod(lambda status: None)
    direct = None                   # the handler of POST /v1/embeddings (direct.py), or None: all via the app

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._admitted = self._refusing = self._in_head = self._begun = False
        self._timer = None
        self._head_bytes = self._head_size = self._header_count = self._body_bytes = 0
        self._body_t0 = 0.0
        self._refusal: tuple[int, str, str] | None = None     # set before a callback raises _Refused

    # ------------------------------------------------------------------ connection
    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        cls, lim = type(self), self.limits
        if cls.admitted >= lim.max_connections and not self._close_an_idle_one():
            if len(self.connections) > lim.max_connections + lim.overflow:
                transport.abort()
                return
            self._refuse(503, f"the gateway has {lim.max_connections} connections open, its limit; retry later",
                         "too_many_connections", lim.retry_after)
            return
        cls.admitted += 1
        self._admitted = self._in_head = True
        self._arm(lim.header_timeout, self._expired)

    def connection_lost(self, exc) -> None:
        if self._admitted:
            self._admitted = False
            type(self).admitted -= 1
        self._disarm()
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            for callback in cycle.scope.pop(DISCONNECT, ()):
                callback()
        super().connection_lost(exc)

    def eof_received(self) -> bool:
        """The client closed its sending side (shutdown(SHUT_WR), as `curl -T` or a one-shot client
        does). Requests it sent whole are still answered, then the connection closes; a connection
        with nothing to answer, or a request cut short, closes now."""
        cycle = self.cycle
        waiting = (cycle is not None and not cycle.response_complete) or bool(self.pipeline)
        if self._begun or not waiting or self._refusing:
            return False                       # asyncio closes the transport
        last = self.pipeline[0][0] if self.pipeline else cycle      # pipeline: newest at the left
        last.keep_alive = False                # closed once its answer is written
        return True

    def _close_an_idle_one(self) -> bool:
        """At the cap: close one keep-alive connection waiting for its next request, if there is one."""
        for other in self.connections:
            if isinstance(other, LimitedHttpProtocol) and other._admitted and \
                    other.timeout_keep_alive_task is not None and not other.pipeline:
                other._admitted = False
                type(self).admitted -= 1
                other.transport.close()
                return True
        return False

    # ------------------------------------------------------------------ parsing
    def data_received(self, data: bytes) -> None:
        if self._refusing:
            return                                   # lingering (the answer is sent) or past an upgrade: dropped
        self._unset_keepalive_if_required()
        if self._in_head:
            self._head_bytes += len(data)            # raw bytes of a head still incomplete
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:          # no protocol switch here: answer, then close
            self._refusing = True
            if self.cycle is None or self.cycle.response_complete:
                self.transport.close()
            else:
                self.cycle.keep_alive = False
            return
        except httptools.HttpParserError as e:
            if self._refusal is not None:
                self._refuse(*self._refusal)
            else:
                self._refuse(400, f"malformed HTTP request: {e}", "invalid_http")
            return
        if self._in_head and self._head_bytes > self.limits.max_header_bytes:
            self._refuse(431, f"the request line and headers are over {self.limits.max_header_bytes} bytes",
                         "request_header_fields_too_large")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = self._begun = True
        self._head_size = self._header_count = 0
        if self._timer is None:                      # a kept-alive connection's next request
            self._arm(self.limits.header_timeout, self._expired)

    def on_url(self, url: bytes) -> None:
        self._grow_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > self.limits.max_headers:
            self._stop(431, f"the request has more than {self.limits.max_headers} header fields")
        self._grow_head(len(name) + len(value) + 4)
        super().on_header(name, value)

    def _grow_head(self, n: int) -> None:
        self._head_size += n
        if self._head_size > self.limits.max_header_bytes:
            self._stop(431, f"the request line and headers are over {self.limits.max_header_bytes} bytes")

    def _stop(self, status: int, message: str, code: str = "request_header_fields_too_large") -> None:
        self._refusal = (status, message, code)
        raise _Refused

    def on_headers_complete(self) -> None:
        if self.parser.should_upgrade() and any(n in (b"content-length", b"transfer-encoding") and v.strip() != b"0"
                                                for n, v in self.headers):
            # the parser hands what follows an upgrade request's headers to the new protocol: its body
            # would be lost (the request would look empty); without a body it is served, then closed
            self._stop(400, "the gateway does not switch protocols and cannot read the body of a request that "
                            "asks to: send it without 'Connection: Upgrade' (curl: --http1.1)", "upgrade_not_supported")
        self._in_head = False
        self._head_bytes = 0
        self._body_bytes, self._body_t0 = 0, self.loop.time()
        self._arm(self.limits.body_timeout, self._expired)
        self.scope[DISCONNECT] = []
        if self.direct is not None and self.url.partition(b"?")[0] in DIRECT_PATHS and \
                self.parser.get_method() == b"POST":
            self._start_direct()
        else:
            super().on_headers_complete()

    def _start_direct(self) -> None:
        """uvicorn's on_headers_complete for the direct path (direct.py): a DirectCycle, started now or
        queued behind the connection's request in progress."""
        version, scope = self.parser.get_http_version(), self.scope
        raw_path, _, query = self.url.partition(b"?")
        scope.update(method="POST", path=raw_path.decode("ascii"), raw_path=raw_path, query_string=query)
        if version != "1.1":
            scope["http_version"] = version
        existing = self.cycle
        self.cycle = DirectCycle(scope, self.transport, self.flow, self.logger, self.access_logger, False,
                                 self.server_state.default_headers, asyncio.Event(), self.expect_100_continue,
                                 version != "1.0", self.on_response_complete)
        self.cycle.handler = self.direct
        if existing is None or existing.response_complete:
            task = self.loop.create_task(self.cycle.run_asgi(None))
            task.add_done_callback(self.tasks.discard)
            self.tasks.add(task)
        else:                                        # pipelined: started by on_response_complete
            self.flow.pause_reading()
            self.pipeline.appendleft((self.cycle, None))

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._disarm()
        self._begun = False
        super().on_message_complete()

    # ------------------------------------------------------------------ deadlines
    def _arm(self, delay: float, callback) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(delay, callback)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        lim = self.limits
        if self._in_head:
            if not self._begun:                      # nothing sent at all: no request to answer
                self.transport.close()
                return
            self._refuse(408, f"the request headers did not arrive within {lim.header_timeout:g} s", "request_timeout")
            return
        allowed = lim.body_timeout + self._body_bytes / lim.min_body_rate
        waited = self.loop.time() - self._body_t0
        if waited < allowed:                         # the body is still keeping up
            self._arm(allowed - waited, self._expired)
            return
        self._refuse(408, f"the request body did not arrive in time: {self._body_bytes} bytes in {waited:.1f} s "
                          f"(the gateway waits {lim.body_timeout:g} s plus 1 s per {lim.min_body_rate} bytes)",
                     "request_timeout")

    # ------------------------------------------------------------------ refusing
    def _refuse(self, status: int, message: str, code: str, retry_after: int | None = None) -> None:
        """Answer `status` (unless a response has begun), then drain the input for LINGER seconds and close."""
        self._refusing = True
        self._disarm()
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.scope[ANSWERED] = status
            cycle.scope.pop(DISCONNECT, None)
            if cycle.response_started:               # too late for an answer: just close
                self.transport.close()
                return
            cycle.disconnected = True                # the app's late answer is dropped, its receive() ends
            cycle.message_event.set()
        self.on_refused(status)
        if self.flow is not None:
            self.flow.resume_reading()               # paused under a large body: drained from here on
        self.transport.write(raw_error_response(status, message, code, retry_after))
        try:
            self.transport.write_eof()
        except (OSError, RuntimeError, NotImplementedError):   # asyncio transports that cannot
            self.transport.close()                              # half-close raise NotImplementedError
            return
        self._timer = self.loop.call_later(LINGER, self.transport.close)


def protocol_class(limits: ConnectionLimits, on_refused: Callable[[int], None],
                   direct=None) -> type[LimitedHttpProtocol]:
    """A LimitedHttpProtocol class of its own (its own connection count) for uvicorn.run(http=...);
    `direct`: the handler POST /v1/embeddings goes to without the app (direct.py)."""
    return type("GatewayHttpProtocol", (LimitedHttpProtocol,),
                {"limits": limits, "admitted": 0, "on_refused": staticmethod(on_refused),
                 "direct": staticmethod(direct) if direct is not None else None})
