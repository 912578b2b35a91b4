"""The gateway's /health counts the workers serving by their marks in the shared state folder
(rose_gateway/workers.py): a worker killed with SIGKILL leaves its mark behind, which must not count
(it once read "serving": 3 of "started": 2). The live count on a real gateway whose worker is killed:
tests/launch/test_stub_recovery.py."""
from __future__ import annotations

import os
import subprocess
import sys

from rose_gateway.workers import remove_mark, serving_count


def test_marks_of_dead_workers_do_not_count(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()                                              # reaped: its pid names no process now
    for pid in (os.getpid(), dead.pid):
        (tmp_path / f"serving-{pid}").touch()
    (tmp_path / "serving-x").touch()                         # not a worker's mark
    assert serving_count(str(tmp_path)) == 1
    remove_mark(str(tmp_path), dead.pid)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"serving-{os.getpid()}", "serving-x"])
    assert serving_count(None) == 1 and serving_count(str(tmp_path / "gone")) == 0
