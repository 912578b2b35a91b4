"""StreamConnection and Channel on grpc.aio: the same stream protocol (transport.py) driven by the
event loop that uses it, with no reader or writer thread. A request is written by the channel's
write path and its answer resolves an asyncio.Future on the loop, so a call to `rose` costs no
thread hand-over on either side (the threaded stream needs two: its writer thread, then its reader
thread waking the loop).

    channel = AioChannel("127.0.0.1:8001")            # inside a running event loop
    conn = channel.stream()
    out = await conn.infer("rose", [("INPUT_IDS", ids), ("SEQ_LENS", lens)])   # asyncio.Future

The interface is StreamConnection's (infer, outstanding, broken, channel, close, cancel), so the
client's Job drives either (AsyncEmbeddingClient(..., asyncio_streams=True)). Everything is bound to
the loop the channel was made in; close() may be called from any thread.
"""
from __future__ import annotations

import asyncio
import itertools

import grpc

from rose_client.transport import (_CHANNEL_OPTIONS, AccessDenied, ConnectionLost, _rpc_error, build_request,
                                   read_answer, settle)

_METHOD = "/inference.GRPCInferenceService/ModelStreamInfer"
_CLOSING: set = set()          # channel-close tasks still running (kept referenced until done)


class AioChannel:
    """One grpc.aio channel (one HTTP/2 connection) to one server; made inside a running loop."""

    def __init__(self, url: str, headers: dict[str, str] | None = None):
        self.url = url
        self.metadata = tuple(headers.items()) if headers else None
        self.loop = asyncio.get_running_loop()
        self.grpc = grpc.aio.insecure_channel(url, options=_CHANNEL_OPTIONS)
        self.streams: set[AioStream] = set()
        self.closed: asyncio.Future = self.loop.create_future()     # done once the channel is closed

    def stream(self) -> "AioStream":
        return AioStream(self.url, self)

    def close(self) -> None:
        """Close the connection (from any thread): every stream on it ends, and its pending
        requests fail with ConnectionLost."""
        def on_loop():
            if self.closed.done():
                return
            for s in list(self.streams):
                s.fail(ConnectionLost(f"{self.url}: the connection was closed"))
            task = self.loop.create_task(self.grpc.close())
            _CLOSING.add(task)

            def done(t):
                _CLOSING.discard(t)
                if not self.closed.done():
                    self.closed.set_result(None)
            task.add_done_callback(done)
        if _on_loop(self.loop):
            on_loop()
        elif not self.loop.is_closed():
            self.loop.call_soon_threadsafe(on_loop)


class AioStream:
    """One ModelStreamInfer stream on an AioChannel; many requests in flight, matched by id."""

    def __init__(self, url: str, channel: AioChannel):
        self.url, self.channel = url, channel
        self._pending: dict[str, asyncio.Future] = {}
        self._ids = itertools.count()
        self._closed = False
        self.broken: Exception | None = None
        self._outbox: asyncio.Queue = asyncio.Queue()
        self._call = channel.grpc.stream_stream(_METHOD)(self._requests(), metadata=channel.metadata)
        self._reader = channel.loop.create_task(self._read())
        channel.streams.add(self)

    @property
    def outstanding(self) -> int:
        return len(self._pending)

    def infer(self, model: str, inputs: list, outputs: list[str] | None = None,
              parameters: dict[str, str] | None = None) -> asyncio.Future:
        """As StreamConnection.infer (on the channel's loop), an asyncio.Future of the outputs."""
        fut = self.channel.loop.create_future()
        fut.add_done_callback(_retrieved)           # a failure nobody awaits (its call ended) is no error to log
        if self.broken is not None or self._closed:
            fut.set_exception(self.broken if isinstance(self.broken, AccessDenied) else
                              ConnectionLost(f"{self.url}: stream is closed ({self.broken})"))
            return fut
        rid = f"{next(self._ids)}"
        self._pending[rid] = fut
        self._outbox.put_nowait(build_request(model, rid, inputs, outputs, parameters).SerializeToString())
        return fut

    async def _requests(self):
        while True:
            r = await self._outbox.get()
            if r is None:
                return
            yield r

    async def _read(self) -> None:
        try:
            async for raw in self._call:
                rid, answer = read_answer(raw, self.url)
                fut = self._pending.pop(rid, None)
                if fut is not None and not fut.done():
                    settle(fut, answer)
            error: Exception = ConnectionLost(f"{self.url}: the server closed the stream")
        except grpc.RpcError as e:
            error = _rpc_error(self.url, e)
        except asyncio.CancelledError:
            error = ConnectionLost(f"{self.url}: the stream was cancelled")
        except Exception as e:  # pragma: no cover - defensive: never leave futures hanging
            error = ConnectionLost(f"{self.url}: {type(e).__name__}: {e}")
        self.fail(error)

    def fail(self, error: Exception) -> None:
        """The stream is over: its pending requests fail with `error`."""
        if self.broken is None:
            self.broken = error
        self.channel.streams.discard(self)
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(error)

    def close(self, wait: bool = True) -> None:
        """No more requests; the server answers those pending, then the stream ends. (`wait`: for
        StreamConnection's signature; nothing here runs on a thread to wait for.)"""
        self._closed = True
        self._outbox.put_nowait(None)

    def cancel(self) -> None:
        """End the stream now: the server cancels the requests still pending on it; here they fail
        with ConnectionLost."""
        self._closed = True
        self._outbox.put_nowait(None)
        self._call.cancel()
        self.fail(ConnectionLost(f"{self.url}: the stream was cancelled"))


def _retrieved(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
