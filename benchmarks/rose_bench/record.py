"""What every benchmark run records beside its numbers: a timestamped log line, the JSON saved
atomically after every cell, the host (CPU, GPU, library versions) and the git commit.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def comma_list(value: str) -> list[str]:
    """"a, b,,c" -> ["a", "b", "c"]."""
    return [x.strip() for x in value.split(",") if x.strip()]


def latency_ms(ms) -> dict:
    """Latencies in ms summarised: n, p50 / p90 / p99 and max ({"n": 0} for none)."""
    import numpy as np
    a = np.asarray(ms, dtype=float)
    if not a.size:
        return {"n": 0}
    return {"n": int(a.size), **{f"p{q}_ms": round(float(np.percentile(a, q)), 3) for q in (50, 90, 99)},
            "max_ms": round(float(a.max()), 3)}


def counts_json(counts: dict) -> dict:
    """A mode's request counts as JSON (dict keys as strings)."""
    return {k: ({str(a): b for a, b in v.items()} if isinstance(v, dict) else v) for k, v in counts.items()}


def save_json(path: Path, result: dict, t_start: float) -> None:
    """Write `result` (with elapsed_s since t_start) to `path` atomically: a run cut short keeps
    its last complete file."""
    result["elapsed_s"] = round(time.monotonic() - t_start, 1)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(path)


def repo_root() -> Path:
    from rose_backend.launch.deployment import REPO_ROOT
    return REPO_ROOT


def host_info(device: str) -> dict:
    info = {"hostname": platform.node(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "device": device, "gpu": None}
    try:
        import torch
        import transformers
        info.update(torch=torch.__version__, transformers=transformers.__version__)
        if device.startswith("cuda"):
            info["gpu"] = torch.cuda.get_device_name(0)
    except Exception:
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        if out.returncode == 0:
            info["nvidia_smi"] = out.stdout.strip()
    except Exception:
        pass
    return info


def cuda_available() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


def command_line(argv: list[str] | None = None) -> str:
    """The run's command line as recorded: `python -m rose_bench NAME` (what __main__ puts in
    sys.argv[0]) and its arguments (`argv` where main() was handed them)."""
    return " ".join([sys.argv[0], *(sys.argv[1:] if argv is None else argv)])


def run_record(commit: str | None, device: str) -> dict:
    """What a run's JSON opens with: its command line, git commit (`commit` where .git is not
    available), date and machine."""
    return {"command": command_line(), "git": git_commit(commit),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": host_info(device)}


def git_commit(explicit: str | None) -> dict:
    if explicit:
        return {"commit": explicit, "source": "--git-commit"}
    try:
        root = repo_root()
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return {"commit": commit or None, "dirty": bool(dirty), "source": "git"}
    except Exception:
        return {"commit": os.environ.get("ROSE_GIT_COMMIT"), "source": "env"}


def tail(path: Path, n: int = 30) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {path})"
    return f"--- last {n} lines of {path} ---\n" + "\n".join(lines[-n:])
