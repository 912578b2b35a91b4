"""A Python-backend stub of ours exits, and frees its shared memory, once its tritonserver is gone.

Why this is needed (Triton 2.51's python backend, found with gdb on an orphaned `rose` stub after
`kill -9` of tritonserver under load): the stub's health thread notices the dead parent and calls
Stub::TerminateStubToParentQueueMonitor(), which takes the stub-to-parent queue mutex. That mutex
is held by the stub-to-parent thread while it waits, forever, on a shared-memory condition for the
dead parent's answer to a `request.is_cancelled()` query (SendIsCancelled). The health thread
deadlocks, the stub never exits, and SIGTERM is ignored by design (the stub's handler skips
SIGINT/SIGTERM, since the server stops it). `rose` asks requests that waited in its pool whether
they were cancelled, so a server killed while requests waited left its `rose` stub behind with its
host (and GPU) memory and its /dev/shm segment; `tokenize` never asks, so its stubs exited.

The cause is in the stub's C++; this watchdog is the workaround: a daemon thread polls the
parent pid (the stub is started with the server's pid as an argument) and, once the stub has been
re-parented, removes the stub's shared-memory region and ends the process with os._exit, which
frees its host and GPU memory. It needs the GIL, which the blocked threads do not hold (checked
in the deadlocked stub: the GIL was free).
"""
from __future__ import annotations

import logging
import os
import threading
import time

log = logging.getLogger(__name__)

_server_pid: int | None = None          # set by watch_parent in a stub


def server_gone() -> bool:
    """True in a stub whose tritonserver has died (the stub was re-parented); False elsewhere.

    Dropping a Triton object (a response sender, a request) runs its C++ destructor with the GIL
    held, and that destructor queues a clean-up message behind the stub-to-parent mutex. Once the
    server is dead, a `request.is_cancelled()` query can hold that mutex forever (above), so such a
    drop blocks forever with the GIL held, and this watchdog, which needs the GIL, never runs. The
    service therefore keeps those objects (drop_triton_objects) once this is True. With
    responder threads, one thread could drop a sender while another waits on such a query.
    """
    return _server_pid is not None and os.getppid() != _server_pid


_kept: list = []                        # Triton objects not dropped because the server was gone


def drop_triton_objects(holder, *names: str) -> None:
    """Set these attributes of `holder` to None; once the server is gone, keep their objects
    alive here instead of letting them be destroyed (server_gone says why)."""
    if server_gone():
        _kept.append(tuple(getattr(holder, n) for n in names))
    for n in names:
        setattr(holder, n, None)


STUB_NAME = "triton_python_backend_stub"


def stub_arguments(cmdline: bytes | None = None) -> tuple[str, int] | None:
    """(shared-memory region name, server pid) of this stub process, or None outside a stub.

    The stub's command line: stub, model.py, region name, region size, growth, parent pid, ...
    """
    if cmdline is None:
        try:
            with open("/proc/self/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            return None
    args = [a.decode("utf-8", errors="replace") for a in cmdline.split(b"\0") if a]
    if len(args) < 6 or not args[0].endswith(STUB_NAME) or not args[5].isdigit():
        return None
    return args[2], int(args[5])


def remove_region(region: str) -> None:
    try:
        os.unlink(os.path.join("/dev/shm", region))
    except FileNotFoundError:
        pass
    except OSError as e:
        log.warning("could not remove /dev/shm/%s: %s", region, e)


def watch_parent(model: str, interval: float = 0.5) -> threading.Thread | None:
    """Start the watchdog in this stub (no-op outside a stub); returns its thread."""
    found = stub_arguments()
    if found is None:
        return None
    region, server_pid = found
    if os.getppid() != server_pid:          # already orphaned (or not started by a server)
        server_pid = os.getppid()
    global _server_pid
    _server_pid = server_pid

    def run():
        while os.getppid() == server_pid:
            time.sleep(interval)
        # stderr, not the logger: the stub's log path goes through the dead server
        os.write(2, f"{model}: tritonserver (pid {server_pid}) is gone; exiting and removing "
                    f"/dev/shm/{region}\n".encode())
        remove_region(region)
        os._exit(1)

    thread = threading.Thread(target=run, name=f"{model}-parent-watch", daemon=True)
    thread.start()
    return thread
