"""rose_client against the session's tritonserver: a call that ends before its answer (an asyncio
task cancelled, a timeout) sends nothing more and cancels its streams, so the server drops its work
(counted in `rose`'s metrics); other calls on the same client are not disturbed. The session server
is this worker's own, so the counts are the test's; the task is cancelled once rose has a backlog
of its chunks (not after a fixed time, which on a loaded machine could come before any reached it)."""
from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from support.metrics import rose_metric, wait_for_backlog, wait_idle

from rose_testing.compare import cos_dist
from rose_client import AsyncEmbeddingClient, EmbeddingClient

pytestmark = pytest.mark.server


def sequences(n: int, length: int = 256, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[101] + rng.integers(2000, 9000, length - 2).tolist() + [102] for _ in range(n)]


class Counted:
    """Sequences computed and requests cancelled by the server from here on."""

    def __init__(self, server):
        wait_idle(server)
        self.server = server
        self.seqs0 = rose_metric(server, "rose_sequences_total")
        self.cancelled0 = rose_metric(server, "rose_requests_cancelled_total")

    def after_idle(self) -> tuple[float, float]:
        wait_idle(self.server)
        return (rose_metric(self.server, "rose_sequences_total") - self.seqs0,
                rose_metric(self.server, "rose_requests_cancelled_total") - self.cancelled0)


def test_a_cancelled_task_cancels_its_requests_at_the_server(server):
    work = sequences(512)                     # 64 chunks of 2048 tokens, all sent at once: seconds of CPU
    counted = Counted(server)

    async def main():
        async with AsyncEmbeddingClient(server.grpc_url) as c:
            task = asyncio.create_task(c.embed_tokens(work))
            await asyncio.to_thread(wait_for_backlog, server)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return await c.embed_tokens(work[:3])            # the client goes on serving

    assert asyncio.run(main()).shape == (3, 384)
    computed, cancelled = counted.after_idle()
    print(f"cancelled with a backlog: {computed - 3:.0f} of 512 sequences computed, {cancelled:.0f} requests cancelled")
    assert cancelled >= 1 and computed - 3 < 384, (computed, cancelled)


def test_a_timed_out_call_cancels_its_requests(server):
    """1024 sequences (128 chunks, all sent at once: ~10 s of this machine's CPU alone) and a 1.5 s
    timeout: fewer than 768 computed shows the call cancelled what it had sent. On a loaded machine
    most chunks may not have reached rose's pool by then (a full run: 12 computed, none counted
    cancelled by rose), so rose's own cancel count is not required here."""
    counted = Counted(server)
    with EmbeddingClient(server.grpc_url, timeout=1.5) as c:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            c.embed_tokens(sequences(1024, seed=1))
        assert time.monotonic() - t0 < 6
    computed, cancelled = counted.after_idle()
    assert computed < 768, (computed, cancelled)


def test_cancelling_one_call_leaves_the_others_answered(server):
    work, other = sequences(512, seed=2), sequences(20, 100, seed=3)     # work: seconds of CPU, in flight at the cancel
    with EmbeddingClient(server.grpc_url) as ref:
        want = ref.embed_tokens(other)

    async def main():
        async with AsyncEmbeddingClient(server.grpc_url) as c:
            doomed = asyncio.create_task(c.embed_tokens(work))
            kept = asyncio.create_task(c.embed_tokens(other))
            await asyncio.sleep(0.3)
            doomed.cancel()
            got = await kept
            await asyncio.gather(doomed, return_exceptions=True)       # its cancellation has run
            return got, c.stats()

    got, stats = asyncio.run(main())
    assert cos_dist(got, want).max() <= 1e-5
    assert all(s["inflight_tokens"] == 0 for s in stats.values())     # the cancelled call's tokens released
