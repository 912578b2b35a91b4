"""Scratch folders of processes killed before they could remove them: found and removed, never a
live process's.

- Triton's Python backend makes one empty folder `/tmp/python_env_XXXXXX` per tritonserver (its
  EnvironmentManager, a fixed path whatever TMPDIR says) and removes it at a clean exit only: a
  server killed with SIGKILL leaves it. remove_python_envs_of_dead_servers() removes those made
  before every live tritonserver of this machine started; such a folder's server is gone. It runs
  each time the launcher has reaped a tritonserver. (A tritonserver this process cannot see, in
  another PID namespace that shares this /tmp, is not counted: such a layout should give each
  container its own /tmp.)
- The HTTP gateway's worker-state folders of gateways that were killed: rose_backend.processes
  (owned_folder, remove_unowned), which the gateway shares.
"""
from __future__ import annotations

import os
from pathlib import Path

PYTHON_ENVS = ("/tmp", "python_env_*")          # where Triton's Python backend makes them


def _boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    raise OSError("no btime in /proc/stat")


def tritonserver_start_times() -> list[float]:
    """When each live tritonserver of this machine started (seconds since the epoch)."""
    boot, hz = _boot_time(), os.sysconf("SC_CLK_TCK")
    starts = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if "tritonserver" not in os.path.basename(os.readlink(entry / "exe")):
                continue
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        starts.append(boot + int(fields[19]) / hz)
    return starts


def remove_python_envs_of_dead_servers(where: tuple[str, str] = PYTHON_ENVS) -> list[str]:
    """Remove the empty python_env folders of this user's that are older than every live
    tritonserver (one second's margin for the clocks' rounding); the ones removed. `where`: the
    folder and the pattern of the names in it."""
    try:
        oldest_live = min(tritonserver_start_times(), default=float("inf")) - 1.0
    except OSError:
        return []
    removed = []
    for path in Path(where[0]).glob(where[1]):
        try:
            st = path.lstat()
            if st.st_uid != os.getuid() or st.st_ctime >= oldest_live:
                continue
            path.rmdir()                         # an empty folder only
        except OSError:
            continue
        removed.append(str(path))
    return removed
