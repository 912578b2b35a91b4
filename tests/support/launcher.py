"""The launcher run as `make serve` runs it (python -m rose_backend.launch), in a child process on
free loopback ports, its output read as it comes; tests/support/leftovers.py watches what it starts.

    with LauncherRun(env={"API_KEY": key}) as run:
        assert run.wait_for("rose: serving", 300), run.output
        ...
        code, seconds = run.terminate()
"""
from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from support import leftovers
from support.ports import free_port, free_ports

ROOT = Path(__file__).resolve().parents[2]
_RUNS = itertools.count()


class LauncherRun:
    def __init__(self, *args: str, env: dict | None = None, gateway: bool = True, gateway_port: int | None = None,
                 python: str = sys.executable):
        self.ports = free_ports()
        self.gateway_port = (gateway_port or free_port()) if gateway else 0
        cmd = [python, "-m", "rose_backend.launch", "--grpc-port", str(self.ports.grpc),
               "--http-port", str(self.ports.http), "--metrics-port", str(self.ports.metrics),
               "--gateway-port", str(self.gateway_port), *args]
        full_env = {k: v for k, v in os.environ.items() if k not in ("API_KEY", "ADMIN_KEY", "MAKELEVEL")}
        self.owner = f"{leftovers.SESSION}launch{next(_RUNS)}_"    # what this launch starts inherits it
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env={**full_env, **(env or {}), leftovers.OWNER: self.owner})
        leftovers.track(self.proc.pid)
        self.prefix = f"rose_{self.proc.pid}_"                  # its servers' shared-memory prefix
        self.prefixes = (self.prefix, self.owner)               # what leftovers finds its processes by
        self.lines: list[str] = []
        self._new = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._new:
                self.lines.append(line)
                self._new.notify_all()
        with self._new:
            self.lines.append("")                 # end of output
            self._new.notify_all()

    @property
    def output(self) -> str:
        return "".join(self.lines)

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.ports.grpc}"

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

    def wait_for(self, needle: str, timeout: float, after: int = 0) -> bool:
        """Until a line (from the after-th on) holds `needle`; False at the end of output or timeout."""
        end = time.monotonic() + timeout
        with self._new:
            while True:
                if any(needle in line for line in self.lines[after:]):
                    return True
                if (self.lines and self.lines[-1] == "") or time.monotonic() >= end:
                    return False
                self._new.wait(max(0.0, min(1.0, end - time.monotonic())))

    def processes(self) -> dict[int, str]:
        """{pid: command line} of what this launch started (its servers, stubs, gateway and workers)."""
        return {p: c for p, c in leftovers.processes(self.prefixes).items() if p != self.proc.pid}

    def terminate(self, timeout: float = 60.0) -> tuple[int, float]:
        """SIGTERM; (exit code, seconds to exit)."""
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        return code, time.monotonic() - t0

    def __enter__(self) -> "LauncherRun":
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.kill()                      # its servers and gateway die with it (PR_SET_PDEATHSIG)
        self.proc.wait()
        leftovers.remove(*leftovers.wait_gone(self.prefixes, 10.0))
