"""Nothing outlives the server: kill -9 of tritonserver, of each stub and of the launcher in turn;
a server that received rejected, cancelled and good requests stops within seconds of SIGTERM
(not its exit timeout); a port already in use (the gateway's too) fails the launch at once. All with real
processes. The gateway's own watch: tests/gateway/test_gateway_watch.py; stops with clients connected:
tests/launch/test_stop_bound.py."""
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from support import leftovers
from rose_backend.launch.connections import children as children_of
from support.ports import free_port, free_ports
from rose_backend.launch.triton_stop import QUIET_S, SETTLE_S
from rose_backend.launch.tritonserver import TritonProcess
from rose_backend.triton.parent_watch import stub_arguments
from rose_backend.launch.supervision import exit_timeout_for
from rose_client import StreamConnection
from support.server import LOG_DIR, repository_with

ROOT = Path(__file__).resolve().parents[2]
HELLO = [("INPUT_IDS", np.array([101, 7592, 102], np.int32)), ("SEQ_LENS", np.array([3], np.int32))]
DRAIN = 4


def prefix(srv: TritonProcess) -> str:
    return f"rose_{os.getpid()}_{srv.ports.grpc}_"


def stubs(srv: TritonProcess) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for pid, cmd in leftovers.processes([prefix(srv)]).items():
        if "triton_python_backend_stub" in cmd:
            out.setdefault(Path(cmd.split()[1]).parent.parent.name, []).append(pid)
    return out


def assert_nothing_left(srv: TritonProcess, timeout: float = 5.0) -> None:
    procs, segs = leftovers.wait_gone([prefix(srv)], timeout)
    assert not procs and not segs, (procs, segs)


def busy(srv: TritonProcess, seconds: float = 1.0) -> StreamConnection:
    """A stream with requests waiting in rose's pool (small batches: they wait > 50 ms, so the
    scheduler asks whether they were cancelled: the query a dead server never answers)."""
    conn = StreamConnection(srv.grpc_url)
    for i in range(8):
        conn.infer("rose", [("INPUT_IDS", np.full(64 * 128, 2000 + i, np.int32)),
                            ("SEQ_LENS", np.full(64, 128, np.int32))])
    time.sleep(seconds)
    return conn


@pytest.fixture
def small_server(tmp_path, request):
    """A server with small batches and drain_timeout_s DRAIN (or the test's indirect parameter)."""
    drain = getattr(request, "param", DRAIN)
    repo = repository_with({"rose": {"max_batch_tokens": "256", "max_batch_seqs": "4",
                                      "drain_timeout_s": str(drain)}}, tmp_path)
    LOG_DIR.mkdir(exist_ok=True)
    srv = TritonProcess(None, repo, free_ports(), log_file=LOG_DIR / f"supervision-{tmp_path.name}.log").start()
    try:
        srv.wait_ready(300)
        yield srv
    finally:
        srv.stop()
        leftovers.remove(*leftovers.wait_gone([prefix(srv)], 5))


# Killed under load, the stubs go within 0.1 s of the server (each stub's watcher process SIGKILLs
# it, parent_watch.py). Before the watcher, a `rose` stub whose metrics thread was in a round trip
# to the server when it died held the GIL forever and never exited (1 run in 3 here).
UNDER_LOAD_EXIT_S = 5.0


@pytest.mark.server
def test_stubs_exit_when_tritonserver_is_killed_under_load(small_server):
    found = stubs(small_server)
    assert len(found.get("rose", [])) == 1 and len(found.get("tokenize", [])) >= 1, found
    conn = busy(small_server)
    try:
        t0 = time.monotonic()
        small_server.proc.kill()
        small_server.proc.wait()
        assert_nothing_left(small_server, UNDER_LOAD_EXIT_S)
        assert time.monotonic() - t0 < UNDER_LOAD_EXIT_S
    finally:
        conn.close()


def wait_dead(pid: int, timeout: float = 10.0) -> None:
    """Until a killed process runs no more (gone, or a zombie its parent has not reaped yet)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                return
        except OSError:
            return
        time.sleep(0.02)
    raise AssertionError(f"process {pid} still runs {timeout:g} s after SIGKILL")


@pytest.mark.server
def test_killing_stubs_leaves_nothing_behind(small_server):
    """kill -9 of a server's `rose` stub, then of its `tokenize` stub, without the launcher's watch:
    the server goes on (Triton 2.51 fails the model's requests with "Stub process ... is not
    healthy" and never restarts the stub; the launcher's watch ends and restarts such a server:
    test_stub_recovery.py), each request after each death ends (an answer or an explicit error,
    never a hang); SIGTERM then stops everything within the drain time, leaving nothing behind."""
    for model in ("rose", "tokenize"):
        victim = stubs(small_server)[model][0]
        os.kill(victim, signal.SIGKILL)
        wait_dead(victim)
        conn = StreamConnection(small_server.grpc_url)
        try:
            for name, inputs in (("rose", HELLO), ("embed", [("TEXT", ["hello"])])):
                try:
                    conn.infer(name, inputs).result(60)
                except Exception as e:                      # an explicit error is fine, a hang is not
                    assert str(e), (model, name, e)
        finally:
            conn.close()
    t0 = time.monotonic()
    small_server.stop()                                  # SIGTERM; the launcher reaps what is left
    assert time.monotonic() - t0 <= DRAIN + 5
    assert_nothing_left(small_server, 2.0)                # SIGKILLed stubs take a moment to go


def rejected_then_cancelled(url: str) -> None:
    """The rejected-and-cancelled recipe: requests Triton rejects before `rose` sees them, a good one and a
    long one in flight, then stop_stream(cancel_requests=True) as a client that gives up."""
    import tritonclient.grpc as grpcclient

    def tensor(name, arr, dtype):
        t = grpcclient.InferInput(name, list(arr.shape), dtype)
        t.set_data_from_numpy(arr)
        return t

    ids, lens = np.array([101, 102], np.int32), np.array([2], np.int32)
    bad = [[tensor("INPUT_IDS", ids.astype(np.float32), "FP32"), tensor("SEQ_LENS", lens, "INT32")],
           [tensor("INPUT_IDS", ids[None], "INT32"), tensor("SEQ_LENS", lens, "INT32")],
           [tensor("INPUT_IDS", ids, "INT32")],
           [tensor("INPUT_IDS", ids, "INT32"), tensor("SEQ_LENS", lens, "INT32"), tensor("EXTRA", lens, "INT32")]]
    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: got.put(error))
    for inputs in bad:
        client.async_stream_infer("rose", inputs)
    errors = [got.get(timeout=60) for _ in bad]
    assert all(e is not None for e in errors), errors
    client.async_stream_infer("rose", [tensor("INPUT_IDS", ids, "INT32"), tensor("SEQ_LENS", lens, "INT32")])
    assert got.get(timeout=60) is None                                   # the good one
    long_ids = np.full(64 * 128, 2000, np.int32)
    client.async_stream_infer("rose", [tensor("INPUT_IDS", long_ids, "INT32"),
                                       tensor("SEQ_LENS", np.full(64, 128, np.int32), "INT32")])
    time.sleep(0.5)
    client.stop_stream(cancel_requests=True)
    client.close()


LONG_DRAIN = 30


@pytest.mark.server
@pytest.mark.parametrize("small_server", [LONG_DRAIN], indirect=True)
def test_server_stops_after_rejected_and_cancelled_requests(small_server, capfd):
    """Triton 2.51 leaks a model reference for requests its core refuses on a stream, and would
    count down its whole exit timeout (LONG_DRAIN + 2 s); the stop ends it once everything is
    answered, idle and its clients closed (triton_stop.py), and says which model it kept."""
    rejected_then_cancelled(small_server.grpc_url)
    conn = StreamConnection(small_server.grpc_url)        # and a client that behaves
    assert conn.infer("rose", HELLO).result(60)["EMBEDDINGS"].shape == (1, 384)
    conn.close()
    assert small_server.exit_timeout == LONG_DRAIN + 2
    t0 = time.monotonic()
    code = small_server.stop()
    took = time.monotonic() - t0
    assert_nothing_left(small_server, 2.0)
    assert took <= QUIET_S + SETTLE_S + 4 < LONG_DRAIN, took
    err = capfd.readouterr().err
    assert code == 0 or (code == -signal.SIGKILL and "still keeps rose loaded" in err), (code, err[-2000:])


def test_exit_timeout_follows_the_drain_time(tmp_path):
    assert exit_timeout_for(ROOT / "model_repository") == 20 + 2
    repo = repository_with({"rose": {"drain_timeout_s": "7"}}, tmp_path)
    assert exit_timeout_for(repo) == 9
    assert "--exit-timeout-secs=9" in " ".join(TritonProcess(repository=repo).command(
        type("I", (), {"binary": "tritonserver", "backend_dir": None})()))


def launcher(*args, env=None) -> subprocess.Popen:
    """The launcher in a child process; without a gateway unless args ask for one."""
    args = args if "--gateway-port" in args else (*args, "--gateway-port", "0")
    proc = subprocess.Popen([sys.executable, "-m", "rose_backend.launch", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **(env or {})})
    leftovers.track(proc.pid)
    return proc


def read_until(proc: subprocess.Popen, needle: str, timeout: float) -> str:
    lines: list[str] = []
    done = threading.Event()

    def reader():
        for line in proc.stdout:
            lines.append(line)
            if needle in line:
                done.set()
        done.set()

    threading.Thread(target=reader, daemon=True).start()
    done.wait(timeout)
    return "".join(lines)


@pytest.mark.server
def test_launcher_killed_takes_its_servers_with_it():
    ports = free_ports()
    proc = launcher("--grpc-port", str(ports.grpc), "--http-port", str(ports.http),
                    "--metrics-port", str(ports.metrics))
    mine = [f"rose_{proc.pid}_"]
    try:
        out = read_until(proc, "rose: serving", 300)
        assert "rose: serving" in out, out
        procs = leftovers.processes(mine)
        assert sum(c.split()[0].endswith("/tritonserver") for c in procs.values()) == 1, procs
        assert sum("triton_python_backend_stub" in c for c in procs.values()) >= 2, procs
        conn = StreamConnection(f"127.0.0.1:{ports.grpc}")
        assert conn.infer("rose", HELLO).result(60)["EMBEDDINGS"].shape == (1, 384)
        conn.close()
        proc.kill()
        proc.wait()
        procs, segs = leftovers.wait_gone(mine, 5.0)
        assert not procs and not segs, (procs, segs)
        with socket.socket() as s:                               # and its ports are free again
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", ports.grpc))
    finally:
        proc.kill()
        leftovers.remove(*leftovers.wait_gone(mine, 5.0))


@pytest.mark.parametrize("which", ["grpc", "http", "metrics", "gateway"])
def test_port_in_use_fails_at_once_naming_it(which):
    ports = free_ports()
    gateway = free_port()
    taken = gateway if which == "gateway" else getattr(ports, which)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", taken))
        holder.listen()
        t0 = time.monotonic()
        proc = launcher("--grpc-port", str(ports.grpc), "--http-port", str(ports.http),
                        "--metrics-port", str(ports.metrics), "--gateway-port", str(gateway))
        out, _ = proc.communicate(timeout=60)
        elapsed = time.monotonic() - t0
    assert proc.returncode == 1, out
    name = {"grpc": "gRPC", "http": "HTTP", "metrics": "metrics", "gateway": "gateway"}[which]
    assert f"port {taken} ({name}) on 127.0.0.1 is already in use" in out, out
    assert elapsed < 10, elapsed                                # no model was loaded
    assert not leftovers.processes([f"rose_{proc.pid}_"])


def test_triton_objects_are_kept_not_destroyed_once_the_server_is_gone(monkeypatch):
    """Destroying a response sender after the server died can block forever with the GIL held
    (parent_watch.server_gone): once the stub has been re-parented, they are kept instead."""
    import gc
    import weakref
    from rose_backend.triton import parent_watch
    from rose_backend.serving.scheduler import Request

    class Sender:            # stands in for Triton's response sender (only its lifetime matters)
        pass

    def answered_request():
        r = Request(np.ones(3, np.int32), np.array([3], np.int32), handle=Sender())
        return r, weakref.ref(r.handle)

    monkeypatch.setattr(parent_watch, "_kept", [])
    monkeypatch.setattr(parent_watch, "_server_pid", os.getppid())           # the server is alive
    r, alive = answered_request()
    parent_watch.drop_triton_objects(r, "handle", "is_cancelled")
    gc.collect()
    assert r.handle is None and alive() is None                               # dropped at once
    monkeypatch.setattr(parent_watch, "_server_pid", os.getppid() + 100000)  # re-parented: it died
    assert parent_watch.server_gone()
    r, alive = answered_request()
    parent_watch.drop_triton_objects(r, "handle", "is_cancelled")
    del r
    gc.collect()
    assert alive() is not None and len(parent_watch._kept) == 1                # kept, never destroyed
    monkeypatch.setattr(parent_watch, "_server_pid", None)                    # not in a stub
    assert not parent_watch.server_gone()


def test_stub_arguments_are_read_from_the_stub_command_line():
    cmd = b"\0".join([b"/x/backends/python/triton_python_backend_stub", b"/r/rose/1/model.py",
                       b"rose_12_8001_abc", b"1048576", b"1048576", b"4242", b"/x/python", b"336",
                       b"rose_0_0", b"DEFAULT"]) + b"\0"
    assert stub_arguments(cmd) == ("rose_12_8001_abc", 4242)
    assert stub_arguments(b"python\0-m\0pytest\0") is None


@pytest.mark.server
def test_killing_make_serve_stops_its_servers(tmp_path):
    """`make serve` execs the launcher (its parent is make, MAKELEVEL set): make killed with
    SIGKILL sends the launcher SIGTERM, and it stops its servers cleanly. A stand-in parent here, so
    that the test never runs make's install step; the test repository (one instance of each tokenize
    model: it stops a second or two sooner than the shipped one)."""
    assert "exec $(BIN)/python -m rose_backend.launch" in (ROOT / "Makefile").read_text()
    ports = free_ports()
    make = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.run(sys.argv[1:])",
                             sys.executable, "-m", "rose_backend.launch", "--grpc-port", str(ports.grpc),
                             "--http-port", str(ports.http), "--metrics-port", str(ports.metrics), "--gateway-port", "0",
                             "--repository", str(repository_with(None, tmp_path))],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "MAKELEVEL": "1"})
    deadline = time.monotonic() + 30
    while not (kids := children_of(make.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert kids, "the launcher did not start"
    launcher_pid = kids[0]
    leftovers.track(launcher_pid)
    mine = [f"rose_{launcher_pid}_"]
    try:
        out = read_until(make, "rose: serving", 300)
        assert "rose: serving" in out, out
        assert leftovers.processes(mine)
        make.kill()
        make.wait()
        t0 = time.monotonic()
        procs, segs = leftovers.wait_gone(mine, 25.0)
        assert not procs and not segs, (procs, segs)
        while Path(f"/proc/{launcher_pid}").exists() and time.monotonic() - t0 < 15:
            time.sleep(0.1)                                     # the launcher exits after them (a loaded CPU: seconds)
        state = Path(f"/proc/{launcher_pid}/stat")
        assert not state.exists() or state.read_text().rsplit(")", 1)[1].split()[0] == "Z"
    finally:
        make.kill()
        try:
            os.kill(launcher_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        leftovers.remove(*leftovers.wait_gone(mine, 5.0))


@pytest.mark.parametrize("aborts", [1, 2])
def test_a_server_that_aborts_as_it_starts_is_started_once_more(tmp_path, monkeypatch, aborts):
    """Triton 2.51's gRPC event engine now and then aborts a server as it starts (SIGABRT, "epoll_wait
    error: Bad file descriptor"). A real tritonserver behind a wrapper that first dies that way
    `aborts` times: wait_ready starts it once more and it serves after one abort; after two it says
    the server exited."""
    import dataclasses

    from rose_backend.launch import tritonserver
    from rose_backend.launch.deployment import DEFAULT_REPOSITORY
    from rose_backend.launch.triton_install import LaunchError
    real = tritonserver.find_triton()
    count = tmp_path / "aborts"
    wrapper = tmp_path / "tritonserver"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'n=$(cat {count} 2>/dev/null || echo 0)\n'
        f'if [ "$n" -lt {aborts} ]; then echo $((n + 1)) > {count}; '
        'echo "E1130 ev_epoll1_linux.cc:373] (event_engine) Epoll1Poller encountered epoll_wait error: Bad file descriptor"; '
        "kill -ABRT $$; fi\n"
        f'exec {real.binary} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setattr(tritonserver, "find_triton", lambda: dataclasses.replace(real, binary=wrapper))
    srv = TritonProcess(None, DEFAULT_REPOSITORY, free_ports(), log_file=tmp_path / "triton.log",
                        models=("tokenize",))
    srv.start()
    try:
        if aborts == 1:
            srv.wait_ready(timeout=120)
            assert srv.restarted and srv._http("/v2/models/tokenize/ready") == 200
        else:
            with pytest.raises(LaunchError, match="exited with code -6 before it was ready"):
                srv.wait_ready(timeout=120)
        assert count.read_text().strip() == str(aborts)
    finally:
        srv.stop()
    assert_nothing_left(srv)


def test_a_missing_model_folder_is_one_clear_line(tmp_path):
    """`make serve MODEL=/missing`: the launcher says what is wrong in one line and exits 1 (no traceback)."""
    ports = free_ports()
    r = subprocess.run([sys.executable, "-m", "rose_backend.launch", "--model", str(tmp_path / "missing"),
                        "--gateway-port", "0", "--grpc-port", str(ports.grpc), "--http-port", str(ports.http),
                        "--metrics-port", str(ports.metrics)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    assert f"rose: model folder {tmp_path / 'missing'} does not exist" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize("last_words,restart", [
    (b"E1201 grpc_server.cc] epoll_wait error: Bad file descriptor\n", True),
    (b"terminate called after throwing an instance of 'boost::interprocess::lock_exception'\n"
     b"  what():  boost::interprocess::lock_exception\n", True),
    (b"E1201 model_lifecycle.cc] failed to load 'rose'\n", False)])
def test_only_the_known_start_up_aborts_are_started_again(tmp_path, last_words, restart):
    from rose_backend.launch.supervision import aborted_at_start
    log = tmp_path / "triton.log"
    log.write_bytes(b"I1201 model_lifecycle.cc] loading: rose:1\n" * 200 + last_words)
    assert aborted_at_start(-signal.SIGABRT, log) is restart
    assert aborted_at_start(1, log) is False                 # not an abort: an error to report
