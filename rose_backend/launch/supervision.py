"""What the launcher needs to be a good citizen under a supervisor (systemd, Kubernetes, make).

- Parent death and the port check (a port already taken fails the launch at once, instead of
  after the models loaded): rose_backend.processes, which the HTTP gateway shares.
- exit_timeout_for(): tritonserver's --exit-timeout-secs from the repository's drain time, so a
  server stops within drain_timeout_s + 5 s of SIGTERM whatever it was sent.
- StopRequested / KILL_BY_S: a launch stops within drain_timeout_s + STOP_BOUND_S of SIGTERM, even
  one that comes while it is still starting (serve.py).
- processes_with() / segments_with(): what carries a server's shared-memory prefix (tests, soak).
- cache_env(): one persistent compile-cache folder for every JIT the server uses, so a restart on
  the same machine does not compile again.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from rose_backend import env_vars

EXIT_MARGIN_S = 2          # tritonserver's exit timeout = drain_timeout_s + this
KILL_MARGIN_S = 2          # the launcher kills a server this long after its exit timeout (a server
                           # whose `rose` stub was killed -9 does not exit at its exit timeout)
STOP_BOUND_S = 5           # a launch exits within drain_timeout_s + this of SIGTERM
KILL_BY_S = 4              # by drain_timeout_s + this after SIGTERM every child left is killed


class StopRequested(Exception):
    """SIGTERM / Ctrl-C came while the launcher was waiting for a child to start: it stops instead."""


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
    if env_vars.ROSE_CACHE_DIR.get(env):
        return Path(env_vars.ROSE_CACHE_DIR.get(env)).expanduser()
    return Path(env_vars.XDG_CACHE_HOME.get(env) or Path.home() / ".cache").expanduser() / "rose"


def cache_env(env: dict) -> dict:
    """Point every compile cache the server uses into one persistent folder (values already set
    in `env` win): flashinfer's JIT (FLASHINFER_WORKSPACE_BASE: its cache is <base>/.cache/flashinfer),
    Triton-language kernels (TRITON_CACHE_DIR), torch inductor (TORCHINDUCTOR_CACHE_DIR) and the
    CUDA driver's PTX cache (CUDA_CACHE_PATH)."""
    root = cache_dir(env).resolve()
    env.setdefault(env_vars.ROSE_CACHE_DIR.name, str(root))
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
    """True when tritonserver died of SIGABRT as it started, its log ending in one of the two aborts
    of Triton 2.51 that a second start does not repeat (docs/OPERATIONS.md, "Ready means ready"):
    gRPC's "epoll_wait error: Bad file descriptor" or the Python backend's
    "boost::interprocess::lock_exception". TritonProcess.wait_ready starts such a server once more."""
    if returncode != -signal.SIGABRT or not log_file:
        return False
    try:
        with open(log_file, "rb") as f:
            f.seek(max(0, os.path.getsize(log_file) - 4096))
            tail = f.read()
        return b"epoll_wait error" in tail or b"boost::interprocess::lock_exception" in tail
    except OSError:
        return False
