"""Text -> ragged token ids, the way sentence-transformers prepares them.

    tok = TextTokenizer.from_folder(model_dir)
    ids, lens = tok.encode(["what is rose?", "..."], prompt_name="query")
    # ids: int32 [sum(lens)], every text's ids end to end; lens: int32 [n]. No padding anywhere.

Prompts come from the model's config_sentence_transformers.json ("prompts", "default_prompt_name")
and may be overridden or extended by the deployment ("fallback" prompts fill in only the names
the model lacks: the shipped deployment names "query" and "passage" that way). The prompt is prepended to the text before
tokenizing and truncation applies to the whole (as sentence-transformers does), at the model's
max_seq_length. Encoding runs in Rust (tokenizers' encode_batch, one text alone too: its single
`encode` costs more in the stub), which releases the GIL.

    ids, lens, counts = tok.encode_counted(texts)     # counts: each text's tokens before truncation

A text over max_text_bytes is cut before anything else (decode_texts_marked says which were).
"""
from __future__ import annotations

from itertools import chain
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer


CUT_AT_SPACE_WITHIN = 256      # bytes before max_text_bytes where a cut looks for a whitespace


class InputError(ValueError):
    """A request's input is invalid; the message says what and where."""


def _cut(b: bytes, limit: int) -> bytes:
    """b's first `limit` bytes, ended at the last ASCII whitespace of their last CUT_AT_SPACE_WITHIN
    bytes if there is one (a whitespace byte is never inside a UTF-8 character)."""
    b = b[:limit]
    tail = b[-CUT_AT_SPACE_WITHIN:]
    at = max(tail.rfind(c) for c in (b" ", b"\n", b"\t", b"\r"))
    return b[:len(b) - len(tail) + at] if at > 0 else b


@dataclass
class TextTokenizer:
    tokenizer: Tokenizer
    max_seq_length: int
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    max_text_bytes: int = 0             # 0: no limit; otherwise texts are cut to this many bytes first
    max_texts: int = 0                  # 0: no limit; otherwise more texts in one request are refused

    def __post_init__(self):
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(self.max_seq_length)
        # encode_batch_fast (tokenizers >= 0.20) skips the character offsets, which nothing here
        # reads: about half the time of encode_batch for a 512-word text on the CPU machine.
        self.encode_batch = getattr(self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch)

    @classmethod
    def from_folder(cls, model_dir: str | Path, max_seq_length: int | None = None,
                    prompts: dict[str, str] | None = None, default_prompt_name: str | None = None,
                    max_text_bytes: int = 0, max_texts: int = 0,
                    fallback_prompts: dict[str, str] | None = None) -> "TextTokenizer":
        """prompts: the deployment's, over the model's; fallback_prompts: only names the model lacks."""
        from rose_backend.config import ModelConfig   # no torch: config.py imports only the stdlib
        cfg = ModelConfig.from_folder(model_dir)
        merged = {**(fallback_prompts or {}), **cfg.prompts, **(prompts or {})}
        return cls(Tokenizer.from_file(str(Path(cfg.model_dir) / "tokenizer.json")),
                   max_seq_length or cfg.max_seq_length, merged,
                   default_prompt_name if default_prompt_name is not None else cfg.default_prompt_name,
                   max_text_bytes, max_texts)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def prompt_for(self, prompt_name: str | None) -> str:
        name = prompt_name if prompt_name else self.default_prompt_name
        if not name:
            return ""
        if name not in self.prompts:
            known = ", ".join(repr(k) for k in sorted(self.prompts)) or "none"
            raise InputError(f"unknown task / prompt name {name!r}; this model knows: {known}")
        return self.prompts[name]

    def decode_texts(self, raw: list[bytes] | np.ndarray, name: str = "TEXT", allow_empty: bool = False) -> list[str]:
        """BYTES elements -> str (decode_texts_marked without the cut marks)."""
        return self.decode_texts_marked(raw, name, allow_empty)[0]

    def decode_texts_marked(self, raw: list[bytes] | np.ndarray, name: str = "TEXT", allow_empty: bool = False,
                            cut_to: int | None = None) -> tuple[list[str], np.ndarray]:
        """BYTES elements -> (str texts, bool [n]: which were cut); an empty (unless allow_empty) or
        invalid UTF-8 text is refused with its index, as input `name`. A text over max_text_bytes (or
        `cut_to`; 0: no cut) is cut before decoding, at its last whitespace within CUT_AT_SPACE_WITHIN
        bytes of the limit (so the words kept tokenize as in the whole text), else at the limit. Truncation
        to max_seq_length tokens comes later."""
        if len(raw) == 0:
            raise InputError(f"{name} is empty: send at least one text")
        if self.max_texts and len(raw) > self.max_texts:
            what = "texts" if name == "TEXT" else name.lower()
            raise InputError(f"the request has {len(raw)} {what}; the limit is max_request_texts={self.max_texts}")
        limit = self.max_text_bytes if cut_to is None else cut_to
        texts, cut_any = [], np.zeros(len(raw), dtype=bool)
        for i, b in enumerate(raw):
            if isinstance(b, str):
                b = b.encode("utf-8")
            if len(b) == 0 and not allow_empty:
                raise InputError(f"{name}[{i}] is an empty string")
            cut = bool(limit) and len(b) > limit
            if cut:
                b = _cut(b, limit)
                cut_any[i] = True
            try:
                texts.append(b.decode("utf-8"))
            except UnicodeDecodeError as e:
                # a cut may split the last character: drop those (at most 3) bytes, nothing else
                if not (cut and e.start >= len(b) - 3 and e.reason == "unexpected end of data"):
                    raise InputError(f"{name}[{i}] is not valid UTF-8 ({e.reason} at byte {e.start})") from None
                texts.append(b[: e.start].decode("utf-8"))
        return texts, cut_any

    def with_prompt(self, texts: list[str], prompt_name: str | None = None) -> list[str]:
        """The texts as they are tokenized: the task's prompt (InputError if unknown) before each."""
        prompt = self.prompt_for(prompt_name)
        return [prompt + t for t in texts] if prompt else texts

    def encode(self, texts: list[str], prompt_name: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(ids int32 [sum(lens)], lens int32 [n]) of the texts, the prompt put before each."""
        return self.encode_requests([self.with_prompt(texts, prompt_name)])[0]

    def encode_counted(self, texts: list[str], prompt_name: str | None = None) -> tuple[np.ndarray, ...]:
        """(ids, lens, counts before truncation) of the texts, the prompt put before each."""
        return self.encode_requests([self.with_prompt(texts, prompt_name)], [True])[0]

    def encode_requests(self, requests: list[list[str]], counted: list[bool] | None = None) -> list[tuple]:
        """Several requests' texts (prompts already put before them: with_prompt) in one Rust call;
        per request (ids int32 [sum(lens)], lens int32 [n]), in order; for a request whose
        `counted` entry is true, (ids, lens, counts int32 [n]) with each text's tokens before
        truncation (prompt and special tokens included)."""
        flat = requests[0] if len(requests) == 1 else [t for texts in requests for t in texts]
        encodings = self.encode_batch(flat, add_special_tokens=True)
        out, start = [], 0
        for k, texts in enumerate(requests):
            mine = encodings[start:start + len(texts)]
            start += len(texts)
            if len(mine) == 1:                     # the common case: one text, no joining
                ids = np.array(mine[0].ids, dtype=np.int32)
                lens = np.array([ids.size], dtype=np.int32)
            else:
                lists = [e.ids for e in mine]
                lens = np.fromiter(map(len, lists), dtype=np.int32, count=len(lists))
                ids = np.fromiter(chain.from_iterable(lists), dtype=np.int32, count=int(lens.sum()))
            out.append((ids, lens, self.counts_before_truncation(mine, lens)) if counted and counted[k] else (ids, lens))
        return out

    def counts_before_truncation(self, encodings, lens: np.ndarray) -> np.ndarray:
        """Each encoding's tokens before truncation: a text cut at max_seq_length keeps the rest in
        `overflowing` (pieces of its tokens, each with the special tokens added again), so only
        texts that reached the maximum length are looked at."""
        counts = lens.copy()
        specials = self.tokenizer.num_special_tokens_to_add(False)
        for i in np.flatnonzero(lens >= self.max_seq_length).tolist():
            counts[i] += sum(len(o.ids) - specials for o in encodings[i].overflowing)
        return counts

    def count_tokens(self, texts: list[str], prompt_name: str | None = None) -> list[int]:
        """Token counts after prompt and truncation, without building the flat array."""
        return [int(n) for n in self.encode(texts, prompt_name)[1]]
