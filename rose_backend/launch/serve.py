"""Start tritonserver with this project's model repository (what `make serve` runs).

    python -m rose_backend.launch [--model DIR] [--reranker DIR] [--grpc-port 8001] [--http-port 8000]
                                  [--metrics-port 8002] [--address 127.0.0.1] [--replicas N]
                                  [--gateway-port 8080] [--api-key-file PATH] [--stub-death-window 60]

It finds tritonserver ($TRITONSERVER_BIN, then `tritonserver` on PATH as in the NGC image, then the
binary bundled in the nvidia-pytriton wheel: triton_install.py), prepares the Python backend (the stub for the running
Python beside libtriton_python.so), makes this project importable inside the stub
(PYTHONPATH, and the interpreter's own libpython first on LD_LIBRARY_PATH), waits until every
model is READY (tritonserver.py), starts the HTTP gateway by its command line and watches it
(gateway.py, gateway_watch.py), prints how to call it, ends and starts again a server whose Python
stub died (stub_watch.py), and stops everything cleanly on Ctrl-C / SIGTERM, within drain_timeout_s +
STOP_BOUND_S of the signal, even one that comes while it is still starting (stop_all). With --replicas N it
starts N servers, replica i on ports shifted by 10*i (8001, 8011, ...); with --gpus 0,1 replica i
sees only GPU i (one server per GPU). --reranker DIR serves a reranker folder's `rerank` beside the
embedding model's `embed` (deployment.py).
Triton's control plane always requires an admin key ($ADMIN_KEY, else a random one); $API_KEY
(or --api-key-file) makes inference, metadata and the gateway's /v1/* require a key too
(keys.py).
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

from rose_backend import env_vars
from rose_backend.engine.choice import check_engine
from rose_backend.launch.args import parse_args
from rose_backend.launch.banner import banner
from rose_backend.launch.deployment import Ports
from rose_backend.launch.gateway import GatewayProcess
from rose_backend.launch.gateway_watch import GatewayFailed, GatewayWatch
from rose_backend.launch.keys import exposure_warning, launch_keys
from rose_backend.launch.stub_watch import StubWatch, StubWatchFailed
from rose_backend.launch.supervision import KILL_BY_S, StopRequested, drain_timeout_of
from rose_backend.launch.triton_install import LaunchError
from rose_backend.launch.tritonserver import ServerOptions, TritonProcess
from rose_backend.processes import PortInUse, check_ports_free, set_parent_death_signal


REAP_S = 0.8           # after the kill: the most the launcher waits for its children to be reaped


def stop_all(servers: list, gateway: GatewayWatch | None = None, kill_at: float | None = None) -> list[str]:
    """Stop every server and the gateway, all at once (each drains side by side with the others).
    kill_at (time.monotonic()): whatever has not exited by then is killed, whatever its own timeout,
    and the call returns by kill_at + REAP_S. Returns the names of the children still exiting then."""
    children = [*((s, f"tritonserver on port {s.ports.grpc}") for s in servers),
                *([(gateway, "the gateway")] if gateway else [])]
    left = None if kill_at is None else max(0.0, kill_at - time.monotonic())
    stoppers = [(threading.Thread(target=child.stop, args=(left,), daemon=True), name) for child, name in children]
    for t, _ in stoppers:
        t.start()
    for t, _ in stoppers:
        t.join(None if kill_at is None else max(0.0, kill_at + REAP_S - time.monotonic()))
    return [name for t, name in stoppers if t.is_alive()]


def gateway_watch(port: int, address: str, model: str | None, urls: str, api_key: str | None = None,
                  drain_timeout: float | None = None, abort=None) -> GatewayWatch | None:
    """A watch over the OpenAI-compatible HTTP gateway (rose_gateway, started by its command line) in
    front of the servers, not started yet; None when port is 0. abort: as GatewayWatch's."""
    if not port:
        return None
    return GatewayWatch(lambda: GatewayProcess(urls, port, address, model, api_key=api_key,
                                               drain_timeout=drain_timeout).start(), abort=abort)


def start_gateway(port: int, address: str, model: str | None, urls: str, api_key: str | None = None,
                  drain_timeout: float | None = None) -> "GatewayProcess | None":
    """The gateway, started and serving on its port (unwatched: for benchmarks); None when port is 0."""
    watch = gateway_watch(port, address, model, urls, api_key, drain_timeout)
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
        os.environ[env_vars.ROSE_MODEL_KIND.name] = args.kind
    if args.trust_remote_code:
        os.environ[env_vars.ROSE_TRUST_REMOTE_CODE.name] = "1"
    warning = exposure_warning(args.address, keys.api_key)
    if warning:
        print(warning, file=sys.stderr, flush=True)

    gpus = [g.strip() for g in args.gpus.split(",") if g.strip()]
    replicas = len(gpus) if gpus else max(1, args.replicas)
    base = Ports(args.grpc_port, args.http_port, args.metrics_port)
    servers = []
    from rose_backend.config import ModelFolderError
    try:
        check_engine(args.model, env_vars.ROSE_MODEL_KIND.get() or None, os.environ)
        if args.reranker:
            check_engine(args.reranker, "auto", os.environ)
    except ModelFolderError as e:               # the folder's problem in one line, no traceback
        print(f"rose: {e}", file=sys.stderr)
        return 1
    for i in range(replicas):
        env = dict(os.environ)
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = gpus[i]
        try:
            options = ServerOptions(args.address, verbose=args.verbose, api_key=keys.api_key, admin_key=keys.admin_key)
            servers.append(TritonProcess(args.model, args.repository, base.shifted(10 * i), env=env,
                                         reranker=args.reranker, options=options))
        except ModelFolderError as e:           # the folder's problem in one line, no traceback
            print(f"rose: {e}", file=sys.stderr)
            return 1

    signalled: list[tuple[float, int]] = []     # (when, which): the first SIGTERM / SIGINT

    def on_signal(signum, _frame):
        if not signalled:
            signalled.append((time.monotonic(), signum))

    def stopping() -> bool:
        return bool(signalled)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    if args.die_with_parent:                    # e.g. `make serve` killed: stop the servers cleanly
        parent = os.getppid()
        set_parent_death_signal(signal.SIGTERM)
        if os.getppid() != parent:
            return 1
    t0 = time.monotonic()
    watch = None
    drain = drain_timeout_of(args.repository)
    stubs = StubWatch(servers, window_s=args.stub_death_window)
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
            if stopping():
                raise StopRequested("stopped before tritonserver started")
            s.start()
        for s in servers:
            s.wait_ready(abort=stopping)
        stubs.arm()
        urls = ",".join(s.grpc_url for s in servers)
        watch = gateway_watch(args.gateway_port, args.address, args.model, urls, keys.api_key, drain, stopping)
        if watch:
            watch.start()
        from rose_backend.config import resolve_model_dir
        print(banner(str(resolve_model_dir(args.model)), urls, time.monotonic() - t0, servers[0].models or (),
                     f"http://{servers[0].address}:{servers[0].ports.metrics}/metrics",
                     watch.gateway.url if watch else None, bool(keys.api_key), args.api_key_file,
                     args.reranker and str(resolve_model_dir(args.reranker))), flush=True)
        while not stopping():
            stubs.check()
            if watch:
                watch.check()
            time.sleep(0.2)
        return 0
    except StopRequested as e:
        print(f"rose: {signal.Signals(signalled[0][1]).name}: {e}; stopping", file=sys.stderr, flush=True)
        return 0
    except StubWatchFailed as e:
        print(f"rose: {e}", file=sys.stderr, flush=True)
        return 1
    except LaunchError as e:
        print(f"rose: {e}", file=sys.stderr)
        return 1
    except GatewayFailed as e:
        print(f"rose: {e} (GATEWAY=0 serves without the gateway)", file=sys.stderr)
        return 1
    finally:
        stubs.close()
        begun = signalled[0][0] if signalled else time.monotonic()
        exiting = stop_all(servers, watch, kill_at=begun + drain + KILL_BY_S)
        if exiting:
            print(f"rose: {', '.join(exiting)} killed {drain + KILL_BY_S:g} s after the stop began, not gone yet; "
                  f"exiting without waiting for it", file=sys.stderr, flush=True)

