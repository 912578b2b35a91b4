"""GatewayWatch's look at who listens on the gateway port, with real processes. A gateway killed a
moment ago leaves its worker processes listening (re-parented to init, no longer its children) until
they have exited, and a worker being killed can have no descriptors left while its socket is still in
the table: neither is "another process", so the launcher restarts the gateway instead of stopping the
launch. A stranger's socket on the port still counts as foreign."""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from rose_backend.launch import connections
from rose_backend.launch.connections import children, family, listening_pids
from rose_backend.launch.gateway_watch import GatewayWatch

# a "gateway": binds the port with SO_REUSEPORT, forks a "worker" that keeps the listening socket
GATEWAY = r"""
import os, socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
s.bind(("127.0.0.1", 0)); s.listen()
if os.fork() == 0:
    time.sleep(60); os._exit(0)
print(s.getsockname()[1], flush=True)
time.sleep(60)
"""

# like the real gateway: the "worker" listens on a socket of its own
GATEWAY_OWN_SOCKETS = r"""
import os, socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
s.bind(("127.0.0.1", 0)); s.listen()
port = s.getsockname()[1]
if os.fork() == 0:
    s.close()
    w = socket.socket()
    w.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    w.bind(("127.0.0.1", port)); w.listen()
    time.sleep(60); os._exit(0)
print(port, flush=True)
time.sleep(60)
"""


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@contextlib.contextmanager
def fake_gateway(script: str):
    """(process, port, its workers) of a "gateway" script once both of its processes listen; every
    one of them killed at the end."""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    workers: list[int] = []
    try:
        port = int(proc.stdout.readline())
        deadline = time.monotonic() + 10
        while len(listening_pids(port, family(proc.pid))[0]) < 2:
            assert time.monotonic() < deadline, "the worker never listened"
            time.sleep(0.05)
        workers = children(proc.pid)
        yield proc, port, workers
    finally:
        for pid in (*workers, proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait(10)


def test_workers_of_a_just_killed_gateway_are_not_a_foreign_listener():
    with fake_gateway(GATEWAY) as (proc, port, workers):
        watch = GatewayWatch(make=lambda: None)
        watch.gateway = SimpleNamespace(proc=proc, port=port, host="127.0.0.1")
        assert not watch._foreign()
        with socket.socket() as stranger:
            stranger.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            stranger.bind(("127.0.0.1", port))
            stranger.listen()
            assert watch._foreign()
        proc.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _parent(workers[0]) == proc.pid:                     # the worker is init's now
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert not watch._foreign(), "the dead gateway's own worker was taken for another process"


def test_a_listener_that_exits_while_its_descriptors_are_read_is_not_foreign(monkeypatch):
    """The interleaving a loaded host produces: the port's table is read, then the worker dies before
    its descriptors are read. Forced here by killing it inside the descriptor read."""
    with fake_gateway(GATEWAY_OWN_SOCKETS) as (proc, port, workers):
        real = connections.socket_fds

        def dies_while_read(pid):
            if pid == workers[0]:
                os.kill(pid, signal.SIGKILL)
                while Path(f"/proc/{pid}/fd").exists() and any(Path(f"/proc/{pid}/fd").iterdir()):
                    time.sleep(0.005)
                return {}
            return real(pid)
        monkeypatch.setattr(connections, "socket_fds", dies_while_read)
        ours, foreign = listening_pids(port, [proc.pid, *workers])
        assert ours == {proc.pid} and not foreign
