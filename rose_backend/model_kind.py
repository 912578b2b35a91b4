"""What a model folder is: an embedder, a cross-encoder, or a Qwen3-Reranker (torch-free).

    kind = detect_kind(folder, config_json)            # "embedding" | "cross-encoder" | "qwen3-reranker"

The rule, in order (the first that applies wins):
1. An explicit choice: the deployment parameter `model_kind` of `rose` / `tokenize`, else
   $ROSE_MODEL_KIND (what `make serve KIND=...` / `rose-serve --kind` sets).
2. config.json `architectures` names a `*ForSequenceClassification` head (bge-reranker-v2-m3's
   XLMRobertaForSequenceClassification, the ms-marco MiniLM BertForSequenceClassification):
   "cross-encoder".
3. A Qwen3 causal LM (`Qwen3ForCausalLM`) marked as a reranker by any of: a sentence-transformers
   `LogitScore` module in modules.json (sentence-transformers' own reranker format), vLLM's
   `is_original_qwen3_reranker` key in config.json, or the model card's front matter saying
   `pipeline_tag: text-ranking` (README.md as Qwen/Qwen3-Reranker-* ship it; Qwen3-Embedding's says
   feature-extraction / sentence-similarity): "qwen3-reranker".
4. Anything else: "embedding".
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from rose_backend import env_vars

KINDS = ("embedding", "cross-encoder", "qwen3-reranker")

# Qwen3-Reranker's prompt, from its model card: the pair is written into one user turn between a
# fixed system prefix and an assistant suffix; the score is p("yes") at the last token.
QWEN3_RERANKER_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
    "Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n")
QWEN3_RERANKER_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
QWEN3_RERANKER_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
QWEN3_RERANKER_MAX_LENGTH = 8192        # the model card's max_length (prefix and suffix included)


def qwen3_reranker_text(query: str, document: str, instruction: str | None = None) -> str:
    """The model card's format_instruction(): the text between the fixed prefix and suffix."""
    return f"<Instruct>: {instruction or QWEN3_RERANKER_INSTRUCTION}\n<Query>: {query}\n<Document>: {document}"


def detect_kind(d: Path, raw: dict, override: str | None = None) -> str:
    """The folder's kind by the rule in this module's docstring; raises ValueError on a bad override."""
    choice = (override or env_vars.ROSE_MODEL_KIND.get()).strip().lower()
    if choice and choice != "auto":
        if choice not in KINDS:
            raise ValueError(f"model kind {choice!r} is not one of {', '.join(KINDS)} (or auto)")
        return choice
    archs = raw.get("architectures") or []
    if any(a.endswith("ForSequenceClassification") for a in archs):
        return "cross-encoder"
    if raw.get("model_type") == "qwen3" and "Qwen3ForCausalLM" in archs and _marked_reranker(d, raw):
        return "qwen3-reranker"
    return "embedding"


def _marked_reranker(d: Path, raw: dict) -> bool:
    if raw.get("is_original_qwen3_reranker"):
        return True
    modules = d / "modules.json"
    if modules.exists():
        try:
            if any(str(m.get("type", "")).endswith("LogitScore") for m in json.loads(modules.read_text())):
                return True
        except (json.JSONDecodeError, AttributeError):
            pass
    readme = d / "README.md"
    if readme.exists():
        head = readme.read_text(errors="replace")[:4096]
        front = re.match(r"---\s*\n(.*?)\n---", head, re.S)
        if front and re.search(r"^pipeline_tag:\s*text-ranking\s*$", front.group(1), re.M):
            return True
    return False


def score_activation(raw: dict, d: Path) -> str:
    """The activation sentence-transformers' CrossEncoder applies by default: config.json's
    `sentence_transformers.activation_fn` (or the pre-v4 `sbert_ce_default_activation_function`)
    when it names Sigmoid or Identity, else Sigmoid for one label. Only one-label heads are served
    (one score per document)."""
    num_labels = _num_labels(raw)
    if num_labels != 1:
        raise ValueError(f"{d / 'config.json'}: a cross-encoder with {num_labels} labels is not a reranker; "
                         "only one-label heads (one relevance score per pair) are served")
    path = (raw.get("sentence_transformers") or {}).get("activation_fn") \
        or raw.get("sbert_ce_default_activation_function")
    if not path:
        return "sigmoid"
    name = str(path).rsplit(".", 1)[-1]
    if name in ("Sigmoid", "Identity"):
        return name.lower()
    raise ValueError(f"{d / 'config.json'}: activation {path!r} is not supported (Sigmoid or Identity)")


def _num_labels(raw: dict) -> int:
    if "num_labels" in raw:
        return int(raw["num_labels"])
    return len(raw.get("id2label") or {0: "LABEL_0", 1: "LABEL_1"})
