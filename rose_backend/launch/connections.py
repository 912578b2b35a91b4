"""A process's TCP sockets as Linux shows them in /proc, and closing some of them from outside.

- listening_pids(port, among): which of `among` listen on a port, and whether someone else does
  too (the launcher checks that its own gateway, and nobody else, serves the gateway port).
- close_sockets(pid, port, ...): shutdown() of a process's own sockets on a port, through a copy of
  each descriptor (pidfd_getfd, Linux 5.6+, the same permission as ptrace: a parent over its child).
  TritonProcess.stop closes tritonserver's gRPC listener and, once its work is answered, the client
  connections that keep it from exiting (rose_backend/launch/triton_stop.py).
"""
from __future__ import annotations

import ctypes
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

LISTEN, ESTABLISHED = 0x0A, 0x01
_SYS_PIDFD_GETFD = 438                      # the same number on x86-64 and arm64
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class TcpSocket:
    local_port: int
    remote_port: int
    state: int
    inode: int


def tcp_sockets(port: int | None = None) -> list[TcpSocket]:
    """Every TCP socket of this network namespace (IPv4 and IPv6), or those with local port `port`."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            s = TcpSocket(int(f[1].rsplit(":", 1)[1], 16), int(f[2].rsplit(":", 1)[1], 16), int(f[3], 16), int(f[9]))
            if port is None or s.local_port == port:
                found.append(s)
    return found


def socket_fds(pid: int) -> dict[int, int]:
    """{socket inode: descriptor} of a process (empty when it is gone or not ours to read)."""
    out = {}
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out[int(target[8:-1])] = int(name)
    return out


def children(pid: int) -> list[int]:
    """The live processes whose parent is `pid`."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            pass
    return out


def family(pid: int) -> list[int]:
    """A process and its children (a gateway and its worker processes)."""
    return [pid, *children(pid)]


def _listening(port: int) -> set[int]:
    return {s.inode for s in tcp_sockets(port) if s.state == LISTEN}


def listening_pids(port: int, among: list[int], settle_s: float = 0.05) -> tuple[set[int], bool]:
    """(the pids of `among` that listen on `port`, whether a socket of anyone else listens there too).
    A process of `among` that is exiting has no descriptors left to read while its socket may still be
    in the table for a moment: a socket found in no one's descriptors counts as someone else's only
    if it still listens `settle_s` later."""
    listening = _listening(port)
    ours, seen = set(), set()
    for pid in among:
        mine = listening & socket_fds(pid).keys()
        if mine:
            ours.add(pid)
            seen |= mine
    unowned = listening - seen
    if unowned:
        time.sleep(settle_s)
        unowned &= _listening(port)
    return ours, bool(unowned)


def close_sockets(pid: int, port: int, listening: bool) -> int:
    """shutdown() the sockets of `pid` on local `port`: its listener (listening=True) or its
    established connections. Returns how many; raises OSError when the process cannot be reached
    (not ours to ptrace, no pidfd_getfd)."""
    wanted = {s.inode for s in tcp_sockets(port)
              if s.state == (LISTEN if listening else ESTABLISHED)}
    fds = [fd for inode, fd in socket_fds(pid).items() if inode in wanted]
    if not fds:
        return 0
    pidfd = os.pidfd_open(pid)
    closed = 0
    try:
        for fd in fds:
            copy = _libc.syscall(_SYS_PIDFD_GETFD, pidfd, fd, 0)
            if copy < 0:
                err = ctypes.get_errno()
                if closed or err == 9:          # EBADF: that descriptor was closed meanwhile
                    continue
                raise OSError(err, f"pidfd_getfd on process {pid}: {os.strerror(err)}")
            sock = socket.socket(fileno=copy)
            try:
                sock.shutdown(socket.SHUT_RDWR)
                closed += 1
            except OSError:
                pass                              # already closed by its peer
            finally:
                sock.close()                      # our copy only; the process's descriptor stays
    finally:
        os.close(pidfd)
    return closed
