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

The cause is in the stub's C++; two watchdogs are the workaround, both started by watch_parent():
- a daemon thread polls the parent pid (the stub is started with the server's pid as an argument)
  and, once the stub has been re-parented, removes the stub's shared-memory region and ends the
  process with os._exit, which frees its host and GPU memory. It needs the GIL, which the threads
  blocked on SendIsCancelled do not hold (checked in the deadlocked stub: the GIL was free).
- a watcher process (a bare `python -I -S`, ~10 MB), for the stubs whose GIL is held forever: a
  custom-metric update (polled_metrics.py; python_backend's Metric round trip keeps the GIL) in
  flight when the server is killed never returns, and then no thread of the stub runs again (seen
  in 1 of 3 `kill -9` runs under load, the metrics thread in the round trip and every other thread
  waiting for the GIL). The watcher holds pidfds of the server and of the stub and sleeps in
  poll(): the stub exiting first ends it; the server dying first makes it SIGKILL the stub and
  remove its region. The kernel, not the stub, wakes it, so nothing the stub holds can stop it.

watch_parent() also has the stub of the `rose` model's first instance export the launcher's
restart count (server_restarts.py): every model of ours calls it as it loads.
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import threading
import time

log = logging.getLogger(__name__)

_server_pid: int | None = None          # set by watch_parent in a stub


def server_gone() -> bool:
    """True in a stub whose tritonserver has died (the stub was re-parented); False elsewhere.

    Once it is True the service keeps Triton's objects instead of dropping them (drop_triton_objects):
    a drop could block forever with the GIL held (docs/OPERATIONS.md, "Nothing outlives the server")."""
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


def _stub_args(cmdline: bytes | None) -> list[str] | None:
    """The stub's command line: stub, model.py, region name, region size, growth, parent pid,
    python lib, ipc handle, instance name, ... (None outside a stub)."""
    if cmdline is None:
        try:
            with open("/proc/self/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            return None
    args = [a.decode("utf-8", errors="replace") for a in cmdline.split(b"\0") if a]
    if len(args) < 6 or not args[0].endswith(STUB_NAME) or not args[5].isdigit():
        return None
    return args


def stub_arguments(cmdline: bytes | None = None) -> tuple[str, int] | None:
    """(shared-memory region name, server pid) of this stub process, or None outside a stub."""
    args = _stub_args(cmdline)
    return None if args is None else (args[2], int(args[5]))


def stub_instance(cmdline: bytes | None = None) -> str | None:
    """Triton's name of this stub's model instance (e.g. rose_0_0), or None outside a stub."""
    args = _stub_args(cmdline)
    return args[8] if args is not None and len(args) > 8 else None


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
    start_watcher(model, region, server_pid)
    try:
        from rose_backend.triton.server_restarts import export_restarts
        export_restarts(stub_instance())
    except Exception as e:                       # a metric never keeps a model from loading
        log.warning("%s: cannot export the server's restart count: %s", model, e)
    return thread


# The watcher process: argv model, region, a pidfd of the server, one of the stub (inherited).
WATCHER = """
import os, select, signal, sys
model, region, server, stub = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
p = select.poll()
p.register(server, select.POLLIN)
p.register(stub, select.POLLIN)
if stub not in {fd for fd, _ in p.poll()}:
    os.write(2, f"{model}: tritonserver is gone; killing its stub and removing /dev/shm/{region}\\n".encode())
    signal.pidfd_send_signal(stub, signal.SIGKILL)
    try:
        os.unlink("/dev/shm/" + region)
    except OSError:
        pass
"""


def watcher_python() -> str | None:
    """The interpreter of the stub's own Python install (sys.executable in a stub is what PATH
    gave, e.g. a pyenv shim: a shell script that costs more CPU than the interpreter's start)."""
    v = sys.version_info
    for name in (f"python{v.major}.{v.minor}", f"python{v.major}"):
        path = os.path.join(sys.base_prefix, "bin", name)
        if os.access(path, os.X_OK):
            return path
    return sys.executable if sys.executable and os.access(sys.executable, os.X_OK) else shutil.which("python3")


def start_watcher(model: str, region: str, server_pid: int) -> subprocess.Popen | None:
    """The watcher process of this stub (None where it cannot run: no pidfds, no Python found)."""
    python = watcher_python()
    if not python or not hasattr(os, "pidfd_open"):
        log.warning("%s: no watcher process (it needs Linux pidfds and a python3); the stub may outlive "
                    "a killed server", model)
        return None
    fds = []
    try:
        fds.append(os.pidfd_open(server_pid))
        if os.getppid() != server_pid:           # gone already: the pid may name another process now
            return None
        fds.append(os.pidfd_open(os.getpid()))
        return subprocess.Popen([python, "-I", "-S", "-c", WATCHER, model, region, *map(str, fds)],
                                stdin=subprocess.DEVNULL, pass_fds=fds)
    except OSError as e:
        log.warning("%s: no watcher process (%s); the stub may outlive a killed server", model, e)
        return None
    finally:
        for fd in fds:
            os.close(fd)
