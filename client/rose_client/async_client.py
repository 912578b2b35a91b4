"""The asyncio twin of EmbeddingClient."""
from __future__ import annotations

import asyncio

import numpy as np

from rose_client.client import EmbeddingClient
from rose_client.dispatch import Chunk, Job
from rose_client.encoded import Ask, Encoded
from rose_client.late_chunks import CountedAsk, LateChunksAsk, document_chunks
from rose_client.rerank import SCORES, pair_chunks, ranked
from rose_client.token_requests import ragged_chunks, token_chunk_request


class AsyncEmbeddingClient:
    """The asyncio twin of EmbeddingClient (same arguments, same chunking, balancing and failover).

    >>> async with AsyncEmbeddingClient("127.0.0.1:8001") as client:
    ...     emb = await client.embed(["hello"])
    """

    def __init__(self, urls: str | list[str], asyncio_streams: bool = False, on_sent=None, **kwargs):
        """asyncio_streams: the streams are grpc.aio streams of the running loop (aio_transport.py):
        no reader thread, no thread hand-over per answer; the client then belongs to that loop
        (make it, use it and close it there). False: threaded streams, usable from any loop.
        on_sent(): called in the calling task each time a call's chunks were just sent (the
        gateway's stage clock marks it)."""
        self.asyncio_streams, self.on_sent = asyncio_streams, on_sent
        if asyncio_streams:
            from rose_client.aio_transport import AioChannel
            kwargs["channel_type"] = AioChannel
        self.sync = EmbeddingClient(urls, **kwargs)
        self.urls = self.sync.urls

    async def embed(self, texts: list[str], task: str | None = None, dimensions: int | None = None,
                    encoding: str = "float32", lane: str | None = None) -> np.ndarray:
        ask = Ask(dimensions=dimensions, encoding=encoding)
        return (await self._run(self.sync.model, self.sync.text_chunks(texts, task, ask), len(texts), ask,
                                lane)).dense

    async def encode(self, texts: list[str], dense: bool = True, sparse: bool = False, colbert: bool = False,
                     dimensions: int | None = None, encoding: str = "float32", task: str | None = None,
                     lane: str | None = None) -> Encoded:
        ask = Ask(dense, sparse, colbert, dimensions, encoding)
        return await self._run(self.sync.text_model(ask), self.sync.text_chunks(texts, task, ask), len(texts), ask,
                               lane)

    async def embed_tokens(self, token_lists: list[list[int]], dimensions: int | None = None,
                           encoding: str = "float32", lane: str | None = None) -> np.ndarray:
        ask = Ask(dimensions=dimensions, encoding=encoding)
        return (await self._run(self.sync.token_model, self.sync.token_chunks(token_lists, ask), len(token_lists),
                                ask, lane)).dense

    async def embed_ragged(self, input_ids: np.ndarray, seq_lens: np.ndarray, dimensions: int | None = None,
                           encoding: str = "float32", lane: str | None = None) -> np.ndarray:
        """See EmbeddingClient.embed_ragged."""
        ask = Ask(dimensions=dimensions, encoding=encoding)
        return (await self._run(self.sync.token_model, ragged_chunks(self.sync, input_ids, seq_lens, ask),
                                len(seq_lens), ask, lane)).dense

    async def embed_token_chunks(self, input_ids: np.ndarray, seq_lens: np.ndarray, token_chunks: np.ndarray,
                                 dimensions: int | None = None, encoding: str = "float32",
                                 lane: str | None = None) -> np.ndarray:
        """See EmbeddingClient.embed_token_chunks."""
        ask = Ask(dimensions=dimensions, encoding=encoding)
        chunks = token_chunk_request(input_ids, seq_lens, token_chunks, ask)
        return (await self._run(self.sync.token_model, chunks, chunks[0].end, ask, lane)).dense

    async def embed_late_chunks(self, documents: list[list[str]], task: str | None = None, counts: bool = False,
                                lane: str | None = None):
        """See EmbeddingClient.embed_late_chunks."""
        ask = LateChunksAsk(documents, counts)
        return await self._run(self.sync.text_model(ask), document_chunks(self.sync, documents, task, Chunk),
                               ask.n_chunks, ask, lane)

    async def embed_counted(self, texts: list[str], task: str | None = None, lane: str | None = None):
        """See EmbeddingClient.embed_counted."""
        ask = CountedAsk()
        return await self._run(self.sync.text_model(ask), self.sync.text_chunks(texts, task, Ask()), len(texts), ask,
                               lane)

    async def rerank(self, query: str, documents: list[str], top_k: int | None = None,
                     return_documents: bool = False, instruction: str | None = None, lane: str | None = None):
        """See EmbeddingClient.rerank."""
        chunks = pair_chunks(self.sync, query, documents, instruction, Chunk)
        scores = (await self._run(self.sync.rerank_model, chunks, len(documents), SCORES, lane)) if chunks \
            else np.zeros(0, np.float32)
        return ranked(scores, list(documents), top_k, return_documents)

    def stats(self):
        return self.sync.stats()

    async def _run(self, model, chunks, n, ask: Ask, lane: str | None = None) -> Encoded:
        return await drive(self.sync, model, chunks, n, ask, lane, self.on_sent)

    async def close(self):
        if not self.asyncio_streams:
            await asyncio.get_running_loop().run_in_executor(None, self.sync.close)
            return
        await asyncio.gather(*(ch.closed for ch in self.sync.close()))

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()


async def drive(client: EmbeddingClient, model: str, chunks, n: int, ask: Ask, lane: str | None = None,
                on_sent=None) -> Encoded:
    """Drive one call's Job to its Encoded answer on the running loop: Job.step() says how long to wait
    (None: done), and an answer, capacity freed by another call (from any thread) or the timer resolves
    the one future waited on. on_sent(): called each time chunks were just sent. Cancelling the
    awaiting task ends the Job, which cancels its streams' pending requests at the server."""
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

    job = Job(client, model, chunks, n, wake, ask, lane)
    try:
        while True:
            wait = job.step()
            if wait is None:
                return job.output()
            if wait <= 0.0:                          # chunks were just sent: look at the answers again
                if on_sent is not None:
                    on_sent()
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
