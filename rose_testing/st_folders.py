"""Random-weight sentence-transformers folders with a chain after the model (Pooling modes, Dense,
Normalize), written as sentence-transformers saves them.

    folder = chain_folder(tmp_path / "m", pooling=("cls", "mean"), dense=[Dense(32, "Tanh")], normalize=True)
    SentenceTransformer(str(folder), model_kwargs={"dtype": torch.float32}).encode(texts)    # the reference

The transformer comes from rose_testing.folders (make_folder's shapes, or `transformer=` a folder
already written, e.g. by fallback_folders.py); the chain's files are written by hand in
sentence-transformers' format: modules.json, the Pooling config (`pooling_mode` as sentence-transformers
6 writes it, or `legacy=True`: the pooling_mode_* flags and module types of the folders on the Hub),
each Dense folder's config.json and model.safetensors (keys linear.weight, linear.bias,
residual.weight) and a Normalize folder. `saved_by_sentence_transformers` writes one through
SentenceTransformer.save instead. Texts are "w5 w17 ..." (the WordLevel tokenizer: word wN is id N).
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ACTIVATIONS = {"Tanh": "torch.nn.modules.activation.Tanh", "Identity": "torch.nn.modules.linear.Identity",
               "GELU": "torch.nn.modules.activation.GELU", "ReLU": "torch.nn.modules.activation.ReLU",
               "Sigmoid": "torch.nn.modules.activation.Sigmoid", "SiLU": "torch.nn.modules.activation.SiLU"}
NEW_TYPES = {"Transformer": "sentence_transformers.base.modules.transformer.Transformer",
             "Pooling": "sentence_transformers.sentence_transformer.modules.pooling.Pooling",
             "Dense": "sentence_transformers.base.modules.dense.Dense",
             "Normalize": "sentence_transformers.base.modules.normalize.Normalize"}
LEGACY_FLAGS = {"cls": "pooling_mode_cls_token", "max": "pooling_mode_max_tokens", "mean": "pooling_mode_mean_tokens",
                "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens",
                "weightedmean": "pooling_mode_weightedmean_tokens", "lasttoken": "pooling_mode_lasttoken"}


@dataclass(frozen=True)
class Dense:
    out_features: int
    activation: str = "Tanh"          # a key of ACTIVATIONS, or None: no activation_function key (Tanh)
    bias: bool = True
    residual: bool = False


def chain_folder(path: str | Path, *, pooling: tuple[str, ...] = ("mean",), dense: list[Dense] | tuple = (),
                 normalize: bool = True, legacy: bool = False, base: str = "tiny-bert",
                 transformer: str | Path | None = None, prompts: dict | None = None,
                 default_prompt_name: str | None = None, seed: int = 0, **config) -> Path:
    """A folder: the transformer (make_folder(base, ..., **config), or a copy of `transformer`), then
    Pooling(pooling) -> each Dense -> Normalize (if normalize)."""
    from rose_testing.folders import make_folder

    path = Path(path)
    if transformer is not None:
        shutil.copytree(transformer, path)
    else:
        make_folder(base, path, seed=seed, **config)
    hidden = _hidden(json.loads((path / "config.json").read_text()))
    kind = _legacy_type if legacy else NEW_TYPES.__getitem__
    modules = [{"idx": 0, "name": "0", "path": "", "type": kind("Transformer")},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": kind("Pooling")}]
    (path / "1_Pooling").mkdir(exist_ok=True)
    (path / "1_Pooling" / "config.json").write_text(json.dumps(_pooling_config(pooling, hidden, legacy), indent=2))
    width, rng = len(pooling) * hidden, np.random.default_rng(seed + 1)
    for d in dense:
        i = len(modules)
        sub = path / f"{i}_Dense"
        write_dense(sub, width, d, rng)
        modules.append({"idx": i, "name": str(i), "path": sub.name, "type": kind("Dense")})
        width = d.out_features
    if normalize:
        i = len(modules)
        (path / f"{i}_Normalize").mkdir(exist_ok=True)
        modules.append({"idx": i, "name": str(i), "path": f"{i}_Normalize", "type": kind("Normalize")})
    (path / "modules.json").write_text(json.dumps(modules, indent=2))
    (path / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": prompts or {}, "default_prompt_name": default_prompt_name, "similarity_fn_name": "cosine"}))
    return path


def write_dense(sub: Path, in_features: int, d: Dense, rng: np.random.Generator) -> None:
    """A Dense module's folder: config.json and model.safetensors, random weights scaled 1/sqrt(in)."""
    import torch
    from safetensors.torch import save_file

    sub.mkdir(exist_ok=True)
    cfg = {"in_features": in_features, "out_features": d.out_features, "bias": d.bias}
    if d.activation is not None:
        cfg["activation_function"] = ACTIVATIONS[d.activation]
    if d.residual:
        cfg["use_residual"] = True
    (sub / "config.json").write_text(json.dumps(cfg, indent=2))
    scale = 1.0 / np.sqrt(in_features)
    state = {"linear.weight": torch.from_numpy(rng.normal(0, scale, (d.out_features, in_features)).astype(np.float32))}
    if d.bias:
        state["linear.bias"] = torch.from_numpy(rng.normal(0, 0.1, d.out_features).astype(np.float32))
    if d.residual and in_features != d.out_features:
        state["residual.weight"] = torch.from_numpy(
            rng.normal(0, scale, (d.out_features, in_features)).astype(np.float32))
    save_file(state, str(sub / "model.safetensors"))


def saved_by_sentence_transformers(path: str | Path, transformer: str | Path, pooling: tuple[str, ...],
                                   dense: list[Dense], normalize: bool = True, seed: int = 0) -> Path:
    """The same kind of folder, made by SentenceTransformer(modules=[...]).save(path, safe_serialization=True)."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense as STDense
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    torch.manual_seed(seed)
    t = Transformer(str(transformer), model_kwargs={"dtype": torch.float32})
    hidden = t.get_embedding_dimension()
    modules, width = [t, Pooling(hidden, pooling_mode=pooling if len(pooling) > 1 else pooling[0])], len(pooling) * hidden
    for d in dense:
        act = getattr(torch.nn, d.activation)() if d.activation else None
        modules.append(STDense(width, d.out_features, bias=d.bias, activation_function=act, use_residual=d.residual))
        width = d.out_features
    if normalize:
        modules.append(Normalize())
    SentenceTransformer(modules=modules, device="cpu").save(str(path), safe_serialization=True)
    return Path(path)


def words(ids) -> str:
    return " ".join(f"w{int(i)}" for i in ids)


def _pooling_config(pooling: tuple[str, ...], hidden: int, legacy: bool) -> dict:
    if legacy:
        return {"word_embedding_dimension": hidden, **{flag: m in pooling for m, flag in LEGACY_FLAGS.items()},
                "include_prompt": True}
    return {"embedding_dimension": hidden, "pooling_mode": list(pooling) if len(pooling) > 1 else pooling[0],
            "include_prompt": True}


def _legacy_type(name: str) -> str:
    return f"sentence_transformers.models.{name}"


def _hidden(config: dict) -> int:
    return next(config[k] for k in ("hidden_size", "d_model", "dim", "n_embd") if k in config)
