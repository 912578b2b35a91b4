"""benchmarks/perf_analyzer.sh as the README runs it, for the tests that load a real server with it."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# windows of a request count, not of time: on a loaded CI machine a 300 ms window once closed before
# its first request came back ("No valid requests recorded within time interval")
WINDOWS = ["--measurement-mode", "count_windows", "--measurement-request-count", "10", "-r", "3",
           "--stability-percentage", "999"]


def perf_analyzer_sh(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """benchmarks/perf_analyzer.sh with no key in its environment but those in `env`."""
    base = {k: v for k, v in os.environ.items() if k not in ("API_KEY", "ADMIN_KEY", "ROSE_ADMIN_KEY")}
    return subprocess.run(["bash", str(ROOT / "benchmarks" / "perf_analyzer.sh"), *args], capture_output=True,
                          text=True, timeout=180, env={**base, **(env or {})})
