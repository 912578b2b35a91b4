"""The launcher's watch over its HTTP gateway: started, serving on ITS port, restarted when it dies.

- serving: the gateway counts as up once its own processes (it, or its worker processes) listen on
  the gateway port, nobody else's socket listens there too, and it answers HTTP. A port that another
  process also serves (SO_REUSEPORT lets a second gateway bind it) fails the launch naming the port,
  instead of HTTP clients silently reaching another deployment.
- check(): called by the launcher's loop. A dead gateway is started again with a message, at most
  `restarts` times within `window_s` seconds; beyond that, or when another process starts listening
  on the port, GatewayFailed (the launcher stops everything and exits non-zero).
- abort(): checked while it waits for a gateway to serve (at its start, at a restart); once true,
  StopRequested, and the gateway is left for stop(), which the launcher runs beside its servers' stops.
"""
from __future__ import annotations

import sys
import time
from collections import deque
from typing import Callable

from rose_backend.launch.child import http_status
from rose_backend.launch.connections import family, listening_pids
from rose_backend.launch.supervision import StopRequested

RESTARTS = 3
WINDOW_S = 60.0
CHECK_PORT_S = 1.0          # how often the port's listeners are looked at while serving


class GatewayFailed(RuntimeError):
    pass


def _answers(url: str) -> bool:
    return http_status(url + "/metrics") != 0         # an HTTP answer, whatever its status


class GatewayWatch:
    def __init__(self, make: Callable[[], object], restarts: int = RESTARTS, window_s: float = WINDOW_S,
                 start_timeout: float = 60.0, abort: Callable[[], bool] | None = None):
        """make(): a started rose_backend.launch.gateway.GatewayProcess (or anything with .proc, .port, .host,
        .url, .log_file and .stop())."""
        self.make, self.restarts, self.window_s, self.start_timeout = make, restarts, window_s, start_timeout
        self.abort = abort
        self.gateway = None
        self.restarted: deque[float] = deque()
        self._port_checked = 0.0

    def _where(self) -> str:
        g = self.gateway
        return f"port {g.port} (gateway) on {g.host}"

    def _foreign(self) -> bool:
        """Whether anyone but the gateway's processes listens on its port. A gateway that died while
        its listeners were read is a death to restart, not an intruder: its workers pass to init (no
        longer its children) and may still listen until they have exited."""
        _, foreign = listening_pids(self.gateway.port, family(self.gateway.proc.pid))
        return foreign and self.gateway.proc.poll() is None

    def _check_abort(self) -> None:
        if self.abort is not None and self.abort():
            raise StopRequested("stopped while the gateway was starting")

    def wait_serving(self) -> None:
        g = self.gateway
        end = time.monotonic() + self.start_timeout
        while time.monotonic() < end:
            self._check_abort()
            code = g.proc.poll()
            if code is not None:
                raise GatewayFailed(f"the gateway exited with code {code} before it served on {self._where()}"
                                    + (f"; see {g.log_file}" if g.log_file else ""))
            ours, foreign = listening_pids(g.port, family(g.proc.pid))
            if foreign:
                raise GatewayFailed(f"{self._where()} is already served by another process; stop it or "
                                    f"choose another GATEWAY_PORT")
            if ours and _answers(g.url):
                return
            time.sleep(0.1)
        raise GatewayFailed(f"the gateway did not serve on {self._where()} within {self.start_timeout:.0f} s")

    def start(self):
        self.gateway = self.make()
        try:
            self.wait_serving()
        except StopRequested:
            raise                                  # stopped by stop(), side by side with the servers
        except BaseException:
            self.gateway.stop()
            raise
        self._port_checked = time.monotonic()
        return self.gateway

    def check(self) -> None:
        """Restart a dead gateway (within the budget) or raise GatewayFailed."""
        g = self.gateway
        code = g.proc.poll()
        now = time.monotonic()
        if code is None:
            if now - self._port_checked >= CHECK_PORT_S:
                self._port_checked = now
                if self._foreign():
                    raise GatewayFailed(f"another process now also listens on {self._where()}: HTTP clients "
                                        f"would reach it; stopping")
            return
        while self.restarted and now - self.restarted[0] > self.window_s:
            self.restarted.popleft()
        if len(self.restarted) >= self.restarts:
            raise GatewayFailed(f"the gateway exited with code {code}: {len(self.restarted) + 1} exits within "
                                f"{self.window_s:.0f} s; stopping"
                                + (f" (see {g.log_file})" if g.log_file else ""))
        self.restarted.append(now)
        print(f"rose: the gateway on {g.host}:{g.port} exited with code {code}; starting it again "
              f"(restart {len(self.restarted)} of {self.restarts} within {self.window_s:.0f} s)",
              file=sys.stderr, flush=True)
        g.stop()                                   # reaps it (and what is left of its workers)
        self._wait_port_released(g)
        self.start()
        print(f"rose: the gateway serves again on {self.gateway.url}", file=sys.stderr, flush=True)

    def _wait_port_released(self, dead, timeout: float = 10.0) -> None:
        """Until no socket listens on the dead gateway's port (its workers die with it)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self._check_abort()
            if not listening_pids(dead.port, [])[1]:
                return
            time.sleep(0.1)
        raise GatewayFailed(f"{self._where()} is still served by another process after the gateway died; stopping")

    def stop(self, timeout: float | None = None) -> None:
        """Stop the gateway (timeout: as GatewayProcess.stop's)."""
        if self.gateway is not None:
            self.gateway.stop(timeout)
