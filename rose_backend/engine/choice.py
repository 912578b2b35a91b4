"""Which engine serves a folder, and why: a native model file (engine.py over rose_backend/models), or
the folder's own transformers model (fallback.py), slower. No torch here: the launcher asks too.

    choice = engine_choice(cfg)           # EngineChoice("fallback", "no native model file for model_type 'electra'")
    check_remote_code(cfg, choice, trusted=settings_say)   # ModelFolderError naming the setting, or nothing
    startup_line(cfg, choice, "float32", "cpu")            # the one line the server logs per folder

A folder whose config.json maps AutoModel to code of its own (`auto_map`: nomic-bert, GTE's "new",
jina) is that code's model, whatever its model_type says: it runs on the fallback engine, and only
where the code is in the folder and the operator has opted in (the `rose` parameter
trust_remote_code, `make serve TRUST_REMOTE_CODE=1`): running it runs that Python code in the server.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rose_backend import env_vars
from rose_backend.config import ModelConfig, ModelFolderError, family_of, resolve_model_dir
from rose_backend.model_families import native_family, why_not_native

TRUST_SETTING = ("the `rose` parameter trust_remote_code=true (make serve TRUST_REMOTE_CODE=1, "
                 "launcher --trust-remote-code, or $ROSE_TRUST_REMOTE_CODE=1)")


@dataclass(frozen=True, slots=True)
class EngineChoice:
    engine: str                           # "native" | "fallback"
    why: str
    remote_code: tuple[str, ...] = ()     # the folder's own modeling files the fallback would run
    code_elsewhere: tuple[str, ...] = ()  # auto_map entries naming code in another repository

    @property
    def native(self) -> bool:
        return self.engine == "native"


def engine_choice(cfg: ModelConfig) -> EngineChoice:
    """The engine of `cfg`'s folder: remote code (auto_map's AutoModel) first, then a native file."""
    auto_map = cfg.raw.get("auto_map") if isinstance(cfg.raw.get("auto_map"), dict) else {}
    if "AutoModel" in auto_map:
        refs = [v for k, v in auto_map.items() if k in ("AutoConfig", "AutoModel")]
        refs = [r for v in refs for r in (v if isinstance(v, list) else [v]) if r]
        elsewhere = tuple(r for r in refs if "--" in r)
        files = tuple(sorted({r.rsplit(".", 1)[0] + ".py" for r in refs if "--" not in r}))
        return EngineChoice("fallback", f"config.json's auto_map runs the folder's own code ({auto_map['AutoModel']})",
                            files, elsewhere)
    family = native_family(cfg.model_type, cfg.raw.get("architectures"))
    if family is not None:
        return EngineChoice("native", f"models/{family}.py serves model_type {cfg.model_type!r}")
    if family_of(cfg.model_type) is None:
        return EngineChoice("fallback", f"no native model file for model_type {cfg.model_type!r}: transformers runs it")
    return EngineChoice("fallback", f"{why_not_native(cfg.model_type, cfg.raw.get('architectures'))}: transformers runs it")


def check_remote_code(cfg: ModelConfig, choice: EngineChoice, trusted: bool) -> None:
    """ModelFolderError unless `choice` can run: a reranker needs a native file; remote code needs its
    files in the folder and the operator's opt-in (TRUST_SETTING)."""
    if not choice.native and cfg.is_reranker:
        raise ModelFolderError(f"{cfg.model_dir}: a {cfg.kind} runs on a native model file only ({choice.why})")
    if not (choice.remote_code or choice.code_elsewhere):
        return
    if choice.code_elsewhere:
        raise ModelFolderError(
            f"{cfg.model_dir / 'config.json'}: auto_map points to code in another repository "
            f"({', '.join(choice.code_elsewhere)}), which rose does not download; copy that modeling file into "
            "the folder and name it in auto_map as module.Class")
    missing = [f for f in choice.remote_code if not (Path(cfg.model_dir) / f).exists()]
    if missing:
        raise ModelFolderError(f"{cfg.model_dir}: config.json's auto_map names {', '.join(missing)}, which the "
                               "folder does not hold")
    if not trusted:
        raise ModelFolderError(
            f"{cfg.model_dir} runs its own modeling code ({', '.join(choice.remote_code)}, named by config.json's "
            f"auto_map), which rose runs only with the operator's opt-in: {TRUST_SETTING}. That runs the "
            "folder's Python code inside the server: set it only for code you trust")


def trust_remote_code(setting: str = "", env=None) -> bool:
    """The `rose` parameter trust_remote_code: "true" / "false", or empty: $ROSE_TRUST_REMOTE_CODE."""
    return (setting or env_vars.ROSE_TRUST_REMOTE_CODE.get(env)).strip().lower() in env_vars.TRUE


def check_engine(folder: str | None, kind: str | None, env) -> EngineChoice:
    """The launcher's check of a folder before any server starts: ModelFolderError where its engine
    cannot run (check_remote_code, under `env`'s $ROSE_TRUST_REMOTE_CODE)."""
    cfg = ModelConfig.from_folder(resolve_model_dir(folder, env), kind)
    choice = engine_choice(cfg)
    check_remote_code(cfg, choice, trust_remote_code("", env))
    return choice


def describe_chain(cfg: ModelConfig) -> str:
    """The chain after the model, as the start-up line shows it."""
    if cfg.kind == "cross-encoder":
        return f"Transformer -> CLS -> classifier ({cfg.score_activation})"
    if cfg.kind == "qwen3-reranker":
        return "Transformer -> last token -> p(yes)"
    return cfg.chain.describe()


def startup_line(cfg: ModelConfig, choice: EngineChoice, dtype: str, device: str) -> str:
    """One line per served folder: its family, engine and why, chain, dtype and maximum length."""
    return (f"rose: {cfg.model_dir}: family {cfg.model_type}, engine {choice.engine} ({choice.why}), "
            f"chain {describe_chain(cfg)}, {cfg.embedding_dim}-dim output, dtype {dtype}, "
            f"max length {cfg.max_seq_length} tokens, on {device}")
