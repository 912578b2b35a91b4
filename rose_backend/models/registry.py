"""The one table from a folder's config.json (`model_type`, `architectures`) to its native model class.

    native_family("mpnet", ["MPNetForMaskedLM"])       # "mpnet": rose_backend/models/mpnet.py serves it
    native_family("bert", ["JinaBertForMaskedLM"])     # None: the folder brings its own modeling code
    native_family("t5", ["T5EncoderModel"])            # None: no native file
    model_class(cfg)                                   # the family's PackedModel subclass, or ModelFolderError
    attention_shape(cfg, torch.bfloat16)               # what the family's layers ask of attention

config.py names the model_type values of each family (ENCODER_FAMILIES / DECODER_FAMILIES: it reads
folders without torch, for the tokenizer tier and the gateway); this module maps each family to its file
and class, and an architecture to whether the native file implements it: the class names transformers
gives that model_type (a `JinaBertForMaskedLM` declared as "bert" runs its own code, which no native
file has), less the heads the native files do not run (a decoder's sequence-classification score).
"""
from __future__ import annotations

import importlib

from rose_backend.config import DECODER_FAMILIES, ENCODER_FAMILIES, ModelConfig, ModelFolderError
from rose_backend.model_families import native_family, supported_types, why_not_native  # noqa: F401 (re-exported)

# family (config.py) -> the class in rose_backend/models/<family>.py
MODEL_CLASSES = {"bert": "BertEncoder", "distilbert": "DistilBertEncoder", "mpnet": "MPNetEncoder",
                 "modernbert": "ModernBertEncoder", "qwen3": "Qwen3Decoder", "llama": "LlamaDecoder",
                 "gemma3": "Gemma3Decoder"}
assert set(MODEL_CLASSES) == set(ENCODER_FAMILIES) | set(DECODER_FAMILIES)


def model_class(cfg: ModelConfig) -> type:
    """The PackedModel subclass of cfg's family; ModelFolderError naming why where none serves it."""
    why = why_not_native(cfg.raw.get("model_type") or cfg.model_type, cfg.raw.get("architectures"))
    if why:
        raise ModelFolderError(f"{cfg.model_dir}: {why}")
    family = cfg.family
    return getattr(importlib.import_module(f"rose_backend.models.{family}"), MODEL_CLASSES[family])


def attention_shape(cfg: ModelConfig, dtype):
    """The AttentionShape (layers/attention.py) of cfg's model in `dtype`: heads, and the sliding windows,
    score scale, soft cap and position bias its family's layers use."""
    return model_class(cfg).attention_shape(cfg, dtype)
