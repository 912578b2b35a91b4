"""Scratch folders of killed processes (rose_backend/launch/scratch.py, rose_backend/processes.py), with real processes: a folder
whose owner lives is kept and removed once the owner is killed with SIGKILL; Triton's empty
python_env folders are removed only when no live tritonserver is older than them; the HTTP gateway
killed under the launcher leaves no worker-state folder behind."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from rose_backend import processes
from rose_backend.launch import scratch

OWNER = """
import sys, time
from rose_backend.processes import owned_folder
path, lock = owned_folder(sys.argv[1])
print(path, flush=True)
time.sleep(120)
"""


def test_a_folder_is_kept_while_its_owner_lives_and_removed_once_it_is_killed():
    prefix = f"rose_test_scratch_{os.getpid()}_"
    owner = subprocess.Popen([sys.executable, "-c", OWNER, prefix], stdout=subprocess.PIPE, text=True)
    try:
        path = Path(owner.stdout.readline().strip())
        assert path.is_dir() and path.name.startswith(prefix), path
        (path / "metrics.db").write_text("x")
        assert processes.remove_unowned(prefix) == [] and path.is_dir()        # its owner holds the lock
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
        assert path.is_dir()                                                 # nobody removed it yet
        assert processes.remove_unowned(prefix) == [str(path)]
        assert not path.exists()
        assert not list(path.parent.glob("." + prefix + "*"))                # nor its name while made
    finally:
        owner.kill()
        owner.wait()
        for p in Path(processes.tempfile.gettempdir()).glob(prefix + "*"):
            shutil.rmtree(p, ignore_errors=True)


def test_python_envs_are_removed_only_when_no_live_server_is_older(tmp_path, monkeypatch):
    old, full = tmp_path / "python_env_old", tmp_path / "python_env_full"
    old.mkdir()
    full.mkdir()
    (full / "env").mkdir()
    made = time.time()
    where = (str(tmp_path), "python_env_*")
    monkeypatch.setattr(scratch, "tritonserver_start_times", lambda: [made - 30, made + 30])
    assert scratch.remove_python_envs_of_dead_servers(where) == []           # its server may be the older one
    assert old.is_dir()
    monkeypatch.setattr(scratch, "tritonserver_start_times", lambda: [made + 30])
    assert scratch.remove_python_envs_of_dead_servers(where) == [str(old)]   # made before any live server
    assert not old.exists() and full.is_dir()                                # one with an env in it is kept
    monkeypatch.setattr(scratch, "tritonserver_start_times", lambda: [])
    assert scratch.remove_python_envs_of_dead_servers(where) == []


def test_tritonserver_start_times_finds_a_live_tritonserver_by_its_executable(tmp_path):
    fake = tmp_path / "tritonserver"
    shutil.copy(shutil.which("sleep"), fake)
    before = time.time()
    proc = subprocess.Popen([str(fake), "30"])
    after = time.time()
    try:
        deadline = time.monotonic() + 5
        while not any(before - 1 <= t <= after + 1 for t in scratch.tritonserver_start_times()):
            assert time.monotonic() < deadline, (before, after, scratch.tritonserver_start_times())
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()
