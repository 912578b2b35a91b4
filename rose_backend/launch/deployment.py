"""What one deployment is made of: the model repository (and copies of it with other parameters),
the models a model folder is served with, and each server's ports.

An embedding folder with a reranker folder beside it (`make serve RERANKER=...`) is served from a
generated repository (reranker_repository): the embedding models as ever, plus `rerank_tokenize` and
`rerank_rose` (copies of `tokenize` and `rose`, their settings included, with model_dir and model_kind
set to the reranker folder's) and a `rerank` ensemble over them. Their model_dir parameters name no
local path (Triton serves model configurations to inference callers): the embedding models read
$ROSE_MODEL_DIR as ever, the reranker's steps $ROSE_RERANKER_DIR, which the server's environment
carries."""
from __future__ import annotations

import json
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

from rose_backend import env_vars
from rose_backend.triton.model_settings import edit_model_config

REPO_ROOT = Path(__file__).resolve().parents[2]          # the project's folder
DEFAULT_REPOSITORY = REPO_ROOT / "model_repository"
MODELS = ("tokenize", "tokenize_batched", "rose", "embed", "encode")
RERANK_MODELS = ("tokenize", "rose", "rerank")
# a reranker beside an embedding model: its own steps, {name: the model it is a copy of}
RERANKER_STEPS = {"rerank_tokenize": "tokenize", "rerank_rose": "rose"}
WITH_RERANKER = MODELS + (*RERANKER_STEPS, "rerank")


def folder_kind(folder: str | Path | None, kind: str | None = None, env: dict | None = None) -> str:
    """The folder's kind (rose_backend/model_kind.py; kind None: $ROSE_MODEL_KIND, else detected);
    folder None: $ROSE_MODEL_DIR of `env`, else the default model."""
    from rose_backend.config import ModelConfig, resolve_model_dir
    return ModelConfig.from_folder(resolve_model_dir(folder, env), kind).kind


def served_models(model_dir: str | None, env: dict | None = None, reranker: str | None = None) -> tuple[str, ...]:
    """The repository's models a folder is served with, by its kind (rose_backend/model_kind.py); with a
    reranker folder beside an embedding folder, both sets (WITH_RERANKER). ModelFolderError when the
    pair is not an embedding folder and a reranker folder."""
    from rose_backend.config import ModelFolderError, resolve_model_dir
    kind = folder_kind(model_dir, env_vars.ROSE_MODEL_KIND.get(env) or None, env)
    if reranker is None:
        return MODELS if kind == "embedding" else RERANK_MODELS
    if kind != "embedding":
        raise ModelFolderError(f"--reranker is served beside an embedding model, but the model folder "
                               f"{resolve_model_dir(model_dir, env)} is a {kind}; serve it alone, or pass an embedding --model")
    rkind = folder_kind(reranker, "auto")     # the reranker's own kind, whatever --kind says of --model
    if rkind == "embedding":
        archs = json.loads((resolve_model_dir(reranker) / "config.json").read_text()).get("architectures")
        raise ModelFolderError(f"the reranker folder {resolve_model_dir(reranker)} is not a reranker (config.json "
                               f"architectures: {archs}); --reranker takes a cross-encoder "
                               f"(*ForSequenceClassification, one label) or a Qwen3-Reranker folder")
    return WITH_RERANKER


def reranker_repository(src: Path, dest: Path, reranker: str) -> Path:
    """A copy of the repository `src` at `dest` that serves the embedding folder ($ROSE_MODEL_DIR, else
    the default model) and the reranker folder ($ROSE_RERANKER_DIR in the server's environment) side by
    side (see the module docstring); both folders' kinds are written into their models' parameters."""
    embedding = {"model_dir": "", "model_kind": "embedding"}
    repository_copy(src, dest, {"tokenize": embedding, "rose": embedding})
    own = {"model_dir": "$" + env_vars.ROSE_RERANKER_DIR.name, "model_kind": folder_kind(reranker, "auto")}
    for name, base in RERANKER_STEPS.items():
        shutil.copytree(dest / base, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        edit_model_config(dest / name / "config.pbtxt", name=name, parameters=own)
    edit_model_config(dest / "rerank" / "config.pbtxt",
                      step_models={base: name for name, base in RERANKER_STEPS.items()})
    return dest


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


def repository_copy(src: Path, dest: Path, params: dict[str, dict[str, str]],
                    instances: dict[str, int] | None = None) -> Path:
    """A copy of a model repository at `dest` with config.pbtxt parameters replaced or added,
    e.g. {"rose": {"max_batch_tokens": "512"}}, and instance counts changed, e.g. {"tokenize": 1}."""
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__"))
    for model, values in params.items():
        set_parameters(dest / model / "config.pbtxt", values)
    for model, count in (instances or {}).items():
        set_instance_count(dest / model / "config.pbtxt", count)
    return dest


def set_instance_count(cfg: Path, count: int) -> None:
    """The instance count of a config.pbtxt with one instance_group."""
    def change(message) -> None:
        if len(message.instance_group) != 1:
            raise ValueError(f"{cfg}: no single instance_group to change")
        message.instance_group[0].count = count
    edit_model_config(cfg, change=change)


def set_parameters(cfg: Path, values: dict[str, str]) -> None:
    """Replace (or add) string parameters of one config.pbtxt."""
    edit_model_config(cfg, parameters=values)
