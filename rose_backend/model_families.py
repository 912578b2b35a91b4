"""Which config.json model_type / architectures a native model file serves (torch-free: the
launcher, the tokenizer tier and the gateway ask too). rose_backend/models/registry.py maps each
family to its class.

    native_family("mpnet", ["MPNetForMaskedLM"])       # "mpnet": rose_backend/models/mpnet.py serves it
    native_family("bert", ["JinaBertForMaskedLM"])     # None: the folder brings its own modeling code
    native_family("t5", ["T5EncoderModel"])            # None: no native file (the fallback engine)
"""
from __future__ import annotations

import re

from rose_backend.config import DECODER_TYPES, ENCODER_TYPES, QWEN3_ALIASES, family_of

# model_type -> the prefixes of transformers' class names for it (its `architectures` entries)
CLASS_PREFIXES = {"bert": ("Bert",), "roberta": ("Roberta",), "xlm-roberta": ("XLMRoberta",),
                  "camembert": ("Camembert",), "distilbert": ("DistilBert",), "mpnet": ("MPNet",),
                  "modernbert": ("ModernBert",), "qwen3": ("Qwen3",), "qwen2": ("Qwen2",),
                  "llama": ("Llama",), "mistral": ("Mistral",), "gemma3_text": ("Gemma3",)}
# what follows the prefix in transformers' class names: the base model or a head (BertForMaskedLM, Gemma3TextModel)
CLASS_SUFFIX = re.compile(r"(Text)?(Model|For[A-Z][A-Za-z]*)")
assert set(CLASS_PREFIXES) == set(ENCODER_TYPES) | set(DECODER_TYPES)


def native_family(model_type: str, architectures: list[str] | tuple[str, ...] | None = None) -> str | None:
    """The native family serving this model_type / architectures (its file under rose_backend/models),
    or None where no native file implements them (another engine, or a refusal, must serve the folder)."""
    return None if why_not_native(model_type, architectures) else family_of(model_type)


def supported_types() -> tuple[str, ...]:
    """Every config.json model_type a native file serves."""
    return ENCODER_TYPES + DECODER_TYPES + tuple(QWEN3_ALIASES)


def why_not_native(model_type: str, architectures) -> str | None:
    if model_type in QWEN3_ALIASES:             # a known folder whose own class names vary
        model_type, architectures = QWEN3_ALIASES[model_type], ()
    if family_of(model_type) is None:
        return f"model_type {model_type!r} has no native model file (native: {', '.join(supported_types())})"
    for arch in architectures or ():
        if not any(arch.startswith(p) and CLASS_SUFFIX.fullmatch(arch[len(p):]) for p in CLASS_PREFIXES[model_type]):
            return (f"architecture {arch!r} is not one of transformers' {model_type} classes "
                    f"({' / '.join(p + '*' for p in CLASS_PREFIXES[model_type])}): the folder brings its own "
                    "modeling code, which the native file does not implement")
        if model_type in DECODER_TYPES and arch.endswith("ForSequenceClassification"):
            return (f"architecture {arch!r}: a decoder's sequence-classification score (at the last "
                    "non-padding token) is not served natively")
    return None
