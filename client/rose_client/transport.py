"""One gRPC bidirectional stream (ModelStreamInfer) to one Triton server, many requests in flight.

Requests are matched to responses by request id (Triton repeats the id on error responses too),
so one stream carries any number of concurrent requests. Uses the Triton gRPC protocol stubs that
ship with tritonclient; no torch and nothing of the server side is imported. Responses arrive as
raw bytes: a large one is decoded by hand so that its tensors are views of the received message
(_decode), not two copies of it (a 100 x 512 ColBERT answer is 210 MB).

    conn = StreamConnection("127.0.0.1:8001")
    fut = conn.infer("rose", [("INPUT_IDS", ids), ("SEQ_LENS", lens)])   # concurrent.futures.Future
    fut.result()["EMBEDDINGS"]                                            # np.ndarray

Several streams can share one Channel (one HTTP/2 connection): EmbeddingClient gives each call
streams of its own, so that `cancel()` (which ends a stream, and with it every request on it at
the server) cancels that call's requests and nobody else's. A Channel carries the metadata of its
streams: the API key of a deployment that requires one (rose_client.auth.grpc_api_key_headers).
Requests to `tokenize` go on a second stream of the same connection (StreamConnection's split_unary).
"""
from __future__ import annotations

import itertools
import queue
import struct
import threading
from concurrent.futures import Future

import grpc
import numpy as np
from tritonclient.grpc import service_pb2

from rose_client.contract import UNARY_MODELS

_NP_TO_TRITON = {np.dtype(np.int32): "INT32", np.dtype(np.int64): "INT64", np.dtype(np.float32): "FP32",
                 np.dtype(np.bool_): "BOOL", np.dtype(np.uint8): "UINT8"}
_TRITON_TO_NP = {"INT32": np.int32, "INT64": np.int64, "FP32": np.float32, "FP16": np.float16, "BOOL": np.bool_,
                 "INT8": np.int8, "UINT8": np.uint8}
_CHANNEL_OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]


class ServerError(RuntimeError):
    """The server answered a request with an error (bad input, overload, ...).

    `retryable` is True when the server said it is overloaded / unavailable ("... retry later"):
    the same request may succeed later or elsewhere. Bad input is not retryable.
    `server_leaving` is True when the server is shutting down (Triton answers "... has no available
    versions" once SIGTERM has unloaded the model, or "Server is stopping" from an ensemble's
    scheduler before that) or cannot serve the model any more (a model's Python stub died: "Stub
    process '<instance>' is not healthy."): the request belongs on another replica, and the
    stream should be closed, since tritonserver does not exit while a client holds one open.
    """

    def __init__(self, message: str):
        super().__init__(message)
        low = message.lower()
        self.server_leaving = any(m in low for m in _LEAVING_MARKERS)
        self.retryable = self.server_leaving or any(m in low for m in _RETRYABLE_MARKERS)


_RETRYABLE_MARKERS = ("overloaded", "retry later", "unavailable", "exceeds the queue", "resource exhausted")
# Triton while it stops: the model unloaded ("has no available versions"), or an ensemble whose
# scheduler stopped taking requests ("Server is stopping, scheduler for model has stopped accepting
# new inference requests")
# ... or whose model's Python stub died (python_backend: "Stub process 'rose_0_0' is not healthy.",
# "Stub process is not healthy.", "Failed to obtain the health mutex.")
_LEAVING_MARKERS = ("has no available versions", "shutting down", "server is stopping",
                    "stopped accepting new inference requests", "is not healthy", "health mutex")


class AccessDenied(ServerError):
    """The server refused the client's key (Triton's restricted protocols: no key, or a wrong one).
    Not retryable: every replica of a deployment checks the same key."""

    def __init__(self, message: str):
        super().__init__(message)
        self.retryable = self.server_leaving = False


_DENIED_MARKER = "protocol is restricted"      # Triton: "This protocol is restricted, expecting header ..."


class ConnectionLost(ConnectionError):
    """The stream to a server broke before the request was answered."""


def serialize_bytes(items) -> bytes:
    """Triton's BYTES wire format: each element as a 4-byte little-endian length, then its bytes."""
    out = []
    for s in items:
        b = s.encode("utf-8") if isinstance(s, str) else bytes(s)
        out.append(struct.pack("<I", len(b)))
        out.append(b)
    return b"".join(out)


class Channel:
    """One gRPC channel (one HTTP/2 connection) to one server, shared by the streams opened on it.
    headers: gRPC metadata sent at the start of each of its streams (e.g. an API key)."""

    def __init__(self, url: str, headers: dict[str, str] | None = None):
        self.url = url
        self.metadata = tuple(headers.items()) if headers else None
        self.grpc = grpc.insecure_channel(url, options=_CHANNEL_OPTIONS)

    def stream(self) -> "StreamConnection":
        return StreamConnection(self.url, channel=self)

    def close(self) -> None:
        """Close the connection: every stream on it ends, its pending requests fail with ConnectionLost."""
        self.grpc.close()


class StreamConnection:
    def __init__(self, url: str, channel: Channel | None = None, headers: dict[str, str] | None = None,
                 split_unary: bool = True):
        """A stream on `channel`, or on a channel of its own (closed with it) made with `headers`.
        split_unary: requests to contract.UNARY_MODELS (`tokenize`) go on a second stream on the same
        channel, opened at the first (`unary_stream`), since Triton 2.51 aborts when one stream mixes
        them with a decoupled model; False: every request on this stream."""
        self.url, self.split_unary = url, split_unary
        self.unary_stream: StreamConnection | None = None
        self._owns_channel = channel is None
        self.channel = Channel(url, headers) if channel is None else channel
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._pending: dict[str, Future] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._closed = False
        self.broken: Exception | None = None
        # raw bytes in, decoded here (_decode): large outputs become views of the received message
        self._responses = self.channel.grpc.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            request_serializer=service_pb2.ModelInferRequest.SerializeToString)(
                self._requests(), metadata=self.channel.metadata)
        self._reader = threading.Thread(target=self._read, name=f"rose-stream-{url}", daemon=True)
        self._reader.start()

    @property
    def outstanding(self) -> int:
        return len(self._pending) + (self.unary_stream.outstanding if self.unary_stream else 0)

    def infer(self, model: str, inputs: list[tuple[str, object]], outputs: list[str] | None = None,
              parameters: dict[str, str] | None = None) -> Future:
        """Send one request; `inputs` are (name, np.ndarray) pairs, or (name, list of str) for BYTES.
        `outputs`: the output names to return (None: all the model has); `parameters`: string
        request parameters."""
        if self.split_unary and model in UNARY_MODELS:
            with self._lock:
                if self.unary_stream is None and not self._closed:
                    self.unary_stream = StreamConnection(self.url, channel=self.channel, split_unary=False)
            if self.unary_stream is not None:
                return self.unary_stream.infer(model, inputs, outputs, parameters)
        fut: Future = Future()
        rid = f"{next(self._ids)}"
        request = build_request(model, rid, inputs, outputs, parameters)
        with self._lock:
            if self.broken is not None or self._closed:
                fut.set_exception(self.broken if isinstance(self.broken, AccessDenied) else
                                  ConnectionLost(f"{self.url}: stream is closed ({self.broken})"))
                return fut
            self._pending[rid] = fut
        self._outbox.put(request)
        return fut

    def _requests(self):
        while True:
            r = self._outbox.get()
            if r is None:
                return
            yield r

    def _read(self):
        try:
            for raw in self._responses:
                rid, answer = read_answer(raw, self.url)
                with self._lock:
                    fut = self._pending.pop(rid, None)
                if fut is not None:                   # None: e.g. an empty FINAL-only message
                    settle(fut, answer)
            error: Exception = ConnectionLost(f"{self.url}: the server closed the stream")
        except grpc.RpcError as e:
            error = _rpc_error(self.url, e)
        except Exception as e:  # pragma: no cover - defensive: never leave futures hanging
            error = ConnectionLost(f"{self.url}: {type(e).__name__}: {e}")
        with self._lock:
            self.broken = error
            pending, self._pending = self._pending, {}
        self._outbox.put(None)          # no request follows: gRPC's thread sending them ends too
        for fut in pending.values():
            fut.set_exception(error)

    def close(self, wait: bool = True):
        """Close the stream. On a channel of its own: the channel too, and requests still pending
        fail with ConnectionLost (never left hanging). On a shared channel: no more requests; the
        server answers those pending, then the stream ends."""
        with self._lock:
            self._closed = True
        if self.unary_stream is not None:
            self.unary_stream.close(wait)
        self._outbox.put(None)
        if self._owns_channel:
            self.channel.close()
        if wait and threading.current_thread() is not self._reader:
            self._reader.join(5)

    def cancel(self) -> None:
        """End the stream now: the server cancels the requests still pending on it (rose drops
        their sequences not yet computed); here they fail with ConnectionLost."""
        with self._lock:
            self._closed = True
        if self.unary_stream is not None:
            self.unary_stream.cancel()
        self._outbox.put(None)
        self._responses.cancel()
        if self._owns_channel:
            self.channel.close()


def build_request(model: str, rid: str, inputs: list[tuple[str, object]], outputs: list[str] | None,
                  parameters: dict[str, str] | None) -> service_pb2.ModelInferRequest:
    """One ModelInferRequest (see StreamConnection.infer for the arguments)."""
    request = service_pb2.ModelInferRequest(model_name=model, id=rid)
    for name in outputs or ():
        request.outputs.add().name = name
    for key, value in (parameters or {}).items():
        request.parameters[key].string_param = str(value)
    for name, value in inputs:
        t = request.inputs.add()
        t.name = name
        if isinstance(value, np.ndarray) and value.dtype != object:
            t.datatype = _NP_TO_TRITON[value.dtype]
            t.shape.extend(value.shape)
            request.raw_input_contents.append(np.ascontiguousarray(value).tobytes())
        else:
            items = list(value.reshape(-1)) if isinstance(value, np.ndarray) else list(value)
            t.datatype = "BYTES"
            t.shape.append(len(items))
            request.raw_input_contents.append(serialize_bytes(items))
    return request


def read_answer(raw: bytes, url: str) -> tuple[str, dict | Exception]:
    """A stream message's request id and its answer: the outputs (name -> array), or the exception
    its request fails with (the server's error; a malformed answer fails its own request only)."""
    resp, contents = _decode(raw)
    rid = resp.infer_response.id
    if resp.error_message:
        return rid, ServerError(f"{url}: {resp.error_message}")
    try:
        return rid, _outputs(resp.infer_response, contents)
    except ServerError as e:
        return rid, e
    except Exception as e:
        return rid, ServerError(f"{url}: malformed response to request {rid}: {type(e).__name__}: {e}")


def settle(fut, answer: dict | Exception) -> None:
    """Resolve a request's future (concurrent or asyncio) with read_answer's answer."""
    if isinstance(answer, Exception):
        fut.set_exception(answer)
    else:
        fut.set_result(answer)


def _rpc_error(url: str, e: grpc.RpcError) -> Exception:
    """What a broken stream's gRPC error becomes: AccessDenied when the server refused the key."""
    details = e.details() or ""
    if e.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED) or \
            _DENIED_MARKER in details.lower():
        return AccessDenied(f"{url}: the server refused this client's API key ({details})")
    return ConnectionLost(f"{url}: {e.code().name}: {details}{http1_hint(details)}")


def http1_hint(details: str) -> str:
    """What to say when a gRPC url turned out to be an HTTP/1 server (Triton's HTTP port, the gateway)."""
    if "Failed parsing HTTP/2" in details or "http1.x" in details.lower():
        return (" -- this address answers HTTP/1, not gRPC: point the client at rose's gRPC port "
                "(GRPC_PORT, 8001 by default); 8000 is Triton's HTTP port and 8080 the HTTP gateway")
    return ""


def _outputs(response, contents=None) -> dict[str, np.ndarray]:
    """Output name -> array (read-only, over the received bytes: no copy). `contents`: the raw
    output contents as _decode found them, else the response's own."""
    contents = response.raw_output_contents if contents is None else contents
    out = {}
    for i, o in enumerate(response.outputs):
        if o.datatype not in _TRITON_TO_NP:
            raise ServerError(f"unexpected output datatype {o.datatype} for {o.name}")
        out[o.name] = np.frombuffer(contents[i], dtype=_TRITON_TO_NP[o.datatype]).reshape(tuple(o.shape))
    return out


_LARGE = 1 << 20      # bytes: a message this large is split by hand so its tensors are not copied


def _decode(raw: bytes) -> tuple[service_pb2.ModelStreamInferResponse, list | None]:
    """A ModelStreamInferResponse from its wire bytes, and (for a large one) its raw output contents
    as memoryviews of `raw`. Protobuf would copy each raw output twice (parsing, then reading the
    field); for a 210 MB ColBERT answer that is most of the client's time. So a large message is
    walked by hand: the raw_output_contents fields (ModelInferResponse field 6) are kept as views,
    everything else is handed to protobuf (fields concatenate: the rest parses as a message)."""
    if len(raw) < _LARGE:
        return service_pb2.ModelStreamInferResponse.FromString(raw), None
    view = memoryview(raw)
    rest, inner, contents = [], [], []
    for field, start, body, end in _fields(view, 0, len(raw)):
        if field != 2:                                   # ModelStreamInferResponse.infer_response
            rest.append(view[start:end])
            continue
        for f, s, b, e in _fields(view, body, end):
            if f == 6:                                   # ModelInferResponse.raw_output_contents
                contents.append(view[b:e])
            else:
                inner.append(view[s:e])
    resp = service_pb2.ModelStreamInferResponse.FromString(b"".join(rest))
    resp.infer_response.MergeFromString(b"".join(inner))
    return resp, contents


def _varint(buf: memoryview, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def _fields(buf: memoryview, i: int, end: int):
    """(field number, field start, value start, field end) of each field of the message in buf[i:end]."""
    while i < end:
        start = i
        key, i = _varint(buf, i)
        kind = key & 7
        if kind == 0:
            _, j = _varint(buf, i)
        elif kind == 1:
            j = i + 8
        elif kind == 2:
            n, i = _varint(buf, i)
            j = i + n
        elif kind == 5:
            j = i + 4
        else:
            raise ServerError(f"malformed response: wire type {kind}")
        yield key >> 3, start, i, j
        i = j
