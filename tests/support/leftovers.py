"""What a test session started and must not leave behind: tritonservers, Python-backend stubs, HTTP
gateways and /dev/shm/rose_* segments, and nothing of other sessions on the machine.

- A server started by this session, its stubs and its segments carry the shared-memory prefix
  `rose_<pid of the process that called TritonProcess.start()>_` in their command lines or names
  (launch/tritonserver.py: TritonProcess.command). Tests that start a launcher in a child process
  register the child's pid with track().
- Every process this session starts inherits OWNER from its environment (set here, at import: the
  conftest imports this module before any test runs); a gateway, whose command line names no
  prefix, is found by it. A launcher run gives its own processes an OWNER of their own
  (support/launcher.py) that begins with the session's value.
The product never reads OWNER: the tests read it from /proc/<pid>/environ.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from rose_backend.launch.supervision import processes_with, remove, segments_with  # noqa: F401 (remove: for tests)

OWNER = "ROSE_TEST_OWNER"
SESSION = f"rose_{os.getpid()}_"
os.environ[OWNER] = SESSION
PREFIXES = {SESSION}


def track(pid: int) -> None:
    """Also watch what a child launcher process (pid) starts."""
    PREFIXES.add(f"rose_{pid}_")


def owned(prefixes) -> dict[int, str]:
    """{pid: command line} of live processes (not this one) whose OWNER begins with one of the prefixes."""
    prefixes, found = tuple(prefixes), {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        mark = next((v[len(OWNER) + 1:].decode(errors="replace") for v in environ if v.startswith(OWNER.encode() + b"=")), "")
        if mark.startswith(prefixes) and cmd:
            found[int(entry.name)] = cmd
    return found


def processes(prefixes=None) -> dict[int, str]:
    prefixes = PREFIXES if prefixes is None else prefixes
    return {**processes_with(prefixes), **owned(prefixes)}


def segments(prefixes=None) -> list[str]:
    return segments_with(PREFIXES if prefixes is None else prefixes)


def wait_gone(prefixes=None, timeout: float = 5.0) -> tuple[dict[int, str], list[str]]:
    """Poll until no process or segment of `prefixes` is left, or `timeout`; return what is left."""
    end = time.monotonic() + timeout
    while True:
        procs, segs = processes(prefixes), segments(prefixes)
        if (not procs and not segs) or time.monotonic() >= end:
            return procs, segs
        time.sleep(0.1)
