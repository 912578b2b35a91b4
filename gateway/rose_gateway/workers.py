"""Several gateway processes on one port: each a whole gateway (its own event loop, tokenizer and
gRPC streams to the replicas), sharing the port through SO_REUSEPORT, so the kernel spreads new
connections over the workers that are serving.

    python -m rose_gateway --workers 4 ...     # (or $GATEWAY_WORKERS; default: the cores this process may use)

The supervising process checks that the port is free, holds it (a socket bound with SO_REUSEPORT,
never listening: it takes no connections, and a process that binds without the option fails as
before), starts the workers (`python -m rose_gateway` with the same arguments, told by
ROSE_GATEWAY_WORKER which one they are) and:
- passes SIGTERM / SIGINT on to every worker (each drains its requests for --drain-timeout, as a
  single gateway does) and exits once they have all exited; a worker still running STOP_MARGIN
  seconds after the drain time is killed (all side by side: the stop takes the drain time once);
- starts a worker again when one dies while serving; a worker that dies within START_GRACE seconds
  of its start (a bad setting, a port it cannot bind) stops them all, with exit code 1.
A worker binds its socket before its start-up, and listens only once it serves, so no connection
waits for a worker still starting. Each one marks itself serving with a file in the shared state
folder (PROMETHEUS_MULTIPROC_DIR: the workers' metrics are kept there too, metrics.py), which
/health counts ("workers": serving / started: the marks of live workers; a dead worker's mark goes
when it is started again); the folder is removed when the gateway exits, and
one whose gateway was killed, by the next gateway or by the launcher that reaped it
(rose_backend/processes.py).
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

from rose_backend import env_vars

WORKER = env_vars.ROSE_GATEWAY_WORKER          # i of n ("0/4"): this process is a worker
STATE = env_vars.PROMETHEUS_MULTIPROC_DIR      # the workers' shared folder: metrics, serving marks
START_GRACE = 10.0                       # seconds: a worker that dies sooner stops the gateway
STOP_MARGIN = 1.5                        # seconds past the drain time a stopping worker is given


def default_workers() -> int:
    """The cores this process may run on (its CPU affinity, as a container's cpuset limits it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def worker_of() -> tuple[int, int] | None:
    """(i, n) when this process is worker i of n, else None."""
    raw = WORKER.get()
    if not raw:
        return None
    i, _, n = raw.partition("/")
    return int(i), int(n)


def reuseport_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def mark_serving(state_dir: str | None) -> None:
    if state_dir:
        with open(os.path.join(state_dir, f"serving-{os.getpid()}"), "w"):
            pass


def unmark_serving(state_dir: str | None) -> None:
    if state_dir:
        try:
            os.unlink(os.path.join(state_dir, f"serving-{os.getpid()}"))
        except OSError:
            pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def serving_count(state_dir: str | None) -> int:
    """Workers serving now: the serving marks of live processes (a killed worker leaves its mark)."""
    if not state_dir:
        return 1
    try:
        names = os.listdir(state_dir)
    except OSError:
        return 0
    return sum(1 for n in names if n.startswith("serving-") and n[8:].isdigit() and _alive(int(n[8:])))


def remove_mark(state_dir: str, pid: int) -> None:
    """A dead worker's serving mark."""
    try:
        os.unlink(os.path.join(state_dir, f"serving-{pid}"))
    except OSError:
        pass


def supervise(host: str, port: int, workers: int, argv: list[str], banner: str, drain_timeout: float = 10.0) -> int:
    """Run `workers` worker processes of `python -m rose_gateway argv` on host:port until SIGTERM;
    drain_timeout: the workers' --drain-timeout."""
    from rose_backend.processes import GATEWAY_STATE_PREFIX, PortInUse, check_ports_free, die_with_parent, owned_folder
    try:
        check_ports_free(host, {"gateway": port})
        guard = reuseport_socket(host, port)
    except (PortInUse, OSError) as e:
        print(f"rose_gateway: {e}", file=sys.stderr, flush=True)
        return 1
    state, lock = owned_folder(GATEWAY_STATE_PREFIX)
    stopping: list[float] = []                   # when the first SIGTERM / SIGINT came

    def start(i: int) -> tuple[subprocess.Popen, float]:
        env = {**os.environ, WORKER.name: f"{i}/{workers}", STATE.name: state}
        return subprocess.Popen([sys.executable, "-m", "rose_gateway", *argv], env=env,
                                preexec_fn=die_with_parent), time.monotonic()

    def stop(sig, _frame):
        if not stopping:
            stopping.append(time.monotonic())
        for p, _ in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    procs: list[tuple[subprocess.Popen, float]] = []
    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    code = 0
    try:
        procs = [start(i) for i in range(workers)]
        if stopping:                             # a signal while they were starting
            stop(stopping[0], None)
        print(banner, flush=True)
        while any(p.poll() is None for p, _ in procs):
            time.sleep(0.1)
            if stopping:
                if time.monotonic() - stopping[0] > drain_timeout + STOP_MARGIN:
                    left = sum(p.poll() is None for p, _ in procs)
                    print(f"rose_gateway: {left} worker(s) still running {drain_timeout + STOP_MARGIN:g} s after "
                          f"SIGTERM; killing them", file=sys.stderr, flush=True)
                    break
                continue
            for i, (p, t0) in enumerate(procs):
                if p.poll() is None:
                    continue
                if time.monotonic() - t0 < START_GRACE:
                    print(f"rose_gateway: worker {i} exited with code {p.returncode} while starting; stopping",
                          file=sys.stderr, flush=True)
                    code = 1
                    stop(signal.SIGTERM, None)
                    break
                print(f"rose_gateway: worker {i} exited with code {p.returncode}; starting it again",
                      file=sys.stderr, flush=True)
                remove_mark(state, p.pid)
                procs[i] = start(i)
        return code
    finally:
        left = [p for p, _ in procs if p.poll() is None]
        for p in left:                           # all at once, then reaped
            p.kill()
        for p in left:
            p.wait()
        for s, h in old.items():
            signal.signal(s, h)
        guard.close()
        shutil.rmtree(state, ignore_errors=True)
        os.close(lock)
