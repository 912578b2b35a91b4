"""Late chunking on rose's side: one vector per chunk, the mean of its tokens' final hidden states.

A late-chunking request carries TOKEN_CHUNKS (int32 [T], beside INPUT_IDS): for each token the
chunk row it is pooled into, or -1 (special and prompt tokens, and a token of a window overlap
that takes its state from the neighbouring window); `embed`'s tokenize step writes it
(ensemble/rose_ensemble/late_chunks.py). The engine hands back every token's final hidden states
(the token output "hidden") piece by piece as the request's batches are collected; add_piece adds
them into per-chunk sums at once (nothing of the engine's reused buffers is kept), and
chunk_means divides by each chunk's token count and normalizes when the model normalizes: the
EMBEDDINGS rows, [n_chunks, H], before DIMENSIONS and ENCODING. This holds for mean-, CLS- and
last-token-pooling models alike: a chunk's vector is always its span's mean.
"""
from __future__ import annotations

import numpy as np

SUMS = "span_sums"           # the request's token_results entry: float64 [n_chunks, H]


def add_piece(results: dict, token_chunks: np.ndarray, hidden: np.ndarray, n_chunks: int) -> None:
    """Add a piece's hidden rows [t, H] into the sums of the chunks token_chunks [t] names."""
    sums = results.get(SUMS)
    if sums is None:
        sums = results[SUMS] = np.zeros((n_chunks, hidden.shape[1]), dtype=np.float64)
    keep = token_chunks >= 0
    if not keep.any():
        return
    rows, ids = hidden[keep], token_chunks[keep]
    # chunk ids come in runs (a chunk's tokens are consecutive): one reduceat per run
    starts = np.flatnonzero(np.concatenate(([True], ids[1:] != ids[:-1])))
    np.add.at(sums, ids[starts], np.add.reduceat(rows, starts, axis=0, dtype=np.float64))


def chunk_means(results: dict, chunk_tokens: np.ndarray, normalize: bool) -> np.ndarray:
    """float32 [n_chunks, H]: each chunk's mean hidden state, L2-normalized if `normalize`."""
    means = results[SUMS] / chunk_tokens[:, None]
    if normalize:
        means = means / np.maximum(np.linalg.norm(means, axis=1, keepdims=True), 1e-12)
    return means.astype(np.float32)
