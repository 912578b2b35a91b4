"""A folder's sentence-transformers chain as modules.json declares it, read without torch.

    chain = read_chain(folder, hidden=768, default="mean")
    chain.pooling            # ("mean",): the Pooling modes, concatenated in this order
    chain.steps              # (DenseSpec(768 -> 3072, ...), DenseSpec(3072 -> 768, ...), NORMALIZE)
    chain.output_dim         # 768: the width of one embedding
    chain.describe()         # "Transformer -> Pooling(mean) -> Dense(768->3072) -> Dense(3072->768) -> Normalize"

What each module means is sentence-transformers' own code (sentence_transformer/modules/pooling.py,
base/modules/dense.py, base/modules/normalize.py):
- Pooling: `pooling_mode` (a name or a list of names), or the legacy `pooling_mode_*_token(s)` flags,
  which sentence-transformers reads as the modes in the order cls, max, mean, mean_sqrt_len_tokens,
  weightedmean, lasttoken (none set: mean). Several modes are concatenated in that order.
  `include_prompt: false` (pool without the prompt's tokens) is refused: rose is handed token ids and
  cannot tell a prompt's tokens from the text's.
- Dense: linear (`bias` or not) then the activation function named by its class path
  (torch.nn.modules.activation.Tanh, torch.nn.modules.linear.Identity, ...; missing: Tanh, the
  constructor's default), optionally plus the input (`use_residual`), weights from the module folder's
  model.safetensors (a pickle file is refused, with the conversion command).
- Normalize: L2 normalization of the sentence embedding.
- Dropout: the identity at inference.
Any other module (a custom type, LayerNorm, WeightedLayerPooling, CNN, LSTM, Router / Asym, ...) is
refused by name, never skipped; so are modules that work on token embeddings or come before Pooling.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
# sentence-transformers' legacy flags, in the order it concatenates their modes
LEGACY_POOLING_FLAGS = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                        "pooling_mode_mean_tokens": "mean", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                        "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}
DEFAULT_ACTIVATION = "torch.nn.modules.activation.Tanh"     # Dense's constructor default
SENTENCE = "sentence_embedding"
NORMALIZE = "normalize"
_IMPLEMENTED = ("Transformer", "Pooling", "Dense", "Normalize", "Dropout")


class ChainError(ValueError):
    """modules.json declares something rose does not serve (config.py raises it as ModelFolderError)."""


@dataclass(frozen=True, slots=True)
class DenseSpec:
    folder: Path                 # the module's folder (model.safetensors)
    in_features: int
    out_features: int
    bias: bool
    activation: str              # a torch.nn module's class path, e.g. torch.nn.modules.activation.Tanh
    residual: bool = False       # use_residual: out + x (or + residual(x) when the widths differ)

    def describe(self) -> str:
        act = self.activation.rsplit(".", 1)[-1]
        extra = [] if act == "Identity" else [act.lower()]
        extra += [] if self.bias else ["no bias"]
        extra += ["residual"] if self.residual else []
        return f"Dense({self.in_features}->{self.out_features}{', ' if extra else ''}{', '.join(extra)})"


@dataclass(frozen=True, slots=True)
class SentenceChain:
    hidden: int                             # the transformer's hidden size (token embedding width)
    pooling: tuple[str, ...] = ("mean",)    # Pooling's modes, concatenated in this order
    steps: tuple = ()                       # DenseSpec or NORMALIZE, in order, after pooling
    declared: bool = True                   # False: no modules.json (the default pooling)
    dropout: bool = False                   # a Dropout module (the identity) is in the chain

    @property
    def pooled_dim(self) -> int:
        return len(self.pooling) * self.hidden

    @property
    def output_dim(self) -> int:
        dense = [s for s in self.steps if isinstance(s, DenseSpec)]
        return dense[-1].out_features if dense else self.pooled_dim

    @property
    def normalizes(self) -> bool:
        """Whether the output is L2-normalized (the last step is Normalize)."""
        return bool(self.steps) and self.steps[-1] == NORMALIZE

    @property
    def dense(self) -> tuple[DenseSpec, ...]:
        return tuple(s for s in self.steps if isinstance(s, DenseSpec))

    @property
    def mode_name(self) -> str:
        """The pooling as one string: "mean", or "cls+mean" for concatenated modes."""
        return "+".join(self.pooling)

    def late_chunking_refusal(self) -> str | None:
        """Why late chunking (a chunk's vector: the mean of its tokens' hidden states, normalized if the
        model normalizes) is not this chain's embedding, or None where it is comparable."""
        if self.dense or len(self.pooling) > 1:
            return (f"late chunking (DOC_CHUNKS / TOKEN_CHUNKS) is not available for this model: its chain "
                    f"({self.describe()}) is not one pooling of the hidden states, which a chunk's vector is; "
                    "embed the chunks as texts of their own")
        return None

    def describe(self) -> str:
        parts = ["Transformer", f"Pooling({self.mode_name})"]
        parts += ["Dropout (identity)"] if self.dropout else []
        parts += ["Normalize" if s == NORMALIZE else s.describe() for s in self.steps]
        return " -> ".join(parts) + ("" if self.declared else " (no modules.json: the default pooling)")


def read_json(path: Path) -> dict | list:
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ChainError(f"{path} is not valid JSON: {e}") from e


def read_chain(d: Path, hidden: int, default: str) -> SentenceChain:
    """The chain of folder `d` (modules.json), or Pooling(`default`) alone without modules.json.
    `hidden`: the transformer's hidden size (a Pooling config's embedding_dimension must agree)."""
    path = d / "modules.json"
    if not path.exists():
        return SentenceChain(hidden, (default,), declared=False)
    modules = read_json(path)
    if not isinstance(modules, list) or not modules:
        raise ChainError(f"{path}: expected a list of modules, got {modules!r}")
    modules = sorted(modules, key=lambda m: m.get("idx", 0))
    first = _class_name(modules[0], path)
    if first != "Transformer":
        raise ChainError(f"{path}: the first module is {modules[0].get('type')!r}; rose serves a Transformer "
                         "first (a Hugging Face model in the folder itself)")
    sb = d / "sentence_bert_config.json"
    task = read_json(sb).get("transformer_task") if sb.exists() else None
    if task not in (None, "feature-extraction"):
        raise ChainError(f"{sb}: transformer_task is {task!r}; rose serves the model's hidden states "
                         "(feature-extraction) only")
    if modules[0].get("path", "") not in ("", "."):
        raise ChainError(f"{path}: the Transformer module lives in {modules[0]['path']!r}; rose reads the model "
                         f"from the folder itself: serve {d / modules[0]['path']} (with the chain's files) instead")
    pooling, steps, dropout, width = None, [], False, hidden
    for m in modules[1:]:
        name, where = _class_name(m, path), d / m.get("path", "")
        if name == "Pooling":
            if pooling is not None:
                raise ChainError(f"{path}: a second Pooling module ({m.get('path')!r}) is not supported")
            pooling = read_pooling(where / "config.json", hidden)
            width = len(pooling) * hidden
        elif pooling is None:
            raise ChainError(f"{path}: module {m.get('type')!r} ({m.get('path')!r}) comes before Pooling, on the "
                             "token embeddings; rose serves token-level modules only as part of the model")
        elif name == "Dense":
            spec = read_dense(where)
            if spec.in_features != width:
                raise ChainError(f"{where / 'config.json'}: in_features is {spec.in_features}, but the embedding "
                                 f"before it has {width} dimensions")
            steps.append(spec)
            width = spec.out_features
        elif name == "Normalize":
            _sentence_only(where / "config.json", "Normalize")
            steps.append(NORMALIZE)
        elif name == "Dropout":
            dropout = True
    if pooling is None:
        raise ChainError(f"{path}: no Pooling module: the chain gives token embeddings, not one embedding "
                         "per text")
    return SentenceChain(hidden, pooling, tuple(steps), dropout=dropout)


def _class_name(module: dict, path: Path) -> str:
    """The class of a modules.json entry, if sentence-transformers' own and implemented here; else refused."""
    kind = str(module.get("type", ""))
    name = kind.rsplit(".", 1)[-1]
    if not kind.startswith("sentence_transformers."):
        raise ChainError(f"{path}: module {kind!r} ({module.get('path')!r}) is a custom module type, which rose "
                         "does not run; only sentence-transformers' Transformer, Pooling, Dense, Normalize and "
                         "Dropout are served")
    if name not in _IMPLEMENTED:
        raise ChainError(f"{path}: module {name} ({kind}, {module.get('path')!r}) is not implemented by rose "
                         "(served: Transformer, Pooling, Dense, Normalize, Dropout); the folder is refused "
                         "rather than served without it")
    return name


def pooling_modes(cfg: dict, where: Path) -> tuple[str, ...]:
    """A Pooling config's modes, as sentence-transformers reads them (see the module docstring)."""
    mode = cfg.get("pooling_mode")
    if mode:
        modes = (mode,) if isinstance(mode, str) else tuple(mode)
    else:
        modes = tuple(m for flag, m in LEGACY_POOLING_FLAGS.items() if cfg.get(flag)) or ("mean",)
    bad = [m for m in modes if m not in POOLING_MODES]
    if bad or not modes:
        raise ChainError(f"{where}: pooling mode {', '.join(map(repr, bad)) or repr(mode)} is not one of "
                         f"{', '.join(POOLING_MODES)}")
    return modes


def read_pooling(path: Path, hidden: int) -> tuple[str, ...]:
    cfg = read_json(path) if path.exists() else {}
    modes = pooling_modes(cfg, path)
    if cfg.get("include_prompt") is False:
        raise ChainError(f"{path}: include_prompt is false (pool without the prompt's tokens), which rose does "
                         "not implement: it is handed token ids and cannot tell a prompt's tokens from the "
                         "text's; set include_prompt to true only if the prompt may be pooled with the text")
    dim = cfg.get("embedding_dimension", cfg.get("word_embedding_dimension"))
    if dim is not None and int(dim) != hidden:
        raise ChainError(f"{path}: the pooling's embedding dimension is {dim}, but the model's hidden size is {hidden}")
    return modes


def read_dense(d: Path) -> DenseSpec:
    path = d / "config.json"
    cfg = read_json(path)
    _sentence_only(path, "Dense", cfg)
    activation = cfg.get("activation_function") or DEFAULT_ACTIVATION
    if not activation.startswith("torch."):
        raise ChainError(f"{path}: activation function {activation!r} is not a torch.nn module; rose runs the "
                         "activations torch provides (e.g. torch.nn.modules.activation.Tanh) and no custom code")
    if not (d / "model.safetensors").exists():
        if (d / "pytorch_model.bin").exists():
            src, dst = d / "pytorch_model.bin", d / "model.safetensors"
            raise ChainError(
                f"{d} holds its Dense weights as pytorch_model.bin (pickle), and rose loads safetensors only. "
                f"Convert them: python -c \"import torch; from safetensors.torch import save_file; "
                f"save_file(torch.load('{src}', weights_only=True), '{dst}')\"")
        raise ChainError(f"{d} has no model.safetensors (the Dense module's weights)")
    try:
        return DenseSpec(d, int(cfg["in_features"]), int(cfg["out_features"]), bool(cfg.get("bias", True)),
                         activation, bool(cfg.get("use_residual", False)))
    except KeyError as e:
        raise ChainError(f"{path} has no {e.args[0]!r}") from None


def _sentence_only(path: Path, name: str, cfg: dict | None = None) -> None:
    """Refuse a module that reads or writes anything but the sentence embedding (token-level modules)."""
    if cfg is None:
        cfg = read_json(path) if path.exists() else {}
    for key in ("module_input_name", "module_output_name"):
        if cfg.get(key, SENTENCE) != SENTENCE:
            raise ChainError(f"{path}: this {name} module's {key} is {cfg[key]!r}; rose serves {name} on the "
                             f"sentence embedding only")


def check_lowercase(d: Path) -> None:
    """sentence_bert_config.json's do_lower_case: sentence-transformers lowercases the texts (a Lowercase
    normalizer put before the tokenizer's own); rose tokenizes with tokenizer.json as it is, so a
    tokenizer that does not lowercase already is refused, with the command that adds it."""
    sb = d / "sentence_bert_config.json"
    if not sb.exists() or not read_json(sb).get("do_lower_case"):
        return
    tok = d / "tokenizer.json"
    normalizer = read_json(tok).get("normalizer") if tok.exists() else None
    if _lowercases(normalizer):
        return
    raise ChainError(
        f"{sb} sets do_lower_case, and {tok} does not lowercase: sentence-transformers lowercases the texts "
        f"first, rose tokenizes with tokenizer.json as it is. Add the lowercasing to it: python -c \"from "
        f"tokenizers import Tokenizer, normalizers as n; t = Tokenizer.from_file('{tok}'); "
        f"t.normalizer = n.Sequence([n.Lowercase()] + ([t.normalizer] if t.normalizer else [])); t.save('{tok}')\"")


def _lowercases(normalizer) -> bool:
    if not isinstance(normalizer, dict):
        return False
    kind = normalizer.get("type")
    if kind == "Lowercase" or (kind == "BertNormalizer" and normalizer.get("lowercase")):
        return True
    return kind == "Sequence" and any(_lowercases(n) for n in normalizer.get("normalizers", []))
