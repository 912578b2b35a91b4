"""Stopping a tritonserver within its bound whatever its clients keep open (TritonProcess.stop).

Triton 2.51 keeps a model loaded for as long as a gRPC stream whose first request went to it stays
open: the stream's first request object, which holds a reference to its model, is released only
when the stream ends (src/grpc/stream_infer_handler.cc of r24.10: the stream's first state waits
for the stream's done notification). At SIGTERM its ServerStop then counts down the whole exit
timeout ("Found 1 live models") for a client that is merely idle, and its endpoints, which would
end those streams, stop only after that. So after SIGTERM the launcher:

1. closes Triton's gRPC listener: a new connection is refused, a client sees UNAVAILABLE (Triton's
   HTTP port already refuses connections once it got SIGTERM); a late request on an open connection
   gets Triton's own refusal ("Server is stopping" while requests in flight finish, then "... has no
   available versions");
2. waits until what Triton's Python models admitted has been answered: each of the server's stubs
   has exited (its model unloaded, after rose's own drain) or has used no CPU for QUIET_S;
3. closes the client connections on the gRPC port: the streams end, their references go, the models
   unload and tritonserver exits on its own, with code 0. A client then sees its stream closed
   (UNAVAILABLE), and a new connection is refused.

Closing another process's sockets needs pidfd_getfd (Linux 5.6+) and the right to ptrace it (a
parent over its child, unless ptrace is locked down); without it the stop waits as before, bounded
by the exit timeout and the kill.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from rose_backend.launch.connections import close_sockets
from rose_backend.launch.supervision import processes_with

QUIET_S = 1.0              # a stub this long without CPU time has nothing left to answer
QUIET_TICKS = 2            # CPU ticks per half second that still count as idle (its idle threads: <= 1)
POLL_S = 0.1


def cpu_ticks(pid: int) -> int | None:
    """User + system CPU time of a process, in clock ticks (None when it is gone)."""
    try:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(f[11]) + int(f[12])


class QuietWatch:
    """Whether every Python-backend stub of one server is gone or idle: since `since`, its CPU time
    grew by at most QUIET_TICKS per half second (a forward pass, a tokenizer or a CUDA wait, which
    spins, uses far more even on a loaded machine), for at least QUIET_S."""

    def __init__(self, stub_prefix: str, now: float):
        self.prefix, self.start = stub_prefix, now
        self.seen: dict[int, tuple[int, float]] = {}          # pid -> (ticks at `since`, since)

    def stubs(self) -> list[int]:
        return [p for p, cmd in processes_with([self.prefix]).items() if "triton_python_backend_stub" in cmd]

    def quiet(self, now: float) -> bool:
        quiet = now - self.start >= QUIET_S
        for pid in self.stubs():
            ticks = cpu_ticks(pid)
            if ticks is None:
                continue
            base, since = self.seen.get(pid, (None, now))
            if base is None or ticks - base > QUIET_TICKS * max(1.0, (now - since) / 0.5):
                self.seen[pid] = (ticks, now)                  # busy (or new): its quiet time starts again
                quiet = False
            else:
                quiet = quiet and now - since >= QUIET_S
        return quiet


def _close(what: str, pid: int, port: int, listening: bool) -> int | None:
    try:
        return close_sockets(pid, port, listening)
    except OSError as e:
        print(f"rose: cannot close tritonserver's gRPC {what} ({e.strerror or e}); its stop waits for its "
              f"clients or its exit timeout", file=sys.stderr, flush=True)
        return None


def stop_tritonserver(proc: subprocess.Popen, grpc_port: int, stub_prefix: str, kill_after: float) -> int:
    """SIGTERM, then the steps of the module docstring; SIGKILL to its process group if it has not
    exited `kill_after` seconds after SIGTERM. Returns its exit code."""
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    can_close = _close("listener", proc.pid, grpc_port, True) is not None
    watch = QuietWatch(stub_prefix, t0)
    closed = not can_close
    while proc.poll() is None:
        now = time.monotonic()
        if now - t0 >= kill_after:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            break
        if not closed and watch.quiet(now):
            closed = _close("connections", proc.pid, grpc_port, False) is not None
            if not closed:
                break
        time.sleep(POLL_S)
    try:
        return proc.wait(max(0.0, kill_after - (time.monotonic() - t0)))
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return proc.wait()
