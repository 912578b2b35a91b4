"""POST /v1/embeddings (and TEI's POST /embed and /) without ASGI: the connection (protocol.py) hands the request to a
DirectCycle, which reads the body itself, awaits the gateway's handler once and writes the whole
answer in one write. No scope-to-Request translation, no middleware, no ASGI messages: the
request's Python is the parser's callbacks, this cycle and the handler.

    cycle = DirectCycle(..., handler=endpoint.direct_endpoint(...))    # protocol.py builds it
    status, body, headers = await handler(cycle)                        # run_asgi awaits it

The cycle keeps uvicorn's RequestResponseCycle's attributes (body, more_body, disconnected,
response_started, response_complete, keep_alive, message_event, on_response), so the connection's
keep-alive, pipelining, flow control, limits (protocol.py: 408 / 431 / 503) and graceful shutdown
treat it as any other request; every other route still goes through the Starlette app.
"""
from __future__ import annotations

import http

from uvicorn.protocols.http.flow_control import CLOSE_HEADER
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from rose_gateway import stages
from rose_gateway.errors import too_large

# POST only (OpenAI's embeddings, TEI's /embed and /); the rest is the app's
DIRECT_PATHS = (b"/v1/embeddings", b"/embeddings", b"/embed", b"/")
JSON = b"application/json"
_STATUS = {s: f"HTTP/1.1 {s} {http.HTTPStatus(s).phrase}\r\n".encode("ascii") for s in http.HTTPStatus}
_STATUS[499] = b"HTTP/1.1 499 Client Closed Request\r\n"


class ClientGone(Exception):
    """The client went away (or the connection refused the request) while its body was read."""


class DirectCycle(RequestResponseCycle):
    handler = None          # async (cycle) -> (status, body, [(name, value)]), set by protocol.py

    def header(self, name: bytes) -> bytes | None:
        for n, v in self.scope["headers"]:
            if n == name:
                return v
        return None

    async def read_body(self, limit: int) -> bytes:
        """The whole body; 413 past `limit` bytes (a declared Content-Length over it before reading)."""
        declared = self.header(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise too_large(None, f"the request body has {int(declared)} bytes; the limit is {limit}")
        chunks, size = [], 0
        while True:
            if self.body:
                size += len(self.body)
                if size > limit:
                    raise too_large(None, f"the request body is over the limit of {limit} bytes")
                chunks.append(self.body)
                self.body = b""
            if self.disconnected:
                raise ClientGone
            # paused by on_body over its high-water mark: read on, also once the body is whole (else a
            # client's reset would not be seen while its request is served)
            self.flow.resume_reading()
            if not self.more_body:
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)
            if self.waiting_for_100_continue and not self.transport.is_closing():
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                self.waiting_for_100_continue = False
            self.message_event.clear()
            await self.message_event.wait()

    async def run_asgi(self, _app) -> None:
        """(Named as uvicorn's, which starts and pipelines cycles by it.) The handler answers every
        failure itself; anything it lets through is logged here and answers 500."""
        try:
            status, body, headers = await self.handler(self)
            if self.flow.write_paused and not self.disconnected:
                await self.flow.drain()
            self.write(status, body, headers)
        except BaseException as exc:
            self.logger.error("the embeddings path failed", exc_info=exc)
            if not self.response_started and not self.disconnected:
                self.write(500, b'{"error": {"message": "internal error in the gateway (see its log)", '
                                b'"type": "server_error", "param": null, "code": "internal_error"}}', [])
            else:
                self.transport.close()
            if not isinstance(exc, Exception):
                raise
        finally:
            self.on_response = lambda: None

    def write(self, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        """The whole answer in one write (dropped when the client is gone or the connection has
        answered itself); then the connection's next request or its keep-alive timer."""
        if self.disconnected or self.response_started:
            return
        self.response_started = True
        self.waiting_for_100_continue = False
        if self.keep_alive and CLOSE_HEADER in self.scope["headers"]:
            self.keep_alive = False
        head = [_STATUS.get(status) or f"HTTP/1.1 {status} \r\n".encode("ascii")]
        for name, value in self.default_headers:
            head += (name, b": ", value, b"\r\n")
        head += (b"content-type: application/json\r\ncontent-length: ", str(len(body)).encode("ascii"), b"\r\n")
        for name, value in headers:
            head += (name, b": ", value, b"\r\n")
        if not self.keep_alive:
            head.append(b"connection: close\r\n")
        head += (b"\r\n", body)
        self.transport.write(b"".join(head))
        stages.finish()
        self.response_complete = True
        self.message_event.set()
        if not self.keep_alive:
            self.transport.close()
        self.on_response()
