"""SIGTERM to a launch stops it within its bound whatever its clients hold open, with real clients:
idle gRPC streams (Triton 2.51 keeps a model loaded while a stream whose first request went to it
is open) no longer hold tritonserver for its exit timeout; requests in flight are answered, a request
on a new connection during the drain is refused with UNAVAILABLE; and the gateway drains side by
side with Triton, so a slow HTTP upload beside 200 idle streams costs drain_timeout_s + 5 s at most;
a SIGTERM that comes while the launch is still starting (its gateway's workers not yet serving) stops it
within the same bound."""
from __future__ import annotations

import queue
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from rose_client.transport import ServerError
from support.launcher import LauncherRun
from support.server import repository_with
from tritonclient.utils import InferenceServerException

from support import leftovers
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]      # each client its own TCP connection


def text(words: int = 1, n: int = 1) -> list:
    t = grpcclient.InferInput("TEXT", [n], "BYTES")
    t.set_data_from_numpy(np.array([("word " * words).encode()] * n, object))
    return [t]


def token_ids(n: int = 1, length: int = 3) -> list:
    ids = grpcclient.InferInput("INPUT_IDS", [n * length], "INT32")
    ids.set_data_from_numpy(np.full(n * length, 2000, np.int32))
    lens = grpcclient.InferInput("SEQ_LENS", [n], "INT32")
    lens.set_data_from_numpy(np.full(n, length, np.int32))
    return [ids, lens]


class Stream:
    """A tritonclient gRPC stream on its own connection, its answers (result, error) in a queue."""

    def __init__(self, url: str):
        self.answers: queue.Queue = queue.Queue()
        self.client = grpcclient.InferenceServerClient(url, channel_args=OWN_CONNECTION)
        self.client.start_stream(callback=lambda result, error: self.answers.put((result, error)))

    def send(self, model: str, inputs: list) -> None:
        self.client.async_stream_infer(model, inputs)

    def close(self) -> None:
        try:
            self.client.stop_stream()
        finally:
            self.client.close()


def idle_streams(url: str, n: int, models: list[str]) -> list[Stream]:
    """n streams, each answered once (by models[i % len], so that it is the model the stream holds), then
    idle; opened 16 at a time."""
    def one(i: int) -> Stream:
        s = Stream(url)
        model = models[i % len(models)]
        s.send(model, token_ids() if model == "rose" else text())
        result, error = s.answers.get(timeout=120)
        assert error is None, error
        return s
    with ThreadPoolExecutor(16) as pool:
        futures = [pool.submit(one, i) for i in range(n)]
    streams = [f.result() for f in futures if f.exception() is None]
    if len(streams) < n:
        for s in streams:
            s.close()
        raise next(f.exception() for f in futures if f.exception() is not None)
    return streams


def stop_and_check(run: LauncherRun, bound: float, busy: Stream | None = None, sent: int = 0) -> float:
    """SIGTERM; a request on a new connection half a second later gets UNAVAILABLE; the launch exits
    with code 0 within `bound` seconds, having answered the `sent` requests of `busy`, leaving nothing."""
    t0 = time.monotonic()
    run.proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    late = grpcclient.InferenceServerClient(run.grpc_url, channel_args=OWN_CONNECTION)
    with pytest.raises(InferenceServerException) as refused:
        late.infer("tokenize", text(), client_timeout=10)
    late.close()
    # refused as the server stops: UNAVAILABLE, or NOT_FOUND once SIGTERM has unloaded the model (no
    # stream holds it), which rose_client reads as the server leaving (ServerError.server_leaving)
    status, message = refused.value.status(), refused.value.message() or ""
    assert status == "StatusCode.UNAVAILABLE" or (status == "StatusCode.NOT_FOUND" and ServerError(message).server_leaving), \
        (status, message)
    code = run.proc.wait(bound + 10)
    seconds = time.monotonic() - t0
    if busy is not None:
        answers = [busy.answers.get(timeout=5) for _ in range(sent)]
        assert all(e is None for _, e in answers), [str(e) for _, e in answers if e is not None]
    assert code == 0, run.output[-3000:]
    assert seconds <= bound, (seconds, run.output[-3000:])
    procs, segs = leftovers.wait_gone(run.prefixes, 10.0)
    assert not procs and not segs, (procs, segs)
    return seconds


@pytest.mark.server
def test_50_idle_streams_do_not_hold_the_stop():
    """Idle streams on each kind of model (an ensemble, the decoupled `rose`, a plain Python model).
    Held open, they kept the server for its whole exit timeout (22 s) and then got it killed; the
    stop is timed beside the other workers' load (6.1 s with three CPU hogs on two cores), within 12 s."""
    with LauncherRun() as run:
        assert run.wait_for("HTTP (OpenAI-compatible)", 300), run.output
        streams = idle_streams(run.grpc_url, 50, ["embed", "rose", "tokenize"])
        busy = Stream(run.grpc_url)
        try:
            for _ in range(3):                                   # in flight when SIGTERM comes
                busy.send("embed", text(words=100, n=4))
                busy.send("rose", token_ids(n=2, length=256))
            time.sleep(0.1)
            assert busy.answers.qsize() < 6                       # some were still being computed
            stop_and_check(run, 12.0, busy, 6)
            _, error = streams[0].answers.get(timeout=10)         # an idle stream is told that it ended
            assert error is not None and "StatusCode.UNAVAILABLE" in str(error.status()), error
        finally:
            for s in [*streams, busy]:
                s.close()


def slow_upload(url: str, stop: threading.Event) -> socket.socket:
    """An HTTP request whose body comes a few bytes every half second (a slow client)."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: rose\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 100000\r\n\r\n{\"input\": \"")

    def trickle():
        while not stop.wait(0.5):
            try:
                sock.sendall(b"word ")
            except OSError:
                return
    threading.Thread(target=trickle, daemon=True).start()
    return sock


@pytest.mark.server
def test_a_slow_upload_and_200_idle_streams_stop_within_the_drain_bound(tmp_path):
    """The documented bound, drain_timeout_s + 5 s, beside the other workers' load (4.6 s with
    three CPU hogs on two cores, drain_timeout_s 4)."""
    drain = 4
    repo = repository_with({"rose": {"drain_timeout_s": str(drain)}}, tmp_path)
    with LauncherRun("--repository", str(repo)) as run:
        assert run.wait_for("HTTP (OpenAI-compatible)", 300), run.output
        streams = idle_streams(run.grpc_url, 200, ["embed", "rose"])
        stop = threading.Event()
        upload = slow_upload(run.gateway_url, stop)
        try:
            time.sleep(1.0)
            seconds = stop_and_check(run, drain + 5.0)
            assert seconds >= drain - 1                           # the gateway did wait for the upload
        finally:
            stop.set()
            upload.close()
            for s in streams:
                s.close()


def wait_server_ready(client: grpcclient.InferenceServerClient, timeout: float) -> None:
    """Until tritonserver says it is ready (every model loaded), polling from before its gRPC port listens."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if client.is_server_ready(client_timeout=2):
                return
        except InferenceServerException:
            pass
        time.sleep(0.1)
    raise AssertionError("tritonserver was not ready in time")


@pytest.mark.server
def test_sigterm_while_the_gateway_starts_stops_within_the_drain_bound(tmp_path):
    """SIGTERM once tritonserver is ready, with a client that connected before its gRPC port listened,
    an open stream on which a request for a missing model name was refused, and the gateway's 16
    workers still starting. The launcher used to finish its start first (wait for the gateway to
    serve, print its banner) and only then stop: 5.5-10 s here with drain_timeout_s 2, past the 7 s
    bound in 2 runs of 4. It now stops at once: 2.3-3.1 s here. On a loaded machine the gateway may
    be serving before the refusal comes back: that launch is a plain stop (the bound still holds)
    and the case is tried again on a new launch, up to three times."""
    drain = 2
    repo = repository_with({"rose": {"drain_timeout_s": str(drain)}}, tmp_path)
    for _ in range(3):
        output = sigterm_once_tritonserver_is_ready(repo, drain)
        if "rose: SIGTERM: stopped while" in output:
            assert "HTTP (OpenAI-compatible)" not in output, output[-3000:]
            return
        assert "HTTP (OpenAI-compatible)" in output, output[-3000:]      # started in full: not the case
    raise AssertionError("the gateway was serving before SIGTERM in all three launches")


def sigterm_once_tritonserver_is_ready(repo, drain: float) -> str:
    """One launch of the case above, stopped within drain + 5 s with nothing left behind; its output."""
    with LauncherRun("--repository", str(repo), env={"GATEWAY_WORKERS": "16"}) as run:
        early = grpcclient.InferenceServerClient(run.grpc_url, channel_args=OWN_CONNECTION)
        stream = None
        try:
            wait_server_ready(early, 300)
            stream = Stream(run.grpc_url)
            stream.send("embedx", text())
            _, error = stream.answers.get(timeout=60)
            assert error is not None and "unknown model" in error.message(), error
            t0 = time.monotonic()
            run.proc.send_signal(signal.SIGTERM)
            code = run.proc.wait(drain + 30)
            seconds = time.monotonic() - t0
        finally:
            early.close()
            if stream is not None:
                stream.close()
        assert code == 0, run.output[-3000:]
        assert seconds <= drain + 5, (seconds, run.output[-3000:])
        procs, segs = leftovers.wait_gone(run.prefixes, 10.0)
        assert not procs and not segs, (procs, segs)
        return run.output
