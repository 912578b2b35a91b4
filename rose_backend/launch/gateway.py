"""The HTTP gateway (rose_gateway) as a child process: what `make serve` (serve.py) and the tests start,
by its command line (`python -m rose_gateway`), so the launcher imports nothing of the gateway.

    with GatewayProcess("127.0.0.1:8001", port=8080) as gw:     # waits until it answers
        print(gw.url)                                           # http://127.0.0.1:8080

Keys go by environment only, never on its command line (a process listing would show them):
api_key as API_KEY (required on /v1/* and sent to Triton; None: the child gets no API_KEY). The
gateway never gets the admin key: it reads only what inference callers may read. drain_timeout: the gateway's
--drain-timeout (seconds requests in flight get at SIGTERM); stop() kills it STOP_MARGIN_S later.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rose_backend import env_vars
from rose_backend.launch.child import ChildProcess, http_answer, reachable
from rose_backend.launch.deployment import REPO_ROOT
from rose_backend.processes import GATEWAY_STATE_PREFIX, remove_unowned

DEFAULT_DRAIN_S = 10.0          # the --drain-timeout a gateway started here gets when none is named
STOP_MARGIN_S = 3.0


class GatewayProcess(ChildProcess):
    def __init__(self, triton_urls: str | list[str], port: int = 8080, host: str = "127.0.0.1",
                 model_dir: str | None = None, api_key: str | None = None, extra_args: list[str] | None = None,
                 log_file: str | Path | None = None, drain_timeout: float | None = None):
        self.urls = triton_urls if isinstance(triton_urls, str) else ",".join(triton_urls)
        self.port, self.host, self.model_dir, self.api_key = port, host, model_dir, api_key
        self.drain_timeout = DEFAULT_DRAIN_S if drain_timeout is None else drain_timeout
        self.extra_args, self.log_file = extra_args or [], log_file
        self.proc = None

    @property
    def url(self) -> str:
        return f"http://{reachable(self.host)}:{self.port}"

    def start(self) -> "GatewayProcess":
        env = dict(os.environ)
        paths = [str(REPO_ROOT / "gateway"), str(REPO_ROOT / "client"), str(REPO_ROOT)]
        env[env_vars.PYTHONPATH.name] = ":".join(paths + [p for p in [env_vars.PYTHONPATH.get(env)] if p])
        env.pop("API_KEY", None)
        for var in ("ADMIN_KEY", "ROSE_ADMIN_KEY"):  # the control plane's key stays with the launcher
            env.pop(var, None)
        if self.api_key:
            env["API_KEY"] = self.api_key          # by environment: kept out of `ps`
        cmd = [sys.executable, "-m", "rose_gateway", "--triton-urls", self.urls, "--host", self.host,
               "--port", str(self.port)] + \
            (["--model", str(self.model_dir)] if self.model_dir else []) + \
            ["--drain-timeout", str(self.drain_timeout)] + self.extra_args
        self.spawn(cmd, env)        # its own process group; SIGKILL when the process that started it dies
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until the gateway answers its /health (which may still say Triton is not ready): the
        gateway's own answer, which names its replicas, not just any server's on that port."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the gateway exited with code {self.proc.returncode}"
                                   + (f"; see {self.log_file}" if self.log_file else ""))
            status, body = http_answer(self.url + "/health")
            if status and b'"replicas"' in body:
                return
            time.sleep(0.1)
        raise RuntimeError(f"the gateway did not answer on {self.url} within {timeout:.0f} s")

    def stop(self, timeout: float | None = None) -> int | None:
        """SIGTERM (it drains for its drain timeout), SIGKILL to its process group `timeout` seconds
        later (default: the drain timeout + STOP_MARGIN_S); then what is left of its group goes too."""
        if self.proc is None:
            return None
        if timeout is None:
            timeout = self.drain_timeout + STOP_MARGIN_S
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)    # it finishes requests in flight, then exits
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill_group()                                # its own group: only its worker processes
        code = self.proc.wait()
        remove_unowned(GATEWAY_STATE_PREFIX)             # a killed gateway's worker state
        return code
