"""The gateway's calls to `rose`: rose_client's Job (chunks on the token budget, least-loaded
replica, failover, timeouts: the same policy as AsyncEmbeddingClient) driven with one future per
wait instead of an asyncio.Event and a wait_for task per step.

    emb = await ragged(client, toks.ids, toks.lens, dimensions=None, lane=None)   # float32 [n, D]

A one-text request is one chunk: sent, then one future that the gRPC thread's answer resolves
(loop.call_soon_threadsafe), then assembled. Cancelling the awaiting task (the client went away)
ends the Job, which cancels its streams' pending requests at the server.
"""
from __future__ import annotations

import asyncio

import numpy as np

from rose_client import AsyncEmbeddingClient
from rose_client.dispatch import Job
from rose_client.encoded import Ask
from rose_client.token_requests import ragged_chunks
from rose_gateway import stages


async def ragged(client: AsyncEmbeddingClient, input_ids: np.ndarray, seq_lens: np.ndarray,
                 dimensions: int | None = None, lane: str | None = None) -> np.ndarray:
    """AsyncEmbeddingClient.embed_ragged, float32 answers."""
    ask = Ask(dimensions=dimensions)
    sync = client.sync
    return (await run_job(sync, sync.token_model, ragged_chunks(sync, input_ids, seq_lens, ask), len(seq_lens),
                          ask, lane)).dense


async def tokens(client: AsyncEmbeddingClient, token_lists: list[list[int]], lane: str | None = None) -> np.ndarray:
    """AsyncEmbeddingClient.embed_tokens, float32 answers."""
    ask, sync = Ask(), client.sync
    return (await run_job(sync, sync.token_model, sync._token_chunks(token_lists, ask), len(token_lists), ask,
                          lane)).dense


async def run_job(sync, model: str, chunks, n: int, ask: Ask, lane: str | None):
    """Drive a Job to its Encoded answer on this event loop. Job.step() returns how long to wait for
    the next event (None: done); an answer, or capacity freed by another call, wakes the wait early."""
    loop = asyncio.get_running_loop()
    waiting: list[asyncio.Future | None] = [None]

    def on_loop() -> None:
        fut = waiting[0]
        if fut is not None and not fut.done():
            fut.set_result(None)

    def wake() -> None:                              # any thread
        try:
            loop.call_soon_threadsafe(on_loop)
        except RuntimeError:                         # the loop is closed: nobody is waiting any more
            pass

    job = Job(sync, model, chunks, n, wake, ask, lane)
    try:
        while True:
            wait = job.step()
            if wait is None:
                return job.output()
            if wait <= 0.0:                          # chunks were just sent: look at the answers again
                stages.mark("sent")
                continue
            fut = waiting[0] = loop.create_future()
            timer = loop.call_later(wait, on_loop)
            try:
                await fut
            finally:
                timer.cancel()
                waiting[0] = None
    finally:
        job.finish()
