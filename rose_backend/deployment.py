"""What one deployment is made of: the model repository (and copies of it with other parameters),
the models a model folder is served with, and each server's ports."""
from __future__ import annotations

import os
import re
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

DEFAULT_REPOSITORY = Path(__file__).resolve().parent.parent / "model_repository"
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
