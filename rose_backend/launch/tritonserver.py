"""One tritonserver serving a model repository, as a child process of the launcher (TritonProcess).

    with TritonProcess(model_dir, ports=free_ports()) as srv:     # waits until every model is READY
        srv.grpc_url                                                # 127.0.0.1:<grpc port>

Where tritonserver comes from and its environment: triton_install.py; its keys: keys.py; its stop,
bounded whatever its clients keep open: triton_stop.py.
"""
from __future__ import annotations

import os
import secrets
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rose_backend.launch.argv_scrub import options_read, scrub_argv
from rose_backend.launch.child import ChildProcess, http_status, kill_group, reachable
from rose_backend import env_vars
from rose_backend.launch.deployment import (DEFAULT_REPOSITORY, MODELS, Ports,
                                            reranker_repository, served_models)
from rose_backend.launch.scratch import remove_python_envs_of_dead_servers
from rose_backend.launch.keys import KEY_VARIABLES, key_from, restricted_args
from rose_backend.launch.supervision import KILL_MARGIN_S, StopRequested, aborted_at_start, cache_env, exit_timeout_for
from rose_backend.launch.triton_install import LaunchError, TritonInstall, find_triton, server_env, stub_site
from rose_backend.launch.triton_stop import stop_tritonserver
from rose_backend.processes import PortInUse, check_ports_free
from rose_client.auth import check_key


@dataclass(frozen=True)
class ServerOptions:
    """How a TritonProcess runs, beside what it serves. address: the one its three ports listen on;
    extra_args: more tritonserver options (not the protocol restrictions: the keys do that);
    verbose: --log-verbose; die_with_parent: SIGKILL when the thread that start()ed it dies (start
    servers from a thread that outlives them); exit_timeout: --exit-timeout-secs (None:
    exit_timeout_for()); api_key / admin_key: see TritonProcess."""
    address: str = "127.0.0.1"
    extra_args: tuple[str, ...] = ()
    verbose: int = 0
    die_with_parent: bool = True
    exit_timeout: int | None = None
    api_key: str | None = None
    admin_key: str | None = None


class TritonProcess(ChildProcess):
    """One tritonserver process serving a model repository; a context manager.

    Its control plane (model repository, shared memory, trace, logging) is restricted, over HTTP and
    gRPC, under `options.admin_key`: the one given, else $ADMIN_KEY, else a fresh random key per start
    (send rose_client.auth.grpc_admin_headers(srv.admin_key)). With an `api_key`, inference, metadata,
    model config and statistics require it. Health stays open. Once the server has read its options
    the keys are overwritten in its command line (argv_scrub.py)."""

    def __init__(self, model_dir: str | None = None, repository: str | Path = DEFAULT_REPOSITORY,
                 ports: Ports | None = None, *, log_file: str | Path | None = None, env: dict | None = None,
                 models: tuple[str, ...] | None = None, reranker: str | None = None,
                 options: ServerOptions = ServerOptions()):
        """models: those to load (None: served_models() for the project's repository, every model for
        another). reranker: a reranker folder served beside model_dir, from a repository made at
        start() and removed at stop()."""
        self.model_dir, self.repository = model_dir, Path(repository).resolve()
        self.models, self.reranker, self.source_repository = models, reranker, self.repository
        if models is None and (reranker or (self.repository / "rose" / "config.pbtxt").exists()):
            self.models = served_models(model_dir, env, reranker)
        self.die_with_parent = options.die_with_parent
        self.exit_timeout = exit_timeout_for(self.repository) if options.exit_timeout is None else options.exit_timeout
        self.ports, self.address = ports or Ports(), options.address
        self.log_file, self.extra_args, self.env, self.verbose = log_file, list(options.extra_args), env, options.verbose
        if any(a.startswith(("--grpc-restricted-protocol", "--http-restricted-api")) for a in self.extra_args):
            raise LaunchError("extra_args restrict Triton's protocols, which TritonProcess does itself: "
                              "pass ServerOptions(api_key=..., admin_key=...) instead")
        self.api_key = check_key(options.api_key, "api_key")
        self._fixed_admin_key = check_key(options.admin_key, "admin_key") or key_from(env, env_vars.ADMIN_KEY)
        self.admin_key = self._fixed_admin_key or secrets.token_urlsafe(32)
        self.proc = None
        self.restarted = False                   # wait_ready started it once more (aborted_at_start)
        self.restarts = 0                        # times restart() started it again
        self.scrubbed: bool | None = None        # keys overwritten in its argv (None: not yet)
        self.shm_prefix = f"rose_{os.getpid()}_{self.ports.grpc}_"

    def command(self, install: TritonInstall) -> list[str]:
        cmd = [str(install.binary), f"--model-repository={self.repository}",
               f"--grpc-port={self.ports.grpc}", f"--http-port={self.ports.http}",
               f"--metrics-port={self.ports.metrics}", f"--grpc-address={self.address}",
               f"--http-address={self.address}", f"--metrics-address={self.address}",
               # each server's Python-backend shared memory regions get their own names
               f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
               f"--exit-timeout-secs={self.exit_timeout}", f"--log-verbose={self.verbose}",
               # every config.pbtxt served here is complete, and no model.py has auto_complete_config:
               # without this Triton starts one more stub per Python model at load only to ask it
               # (a server starts 1.5 s sooner and uses a third less CPU doing so on the 2-core machine)
               "--disable-auto-complete-config"]
        if install.backend_dir is not None:
            cmd.append(f"--backend-directory={install.backend_dir}")
        if self.models:
            cmd += ["--model-control-mode=explicit"] + [f"--load-model={m}" for m in self.models]
        return cmd + restricted_args(self.api_key, self.admin_key) + self.extra_args

    def check_ports(self) -> None:
        """LaunchError naming the port if one of this server's ports is already taken."""
        try:
            check_ports_free(self.address, {"gRPC": self.ports.grpc, "HTTP": self.ports.http,
                                            "metrics": self.ports.metrics})
        except PortInUse as e:
            raise LaunchError(str(e)) from None
        except OSError as e:
            raise LaunchError(f"cannot bind {self.address} ({e.strerror or e}); choose an address of this "
                              f"machine") from None

    def start(self, keep_keys: bool = False) -> "TritonProcess":
        """Spawn the server (wait_ready follows). keep_keys: the admin key of the last start, not a
        fresh one (restart)."""
        self.check_ports()
        install = find_triton()
        if self.reranker and self.repository == self.source_repository:
            tmp = Path(tempfile.mkdtemp(prefix=f"rose-models-{os.getpid()}-"))
            self.repository = reranker_repository(self.source_repository, tmp / "model_repository", self.reranker)
        if self._fixed_admin_key is None and not keep_keys:
            self.admin_key = secrets.token_urlsafe(32)
        env = cache_env(server_env(self.model_dir, install, self.env))
        env[env_vars.ROSE_SERVER_RESTARTS.name] = str(self.restarts)   # its metrics port counts them (server_restarts.py)
        if self.reranker:
            from rose_backend.config import resolve_model_dir
            env[env_vars.ROSE_RERANKER_DIR.name] = str(resolve_model_dir(self.reranker))
        for var in KEY_VARIABLES:                # the server reads its keys from its options only
            env.pop(var, None)
        self.scrubbed = None
        self.spawn(self.command(install), env, cwd=stub_site(env))
        return self

    def hide_keys(self, force: bool = False) -> None:
        """Overwrite the keys in tritonserver's argv once it has read its options (force: it is live)."""
        if self.scrubbed is not None or not (force or options_read(self.proc.pid)):
            return
        try:
            scrub_argv(self.proc.pid, [k for k in (self.api_key, self.admin_key) if k])
            self.scrubbed = True
        except OSError as e:
            self.scrubbed = False
            print(f"rose: could not hide the keys in tritonserver's command line ({e.strerror or e}); "
                  f"process listings of this machine show them", file=sys.stderr, flush=True)

    @property
    def grpc_url(self) -> str:
        return f"{reachable(self.address)}:{self.ports.grpc}"

    def _http(self, path: str) -> int:
        return http_status(f"http://{reachable(self.address)}:{self.ports.http}{path}")

    def wait_ready(self, timeout: float = 300.0, models: tuple[str, ...] | None = None, abort=None) -> None:
        """Until the server and every model are READY (health: open without keys). abort(): checked
        between polls; once true, StopRequested (the launcher got SIGTERM while the server loaded)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if abort is not None and abort():
                raise StopRequested("stopped while tritonserver was starting")
            if self.poll_ready(models):
                return
            time.sleep(0.25)
        raise LaunchError(f"tritonserver was not ready within {timeout:.0f} s"
                          + (f"; see {self.log_file}" if self.log_file else ""))

    def poll_ready(self, models: tuple[str, ...] | None = None) -> bool:
        """Whether the server and every model are READY now; LaunchError once the server has exited
        (after one abort at start it is started once more: aborted_at_start)."""
        models = models or self.models or MODELS
        if self.proc.poll() is not None:
            if not self.restarted and aborted_at_start(self.proc.returncode, self.log_file):
                print("rose: tritonserver aborted as it started; starting it once more", file=sys.stderr)
                self.restarted = True
                self._reap()
                self.start(keep_keys=True)
                return False
            raise LaunchError(f"tritonserver exited with code {self.proc.returncode} before it was ready"
                              + (f"; see {self.log_file}" if self.log_file else ""))
        self.hide_keys()
        if self._http("/v2/health/ready") == 200 and all(
                self._http(f"/v2/models/{m}/ready") == 200 for m in models):
            self.hide_keys(force=True)
            return True
        return False

    def model_ready(self, model: str) -> int:
        """The HTTP status of the model's readiness (200 READY; 0: the server does not answer)."""
        return self._http(f"/v2/models/{model}/ready")

    def restart(self) -> None:
        """End the server at once (kill()) and start it again on the same ports with the same keys;
        poll_ready() or wait_ready() follows."""
        self.kill()
        self.restarts += 1
        self.start(keep_keys=True)

    def kill(self) -> None:
        """SIGKILL to the server's process group, at once: its clients' streams fail with
        UNAVAILABLE and its ports stop answering; then its stubs' shared memory is removed."""
        if self.proc is not None:
            kill_group(self.proc)
            self.proc.wait()
            self._reap()

    def stop(self, timeout: float | None = None) -> int | None:
        """SIGTERM, close what keeps it from exiting once its work is answered (triton_stop.py), then
        SIGKILL to the server's process group if it has not exited `timeout` seconds later (default:
        its exit timeout + 2 s, i.e. drain_timeout_s + 4 s); then remove whatever of it is left (a
        stub, a stub's /dev/shm segment). Returns the exit code."""
        timeout = self.exit_timeout + KILL_MARGIN_S if timeout is None else timeout
        if self.proc is not None:
            if self.proc.poll() is None:
                stop_tritonserver(self.proc, self.ports.grpc, self.shm_prefix, timeout)
            self._reap()
        if self.repository != self.source_repository:          # the generated one, once the server is gone
            shutil.rmtree(self.repository.parent, ignore_errors=True)
            self.repository = self.source_repository
        return None if self.proc is None else self.proc.returncode

    def _reap(self) -> None:
        """After tritonserver has exited: a Python stub it left behind (one whose model did not unload
        before --exit-timeout-secs ran out) is killed, and its shared memory regions removed."""
        self.kill_group()                      # the server's group: only its own stubs are left
        for f in Path("/dev/shm").glob(self.shm_prefix + "*"):
            f.unlink(missing_ok=True)
        remove_python_envs_of_dead_servers()   # Triton's own scratch folder, when it was killed
