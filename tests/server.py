"""Start real tritonserver processes for tests (through the project's own launcher).

    with running_server(model_dir=None) as srv:       # the default model
        client = EmbeddingClient(srv.grpc_url)

`free_ports()` picks unused loopback ports; logs go to tests/.logs/ (git-ignored) so a failing
test can say where to look. `params` rewrites config.pbtxt parameters of the served models in a
private copy of the repository, e.g. {"rose": {"max_batch_tokens": "256"}}.
"""
from __future__ import annotations

import contextlib
import re
import shutil
import socket
import tempfile
from pathlib import Path

from rose_backend.launcher import DEFAULT_REPOSITORY, Ports, TritonProcess

LOG_DIR = Path(__file__).resolve().parent / ".logs"


def free_ports() -> Ports:
    socks = []
    for _ in range(3):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = Ports(*(s.getsockname()[1] for s in socks))
    for s in socks:
        s.close()
    return ports


def repository_with(params: dict[str, dict[str, str]], dest: Path) -> Path:
    """A copy of the model repository with some config.pbtxt parameters replaced or added."""
    repo = dest / "model_repository"
    shutil.copytree(DEFAULT_REPOSITORY, repo, ignore=shutil.ignore_patterns("__pycache__"))
    for model, values in params.items():
        cfg = repo / model / "config.pbtxt"
        text = cfg.read_text()
        for key, value in values.items():
            entry = f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}'
            pattern = re.compile(r'parameters \{ key: "' + re.escape(key) + r'" value: \{ string_value: "[^"]*" \} \}')
            text, n = pattern.subn(lambda _m: entry, text)
            if n == 0:
                text += "\n" + entry + "\n"
        cfg.write_text(text)
    return repo


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
