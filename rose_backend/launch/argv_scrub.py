"""Hiding secrets in a child's command line once it has read them.

tritonserver takes its restricted-protocol keys only as options, so `ps` (and /proc/<pid>/cmdline)
would show them to every user of the machine. Linux shows a process's arguments from its own
memory, between arg_start and arg_end of /proc/<pid>/stat; the process that may ptrace a child
(its parent, here the launcher) can overwrite them through /proc/<pid>/mem. Triton copies every
option into its own strings while it parses them (at start, before it loads a backend), so once it
has a backend library mapped the bytes can go: each secret is overwritten with '*' of its length.
"""
from __future__ import annotations

from pathlib import Path

MASK = b"*"


def argv_range(pid: int) -> tuple[int, int]:
    """(arg_start, arg_end) of a process: fields 48 and 49 of /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[48 - 3]), int(fields[49 - 3])      # fields[0] is field 3 (state)


def options_read(pid: int, marker: str = "/libtriton_") -> bool:
    """Whether tritonserver has read its options: a backend library (found through them) is mapped."""
    try:
        return marker in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def scrub_argv(pid: int, secrets: list[str]) -> int:
    """Overwrite every occurrence of each secret in the process's arguments; returns how many were
    overwritten. Raises OSError when the process's memory cannot be written (not ours, locked down)."""
    wanted = [s.encode() for s in secrets if s]
    if not wanted:
        return 0
    start, end = argv_range(pid)
    done = 0
    with open(f"/proc/{pid}/mem", "r+b", buffering=0) as mem:
        mem.seek(start)
        args = bytearray(mem.read(end - start))
        for secret in wanted:
            at = args.find(secret)
            while at >= 0:
                args[at:at + len(secret)] = MASK * len(secret)
                done += 1
                at = args.find(secret, at + len(secret))
        if done:
            mem.seek(start)
            mem.write(bytes(args))
    return done
