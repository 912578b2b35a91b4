"""What a test session started and must not leave behind: tritonservers, Python-backend stubs and
/dev/shm/rose_* segments. Everything a server started by this session creates carries the
shared-memory prefix `rose_<pid of the process that called TritonProcess.start()>_` in its command
line or name (launch/tritonserver.py: TritonProcess.command), so other workers' servers on the machine are never
matched. Tests that start a launcher in a child process register the child's pid with track().
"""
from __future__ import annotations

import os

from rose_backend.launch.supervision import processes_with, remove, segments_with  # noqa: F401 (remove: for tests)
from rose_backend.launch.supervision import wait_gone as _wait_gone

PREFIXES = {f"rose_{os.getpid()}_"}


def track(pid: int) -> None:
    """Also watch what a child launcher process (pid) starts."""
    PREFIXES.add(f"rose_{pid}_")


def processes(prefixes=None) -> dict[int, str]:
    return processes_with(PREFIXES if prefixes is None else prefixes)


def segments(prefixes=None) -> list[str]:
    return segments_with(PREFIXES if prefixes is None else prefixes)


def wait_gone(prefixes=None, timeout: float = 5.0) -> tuple[dict[int, str], list[str]]:
    return _wait_gone(PREFIXES if prefixes is None else prefixes, timeout)
