"""What the launcher needs to be a good citizen under a supervisor (systemd, Kubernetes, make).

- die_with_parent(): a child (tritonserver) is killed when the process that started it dies, even
  by SIGKILL (Linux PR_SET_PDEATHSIG), since tritonserver runs in its own session.
- check_ports_free(): a port already taken fails the launch at once, naming the port, instead of
  after the models loaded (gRPC binds with SO_REUSEPORT, so Triton itself may not even notice).
- exit_timeout_for(): tritonserver's --exit-timeout-secs from the repository's drain time, so a
  server stops within drain_timeout_s + 5 s of SIGTERM whatever it was sent.
- StopRequested / KILL_BY_S: a launch stops within drain_timeout_s + STOP_BOUND_S of SIGTERM, even
  one that comes while it is still starting (serve.py).
- processes_with() / segments_with(): what carries a server's shared-memory prefix (tests, soak).
- cache_env(): one persistent compile-cache folder for every JIT the server uses, so a restart on
  the same machine does not compile again.
"""
from __future__ import annotations

import ctypes
import errno
import os
import signal
import socket
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1
EXIT_MARGIN_S = 2          # tritonserver's exit timeout = drain_timeout_s + this
KILL_MARGIN_S = 2          # the launcher kills a server this long after its exit timeout (a server
                           # whose `rose` stub was killed -9 does not exit at its exit timeout)
STOP_BOUND_S = 5           # a launch exits within drain_timeout_s + this of SIGTERM
KILL_BY_S = 4              # by drain_timeout_s + this after SIGTERM every child left is killed


class PortInUse(RuntimeError):
    pass


class StopRequested(Exception):
    """SIGTERM / Ctrl-C came while the launcher was waiting for a child to start: it stops instead."""


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
    """preexec_fn for a server process: SIGKILL when the launcher dies (its stubs then see their
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


def drain_timeout_of(repository: str | Path, model: str = "rose") -> int:
    """The `drain_timeout_s` parameter of `model` in a model repository, read as Triton reads the
    file (RoseSettings' default where the model or the parameter is absent)."""
    from rose_backend.triton.model_settings import RoseSettings, model_config_file
    cfg = Path(repository) / model / "config.pbtxt"
    raw = None
    if cfg.exists():
        raw = (model_config_file(cfg).get("parameters") or {}).get("drain_timeout_s", {}).get("string_value")
    return RoseSettings.from_values({"drain_timeout_s": raw} if raw else {}).drain_timeout_s


def exit_timeout_for(repository: str | Path) -> int:
    """tritonserver --exit-timeout-secs: the drain time plus a margin.

    Triton 2.51 leaks a model reference when it rejects a request for the decoupled `rose` model
    before the model sees it (wrong dtype or shape, missing or extra input) and the client then
    cancels its stream; `rose` is then never unloaded and tritonserver waits its full exit timeout.
    Bounding that timeout by the drain time bounds every shutdown (the stubs then exit on their
    own, parent_watch.py).
    """
    return drain_timeout_of(repository) + EXIT_MARGIN_S


def cache_dir(env: dict | None = None) -> Path:
    """$ROSE_CACHE_DIR, else $XDG_CACHE_HOME/rose, else ~/.cache/rose."""
    env = os.environ if env is None else env
    if env.get("ROSE_CACHE_DIR"):
        return Path(env["ROSE_CACHE_DIR"]).expanduser()
    return Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "rose"


def cache_env(env: dict) -> dict:
    """Point every compile cache the server uses into one persistent folder (values already set
    in `env` win): flashinfer's JIT (FLASHINFER_WORKSPACE_BASE: its cache is <base>/.cache/flashinfer),
    Triton-language kernels (TRITON_CACHE_DIR), torch inductor (TORCHINDUCTOR_CACHE_DIR) and the
    CUDA driver's PTX cache (CUDA_CACHE_PATH)."""
    root = cache_dir(env).resolve()
    env.setdefault("ROSE_CACHE_DIR", str(root))
    for var, sub in (("FLASHINFER_WORKSPACE_BASE", "flashinfer"), ("TRITON_CACHE_DIR", "triton"),
                     ("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("CUDA_CACHE_PATH", "cuda")):
        env.setdefault(var, str(root / sub))
    return env


def processes_with(prefixes) -> dict[int, str]:
    """{pid: command line} of live processes (not this one) whose command line holds a prefix."""
    prefixes = tuple(prefixes)
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(p in cmd for p in prefixes):
            found[int(entry.name)] = cmd.strip()
    return found


def segments_with(prefixes) -> list[str]:
    """Names of the /dev/shm segments starting with one of the prefixes."""
    try:
        return sorted(n for n in os.listdir("/dev/shm") if n.startswith(tuple(prefixes)))
    except FileNotFoundError:
        return []


def wait_gone(prefixes, timeout: float) -> tuple[dict[int, str], list[str]]:
    """Poll until no process or segment of `prefixes` is left, or `timeout`; return what is left."""
    end = time.monotonic() + timeout
    while True:
        procs, segs = processes_with(prefixes), segments_with(prefixes)
        if (not procs and not segs) or time.monotonic() >= end:
            return procs, segs
        time.sleep(0.1)


def remove(procs: dict[int, str], segs: list[str]) -> None:
    """SIGKILL these processes, then unlink these /dev/shm segments."""
    for pid in procs:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for name in segs:
        try:
            os.unlink(os.path.join("/dev/shm", name))
        except FileNotFoundError:
            pass


def aborted_at_start(returncode: int | None, log_file) -> bool:
    """True when tritonserver died of SIGABRT as it started with one of the two aborts of Triton
    2.51 that a second start does not repeat as its log's last words: "epoll_wait error: Bad file
    descriptor" (its gRPC event engine; 2 of 13 full CPU test runs of 2026-11-30) or the Python
    backend's "boost::interprocess::lock_exception" (its shared-memory mutex timing out while it
    starts model instances on a host starved of CPU; triton-inference-server/server#5949, #8882).
    TritonProcess.wait_ready starts such a server once more."""
    if returncode != -signal.SIGABRT or not log_file:
        return False
    try:
        with open(log_file, "rb") as f:
            f.seek(max(0, os.path.getsize(log_file) - 4096))
            tail = f.read()
        return b"epoll_wait error" in tail or b"boost::interprocess::lock_exception" in tail
    except OSError:
        return False
