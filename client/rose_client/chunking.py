"""Cut a list of inputs into chunks on a token budget, and count (or estimate) tokens of texts.

Chunks are contiguous ranges of the input, so results are put back in order by position alone:

    >>> chunk_ranges([500, 500, 500, 10, 10], budget=1024)
    [(0, 2), (2, 5)]

Token counts: token ids are counted exactly. Texts are counted with the model's tokenizer when the
client has one (`tokenizer="path/to/tokenizer.json"` or a Hugging Face model folder; needs the
`tokenizers` package), otherwise estimated as `utf8_bytes // 4 + 2` (about four bytes a token for
English wordpiece / BPE vocabularies, plus the two special tokens), capped at `max_text_tokens`.
The count only steers chunking and balancing: a wrong estimate costs balance, never correctness.
"""
from __future__ import annotations

import json
from pathlib import Path


def chunk_ranges(costs: list[int], budget: int, max_items: int = 1 << 30,
                 sizes: list[int] | None = None, max_bytes: int = 1 << 62) -> list[tuple[int, int]]:
    """Split positions 0..len(costs) into contiguous [start, end) ranges.

    A range closes before the item that would take it over `budget` tokens, `max_items` items or
    `max_bytes` bytes (`sizes`, optional). An item larger than the budget gets a range of its own.
    """
    if budget < 1 or max_items < 1:
        raise ValueError(f"budget and max_items must be >= 1, got {budget} and {max_items}")
    out, start, used, nbytes = [], 0, 0, 0
    for i, c in enumerate(costs):
        b = sizes[i] if sizes is not None else 0
        if i > start and (used + c > budget or i - start >= max_items or nbytes + b > max_bytes):
            out.append((start, i))
            start, used, nbytes = i, 0, 0
        used += c
        nbytes += b
    if start < len(costs):
        out.append((start, len(costs)))
    return out


def estimate_text_tokens(nbytes: int, max_text_tokens: int) -> int:
    """The documented estimate used without a tokenizer: bytes // 4 + 2, capped."""
    return min(nbytes // 4 + 2, max_text_tokens)


class TextTokenCounter:
    """Token counts of texts with the model's own tokenizer (Rust `tokenizers`), capped at the
    model's max_seq_length when the folder says it (the server truncates there too)."""

    def __init__(self, path: str | Path, max_text_tokens: int | None = None):
        try:
            from tokenizers import Tokenizer
        except ImportError as e:  # pragma: no cover - depends on the install
            raise ImportError("counting text tokens exactly needs `pip install tokenizers` "
                              "(or leave tokenizer=None to use the bytes/4 estimate)") from e
        path = Path(path).expanduser()
        folder = path if path.is_dir() else path.parent
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.exists():
            raise FileNotFoundError(f"no tokenizer.json at {file}")
        self.tokenizer = Tokenizer.from_file(str(file))
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        cap = max_text_tokens
        st = folder / "sentence_bert_config.json"
        if cap is None and st.exists():
            cap = json.loads(st.read_text()).get("max_seq_length")
        self.max_text_tokens = int(cap) if cap else 1 << 30

    def __call__(self, texts: list[str | bytes]) -> list[int]:
        strs = [t.decode("utf-8", errors="replace") if isinstance(t, bytes) else t for t in texts]
        encs = self.tokenizer.encode_batch(strs)
        return [min(len(e.ids), self.max_text_tokens) for e in encs]
