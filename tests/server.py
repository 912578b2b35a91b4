"""Start real tritonserver processes for tests (through the project's own launcher).

    with running_server(model_dir=None) as srv:       # the default model
        client = EmbeddingClient(srv.grpc_url)

`free_ports()` picks unused loopback ports; logs go to tests/.logs/ (git-ignored) so a failing
test can say where to look. `params` rewrites config.pbtxt parameters of the served models in a
private copy of the repository, e.g. {"rose": {"max_batch_tokens": "256"}}.
"""
from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

from rose_backend.launcher import DEFAULT_REPOSITORY, TritonProcess, free_ports, repository_copy  # noqa: F401

LOG_DIR = Path(__file__).resolve().parent / ".logs"


def repository_with(params: dict[str, dict[str, str]], dest: Path) -> Path:
    """A copy of the project's model repository under `dest` with some parameters changed."""
    return repository_copy(DEFAULT_REPOSITORY, dest / "model_repository", params)


@contextlib.contextmanager
def running_server(model_dir: str | None = None, params: dict | None = None, name: str = "server",
                   timeout: float = 300.0):
    LOG_DIR.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rose-repo-") as tmp:
        repo = repository_with(params, Path(tmp)) if params else DEFAULT_REPOSITORY
        log = LOG_DIR / f"{name}-{next(_counter)}.log"
        log.unlink(missing_ok=True)
        srv = TritonProcess(model_dir, repo, free_ports(), log_file=log)
        srv.start()
        try:
            srv.wait_ready(timeout)
            yield srv
        finally:
            srv.stop()


def _count():
    i = 0
    while True:
        i += 1
        yield i


_counter = _count()
