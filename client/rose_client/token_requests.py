"""`rose` requests of token ids: sequences end to end cut into chunks on the client's token budget,
and one late-chunking request (TOKEN_CHUNKS beside INPUT_IDS: each token's chunk row, or -1).

    chunks = ragged_chunks(client, input_ids, seq_lens, ask)     # INPUT_IDS, SEQ_LENS (+ DIMENSIONS, ENCODING)
    [chunk] = token_chunk_request(input_ids, seq_lens, token_chunks, ask)   # one vector per chunk row
"""
from __future__ import annotations

import numpy as np

from rose_client.chunking import chunk_ranges
from rose_client.dispatch import Chunk
from rose_client.encoded import Ask


def ragged_chunks(client, input_ids, seq_lens, ask: Ask = Ask()) -> list[Chunk]:
    """input_ids int32 [sum(seq_lens)], seq_lens [n] -> the chunks of a call (contiguous sequences)."""
    flat = np.ascontiguousarray(input_ids, dtype=np.int32).reshape(-1)
    lens = np.ascontiguousarray(seq_lens, dtype=np.int32).reshape(-1)
    if int(lens.sum(dtype=np.int64)) != flat.size:
        raise ValueError(f"seq_lens sum to {int(lens.sum(dtype=np.int64))} tokens but input_ids holds {flat.size}")
    extra = ask.inputs()
    if lens.size == 1:                                   # the common case: one sequence, one request
        return [Chunk(0, 1, flat.size, [("INPUT_IDS", flat), ("SEQ_LENS", lens)] + extra)]
    offs = np.concatenate([[0], np.cumsum(lens, dtype=np.int64)])
    ranges = chunk_ranges(lens.tolist(), client.token_budget, client.max_chunk_seqs) or [(0, 0)]
    return [Chunk(s, e, int(offs[e] - offs[s]),
                  [("INPUT_IDS", flat[offs[s]:offs[e]]), ("SEQ_LENS", lens[s:e])] + extra) for s, e in ranges]


def token_chunk_request(input_ids, seq_lens, token_chunks, ask: Ask = Ask()) -> list[Chunk]:
    """One request (never split: every window of a document is pooled together); its rows are the
    chunk rows 0..max(token_chunks)."""
    flat = np.ascontiguousarray(input_ids, dtype=np.int32).reshape(-1)
    rows = np.ascontiguousarray(token_chunks, dtype=np.int32).reshape(-1)
    if rows.size != flat.size:
        raise ValueError(f"token_chunks holds {rows.size} values for {flat.size} token ids")
    n = int(rows.max()) + 1 if rows.size else 0
    if n < 1:
        raise ValueError("token_chunks gives no token a chunk row")
    lens = np.ascontiguousarray(seq_lens, dtype=np.int32).reshape(-1)
    return [Chunk(0, n, flat.size, [("INPUT_IDS", flat), ("SEQ_LENS", lens), ("TOKEN_CHUNKS", rows)] + ask.inputs())]
