"""The launcher's watch over its tritonservers and their Python stubs: a server whose stub died is
ended at once and started again, and so is a server that exited on its own (a crash: Triton 2.51
aborts, for one, when a client's gRPC stream carries both a decoupled model and `tokenize`).

Triton 2.51 neither restarts a Python stub that died (kill -9, the OOM killer, a crash in native
code; python_backend r24.10 has no restart for it) nor answers the requests it held, and it
goes on reporting the server and the model READY: every later request to the model fails after
about a second with "Stub process '<instance>' is not healthy." So once a server is READY the watch
holds a pidfd of each of its stubs, and check() (the launcher's loop, every 0.2 s) acts on a stub
that has exited while its server runs:
- the server is ended at once (SIGKILL to its process group): its clients' gRPC streams fail with
  UNAVAILABLE, so every request it held gets an error (rose_client and the gateway take it to
  another replica, or answer 503), and its ports stop answering, so it is not ready;
- it is started again on the same ports with the same keys. Once every model is READY the launcher
  prints one line (which stub died, how long the server was out) and the new server's metrics
  port counts the restart in rose_server_restarts_total (rose_backend/triton/server_restarts.py);
- a tritonserver that exited on its own is a death too: what it left (its stubs, their shared
  memory) is removed and it is started again the same way;
- StubWatchFailed, on which the launcher stops with exit code 1 and the reason (for a supervisor to
  replace it): a death while a restart is under way or within `window_s` seconds of the last
  server serving again, or a server that does not come back within `ready_timeout`.
A stub that exits because its model was unloaded or reloaded through the control plane is no
death: its model is no longer READY, or its stubs are whole again (a reload starts the new ones first).
"""
from __future__ import annotations

import os
import select
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from rose_backend.launch.supervision import processes_with
from rose_backend.launch.triton_install import LaunchError
from rose_backend.triton.parent_watch import STUB_NAME

WINDOW_S = 60.0
READY_TIMEOUT_S = 300.0


class StubWatchFailed(RuntimeError):
    pass


@dataclass(frozen=True)
class Stub:
    pid: int
    model: str
    instance: str
    kind = "stub"

    def __str__(self) -> str:
        return f"the Python stub of model '{self.model}' (instance {self.instance}, pid {self.pid})"


@dataclass(frozen=True)
class ServerExit:
    """A tritonserver that exited on its own, as the watch names it."""
    what: str
    kind = "server"

    def __str__(self) -> str:
        return self.what


def server_stubs(srv) -> dict[int, Stub]:
    """{pid: Stub} of a TritonProcess's live Python-backend stubs (its children whose command line
    carries the server's shared-memory prefix: stub, model.py, region, size, growth, parent pid,
    python lib, ipc handle, instance name, ...)."""
    out = {}
    for pid, cmd in processes_with([srv.shm_prefix]).items():
        args = cmd.split()
        if len(args) > 8 and args[0].endswith(STUB_NAME) and args[5] == str(srv.proc.pid):
            out[pid] = Stub(pid, Path(args[1]).parent.parent.name, args[8])
    return out


@dataclass(eq=False)
class _Watched:
    srv: object
    stubs: dict[int, Stub] = field(default_factory=dict)
    fds: dict[int, int] = field(default_factory=dict)            # pidfd -> stub pid
    poller: select.poll | None = None
    death: object = None                 # restarting after this death: a Stub, or what ended the server
    died_at: float = 0.0

    def arm(self) -> None:
        """Hold a pidfd of each of the server's stubs now."""
        self.disarm()
        self.stubs, self.poller = server_stubs(self.srv), select.poll()
        for pid in self.stubs:
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                fd = os.open("/dev/null", os.O_RDONLY)       # gone already: always readable
            except OSError:                                  # no pidfds here (Linux < 5.3)
                self.disarm()
                raise
            self.fds[fd] = pid
            self.poller.register(fd, select.POLLIN)

    def disarm(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds, self.poller = {}, None

    def exited(self) -> list[Stub]:
        if self.poller is None:
            return []
        return [self.stubs[self.fds[fd]] for fd, _ in self.poller.poll(0)]


class StubWatch:
    def __init__(self, servers: list, window_s: float = WINDOW_S, ready_timeout: float = READY_TIMEOUT_S):
        """servers: the launcher's TritonProcesses, each READY (arm() follows)."""
        self.window_s, self.ready_timeout = window_s, ready_timeout
        self.watched = [_Watched(s) for s in servers]
        self.recovered_at: float | None = None      # when a restarted server last served again
        self.can_watch_stubs = True

    def arm(self) -> None:
        for w in self.watched:
            self._arm(w)

    def _arm(self, w: _Watched) -> None:
        """Watch the server's stubs now; where pidfds are missing, say so once and watch only the servers."""
        if not self.can_watch_stubs:
            return
        try:
            w.arm()
        except OSError as e:
            self.can_watch_stubs = False
            self.close()
            print(f"rose: cannot watch the servers' Python stubs (pidfd_open: {e.strerror or e}); a server whose "
                  f"stub dies is not restarted", file=sys.stderr, flush=True)

    def close(self) -> None:
        for w in self.watched:
            w.disarm()

    def check(self) -> None:
        """Act on what happened since the last call (see the module docstring); StubWatchFailed
        when the launcher should stop."""
        for w in self.watched:
            if w.death is not None:
                self._follow_restart(w)
            else:
                self._watch(w)

    def _port(self, w: _Watched) -> str:
        return f"tritonserver on port {w.srv.ports.grpc}"

    def _watch(self, w: _Watched) -> None:
        code = w.srv.proc.poll()
        if code is not None:
            how = f"killed by {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals() \
                else f"exit code {code}"
            self._restart(w, ServerExit(f"tritonserver itself (pid {w.srv.proc.pid}, {how})"))
            return
        exited = w.exited()
        if not exited:
            return
        dead = self._deaths(w, exited)
        if not dead:
            self._arm(w)                             # unloaded or reloaded: watch the stubs it has now
            return
        self._restart(w, dead[0])

    def _restart(self, w: _Watched, death) -> None:
        """Start w's server again after `death` (a Stub, or a ServerExit); StubWatchFailed where it
        is a second death within the window."""
        now = time.monotonic()
        busy = next((o for o in self.watched if o.death is not None), None)
        if busy is not None or (self.recovered_at is not None and now - self.recovered_at < self.window_s):
            w.srv.kill()                             # answers what it held; the launcher stops the rest
            since = (f"while {self._port(busy)} was being restarted" if busy is not None else
                     f"{now - self.recovered_at:.1f} s after a restarted server served again")
            of = "" if isinstance(death, ServerExit) else f" of {self._port(w)}"
            raise StubWatchFailed(f"{death}{of} died {since} (a second {death.kind} death within "
                                  f"{self.window_s:g} s); stopping, for a supervisor to replace this deployment")
        w.disarm()
        w.death, w.died_at = death, now
        try:
            w.srv.restart()
        except LaunchError as e:
            raise StubWatchFailed(f"{self._port(w)} cannot be started again after {death} died: {e}") from None

    def _deaths(self, w: _Watched, exited: list[Stub]) -> list[Stub]:
        """The exited stubs whose model is still READY with fewer stubs than it had."""
        live = server_stubs(w.srv)
        dead = []
        for stub in exited:
            had = sum(s.model == stub.model for s in w.stubs.values())
            has = sum(s.model == stub.model for s in live.values())
            if has < had and w.srv.model_ready(stub.model) in (200, 0):
                dead.append(stub)
        return dead

    def _follow_restart(self, w: _Watched) -> None:
        try:
            ready = w.srv.poll_ready()
        except LaunchError as e:
            raise StubWatchFailed(f"{self._port(w)} did not come back after {w.death} died: {e}") from None
        now = time.monotonic()
        if not ready:
            if now - w.died_at > self.ready_timeout:
                raise StubWatchFailed(f"{self._port(w)} was not ready again {self.ready_timeout:.0f} s after "
                                      f"{w.death} died; stopping")
            return
        print(f"rose: {self._port(w)} was restarted because {w.death} died; it serves again "
              f"{now - w.died_at:.1f} s after the death (restarts: {w.srv.restarts}, rose_server_restarts_total on "
              f"its metrics port; another death within {self.window_s:g} s stops the launcher)",
              file=sys.stderr, flush=True)
        w.death = None
        self.recovered_at = now
        self._arm(w)
