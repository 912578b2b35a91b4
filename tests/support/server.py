"""Start real tritonserver processes for tests (through the project's own launcher).

    with running_server(model_dir=None) as srv:       # the default model
        client = EmbeddingClient(srv.grpc_url)
    with running_servers(3, name="replica") as servers: # several side by side (~5 s, ~1 GB each here)
        ...

Tests that only talk to a server share one: the session fixtures of conftest.py (`server`, the
default deployment, and `shared_server(params)`, one server per distinct parameter set). Start a
private one with these helpers only where a test kills, restarts or reconfigures it.
Leaving `running_servers` stops its servers in a background thread (tritonserver's own unload takes
~4 s here, time the next tests use); `wait_stopped()`, called at session end before the leak check of
conftest.py, joins them. A test about stopping calls `srv.stop()` itself.
`free_ports()` picks unused loopback ports (support/ports.py: a block of its own per xdist worker); logs go to tests/.logs/ (git-ignored) so a failing
test can say where to look. Triton's control plane (repository, shared memory, trace, logging)
needs each server's admin key: rose_client.auth.grpc_admin_headers(srv.admin_key) as gRPC
headers, {"admin-key": srv.admin_key} over HTTP; `api_key` starts servers that require an API key.
Every server runs a private copy of the repository, with one instance of each tokenize model
(TEST_INSTANCES); `params` rewrites config.pbtxt parameters of the served models in it,
e.g. {"rose": {"max_batch_tokens": "256"}}.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import tempfile
import threading
from pathlib import Path

from rose_backend.launch.deployment import DEFAULT_REPOSITORY, repository_copy  # noqa: F401
from rose_backend.launch.serve import stop_all  # noqa: F401
from rose_backend.launch.tritonserver import ServerOptions, TritonProcess  # noqa: F401
from support.ports import free_ports  # noqa: F401

LOG_DIR = Path(__file__).resolve().parents[1] / ".logs"
# Seconds tritonserver waits at SIGTERM for in-flight work and model unloads. A test server is stopped
# with nothing in flight, and a server that has run the `embed` ensemble may otherwise wait the whole
# drain_timeout_s + 2 s of the launcher's default (docs/OPERATIONS.md); tests of draining pass
# exit_timeout=None (the repository's).
TEST_EXIT_TIMEOUT_S = 5
# One instance of each tokenize model, not the repository's two: a server starts 0.5 s sooner,
# stops 1-2 s sooner (Triton unloads a model's instances one after another, a second each) and
# costs 0.65 CPU-s less; `make serve`'s tests on the shipped repository and the benchmarks run two.
TEST_INSTANCES = {"tokenize": 1, "tokenize_batched": 1}
# max_seq_length of the session's random-weight BGE-M3 folder (conftest's m3_deployment).
M3_MAX_LEN = 32
_counter = itertools.count(1)
WORKER = f"{os.environ['PYTEST_XDIST_WORKER']}-" if os.environ.get("PYTEST_XDIST_WORKER") else ""   # log names
_stopping: list[threading.Thread] = []


def stop_in_background(servers: list[TritonProcess], then_remove: str | None = None) -> None:
    """Stop the servers (SIGTERM, exit, reap; then remove the folder then_remove) in a thread that
    wait_stopped() joins."""
    def stop():
        try:
            stop_all(servers)
        finally:
            if then_remove:
                shutil.rmtree(then_remove, ignore_errors=True)
    t = threading.Thread(target=stop, name="stop-servers")
    t.start()
    _stopping.append(t)


def wait_stopped() -> None:
    """Wait for every server stop_in_background() let go of."""
    while _stopping:
        _stopping.pop().join()


def repository_with(params: dict[str, dict[str, str]] | None, dest: Path) -> Path:
    """A copy of the project's model repository under `dest` with some parameters changed and the
    instance counts of TEST_INSTANCES."""
    return repository_copy(DEFAULT_REPOSITORY, dest / "model_repository", params or {}, TEST_INSTANCES)


@contextlib.contextmanager
def running_servers(n: int, model_dir: str | None = None, params: dict | None = None, name: str = "server",
                    env: dict | None = None, timeout: float = 300.0, exit_timeout: int | None = TEST_EXIT_TIMEOUT_S,
                    api_key: str | None = None, process: type[TritonProcess] = TritonProcess,
                    models: tuple[str, ...] | None = None):
    """n tritonservers of one repository, started side by side; all stopped (in parallel, in the
    background: stop_in_background) on exit. process: TritonProcess or a subclass of it; models:
    those loaded (None: all that the repository serves)."""
    LOG_DIR.mkdir(exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="rose-repo-")            # removed once the servers have exited
    servers: list[TritonProcess] = []
    try:
        repo = repository_with(params, Path(tmp))
        for _ in range(n):
            log = LOG_DIR / f"{name}-{WORKER}{next(_counter)}.log"
            log.unlink(missing_ok=True)
            servers.append(process(model_dir, repo, free_ports(), log_file=log, env={**os.environ, **(env or {})},
                                   models=models, options=ServerOptions(exit_timeout=exit_timeout, api_key=api_key)).start())
        for s in servers:
            s.wait_ready(timeout)
        yield servers
    finally:
        stop_in_background(servers, then_remove=tmp)


@contextlib.contextmanager
def running_server(model_dir: str | None = None, params: dict | None = None, name: str = "server",
                   timeout: float = 300.0, env: dict | None = None, exit_timeout: int | None = TEST_EXIT_TIMEOUT_S,
                   api_key: str | None = None, process: type[TritonProcess] = TritonProcess,
                   models: tuple[str, ...] | None = None):
    with running_servers(1, model_dir, params, name, env, timeout, exit_timeout, api_key, process, models) as (srv,):
        yield srv
