"""The watcher process of parent_watch.py, with real processes standing in for tritonserver and its
stub: a server killed with SIGKILL takes its stub with it even when the stub holds the GIL forever
(what a custom-metric round trip to a dead server does), its shared-memory region goes too, and a
stub that exits on its own leaves no watcher behind. (Against a real tritonserver:
tests/launch/test_supervision.py.)"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

STUB = f"""
import ctypes, os, sys, time
sys.path.insert(0, {str(ROOT)!r})
from rose_backend.triton.parent_watch import start_watcher
region, mode = sys.argv[1:3]
open("/dev/shm/" + region, "w").close()
w = start_watcher("test", region, os.getppid())
print("watcher", w.pid, flush=True)
if mode == "hang":
    ctypes.PyDLL(None).sleep(600)          # libc sleep with the GIL held: no thread of ours runs again
time.sleep(float(mode))
"""
SERVER = """
import subprocess, sys, time
p = subprocess.Popen([sys.executable, "-c", sys.argv[1], *sys.argv[2:]])
print("stub", p.pid, flush=True)
time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_until(pred, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


@pytest.fixture
def start(request):
    started = []

    def run(mode: str):
        region = f"rose_test_watch_{os.getpid()}_{len(started)}"
        server = subprocess.Popen([sys.executable, "-c", SERVER, STUB, region, mode], stdout=subprocess.PIPE, text=True)
        started.append((server, region))
        pids = dict(server.stdout.readline().split() for _ in range(2))
        return server, int(pids["stub"]), int(pids["watcher"]), Path("/dev/shm") / region

    yield run
    for server, region in started:
        server.kill()
        server.wait()
        Path("/dev/shm", region).unlink(missing_ok=True)


def test_a_killed_server_takes_a_stub_that_holds_the_gil_with_it(start):
    server, stub, watcher, region = start("hang")
    assert region.exists() and alive(stub) and alive(watcher)
    time.sleep(0.3)
    assert alive(stub)                                  # the watcher waits while the server lives
    server.send_signal(signal.SIGKILL)
    server.wait()
    assert wait_until(lambda: not alive(stub), 5), "the stub outlived its server"
    assert wait_until(lambda: not region.exists(), 2) and wait_until(lambda: not alive(watcher), 2)


def test_a_stub_that_exits_leaves_no_watcher_behind(start):
    server, stub, watcher, region = start("0.3")
    assert wait_until(lambda: not alive(stub), 10)
    assert wait_until(lambda: not alive(watcher), 2), "the watcher outlived its stub"
    assert region.exists()                              # the server's to remove, not the watcher's
    assert server.poll() is None
