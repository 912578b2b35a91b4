"""Model folder -> ModelConfig.

Reads a Hugging Face model folder the way sentence-transformers does: config.json for the
architecture, modules.json and its modules' folders for the chain after the model (Pooling, Dense,
Normalize: st_folder.py), sentence_bert_config.json for the maximum sequence length,
config_sentence_transformers.json for prompts. Any model_type is read (families without a native
file run on transformers: engine/choice.py). Nothing here imports torch, so the tokenizer tier and
the client can use it too.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from rose_backend.model_folder import (ModelFolderError, default_model_dir,  # noqa: F401
                                       hub_id_message, resolve_model_dir, validate_model_folder)
from rose_backend.model_kind import QWEN3_RERANKER_MAX_LENGTH, detect_kind, score_activation
from rose_backend.st_folder import POOLING_MODES, ChainError, SentenceChain, check_lowercase, read_chain

# The native model families (rose_backend/models/<family>.py, built through models/registry.py) and the
# config.json model_type values each serves. Decoders are causal unless config.json says otherwise.
ENCODER_FAMILIES = {"bert": ("bert", "roberta", "xlm-roberta", "camembert"), "distilbert": ("distilbert",),
                    "mpnet": ("mpnet",), "modernbert": ("modernbert",)}
DECODER_FAMILIES = {"qwen3": ("qwen3",), "llama": ("llama", "mistral", "qwen2"), "gemma3": ("gemma3_text",)}
ENCODER_TYPES = tuple(t for types in ENCODER_FAMILIES.values() for t in types)
DECODER_TYPES = tuple(t for types in DECODER_FAMILIES.values() for t in types)
# Where a config.json leaves a key out: transformers' config-class default, when it is not the generic
# one (head_dim = hidden / heads; norm eps 1e-12 for encoders, 1e-6 for decoders).
TYPE_DEFAULTS = {"qwen3": {"head_dim": 128, "hidden_act": "silu"}, "llama": {"hidden_act": "silu"},
                 "mistral": {"hidden_act": "silu"}, "qwen2": {"hidden_act": "silu"},
                 "gemma3_text": {"head_dim": 256, "hidden_act": "gelu_pytorch_tanh"}, "modernbert": {"norm_eps": 1e-5}}
# Positions numbered from an offset: RoBERTa's family from pad_token_id + 1, MPNet from 2 (its padding_idx 1).
POSITION_OFFSETS = {"roberta": "pad", "xlm-roberta": "pad", "camembert": "pad", "mpnet": 2}
# config.json key spellings of the generic fields, first found wins (transformers' attribute_map).
KEY_SPELLINGS = {"hidden_size": ("hidden_size", "dim"), "num_hidden_layers": ("num_hidden_layers", "n_layers"),
                 "num_attention_heads": ("num_attention_heads", "n_heads"),
                 "intermediate_size": ("intermediate_size", "hidden_dim"),
                 "hidden_act": ("hidden_activation", "hidden_act", "activation"),
                 "norm_eps": ("layer_norm_eps", "rms_norm_eps", "norm_eps", "layer_norm_epsilon")}
# Folders whose config.json names another model_type but whose weights are Qwen3's, read as "qwen3".
# pplx-embed ships as `bidirectional_pplx_qwen3` (Qwen3Model with use_bidirectional_attention).
QWEN3_ALIASES = {"bidirectional_pplx_qwen3": "qwen3"}
# Families without a native model file run on transformers (engine/fallback.py): their config.json
# keys vary, so each size is read from the first of these that it has.
_SIZE_KEYS = {"hidden_size": ("hidden_size", "d_model", "dim", "n_embd", "embed_dim"),
              "num_layers": ("num_hidden_layers", "num_layers", "n_layers", "n_layer"),
              "num_heads": ("num_attention_heads", "num_heads", "n_heads", "n_head", "encoder_attention_heads"),
              "intermediate_size": ("intermediate_size", "d_ff", "hidden_dim", "n_inner", "encoder_ffn_dim"),
              "max_position_embeddings": ("max_position_embeddings", "n_positions", "max_seq_len")}
# transformers families whose position table starts after the padding id (as XLM-R's does)
_PAD_OFFSET_TYPES = ("xlm-roberta", "roberta", "camembert", "mpnet", "data2vec-text", "xmod", "longformer", "ibert")
def _read_json(path: Path) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ModelFolderError(f"{path} is not valid JSON: {e}") from e


@dataclass(slots=True)
class ModelConfig:
    model_dir: Path
    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int
    max_seq_length: int                 # truncation length (sentence-transformers' max_seq_length)
    norm_eps: float
    hidden_act: str = "gelu"
    pad_token_id: int = 0
    type_vocab_size: int = 0
    position_offset: int = 0            # XLM-R numbers positions from pad_token_id + 1
    rope_theta: float = 1_000_000.0
    causal: bool = False
    pooling: str = "mean"               # the Pooling modes, "+"-joined when concatenated ("cls+mean")
    normalize: bool = False             # the output is L2-normalized (the chain ends with Normalize)
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    kind: str = "embedding"             # embedding | cross-encoder | qwen3-reranker (model_kind.py)
    score_activation: str = "identity"  # rerankers: sigmoid | identity on the head's logit
    chain: SentenceChain | None = None  # the sentence-transformers chain after the model (None: rerankers)
    raw: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        bad = [m for m in self.pooling.split("+") if m not in POOLING_MODES]
        if bad:
            raise ModelFolderError(f"pooling mode {'+'.join(bad)!r} is not supported; use one of {POOLING_MODES}")
        if self.num_heads * self.head_dim <= 0 or self.num_heads % self.num_kv_heads:
            raise ModelFolderError(
                f"bad attention shape: {self.num_heads} heads, {self.num_kv_heads} key/value heads, "
                f"head_dim {self.head_dim}")
        if self.max_seq_length <= 0:
            raise ModelFolderError(f"max_seq_length must be positive, got {self.max_seq_length}")

    @property
    def is_decoder(self) -> bool:
        return self.model_type in DECODER_TYPES

    @property
    def family(self) -> str | None:
        """The native model file that serves this folder (models/<family>.py), or None."""
        return family_of(self.model_type)

    @property
    def is_reranker(self) -> bool:
        return self.kind != "embedding"

    @property
    def embedding_dim(self) -> int:
        """Width of one output row: the chain's output (the hidden size times the pooling modes, or the
        last Dense module's width), or 1 (the score) for a reranker."""
        if self.is_reranker:
            return 1
        return self.chain.output_dim if self.chain is not None else self.hidden_size

    @property
    def uses_token_types(self) -> bool:
        """BERT cross-encoders read segment ids (query 0, document 1); XLM-R and Qwen3 have none."""
        return self.kind == "cross-encoder" and self.model_type == "bert" and self.type_vocab_size > 1

    @property
    def max_positions(self) -> int:
        """The longest sequence the position table can embed (RoBERTa's / MPNet's offset taken off)."""
        return self.max_position_embeddings - self.position_offset

    @classmethod
    def from_folder(cls, model_dir: str | os.PathLike | None = None, kind: str | None = None) -> "ModelConfig":
        """kind: "embedding" | "cross-encoder" | "qwen3-reranker" to override detection (None / "auto":
        $ROSE_MODEL_KIND, else detected from the folder; see model_kind.py)."""
        d = resolve_model_dir(model_dir)
        validate_model_folder(d)
        raw = _read_json(d / "config.json")
        model_type = QWEN3_ALIASES.get(raw.get("model_type", ""), raw.get("model_type", ""))
        if not model_type:
            raise ModelFolderError(f"{d / 'config.json'} has no model_type: not a transformers model folder")
        native_type = model_type in ENCODER_TYPES + DECODER_TYPES
        causal = model_type in DECODER_TYPES and not _is_bidirectional(raw)
        try:
            kind = detect_kind(d, raw, kind)
            activation = score_activation(raw, d) if kind == "cross-encoder" else "identity"
        except ValueError as e:
            raise ModelFolderError(str(e)) from None
        if kind == "cross-encoder" and model_type not in ENCODER_TYPES:
            raise ModelFolderError(
                f"{d}: a cross-encoder (sequence-classification head) is served for the encoder types "
                f"{', '.join(ENCODER_TYPES)}; a {model_type!r} classification head is not")
        if kind == "qwen3-reranker" and (model_type != "qwen3" or not causal):
            raise ModelFolderError(f"{d}: a Qwen3-Reranker must be a causal qwen3 model, got {model_type!r}")
        st = _read_json(d / "config_sentence_transformers.json") if (d / "config_sentence_transformers.json").exists() else {}
        if native_type:                               # the family's keys and defaults (TYPE_DEFAULTS)
            field_of = _generic_fields(raw, model_type, d)
            num_heads, hidden = field_of("num_attention_heads"), field_of("hidden_size")
            head_dim = field_of("head_dim", hidden // num_heads)
            vocab, layers, inter = field_of("vocab_size"), field_of("num_hidden_layers"), field_of("intermediate_size")
            norm_eps = field_of("norm_eps", 1e-6 if model_type in DECODER_TYPES else 1e-12)
            act, max_pos = field_of("hidden_act", "gelu"), raw.get("max_position_embeddings") or 512
        else:                                         # the fallback engine's: any spelling transformers uses
            size = _sizes(raw, d)
            if width := _pooling_width(d):            # what the model outputs, whatever config.json calls it
                size["hidden_size"] = width
            hidden, num_heads = size["hidden_size"], size["num_heads"]
            head_dim = raw.get("head_dim") or raw.get("d_kv") or hidden // num_heads
            vocab, layers, inter = size["vocab_size"], size["num_layers"], size["intermediate_size"]
            norm_eps = raw.get("layer_norm_eps", raw.get("rms_norm_eps", 1e-12))
            act, max_pos = raw.get("hidden_act", "gelu"), size["max_position_embeddings"] or 0
        offset = POSITION_OFFSETS.get(model_type, "pad" if model_type in _PAD_OFFSET_TYPES else 0)
        position_offset = (raw.get("pad_token_id", 1) + 1) if offset == "pad" else offset
        max_len = _read_max_seq_length(d, max_pos - position_offset if max_pos else None)
        max_pos = max_pos or max_len                  # relative positions (T5): the length it is served at
        chain = None
        if kind == "cross-encoder":          # the first token (ModernBERT: its classifier_pooling) through the head
            pooling, normalize = ("mean" if raw.get("classifier_pooling") == "mean" else "cls"), False
        elif kind == "qwen3-reranker":                # p(yes) at the last token; the card's max_length
            pooling, normalize, max_len = "lasttoken", False, min(max_len, QWEN3_RERANKER_MAX_LENGTH)
        else:
            # Without modules.json: CLS for the native encoders, last token for causal decoders
            # (Qwen3-Embedding), mean for bidirectional ones (pplx-embed) and, as sentence-transformers
            # does, for every other family.
            default = ("cls" if model_type in ENCODER_TYPES else "lasttoken" if causal else "mean") if native_type \
                else "mean"
            chain = _read_chain(d, hidden, default)
            pooling, normalize = chain.mode_name, chain.normalizes
        return cls(
            model_dir=d, model_type=model_type, vocab_size=vocab, hidden_size=hidden,
            num_layers=layers, num_heads=num_heads,
            num_kv_heads=raw.get("num_key_value_heads") or num_heads, head_dim=head_dim,
            intermediate_size=inter, max_position_embeddings=max_pos,
            max_seq_length=max_len,
            norm_eps=norm_eps, hidden_act=act, pad_token_id=raw.get("pad_token_id") or 0,
            type_vocab_size=raw.get("type_vocab_size", 0), position_offset=position_offset,
            rope_theta=_read_qwen3_rope_theta(raw, d) if model_type == "qwen3" else raw.get("rope_theta", 1_000_000.0),
            causal=causal,
            pooling=pooling, normalize=normalize, chain=chain,
            prompts=dict(st.get("prompts") or {}), default_prompt_name=st.get("default_prompt_name"),
            kind=kind, score_activation=activation, raw=raw,
        )


def family_of(model_type: str) -> str | None:
    """The native family (models/<family>.py) that serves config.json's model_type, or None."""
    model_type = QWEN3_ALIASES.get(model_type, model_type)
    return next((f for families in (ENCODER_FAMILIES, DECODER_FAMILIES) for f, types in families.items()
                 if model_type in types), None)


def _generic_fields(raw: dict, model_type: str, d: Path):
    """field_of(name, default=required): config.json's value under any of its KEY_SPELLINGS, else the
    type's TYPE_DEFAULTS, else `default`; a required field that is missing is a ModelFolderError."""
    defaults = TYPE_DEFAULTS.get(model_type, {})

    def field_of(name: str, default=ModelFolderError):
        for key in KEY_SPELLINGS.get(name, (name,)):
            if raw.get(key) is not None:
                return raw[key]
        if name in defaults:
            return defaults[name]
        if default is ModelFolderError:
            raise ModelFolderError(f"{d / 'config.json'}: no {' / '.join(KEY_SPELLINGS.get(name, (name,)))} "
                                   f"(a {model_type} config.json names it)")
        return default
    return field_of


def _sizes(raw: dict, d: Path) -> dict[str, int | None]:
    """The model's sizes under the first of _SIZE_KEYS' names config.json has (or its text_config's);
    the hidden size may also come from the pooling config. vocab_size and the hidden size are required."""
    inner = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else {}
    out = {}
    for name, keys in _SIZE_KEYS.items():
        out[name] = next((c[k] for c in (raw, inner) for k in keys if isinstance(c.get(k), int)), None)
    out["vocab_size"] = raw.get("vocab_size") or inner.get("vocab_size")
    if not out["hidden_size"]:
        out["hidden_size"] = _pooling_width(d)
    for name in ("vocab_size", "hidden_size"):
        if not out[name]:
            raise ModelFolderError(f"{d / 'config.json'} has no {name} (nor {', '.join(_SIZE_KEYS.get(name, ()))})")
    heads = out["num_heads"] or 1
    out["num_heads"] = heads if out["hidden_size"] % heads == 0 else 1
    out["num_layers"] = out["num_layers"] or 1
    out["intermediate_size"] = out["intermediate_size"] or 4 * out["hidden_size"]
    return out


def _pooling_width(d: Path) -> int | None:
    """The token embedding width a Pooling config names (for config.json files that name it otherwise)."""
    modules = d / "modules.json"
    if not modules.exists():
        return None
    for m in _read_json(modules):
        path = d / m.get("path", "") / "config.json"
        if str(m.get("type", "")).endswith("Pooling") and path.exists():
            cfg = _read_json(path)
            return cfg.get("embedding_dimension", cfg.get("word_embedding_dimension"))
    return None


def _read_chain(d: Path, hidden: int, default: str) -> SentenceChain:
    try:
        check_lowercase(d)
        return read_chain(d, hidden, default)
    except ChainError as e:
        raise ModelFolderError(str(e)) from None


def _is_bidirectional(raw: dict) -> bool:
    """Decoders are causal unless config.json says otherwise, in any of the spellings in use:
    use_bidirectional_attention (pplx-embed), is_causal false, is_bidirectional, attention_type."""
    return bool(raw.get("use_bidirectional_attention") or raw.get("is_bidirectional")
                or raw.get("is_causal") is False or raw.get("attention_type") == "bidirectional")


def _read_qwen3_rope_theta(raw: dict, d: Path) -> float:
    """RoPE base from transformers 5's rope_parameters or 4.x's rope_theta / rope_scaling.

    Only plain RoPE over full attention is implemented; a folder asking for scaled RoPE (YaRN,
    linear, dynamic) or sliding windows is refused rather than embedded with the wrong attention."""
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise ModelFolderError(
            f"{d / 'config.json'}: rope type {kind!r} is not supported (only plain RoPE); "
            "remove the rope scaling entry to serve up to max_position_embeddings tokens")
    if raw.get("use_sliding_window"):
        raise ModelFolderError(f"{d / 'config.json'}: sliding-window attention is not supported; "
                               "set use_sliding_window to false")
    return float(rope.get("rope_theta", raw.get("rope_theta", 1_000_000.0)))


def _read_max_seq_length(d: Path, fallback: int | None) -> int:
    """sentence_bert_config.json's max_seq_length, else the tokenizer's model_max_length up to
    `fallback` (the positions the model has; None: relative positions, 512 where nothing says)."""
    sb = d / "sentence_bert_config.json"
    if sb.exists():
        value = _read_json(sb).get("max_seq_length")
        if value:
            return int(value)
    tc = d / "tokenizer_config.json"
    if tc.exists():
        value = _read_json(tc).get("model_max_length")
        if isinstance(value, int) and 0 < value < 1_000_000:
            return min(value, fallback) if fallback else value
    return fallback or 512
