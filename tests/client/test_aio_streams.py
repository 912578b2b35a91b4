"""rose_client's grpc.aio streams (aio_transport.py, AsyncEmbeddingClient(asyncio_streams=True), what
the gateway uses) against the session's tritonserver: the same answers as the threaded streams, in
order under concurrency; bad input named and the client serving on; a cancelled call cancels its
requests at the server; a closed connection fails what is pending, from any thread, and nothing hangs."""
from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
from support.metrics import rose_metric, wait_idle

from rose_testing.compare import cos_dist
from rose_client import AsyncEmbeddingClient, ConnectionLost, EmbeddingClient, ServerError
from rose_client.aio_transport import AioChannel

pytestmark = pytest.mark.server


def sequences(n: int, length: int = 40, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[101] + rng.integers(2000, 9000, int(rng.integers(1, length))).tolist() + [102] for _ in range(n)]


def test_answers_equal_the_threaded_streams_in_order(server):
    texts = [f"text {i}: " + "word " * (i % 17) for i in range(40)]
    tokens = sequences(50)
    with EmbeddingClient(server.grpc_url, token_budget=256) as ref:
        want_texts, want_tokens = ref.embed(texts, task="query"), ref.embed_tokens(tokens)

    async def main():
        async with AsyncEmbeddingClient(server.grpc_url, asyncio_streams=True, token_budget=256) as c:
            calls = [c.embed(texts, task="query"), c.embed_tokens(tokens)] + \
                    [c.embed_tokens(tokens[i:i + 3]) for i in range(0, 30, 3)]      # 12 calls at once
            return await asyncio.gather(*calls), c.stats()

    (got_texts, got_tokens, *parts), stats = asyncio.run(main())
    assert cos_dist(got_texts, want_texts).max() <= 1e-6
    assert cos_dist(got_tokens, want_tokens).max() <= 1e-6
    for i, part in zip(range(0, 30, 3), parts):
        assert cos_dist(part, want_tokens[i:i + 3]).max() <= 1e-6
    assert all(s["inflight_tokens"] == 0 for s in stats.values())


def test_bad_input_is_named_and_the_client_serves_on(server):
    async def main():
        async with AsyncEmbeddingClient(server.grpc_url, asyncio_streams=True) as c:
            with pytest.raises(ServerError) as bad:
                await c.embed_tokens([[101, 2000, 102], [101, 10 ** 9, 102]])
            return str(bad.value), await c.embed_tokens([[101, 2000, 102]])

    message, ok = asyncio.run(main())
    assert "token id" in message.lower() or "vocab" in message.lower(), message
    assert ok.shape == (1, 384)


def test_a_cancelled_call_cancels_its_requests_at_the_server(server):
    """The worker's own session server (no other test uses it meanwhile); the call is cancelled a
    moment after its first chunks left, whatever the machine's load, so rose has a backlog then."""
    work = [[101] + [2000 + (i + j) % 500 for j in range(254)] + [102] for i in range(512)]   # 64 chunks
    wait_idle(server)
    seqs0, cancelled0 = rose_metric(server, "rose_sequences_total"), rose_metric(server, "rose_requests_cancelled_total")

    async def main():
        sent = asyncio.Event()
        async with AsyncEmbeddingClient(server.grpc_url, asyncio_streams=True, on_sent=sent.set) as c:
            task = asyncio.create_task(c.embed_tokens(work))
            await asyncio.wait_for(sent.wait(), 30)
            await asyncio.sleep(0.3)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return await c.embed_tokens(work[:3]), c.stats()

    out, stats = asyncio.run(main())
    assert out.shape == (3, 384) and all(s["inflight_tokens"] == 0 for s in stats.values())
    wait_idle(server)
    computed = rose_metric(server, "rose_sequences_total") - seqs0 - 3
    cancelled = rose_metric(server, "rose_requests_cancelled_total") - cancelled0
    print(f"{computed:.0f} of 512 sequences computed after the cancel, {cancelled:.0f} requests cancelled")
    assert cancelled >= 1 and computed < 384, (computed, cancelled)


def test_a_closed_connection_fails_what_is_pending_from_any_thread(server):
    ids = np.full(64 * 200, 2000, np.int32)
    lens = np.full(64, 200, np.int32)

    async def main():
        channel = AioChannel(server.grpc_url)
        conn = channel.stream()
        first = await conn.infer("rose", [("INPUT_IDS", ids[:3]), ("SEQ_LENS", np.array([3], np.int32))])
        pending = [conn.infer("rose", [("INPUT_IDS", ids), ("SEQ_LENS", lens)]) for _ in range(4)]
        closer = threading.Thread(target=channel.close)          # not the loop's thread
        closer.start()
        closer.join()
        results = await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), 30)
        await asyncio.wait_for(channel.closed, 30)
        late = await asyncio.gather(conn.infer("rose", [("INPUT_IDS", ids[:3]), ("SEQ_LENS", lens[:1] * 0 + 3)]),
                                    return_exceptions=True)
        return first, results, late[0], conn.outstanding

    first, results, late, outstanding = asyncio.run(main())
    assert first["EMBEDDINGS"].shape == (1, 384)
    assert all(isinstance(r, (ConnectionLost, dict)) for r in results), results
    assert any(isinstance(r, ConnectionLost) for r in results), results     # not all of 4 x 64 x 200 was done
    assert isinstance(late, ConnectionLost) and outstanding == 0
