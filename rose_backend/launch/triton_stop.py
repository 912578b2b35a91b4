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
   (UNAVAILABLE), and a new connection is refused;
4. if, SETTLE_S after that, tritonserver is still up and its stubs are still gone or idle, the
   models it keeps are held by references nothing will release: Triton 2.51 leaks one for a request
   its core refuses on a gRPC stream (a wrong shape or dtype, a missing or an extra input), and
   then counts down its whole exit timeout (drain_timeout_s + 2 s) for nothing and exits with code
   1. The launcher says which models were kept and ends it (SIGKILL to its group, exit code -9;
   TritonProcess.stop then removes its stubs and their shared memory).

Closing another process's sockets needs pidfd_getfd (Linux 5.6+) and the right to ptrace it (a
parent over its child, unless ptrace is locked down); without it the stop waits as before, bounded
by the exit timeout and the kill.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from rose_backend.launch.child import kill_group
from rose_backend.launch.connections import close_sockets
from rose_backend.launch.supervision import processes_with

QUIET_S = 1.0              # a stub this long without CPU time has nothing left to answer
QUIET_TICKS = 2            # CPU ticks per half second that still count as idle (its idle threads: <= 1)
POLL_S = 0.1
# After the client connections are closed, an unloading stub finishes within ~1.2 s here (a
# tokenize or rose stub) and a torch model's stub within ~2.6 s (the naive baseline), using CPU
# for part of it; a stub idle this long with the server still up is held by a leaked reference.
SETTLE_S = 3.0


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
        return list(self.stub_models())

    def stub_models(self) -> dict[int, str]:
        """{pid: model name} of the server's live stubs (a stub's second argument is its model.py,
        <repository>/<model>/<version>/model.py)."""
        return {p: _model_of(cmd) for p, cmd in processes_with([self.prefix]).items()
                if "triton_python_backend_stub" in cmd}

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


def _model_of(stub_command: str) -> str:
    args = stub_command.split()
    return Path(args[1]).parent.parent.name if len(args) > 1 else "?"


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
    settled_since = None               # since when, after the connections were closed, all is quiet
    while proc.poll() is None:
        now = time.monotonic()
        if now - t0 >= kill_after:
            kill_group(proc)
            break
        if not closed and watch.quiet(now):
            closed = _close("connections", proc.pid, grpc_port, False) is not None
            if not closed:
                break
            settled_since = now
        elif settled_since is not None:
            if not watch.quiet(now):
                settled_since = now
            elif now - settled_since >= SETTLE_S:
                kept = sorted(set(watch.stub_models().values())) or ["an ensemble"]
                print(f"rose: tritonserver still keeps {', '.join(kept)} loaded {SETTLE_S:g} s after its work "
                      f"was answered and its clients were closed (Triton 2.51 leaks a model reference for a "
                      f"request it refused on a stream); ending it now, not after its exit timeout",
                      file=sys.stderr, flush=True)
                kill_group(proc)
                break
        time.sleep(POLL_S)
    try:
        return proc.wait(max(0.0, kill_after - (time.monotonic() - t0)))
    except subprocess.TimeoutExpired:
        kill_group(proc)
        return proc.wait()
