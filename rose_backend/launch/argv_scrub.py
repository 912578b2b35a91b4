"""Hiding secrets in a child's command line once it has read them.

tritonserver takes its restricted-protocol keys only as options, so `ps` (and /proc/<pid>/cmdline)
would show them to every user of the machine. Linux shows a process's arguments from its own
memory, between arg_start and arg_end of /proc/<pid>/stat; the process that may ptrace a child
(its parent, here the launcher) can overwrite them through /proc/<pid>/mem. Triton copies every
option into its own strings while it parses them (at start, before it loads a backend), so once it
has a backend library mapped the bytes can go.

Each secret becomes MASK, whatever its length. The area's size cannot change, so it is rewritten
the way setproctitle(3) does: the arguments joined by spaces and ended by a NUL, the rest of the
area filled, and its last byte not a NUL; Linux then shows the area up to its first NUL as one
string (fs/proc/base.c, get_mm_cmdline), and nothing tells how long the keys were.
"""
from __future__ import annotations

from pathlib import Path

MASK = b"***"          # shorter than any key (check_key: 8 characters at least)
FILL = b"."


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


def masked_area(area: bytes, secrets: list[bytes]) -> tuple[bytes, int]:
    """The argument area `area` (NUL-ended arguments) with every secret as MASK, laid out as
    setproctitle does (see the module docstring), and how many secrets were masked. Unchanged when
    there is none or the masked line would not fit with a byte to spare."""
    args = area.rstrip(b"\0").split(b"\0")
    done = 0
    for i, arg in enumerate(args):
        for secret in secrets:
            done += arg.count(secret)
            arg = arg.replace(secret, MASK)
        args[i] = arg
    line = b" ".join(args) + b"\0"
    if not done or len(line) >= len(area):
        return area, 0
    return line + FILL * (len(area) - len(line)), done


def scrub_argv(pid: int, secrets: list[str]) -> int:
    """Overwrite every occurrence of each secret in the process's arguments with MASK; returns how
    many were overwritten. Raises OSError when the process's memory cannot be written (not ours,
    locked down)."""
    wanted = [s.encode() for s in secrets if s]
    if not wanted:
        return 0
    start, end = argv_range(pid)
    with open(f"/proc/{pid}/mem", "r+b", buffering=0) as mem:
        mem.seek(start)
        area, done = masked_area(mem.read(end - start), wanted)
        if done:
            mem.seek(start)
            mem.write(area)
    return done
