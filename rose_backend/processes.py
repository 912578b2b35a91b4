"""What a process that holds a port and starts children needs, shared by the launcher
(rose_backend.launch) and the HTTP gateway's worker supervisor (rose_gateway.workers), which
imports nothing of the launcher. Standard library only.

- check_ports_free(): a port already taken fails a start at once, naming the port (gRPC and the
  gateway's workers bind with SO_REUSEPORT, so the bind itself may not notice).
- die_with_parent(): a child is killed when the process that started it dies, even by SIGKILL
  (Linux PR_SET_PDEATHSIG), whatever session it runs in.
- owned_folder(prefix): a temporary folder whose owner holds a lock on a file in it for as long as
  it lives (the gateway's shared worker state). remove_unowned(prefix) removes those whose lock
  nobody holds: their owner is gone, however it ended. The kernel drops a lock with the process,
  so there is no guessing.
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import shutil
import signal
import socket
import tempfile
from pathlib import Path

PR_SET_PDEATHSIG = 1
GATEWAY_STATE_PREFIX = "rose_gateway_state_"     # the gateway's worker state (rose_gateway.workers)
LOCK_NAME = ".owner"


class PortInUse(RuntimeError):
    pass


try:                       # loaded once here: die_with_parent() runs between fork and exec
    _prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
except (OSError, AttributeError):       # not Linux/glibc: no parent-death signal
    _prctl = None


def set_parent_death_signal(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send `sig` to this process when its parent (thread) dies (Linux only)."""
    if _prctl is None:
        return
    if _prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def die_with_parent() -> None:
    """preexec_fn for a child process: SIGKILL when its starter dies (a server's stubs then see their
    server gone and exit, rose_backend/triton/parent_watch.py). Runs between fork and exec."""
    set_parent_death_signal(signal.SIGKILL)


def check_ports_free(host: str, ports: dict[str, int]) -> None:
    """Raise PortInUse naming the first of {name: port} that something already listens on."""
    for name, port in ports.items():
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # TIME_WAIT is not "in use"
            try:
                sock.bind((host, port))
            except OSError as e:
                if e.errno in (errno.EADDRINUSE, errno.EACCES):
                    raise PortInUse(f"port {port} ({name}) on {host} is already in use"
                                    f"{' (needs privileges)' if e.errno == errno.EACCES else ''}; "
                                    f"stop what holds it or choose another port") from None
                raise


def owned_folder(prefix: str) -> tuple[str, int]:
    """A new temporary folder and the descriptor of the lock this process holds on it while it
    lives (keep it open; it is not inherited by children started with close_fds)."""
    remove_unowned(prefix)
    making = tempfile.mkdtemp(prefix="." + prefix)      # locked under a name no sweep looks at
    fd = os.open(os.path.join(making, LOCK_NAME), os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    path = os.path.join(os.path.dirname(making), os.path.basename(making)[1:])
    os.rename(making, path)
    return path, fd


def remove_unowned(prefix: str) -> list[str]:
    """Remove this user's temporary folders named `prefix`* whose lock no process holds."""
    removed = []
    for path in Path(tempfile.gettempdir()).glob(prefix + "*"):
        try:
            fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CLOEXEC)
        except OSError:                          # not ours
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:                          # its owner lives
            continue
        finally:
            os.close(fd)
        shutil.rmtree(path, ignore_errors=True)
        removed.append(str(path))
    return removed
