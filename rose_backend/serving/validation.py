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
    # one of them fails (this runs on the request path of every request).
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


def validate_token_chunks(token_chunks: np.ndarray | None, num_tokens: int,
                          limits: RequestLimits) -> tuple[np.ndarray, np.ndarray] | None:
    """TOKEN_CHUNKS (optional, late chunking): int32 [T] beside INPUT_IDS, each token's chunk row or
    -1, every row 0..n-1 holding at least one token. Returns (token_chunks, tokens per chunk
    int32 [n]) or None when absent."""
    if token_chunks is None:
        return None
    chunks = token_chunks.reshape(-1)
    if chunks.dtype != np.int32:
        raise ValueError(f"TOKEN_CHUNKS must be INT32, got {chunks.dtype}")
    if chunks.size != num_tokens:
        raise ValueError(f"TOKEN_CHUNKS holds {chunks.size} values but INPUT_IDS holds {num_tokens} token ids")
    if chunks.size and int(chunks.min()) < -1:
        i = int(np.flatnonzero(chunks < -1)[0])
        raise ValueError(f"TOKEN_CHUNKS[{i}] = {chunks[i]}: a chunk row is at least 0 (-1: the token belongs to none)")
    n = int(chunks.max()) + 1 if chunks.size else 0
    if n == 0:
        raise ValueError("TOKEN_CHUNKS gives no token a chunk: late chunking needs at least one chunk")
    if n > limits.max_request_seqs:
        raise ValueError(f"TOKEN_CHUNKS names {n} chunks; the limit is max_request_seqs={limits.max_request_seqs}")
    counts = np.bincount(chunks[chunks >= 0], minlength=n)
    empty = np.flatnonzero(counts == 0)
    if empty.size:
        raise ValueError(f"chunk {empty[0]} has no token in TOKEN_CHUNKS (every chunk row 0..{n - 1} needs one)")
    return np.ascontiguousarray(chunks), counts.astype(np.int32)


def validate_counts(token_counts: np.ndarray | None, truncated: np.ndarray | None,
                    lens: np.ndarray, late: bool) -> tuple[np.ndarray | None, np.ndarray | None]:
    """TOKEN_COUNTS (int32 [n]) and TRUNCATED (bool [n]), optional: the tokenizer's counts before
    truncation and cut marks, one per input (per chunk when late); `lens` the tokens each input
    holds (SEQ_LENS, or each chunk's own tokens), which a count cannot be below."""
    if token_counts is not None:
        token_counts = token_counts.reshape(-1)
        if token_counts.dtype != np.int32:
            raise ValueError(f"TOKEN_COUNTS must be INT32, got {token_counts.dtype}")
        if token_counts.size != lens.size:
            raise ValueError(f"TOKEN_COUNTS holds {token_counts.size} counts for {lens.size} "
                             f"{'chunks' if late else 'sequences'}")
        below = np.flatnonzero(token_counts < lens)
        if below.size:
            i = int(below[0])
            raise ValueError(f"TOKEN_COUNTS[{i}] = {token_counts[i]} is below the {lens[i]} tokens "
                             f"{'of chunk' if late else 'in sequence'} {i}")
    if truncated is not None:
        truncated = truncated.reshape(-1)
        if truncated.dtype != np.bool_:
            raise ValueError(f"TRUNCATED must be BOOL, got {truncated.dtype}")
        if truncated.size != lens.size:
            raise ValueError(f"TRUNCATED holds {truncated.size} flags for {lens.size} "
                             f"{'chunks' if late else 'sequences'}")
    return token_counts, truncated
