"""Keys hidden in a child's command line (rose_backend/launch/argv_scrub.py): a fixed mask, so that
neither /proc/<pid>/cmdline nor `ps` tells how long a key was. Real child processes, no server
(tests/server/test_security.py checks a real tritonserver's)."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from rose_backend.launch.argv_scrub import MASK, masked_area, scrub_argv


def sleeper(key: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                             f"--grpc-restricted-protocol=model-repository:admin-key={key}", "--last=1"])


def cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def ps(pid: int) -> str:
    return subprocess.run(["ps", "-ww", "-o", "args=", "-p", str(pid)], capture_output=True, text=True).stdout.strip()


def test_keys_of_any_length_look_the_same_once_masked():
    short, long = "k" * 8, "K" * 256
    procs = [sleeper(short), sleeper(long)]
    try:
        time.sleep(0.3)
        assert [scrub_argv(p.pid, [k]) for p, k in zip(procs, (short, long))] == [1, 1]
        lines = [cmdline(p.pid) for p in procs]
        assert lines[0] == lines[1], lines                       # nothing of the length is left
        assert b"admin-key=" + MASK + b" --last=1\0" in lines[0] and b"k" * 8 not in lines[0]
        assert ps(procs[0].pid) == ps(procs[1].pid) and "admin-key=*** --last=1" in ps(procs[0].pid)
        assert scrub_argv(procs[0].pid, [short]) == 0             # masked once; nothing left to find
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.mark.parametrize("area,secrets,expect", [
    (b"a\0key=SECRET123\0b\0", [b"SECRET123"], b"a key=*** b\0"),
    (b"a\0b\0", [b"SECRET123"], None),                            # nothing to mask: unchanged
    (b"x=SECRET123\0y=SECRET123\0", [b"SECRET123"], b"x=*** y=***\0"),
])
def test_the_area_keeps_its_size_and_ends_in_a_byte_that_is_not_nul(area, secrets, expect):
    out, done = masked_area(area, secrets)
    assert len(out) == len(area)
    if expect is None:
        assert (out, done) == (area, 0)
    else:
        assert out.startswith(expect) and out[-1:] != b"\0" and done == expect.count(MASK)
