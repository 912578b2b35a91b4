"""A packed batch on the host: every sequence's token ids end to end, plus their lengths."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

HEAD_OUTPUTS = ("sparse", "colbert")      # BGE-M3's heads, per token
TOKEN_OUTPUTS = (*HEAD_OUTPUTS, "hidden")  # token-level outputs a batch may ask for; "hidden": final hidden states


@dataclass(slots=True)
class PackedBatch:
    input_ids: np.ndarray            # [T] int32, sequences end to end, no padding
    seq_lens: np.ndarray             # [S] int32, each >= 1, summing to T
    token_outputs: frozenset = frozenset()   # subset of TOKEN_OUTPUTS, computed for every token
    token_type_ids: np.ndarray | None = None   # [T] int32 segment ids (BERT cross-encoders), or None

    def __post_init__(self):
        if self.input_ids.ndim != 1 or self.seq_lens.ndim != 1:
            raise ValueError("input_ids and seq_lens must be 1-D")
        if int(self.seq_lens.sum()) != self.input_ids.shape[0]:
            raise ValueError(f"seq_lens sum to {int(self.seq_lens.sum())} but there are "
                             f"{self.input_ids.shape[0]} token ids")
        if not self.token_outputs <= set(TOKEN_OUTPUTS):
            raise ValueError(f"unknown token outputs {sorted(self.token_outputs - set(TOKEN_OUTPUTS))}")

    @classmethod
    def of_lists(cls, token_lists, type_lists=None) -> "PackedBatch":
        """Token id (and segment id) lists -> one packed batch (tests and tools)."""
        lens = np.array([len(t) for t in token_lists], dtype=np.int32)
        ids = np.concatenate([np.asarray(t, dtype=np.int32) for t in token_lists])
        types = None if type_lists is None else np.concatenate([np.asarray(t, dtype=np.int32) for t in type_lists])
        return cls(ids, lens, token_type_ids=types)

    @classmethod
    def filler(cls, num_seqs: int, num_tokens: int, vocab_size: int, rng) -> "PackedBatch":
        """Random ids in num_seqs sequences of near-equal lengths, num_tokens in all (warm-up batches)."""
        t = max(num_tokens, num_seqs)
        lens = np.full(num_seqs, t // num_seqs, dtype=np.int32)
        lens[: t % num_seqs] += 1
        return cls(rng.integers(0, vocab_size, size=t, dtype=np.int32), lens)

    def embedding_positions(self, type_stride: int) -> np.ndarray:
        """positions() + token type * type_stride: the row of the position-and-segment table of
        models that read segment ids (models/bert.py); plain positions when there are none."""
        pos = self.positions()
        if self.token_type_ids is None or not type_stride:
            return pos
        return (pos + self.token_type_ids.astype(np.int32) * np.int32(type_stride)).astype(np.int32)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])

    @property
    def max_seqlen(self) -> int:
        return int(self.seq_lens.max())

    def cu_seqlens(self) -> np.ndarray:
        """[S + 1] int32 offsets: sequence i owns tokens cu[i]:cu[i+1]."""
        cu = np.zeros(self.num_seqs + 1, dtype=np.int32)
        np.cumsum(self.seq_lens, out=cu[1:])
        return cu

    def positions(self) -> np.ndarray:
        """[T] int32 position of each token within its own sequence (restarting at 0)."""
        cu = self.cu_seqlens()
        return (np.arange(self.num_tokens, dtype=np.int32) - np.repeat(cu[:-1], self.seq_lens)).astype(np.int32)

    def seq_ids(self) -> np.ndarray:
        """[T] int64 index of the sequence each token belongs to."""
        return np.repeat(np.arange(self.num_seqs, dtype=np.int64), self.seq_lens)


def row_names(want: frozenset) -> list[str]:
    """The token-level outputs a forward pass returns for `want`, in order: the heads' two, then hidden."""
    return ([] if want.isdisjoint(HEAD_OUTPUTS) else list(HEAD_OUTPUTS)) + (["hidden"] if "hidden" in want else [])


def graph_tags(want: frozenset) -> tuple[str, ...]:
    """Graph key suffix of a batch's token outputs: "m3" (the heads), "hidden"; none for dense-only."""
    return (() if want.isdisjoint(HEAD_OUTPUTS) else ("m3",)) + (("hidden",) if "hidden" in want else ())
