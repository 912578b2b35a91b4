"""The gateway's calls to `rose`: rose_client's Job (chunks on the token budget, least-loaded
replica, failover, timeouts: AsyncEmbeddingClient's policy and driver) with the stage clock's
"sent" mark (stages.py) each time chunks go out.

    emb = await ragged(client, toks.ids, toks.lens, dimensions=None, lane=None)   # float32 [n, D]
"""
from __future__ import annotations

import numpy as np

from rose_client import AsyncEmbeddingClient
from rose_client.async_client import drive
from rose_client.encoded import Ask
from rose_client.token_requests import ragged_chunks
from rose_gateway import stages


async def ragged(client: AsyncEmbeddingClient, input_ids: np.ndarray, seq_lens: np.ndarray,
                 dimensions: int | None = None, lane: str | None = None) -> np.ndarray:
    """AsyncEmbeddingClient.embed_ragged, float32 answers."""
    ask, sync = Ask(dimensions=dimensions), client.sync
    return (await drive(sync, sync.token_model, ragged_chunks(sync, input_ids, seq_lens, ask), len(seq_lens), ask,
                        lane, _sent)).dense


async def tokens(client: AsyncEmbeddingClient, token_lists: list[list[int]], lane: str | None = None) -> np.ndarray:
    """AsyncEmbeddingClient.embed_tokens, float32 answers."""
    ask, sync = Ask(), client.sync
    return (await drive(sync, sync.token_model, sync._token_chunks(token_lists, ask), len(token_lists), ask, lane,
                        _sent)).dense


def _sent() -> None:
    stages.mark("sent")
