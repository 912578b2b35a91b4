"""The config.pbtxt parameters of `tokenize` and `tokenize_batched`, parsed once (TokenizeSettings).

Their meanings are docs/OPERATIONS.md's tables; docs and config.pbtxt state the defaults below
(tests/triton/test_settings.py checks both). No torch, no Triton: the gateway reads them too.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from rose_backend.triton.model_settings import ModelSettings


@dataclass(frozen=True)
class TokenizeSettings(ModelSettings):
    """Parameters of `tokenize` (texts -> token ids) and of `tokenize_batched`, all optional: their
    meanings are docs/OPERATIONS.md's tables, their types and defaults the fields below."""
    MODEL = "tokenize"
    MINIMUM = {"max_seq_length": 0, "max_text_bytes": 0, "max_request_texts": 1, "batch_backlog_us": 0,
               "late_chunk_overlap": -1}

    model_dir: str = ""
    model_kind: str = ""
    prompts: str = ""
    fallback_prompts: str = '{"query": "", "passage": ""}'
    default_prompt_name: str = ""
    max_seq_length: int = 0
    max_text_bytes: int = 65536
    max_request_texts: int = 4096
    late_chunk_overlap: int = -1
    batch_backlog_us: int = 250

    def __post_init__(self):
        self._check()
        self.prompt_map               # parse, or say what is wrong
        self.fallback_prompt_map

    @property
    def overlap(self) -> int | None:
        """late_chunk_overlap as LateChunker takes it (None: its default)."""
        return None if self.late_chunk_overlap < 0 else self.late_chunk_overlap

    @property
    def prompt_map(self) -> dict[str, str]:
        return parse_prompts(self.prompts)

    @property
    def fallback_prompt_map(self) -> dict[str, str]:
        return parse_prompts(self.fallback_prompts, "fallback_prompts")


def parse_prompts(value: str, name: str = "prompts") -> dict[str, str]:
    """Deployment prompts from a config.pbtxt parameter: a JSON object {name: prefix}."""
    if not value.strip():
        return {}
    try:
        prompts = json.loads(value)
    except json.JSONDecodeError as e:
        raise ValueError(f"parameter {name!r} must be a JSON object of name -> prefix: {e}") from e
    if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise ValueError(f"parameter {name!r} must be a JSON object mapping prompt names to prefix strings")
    return prompts


