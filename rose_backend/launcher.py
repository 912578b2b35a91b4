"""Start tritonserver with this project's model repository (what `make serve` runs).

    python -m rose_backend.launcher [--model DIR] [--reranker DIR] [--grpc-port 8001] [--http-port 8000]
                                    [--metrics-port 8002] [--address 127.0.0.1] [--replicas N]
                                    [--gateway-port 8080] [--api-key-file PATH]

It finds tritonserver ($TRITONSERVER_BIN, then `tritonserver` on PATH as in the NGC image, then the
binary bundled in the nvidia-pytriton wheel), prepares the Python backend (the stub for the running
Python beside libtriton_python.so), makes this project importable inside the stub
(PYTHONPATH, and the interpreter's own libpython first on LD_LIBRARY_PATH), waits until every
model is READY, starts the HTTP gateway and watches it, prints how to call it, and stops everything
cleanly on Ctrl-C / SIGTERM. With --replicas N it starts N servers, replica i on ports shifted by
10*i (8001, 8011, ...); with --gpus 0,1 replica i sees only GPU i (one server per GPU). --reranker DIR
serves a reranker folder's `rerank` beside the embedding model's `embed` (rose_backend/deployment.py).
Triton's control plane always requires an admin key ($ADMIN_KEY, else a random one); $API_KEY
(or --api-key-file) makes inference, metadata and the gateway's /v1/* require a key too
(rose_backend/launch_keys.py).
"""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from rose_backend.argv_scrub import options_read, scrub_argv
from rose_backend.deployment import (DEFAULT_REPOSITORY, MODELS, RERANK_MODELS, WITH_RERANKER, Ports,  # noqa: F401
                                     free_ports, repository_copy, reranker_repository, served_models)
from rose_backend.gateway_watch import GatewayFailed, GatewayWatch
from rose_backend.launch_args import parse_args
from rose_backend.launch_banner import banner, client_command  # noqa: F401
from rose_backend.launch_keys import (KEY_VARIABLES, check_key, exposure_warning, key_from, launch_keys,
                                      restricted_args)
from rose_backend.supervision import (KILL_MARGIN_S, PortInUse, aborted_at_start, cache_env, check_ports_free,
                                      die_with_parent, drain_timeout_of, exit_timeout_for, set_parent_death_signal)
from rose_backend.triton_install import REPO_ROOT, LaunchError, TritonInstall, find_triton, server_env, stub_site  # noqa: F401
from rose_backend.triton_stop import stop_tritonserver


class TritonProcess:
    """One tritonserver process serving a model repository; a context manager.

    Its control plane (model repository, model config, shared memory, statistics, trace, logging)
    is restricted, over HTTP and gRPC, under `admin_key`: the one given, else $ADMIN_KEY, else a
    fresh random key per start (send rose_client.auth.grpc_admin_headers(srv.admin_key)). With an
    `api_key`, inference and metadata require it as well. Health stays open. Once the server has
    read its options the keys are overwritten in its command line (rose_backend/argv_scrub.py)."""

    def __init__(self, model_dir: str | None = None, repository: str | Path = DEFAULT_REPOSITORY,
                 ports: Ports | None = None, address: str = "127.0.0.1", log_file: str | Path | None = None,
                 extra_args: list[str] | None = None, env: dict | None = None, verbose: int = 0,
                 models: tuple[str, ...] | None = None, die_with_parent: bool = True,
                 exit_timeout: int | None = None, api_key: str | None = None, admin_key: str | None = None,
                 reranker: str | None = None):
        """models: those to load (explicit model control). None: served_models() for the project's repository,
        every model for any other (the benchmarks' baselines). die_with_parent: the server is SIGKILLed when the
        thread that start()ed it dies (start servers from a thread that outlives them, e.g. the main thread).
        exit_timeout: tritonserver's --exit-timeout-secs (default: exit_timeout_for, drain_timeout_s + 2).
        reranker: a reranker folder served beside the embedding folder model_dir, from a repository
        generated at start() and removed at stop() (deployment.reranker_repository)."""
        self.model_dir, self.repository = model_dir, Path(repository).resolve()
        self.models, self.reranker, self.source_repository = models, reranker, self.repository
        if models is None and (reranker or (self.repository / "rose" / "config.pbtxt").exists()):
            self.models = served_models(model_dir, os.environ if env is None else env, reranker)
        self.die_with_parent = die_with_parent
        self.exit_timeout = exit_timeout_for(self.repository) if exit_timeout is None else exit_timeout
        self.ports, self.address = ports or Ports(), address
        self.log_file, self.extra_args, self.env, self.verbose = log_file, extra_args or [], env, verbose
        if any(a.startswith(("--grpc-restricted-protocol", "--http-restricted-api")) for a in self.extra_args):
            raise LaunchError("extra_args restrict Triton's protocols, which TritonProcess does itself: "
                              "pass api_key= / admin_key= instead")
        self.api_key = check_key(api_key, "api_key")
        self._fixed_admin_key = check_key(admin_key, "admin_key") or key_from(os.environ if env is None else env,
                                                                              "ADMIN_KEY")
        self.admin_key = self._fixed_admin_key or secrets.token_urlsafe(32)
        self.proc: subprocess.Popen | None = None
        self.restarted = False                   # wait_ready started it once more (aborted_at_start)
        self.scrubbed: bool | None = None        # keys overwritten in its argv (None: not yet)
        self.shm_prefix = f"rose_{os.getpid()}_{self.ports.grpc}_"

    def command(self, install: TritonInstall) -> list[str]:
        cmd = [str(install.binary), f"--model-repository={self.repository}",
               f"--grpc-port={self.ports.grpc}", f"--http-port={self.ports.http}",
               f"--metrics-port={self.ports.metrics}", f"--grpc-address={self.address}",
               f"--http-address={self.address}", f"--metrics-address={self.address}",
               # each server's Python-backend shared memory regions get their own names
               f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
               f"--exit-timeout-secs={self.exit_timeout}", f"--log-verbose={self.verbose}"]
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

    def start(self) -> "TritonProcess":
        self.check_ports()
        install = find_triton()
        if self.reranker and self.repository == self.source_repository:
            tmp = Path(tempfile.mkdtemp(prefix=f"rose-models-{os.getpid()}-"))
            self.repository = reranker_repository(self.source_repository, tmp / "model_repository",
                                                  self.model_dir or (self.env or os.environ).get("ROSE_MODEL_DIR"),
                                                  self.reranker)
        if self._fixed_admin_key is None:
            self.admin_key = secrets.token_urlsafe(32)
        env = cache_env(server_env(self.model_dir, install, self.env))
        for var in KEY_VARIABLES:                # the server reads its keys from its options only
            env.pop(var, None)
        out = open(self.log_file, "ab") if self.log_file else None
        self.scrubbed = None
        self.proc = subprocess.Popen(self.command(install), env=env, stdout=out or None, cwd=stub_site(env),
                                     stderr=subprocess.STDOUT if out else None, start_new_session=True,
                                     preexec_fn=die_with_parent if self.die_with_parent else None)
        if out:
            out.close()
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
        return f"{'127.0.0.1' if self.address == '0.0.0.0' else self.address}:{self.ports.grpc}"

    def _http(self, path: str) -> int:
        host = "127.0.0.1" if self.address == "0.0.0.0" else self.address
        try:
            with urllib.request.urlopen(f"http://{host}:{self.ports.http}{path}", timeout=2) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:
            return 0

    def wait_ready(self, timeout: float = 300.0, models: tuple[str, ...] | None = None) -> None:
        """Until the server and every model are READY (health: open without keys)."""
        models = models or self.models or MODELS
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                if not self.restarted and aborted_at_start(self.proc.returncode, self.log_file):
                    print("rose: tritonserver aborted as it started; starting it once more", file=sys.stderr)
                    self.restarted = True
                    self._reap()
                    self.start()
                    continue
                raise LaunchError(f"tritonserver exited with code {self.proc.returncode} before it was ready"
                                  + (f"; see {self.log_file}" if self.log_file else ""))
            self.hide_keys()
            if self._http("/v2/health/ready") == 200 and all(
                    self._http(f"/v2/models/{m}/ready") == 200 for m in models):
                self.hide_keys(force=True)
                return
            time.sleep(0.25)
        raise LaunchError(f"tritonserver was not ready within {timeout:.0f} s"
                          + (f"; see {self.log_file}" if self.log_file else ""))

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
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)   # the server's session: only its own stubs are left
        except (ProcessLookupError, PermissionError):
            pass
        for f in Path("/dev/shm").glob(self.shm_prefix + "*"):
            f.unlink(missing_ok=True)

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


def stop_all(servers: list, gateway: GatewayWatch | None = None) -> None:
    """Stop every server and the gateway, all at once (each drains side by side with the others)."""
    stoppers = [threading.Thread(target=s.stop) for s in [*servers, *([gateway] if gateway else [])]]
    for t in stoppers:
        t.start()
    for t in stoppers:
        t.join()


def gateway_watch(port: int, address: str, model: str | None, urls: str, api_key: str | None = None,
                  admin_key: str | None = None, drain_timeout: float | None = None) -> GatewayWatch | None:
    """A watch over the OpenAI-compatible HTTP gateway (rose_gateway) in front of the servers, not
    started yet; None when port is 0."""
    if not port:
        return None
    from rose_gateway.process import GatewayProcess
    return GatewayWatch(lambda: GatewayProcess(urls, port, address, model, api_key=api_key, admin_key=admin_key,
                                               drain_timeout=drain_timeout).start())


def start_gateway(port: int, address: str, model: str | None, urls: str, api_key: str | None = None,
                  admin_key: str | None = None, drain_timeout: float | None = None) -> "GatewayProcess | None":
    """The gateway, started and serving on its port (unwatched: for benchmarks); None when port is 0."""
    watch = gateway_watch(port, address, model, urls, api_key, admin_key, drain_timeout)
    if watch is None:
        return None
    try:
        return watch.start()
    except GatewayFailed as e:
        raise LaunchError(f"{e} (GATEWAY=0 serves without it)") from None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__.split("\n\n")[0])
    try:
        keys = launch_keys(os.environ, args.api_key_file)
    except ValueError as e:
        print(f"rose: {e}", file=sys.stderr)
        return 2
    if args.kind:
        os.environ["ROSE_MODEL_KIND"] = args.kind
    warning = exposure_warning(args.address, keys.api_key)
    if warning:
        print(warning, file=sys.stderr, flush=True)

    gpus = [g.strip() for g in args.gpus.split(",") if g.strip()]
    replicas = len(gpus) if gpus else max(1, args.replicas)
    base = Ports(args.grpc_port, args.http_port, args.metrics_port)
    servers = []
    from rose_backend.config import ModelFolderError
    for i in range(replicas):
        env = dict(os.environ)
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = gpus[i]
        try:
            servers.append(TritonProcess(args.model, args.repository, base.shifted(10 * i), args.address, env=env,
                                         verbose=args.verbose, api_key=keys.api_key, admin_key=keys.admin_key,
                                         reranker=args.reranker))
        except ModelFolderError as e:           # the folder's problem in one line, no traceback
            print(f"rose: {e}", file=sys.stderr)
            return 1

    stopping = False

    def on_signal(signum, _frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    if args.die_with_parent:                    # e.g. `make serve` killed: stop the servers cleanly
        parent = os.getppid()
        set_parent_death_signal(signal.SIGTERM)
        if os.getppid() != parent:
            return 1
    t0 = time.monotonic()
    watch = None
    try:
        for s in servers:
            s.check_ports()                     # every port, the gateway's too, before anything starts
        if args.gateway_port:
            try:
                check_ports_free(args.address, {"gateway": args.gateway_port})
            except PortInUse as e:
                raise LaunchError(f"{e} (GATEWAY=0 serves without the gateway)") from None
            except OSError as e:
                raise LaunchError(f"cannot bind {args.address} ({e.strerror or e})") from None
        for s in servers:
            s.start()
        for s in servers:
            s.wait_ready()
        urls = ",".join(s.grpc_url for s in servers)
        watch = gateway_watch(args.gateway_port, args.address, args.model, urls, keys.api_key, keys.admin_key,
                              drain_timeout_of(args.repository))
        if watch:
            watch.start()
        from rose_backend.config import resolve_model_dir
        print(banner(str(resolve_model_dir(args.model)), urls, time.monotonic() - t0, servers[0].models or (),
                     f"http://{servers[0].address}:{servers[0].ports.metrics}/metrics",
                     watch.gateway.url if watch else None, bool(keys.api_key), args.api_key_file,
                     args.reranker and str(resolve_model_dir(args.reranker))), flush=True)
        while not stopping and all(s.proc.poll() is None for s in servers):
            if watch:
                watch.check()
            time.sleep(0.2)
        dead = [s for s in servers if s.proc.poll() is not None]
        if dead and not stopping:
            print(f"rose: tritonserver on port {dead[0].ports.grpc} exited with code {dead[0].proc.returncode}",
                  file=sys.stderr)
            return 1
        return 0
    except LaunchError as e:
        print(f"rose: {e}", file=sys.stderr)
        return 1
    except GatewayFailed as e:
        print(f"rose: {e} (GATEWAY=0 serves without the gateway)", file=sys.stderr)
        return 1
    finally:
        stop_all(servers, watch)


if __name__ == "__main__":
    sys.exit(main())
