"""The Hugging Face reference of late chunking, for the tests: transformers' tokenizer and model.

    vectors = late_chunk_reference(folder, [["Paris is ", "the capital."], ...], prompt="", window=256,
                                   overlap=64)      # one float32 [n_chunks, D] per document

Each document is its chunks joined as given with the prompt in front, tokenized by transformers'
fast tokenizer (offsets and special-token mask; no truncation). A document of at most `window`
tokens runs in one forward pass (Reference.hidden: transformers in float32); a longer one in
windows of `window` tokens starting every window - overlap tokens, the last ending at the
document's end, each token taking its state from the window where it is farthest from an edge
(the earlier one on a tie), decided here token by token. A chunk's vector is the mean of the
states of the tokens whose first character lies in it (special and prompt tokens left out),
normalized if the folder normalizes.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np


def late_chunk_reference(folder: str | Path, documents: list[list[str]], prompt: str = "",
                         window: int = 512, overlap: int = 0, reference=None) -> list[np.ndarray]:
    from transformers import PreTrainedTokenizerFast

    from rose_testing.reference import Reference

    ref = reference or Reference(folder)
    tok = PreTrainedTokenizerFast(tokenizer_file=str(Path(folder) / "tokenizer.json"))
    out = []
    for chunks in documents:
        enc = tok(prompt + "".join(chunks), return_offsets_mapping=True, return_special_tokens_mask=True,
                  add_special_tokens=True, truncation=False)
        ids, offsets, special = enc["input_ids"], enc["offset_mapping"], enc["special_tokens_mask"]
        states = _token_states(ref, ids, window, overlap)
        ends = np.cumsum([len(c) for c in chunks]) + len(prompt)
        vectors = []
        for c in range(len(chunks)):
            start = ends[c - 1] if c else len(prompt)
            mine = [j for j, (o, s) in enumerate(zip(offsets, special)) if not s and start <= o[0] < ends[c]]
            v = states[mine].mean(0)
            if ref.cfg.normalize:
                v = v / np.linalg.norm(v)
            vectors.append(v)
        out.append(np.stack(vectors).astype(np.float32))
    return out


def _token_states(ref, ids: list[int], window: int, overlap: int) -> np.ndarray:
    if len(ids) <= window:
        return ref.hidden(ids).numpy()
    spans, start = [], 0
    while True:
        spans.append((start, min(start + window, len(ids))))
        if start + window >= len(ids):
            break
        start += window - overlap
    hidden = [ref.hidden(ids[a:b]).numpy() for a, b in spans]
    states = np.zeros((len(ids), hidden[0].shape[1]), dtype=np.float32)
    for j in range(len(ids)):
        best, where = -1, None
        for w, (a, b) in enumerate(spans):
            if a <= j < b and min(j - a, b - 1 - j) > best:
                best, where = min(j - a, b - 1 - j), w
        states[j] = hidden[where][j - spans[where][0]]
    return states
