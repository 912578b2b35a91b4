"""Checks on pre-tokenized requests, with messages that name what is wrong."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(slots=True, frozen=True)
class RequestLimits:
    max_seq_len: int                  # the model's position table: the longest sequence it can embed
    vocab_size: int
    max_request_seqs: int = 4096
    max_request_tokens: int = 1 << 20
    type_vocab_size: int = 1          # segment ids the model reads (2 for BERT cross-encoders; 1: only 0)


def validate_tokens(input_ids: np.ndarray | None, seq_lens: np.ndarray | None,
                    limits: RequestLimits) -> tuple[np.ndarray, np.ndarray]:
    """Return (input_ids int32 [T], seq_lens int32 [S]) or raise ValueError naming the problem."""
    if input_ids is None:
        raise ValueError("missing input INPUT_IDS")
    if seq_lens is None:
        raise ValueError("missing input SEQ_LENS")
    input_ids, seq_lens = input_ids.reshape(-1), seq_lens.reshape(-1)
    for name, a in (("INPUT_IDS", input_ids), ("SEQ_LENS", seq_lens)):
        if a.dtype != np.int32:
            raise ValueError(f"{name} must be INT32, got {a.dtype}")
    if seq_lens.size == 0:
        raise ValueError("SEQ_LENS is empty: send at least one sequence")
    if seq_lens.size > limits.max_request_seqs:
        raise ValueError(f"the request has {seq_lens.size} sequences; the limit is "
                         f"max_request_seqs={limits.max_request_seqs}")
    # The common case costs a few reductions; the element that is wrong is looked for only after
    # one of them fails (this runs on the request path: ~100 us before, measured on the H200 host).
    if seq_lens.size == 1:            # one sequence (the online case): Python ints, no reductions
        n = int(seq_lens[0])
        lo, total, hi = n, n, n
    else:
        lo, total, hi = int(seq_lens.min()), int(seq_lens.sum(dtype=np.int64)), int(seq_lens.max())
    if lo <= 0:
        i = int(np.flatnonzero(seq_lens <= 0)[0])
        raise ValueError(f"SEQ_LENS[{i}] is {seq_lens[i]}: every length must be at least 1")
    if total != input_ids.size:
        raise ValueError(f"SEQ_LENS sum to {total} but INPUT_IDS holds {input_ids.size} token ids")
    if total > limits.max_request_tokens:
        raise ValueError(f"the request has {total} tokens; the limit is max_request_tokens={limits.max_request_tokens}")
    if hi > limits.max_seq_len:
        i = int(np.flatnonzero(seq_lens > limits.max_seq_len)[0])
        raise ValueError(f"sequence {i} has {seq_lens[i]} tokens; this model embeds at most {limits.max_seq_len} "
                         "tokens per sequence (truncate it, or send text through `embed`, which truncates)")
    # one reduction: read as unsigned, a negative id is larger than any vocabulary
    if input_ids.size and int(input_ids.view(np.uint32).max()) >= limits.vocab_size:
        i = int(np.flatnonzero((input_ids < 0) | (input_ids >= limits.vocab_size))[0])
        raise ValueError(f"INPUT_IDS[{i}] = {input_ids[i]} is outside the vocabulary [0, {limits.vocab_size})")
    return np.ascontiguousarray(input_ids), np.ascontiguousarray(seq_lens)


def validate_token_types(token_type_ids: np.ndarray | None, num_tokens: int,
                         limits: RequestLimits) -> np.ndarray | None:
    """TOKEN_TYPE_IDS (optional): int32 [T] beside INPUT_IDS, each in [0, type_vocab_size).
    Returns None when absent or when the model reads no segment ids (then they must all be 0)."""
    if token_type_ids is None:
        return None
    types = token_type_ids.reshape(-1)
    if types.dtype != np.int32:
        raise ValueError(f"TOKEN_TYPE_IDS must be INT32, got {types.dtype}")
    if types.size != num_tokens:
        raise ValueError(f"TOKEN_TYPE_IDS holds {types.size} ids but INPUT_IDS holds {num_tokens}")
    bad = np.flatnonzero((types < 0) | (types >= limits.type_vocab_size))
    if bad.size:
        i = bad[0]
        raise ValueError(f"TOKEN_TYPE_IDS[{i}] = {types[i]} is outside [0, {limits.type_vocab_size}) "
                         "(this model's segment ids)")
    return np.ascontiguousarray(types) if limits.type_vocab_size > 1 else None
