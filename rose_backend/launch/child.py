"""A child process of the launcher's (tritonserver, the HTTP gateway), each in its own process group.

    class Server(ChildProcess):
        def start(self): ...            # its command and environment, then self.spawn(cmd, env)
        def wait_ready(self): ...       # until it serves
        def stop(self, timeout=None): ...

spawn(): the child leads a process group of its own, detached from the launcher's terminal (a
Ctrl-C there reaches the launcher only, which stops its children in order), its output is appended
to `log_file` when one is set, and with `die_with_parent` the kernel SIGKILLs it when the thread
that started it dies (a killed launcher: rose_backend.processes.die_with_parent). kill_group(): SIGKILL to
whatever is left of its group (its Python stubs, its worker processes). As a context manager: start() and wait_ready()
(stop() if either fails), stop() on leaving.
"""
from __future__ import annotations

import abc
import os
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from rose_backend.processes import die_with_parent


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to the process group that `proc` leads (gone already: nothing to do)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def reachable(host: str) -> str:
    """The address a client on this machine reaches a server bound to `host` at."""
    return "127.0.0.1" if host == "0.0.0.0" else host


def http_status(url: str, timeout: float = 2.0) -> int:
    """The HTTP status a GET of `url` answers with (whatever it is); 0 when nothing answers."""
    return http_answer(url, timeout)[0]


def http_answer(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    """(status, body) of a GET of `url`, whatever the status; (0, b"") when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


class ChildProcess(abc.ABC):
    proc: subprocess.Popen | None = None
    log_file: str | Path | None = None
    die_with_parent: bool = True

    def spawn(self, cmd: list[str], env: dict, cwd: str | None = None) -> subprocess.Popen:
        out = open(self.log_file, "ab") if self.log_file else None
        try:
            self.proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT if out else None,
                                         start_new_session=True,
                                         preexec_fn=die_with_parent if self.die_with_parent else None)
        finally:
            if out:
                out.close()
        return self.proc

    def kill_group(self) -> None:
        kill_group(self.proc)

    @abc.abstractmethod
    def start(self):
        """Spawn the child (its command and environment)."""

    @abc.abstractmethod
    def wait_ready(self) -> None:
        """Return once the child serves."""

    @abc.abstractmethod
    def stop(self, timeout: float | None = None) -> int | None:
        """Stop the child; its exit code."""

    def __enter__(self):
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc):
        self.stop()
