"""Late chunking: a document given as its consecutive chunks -> one token plan, one vector per chunk.

    chunker = LateChunker(text_tokenizer, overlap=64)   # default: 64, at most a quarter of the window
    plan = chunker.plan(documents, prompt)      # documents: [[chunk, chunk, ...], ...] (str)
    # plan.input_ids / plan.seq_lens: the windows `rose` runs, end to end
    # plan.token_chunks: int32 [T], per window token the chunk row it is pooled into, or -1
    # plan.chunk_tokens: int32 [n_chunks], the tokens of each chunk's own (its vector's mean)

A document is its chunks joined exactly as given (no separator), with the task's prompt in front.
It is tokenized once, with character offsets, without truncation; a token belongs to the chunk
holding its first character; special tokens and the prompt's tokens belong to none. A chunk with
no token of its own is refused with an InputError naming it (its TEXT index, document, chunk).
A document longer than the model's maximum length (max_seq_length tokens) runs in windows of that
length, window k starting at k * (max_seq_length - overlap), the last one ending at the document's
end; a token that lies in several windows takes its state from the one where it is farthest from
an edge (the earlier one on a tie), and only there is it given a chunk row. `rose` then pools each
chunk row as the mean of its tokens' final hidden states (serving/spans.py).
The work is bounded before tokenizing: a document of more than max_text_bytes bytes is refused
(cutting it would leave chunks without their text).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

from rose_ensemble.tokenization import InputError, TextTokenizer

DEFAULT_OVERLAP = 64


@dataclass(slots=True)
class ChunkPlan:
    input_ids: np.ndarray         # int32 [T]: every window's token ids, end to end
    seq_lens: np.ndarray          # int32 [W]: window lengths
    token_chunks: np.ndarray      # int32 [T]: chunk row (over the whole request) per token, -1: none
    chunk_tokens: np.ndarray      # int32 [n_chunks]: tokens pooled into each chunk


def windows(length: int, size: int, overlap: int) -> list[tuple[int, int]]:
    """[start, end) of the windows over `length` tokens: `size` long, `overlap` shared by neighbours."""
    if length <= size:
        return [(0, length)]
    step = size - overlap
    out, start = [], 0
    while True:
        out.append((start, min(start + size, length)))
        if start + size >= length:
            return out
        start += step


def owning_window(length: int, spans: list[tuple[int, int]]) -> np.ndarray:
    """int [length]: for each token the window (index into spans) where it is farthest from an
    edge; the earlier window on a tie."""
    best = np.full(length, -1, dtype=np.int64)
    owner = np.zeros(length, dtype=np.int32)
    for w, (a, b) in enumerate(spans):
        pos = np.arange(a, b)
        dist = np.minimum(pos - a, b - 1 - pos)
        better = dist > best[a:b]
        best[a:b] = np.where(better, dist, best[a:b])
        owner[a:b] = np.where(better, w, owner[a:b])
    return owner


class LateChunker:
    def __init__(self, texts: TextTokenizer, overlap: int | None = None):
        """overlap: tokens shared by neighbouring windows; None: DEFAULT_OVERLAP, at most a quarter
        of the maximum length."""
        size = texts.max_seq_length
        overlap = min(DEFAULT_OVERLAP, size // 4) if overlap is None else overlap
        if not 0 <= overlap < size:
            raise ValueError(f"late_chunk_overlap is {overlap}; it must be at least 0 and below the "
                             f"model's maximum length ({size} tokens)")
        self.texts, self.size, self.overlap = texts, size, overlap
        self.tokenizer = Tokenizer.from_str(texts.tokenizer.to_str())     # the same, without truncation
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()

    @staticmethod
    def split(raw: list[str], doc_chunks: np.ndarray | None) -> list[list[str]]:
        """TEXT's chunks end to end -> one list per document, by DOC_CHUNKS (chunks per document)."""
        counts = np.asarray(doc_chunks).reshape(-1)
        if counts.dtype != np.int32:
            raise InputError(f"DOC_CHUNKS must be INT32, got {counts.dtype}")
        if counts.size == 0:
            raise InputError("DOC_CHUNKS is empty: give each document's number of chunks")
        bad = np.flatnonzero(counts < 1)
        if bad.size:
            raise InputError(f"DOC_CHUNKS[{bad[0]}] is {counts[bad[0]]}: every document needs at least one chunk")
        if int(counts.sum()) != len(raw):
            raise InputError(f"DOC_CHUNKS sum to {int(counts.sum())} chunks but TEXT holds {len(raw)} texts")
        ends = np.cumsum(counts).tolist()
        return [raw[a:b] for a, b in zip([0] + ends[:-1], ends)]

    def check_sizes(self, raw: list[bytes], doc_chunks: np.ndarray) -> None:
        """Refuse a document over max_text_bytes before anything is decoded or tokenized."""
        limit = self.texts.max_text_bytes
        if not limit:
            return
        start = 0
        for d, n in enumerate(np.asarray(doc_chunks).reshape(-1).tolist()):
            size = sum(len(b) for b in raw[start:start + n])
            if size > limit:
                raise InputError(f"document {d} (TEXT[{start}:{start + n}]) holds {size} bytes; late chunking "
                                 f"takes documents of at most max_text_bytes={limit} bytes (send it shorter "
                                 "or as several documents)")
            start += n

    def plan(self, documents: list[list[str]], prompt: str = "") -> ChunkPlan:
        encodings = self.tokenizer.encode_batch([prompt + "".join(chunks) for chunks in documents],
                                                add_special_tokens=True)
        ids, lens, rows, own = [], [], [], []
        first_chunk = 0
        for d, (chunks, enc) in enumerate(zip(documents, encodings)):
            chunk_of = self._chunk_of_tokens(chunks, enc, len(prompt))
            counts = np.bincount(chunk_of[chunk_of >= 0], minlength=len(chunks))
            empty = np.flatnonzero(counts == 0)
            if empty.size:
                c = int(empty[0])
                raise InputError(f"TEXT[{first_chunk + c}] (document {d}, chunk {c}) has no token of its own: "
                                 f"{chunks[c][:40]!r} (late chunking pools each chunk's tokens; join it to a neighbour)")
            doc_ids = np.asarray(enc.ids, dtype=np.int32)
            spans = windows(doc_ids.size, self.size, self.overlap)
            owner = owning_window(doc_ids.size, spans)
            global_rows = np.where(chunk_of >= 0, chunk_of + first_chunk, -1).astype(np.int32)
            for w, (a, b) in enumerate(spans):
                ids.append(doc_ids[a:b])
                lens.append(b - a)
                rows.append(np.where(owner[a:b] == w, global_rows[a:b], -1).astype(np.int32))
            own.append(counts)
            first_chunk += len(chunks)
        return ChunkPlan(np.concatenate(ids), np.asarray(lens, dtype=np.int32), np.concatenate(rows),
                         np.concatenate(own).astype(np.int32))

    @staticmethod
    def _chunk_of_tokens(chunks: list[str], enc, prompt_chars: int) -> np.ndarray:
        """int32 [tokens]: the chunk holding each token's first character; -1 for special tokens
        and the prompt's tokens."""
        starts = np.fromiter((o[0] for o in enc.offsets), dtype=np.int64, count=len(enc.offsets))
        bounds = np.cumsum([len(c) for c in chunks]) + prompt_chars       # end of each chunk (chars)
        chunk = np.searchsorted(bounds, starts, side="right").astype(np.int32)
        special = np.asarray(enc.special_tokens_mask, dtype=bool)
        return np.where(special | (starts < prompt_chars) | (chunk >= len(chunks)), -1, chunk).astype(np.int32)
