"""rose_client: chunking, balancing and failover, first against fake replicas (every failure mode,
fast), then against three real tritonserver processes (order, equality with one server, a server
killed midway)."""
from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest

import rose_client.client as client_mod
import rose_client.replica as replica_mod
from rose_client import AllReplicasDown, AsyncEmbeddingClient, ConnectionLost, EmbeddingClient, ServerError
from rose_testing.compare import cos_dist
from rose_client.chunking import chunk_ranges, estimate_text_tokens

D = 8


# ------------------------------------------------------------------------------------ chunking
@pytest.mark.parametrize("costs,budget,max_items,expected", [
    ([500, 500, 500, 10, 10], 1024, 99, [(0, 2), (2, 5)]),
    ([3000, 1, 1], 1024, 99, [(0, 1), (1, 3)]),           # an oversize item gets a chunk of its own
    ([1] * 10, 1024, 4, [(0, 4), (4, 8), (8, 10)]),       # sequence cap
    ([], 10, 10, []),
])
def test_chunk_ranges(costs, budget, max_items, expected):
    assert chunk_ranges(costs, budget, max_items) == expected


def test_chunk_ranges_cover_everything_once_and_respect_the_budget():
    rng = random.Random(0)
    for _ in range(200):
        costs = [rng.randint(1, 700) for _ in range(rng.randint(1, 80))]
        budget = rng.randint(1, 3000)
        ranges = chunk_ranges(costs, budget, rng.randint(1, 50))
        assert [s for s, _ in ranges][1:] == [e for _, e in ranges][:-1] and ranges[0][0] == 0
        assert ranges[-1][1] == len(costs)
        for s, e in ranges:
            assert e - s == 1 or sum(costs[s:e]) <= budget


def test_estimate_and_client_import_nothing_of_the_server():
    assert estimate_text_tokens(400, 512) == 102 and estimate_text_tokens(10 ** 6, 512) == 512
    code = ("import sys; sys.path.insert(0, 'client'); import rose_client, rose_client.cli; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'rose_backend', 'rose_ensemble')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=client_mod.__file__.rsplit("/client/", 1)[0])


# ------------------------------------------------------------------------------------ fake replicas
class FakeCluster:
    """Stands in for the client's gRPC channels and their streams: answers `rose` requests with rows
    [first token id, length, ...] from a thread, after a delay; each url can be made to drop its
    stream, hang, or be overloaded."""

    def __init__(self, seed=0):
        self.rng = random.Random(seed)
        self.dead: set[str] = set()
        self.hang: set[str] = set()
        self.overload_p: dict[str, float] = {}
        self.drop_p: dict[str, float] = {}
        self.served: dict[str, int] = {}      # url -> sequences answered
        self.lock = threading.Lock()

    def channel(self, url, headers=None):
        cluster = self

        class FakeChannel:
            def __init__(self):
                self.url, self.streams = url, []

            def stream(self):
                conn = cluster.connection(url, self)
                self.streams.append(conn)
                return conn

            def close(self):
                for conn in self.streams:
                    conn.close()

        return FakeChannel()

    def connection(self, url, channel=None):
        cluster = self

        class Conn:
            def __init__(self):
                self.url, self.broken, self.pending, self.channel = url, None, [], channel

            @property
            def outstanding(self):
                return sum(not f.done() for f in self.pending)

            def cancel(self):
                self.close()

            def infer(self, model, inputs, outputs=None, parameters=None):
                fut = Future()
                if self.broken or url in cluster.dead:
                    self.broken = self.broken or ConnectionLost(f"{url}: connection refused")
                    fut.set_exception(self.broken)
                    return fut
                self.pending.append(fut)
                threading.Thread(target=self._answer, args=(fut, dict(inputs)), daemon=True).start()
                return fut

            def _answer(self, fut, inputs):
                with cluster.lock:
                    delay = cluster.rng.random() * 0.01
                    overload = cluster.rng.random() < cluster.overload_p.get(url, 0)
                    drop = cluster.rng.random() < cluster.drop_p.get(url, 0)
                time.sleep(delay)
                if url in cluster.hang or fut.done():
                    return
                if drop:
                    self.close()
                    return
                if overload:
                    fut.set_exception(ServerError(f"{url}: rose: overloaded: 9 tokens already queued; retry later"))
                    return
                lens = inputs["SEQ_LENS"]
                ids = inputs["INPUT_IDS"]
                first = ids[np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)]
                out = np.zeros((len(lens), D), np.float32)
                out[:, 0], out[:, 1] = first, lens
                with cluster.lock:
                    cluster.served[url] = cluster.served.get(url, 0) + len(lens)
                if not fut.done():
                    fut.set_result({"EMBEDDINGS": out})

            def close(self, wait=True):
                self.broken = self.broken or ConnectionLost(f"{url}: the server closed the stream")
                for f in self.pending:
                    if not f.done():
                        f.set_exception(self.broken)

        return Conn()


@pytest.fixture
def fake(monkeypatch):
    cluster = FakeCluster()
    monkeypatch.setattr(replica_mod, "Channel", cluster.channel)
    return cluster


def token_input(n, seed=0):
    rng = np.random.default_rng(seed)
    return [[i] + [7] * int(rng.integers(0, 300)) for i in range(n)]


def check_rows(out, seqs):
    assert out.shape == (len(seqs), D) and out.dtype == np.float32
    np.testing.assert_array_equal(out[:, 0], [s[0] for s in seqs])      # each row once, in order
    np.testing.assert_array_equal(out[:, 1], [len(s) for s in seqs])


URLS = "a:1,b:2,c:3"


def test_chunks_spread_over_replicas_in_order(fake):
    seqs = token_input(500)
    with EmbeddingClient(URLS, token_budget=1024, max_inflight_tokens=4096) as c:
        check_rows(c.embed_tokens(seqs), seqs)
        loads = [s["tokens"] for s in c.stats().values()]
    assert sum(loads) == sum(map(len, seqs)) and min(loads) > 0


def test_every_failure_mode_at_once_loses_and_duplicates_nothing(fake):
    fake.overload_p = {"a:1": 0.3}
    fake.drop_p = {"b:2": 0.1}
    seqs = token_input(800, seed=1)
    with EmbeddingClient(URLS, token_budget=512, max_inflight_tokens=2048, backoff=0.001, chunk_timeout=2) as c:
        check_rows(c.embed_tokens(seqs), seqs)
        fake.dead.add("c:3")
        check_rows(c.embed_tokens(seqs), seqs)
        assert c.stats()["c:3"]["failures"] >= 1


def test_a_hanging_replica_times_out_and_its_chunks_go_elsewhere(fake):
    fake.hang.add("b:2")
    seqs = token_input(60)
    with EmbeddingClient(URLS, token_budget=600, chunk_timeout=0.3, backoff=0.01) as c:
        t0 = time.monotonic()
        check_rows(c.embed_tokens(seqs), seqs)
        assert time.monotonic() - t0 < 10
    assert "b:2" not in fake.served


def test_all_replicas_down_names_them(fake):
    fake.dead.update(URLS.split(","))
    with EmbeddingClient(URLS, backoff=0.001) as c:
        with pytest.raises(AllReplicasDown, match=r"all 3 replicas are down: a:1 .*connection refused.*b:2.*c:3"):
            c.embed_tokens([[1, 2, 3]])


def test_bad_input_is_not_retried_and_names_its_positions():
    # a real error message shape, from a fake that rejects the chunk holding sequence 700
    class Rejecting:
        outstanding = 0

        def __init__(self, url, headers=None):
            self.url, self.broken, self.calls, self.channel = url, None, 0, self

        def stream(self):
            return self

        def infer(self, model, inputs, outputs=None, parameters=None):
            fut = Future()
            lens = dict(inputs)["SEQ_LENS"]
            if 700 in dict(inputs)["INPUT_IDS"]:
                fut.set_exception(ServerError(f"{self.url}: rose: INPUT_IDS[0] = 30522 is outside the vocabulary"))
            else:
                fut.set_result({"EMBEDDINGS": np.zeros((len(lens), D), np.float32)})
            return fut

        def close(self, wait=True):
            pass

        cancel = close

    orig = replica_mod.Channel
    replica_mod.Channel = Rejecting
    try:
        with EmbeddingClient("x:1", token_budget=100) as c:
            with pytest.raises(ServerError, match=r"outside the vocabulary \(inputs 7\d\d\.\.7\d\d of this call\)"):
                c.embed_tokens([[i] * 10 for i in range(1000)])
    finally:
        replica_mod.Channel = orig


def test_async_twin_with_concurrent_calls(fake):
    fake.drop_p = {"a:1": 0.05}
    calls = [token_input(100 + 10 * k, seed=k) for k in range(6)]

    async def main():
        async with AsyncEmbeddingClient(URLS, token_budget=700, backoff=0.001) as c:
            return await asyncio.gather(*(c.embed_tokens(s) for s in calls))

    for out, seqs in zip(asyncio.run(main()), calls):
        check_rows(out, seqs)


def test_many_threads_share_one_client_and_the_inflight_cap(fake):
    seqs = [token_input(150, seed=k) for k in range(8)]
    peak = {}
    with EmbeddingClient(URLS, token_budget=500, max_inflight_tokens=1000) as c:
        stop = threading.Event()

        def watch():
            while not stop.is_set():
                for url, s in c.stats().items():
                    peak[url] = max(peak.get(url, 0), s["inflight_tokens"])
                time.sleep(0.001)

        w = threading.Thread(target=watch)
        w.start()
        results = [None] * len(seqs)
        threads = [threading.Thread(target=lambda k=k: results.__setitem__(k, c.embed_tokens(seqs[k])))
                   for k in range(len(seqs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stop.set()
        w.join()
    for out, s in zip(results, seqs):
        check_rows(out, s)
    assert max(peak.values()) <= 1000


# ------------------------------------------------------------------------------------ real servers
@pytest.fixture(scope="module")
def three(replicas):
    """conftest's three session replicas (this module kills the second)."""
    return replicas


def mixed_texts(n, seed=0):
    rng = np.random.default_rng(seed)
    words = ("embedding server replica chunk token budget balance latency tail queue triton rose ivy "
             "tulip graph kernel batch ragged attention pooling vector search retrieval").split()
    return [f"{i}: " + " ".join(rng.choice(words, size=int(rng.integers(3, 41)))) for i in range(n)]


@pytest.mark.server
def test_three_servers_equal_one_server_in_order_and_survive_a_kill(three):
    texts = mixed_texts(300)                      # ~15 chunks of 512 tokens; the kill comes after 5
    urls = [s.grpc_url for s in three]
    with EmbeddingClient(urls[0], token_budget=1 << 20, max_chunk_seqs=4096) as one:
        ref = one.embed(texts)                                   # one request, one server
    with EmbeddingClient(urls, token_budget=512) as c:
        out = c.embed(texts)
        assert out.shape == ref.shape == (300, 384)
        assert cos_dist(out, ref).max() <= 1e-5
        assert all(s["chunks"] > 0 for s in c.stats().values())

        # kill one server once some chunks have come back; the same result, nothing lost or twice
        victim = three[1]
        before = sum(s["chunks"] for s in c.stats().values())

        def killer():
            while sum(s["chunks"] for s in c.stats().values()) < before + 5:
                time.sleep(0.005)
            victim.proc.kill()

        k = threading.Thread(target=killer)
        k.start()
        out2 = c.embed(texts * 3)                         # ~45 chunks: the kill comes well before the end
        k.join()
        assert victim.proc.poll() is not None
        # stopping a server whose tritonserver was SIGKILLed leaves none of its stubs or segments
        victim.stop()
        deadline = time.monotonic() + 10                  # SIGKILLed processes take a moment to go
        while [p for p in os.listdir("/proc") if p.isdigit() and _pgid(int(p)) == victim.proc.pid]:
            assert time.monotonic() < deadline, "stubs of the killed server are still running"
            time.sleep(0.1)
        assert not list(Path("/dev/shm").glob(victim.shm_prefix + "*"))
        assert out2.shape == (900, 384) and cos_dist(out2, np.concatenate([ref] * 3)).max() <= 1e-5
        assert c.stats()[victim.grpc_url]["failures"] >= 1

        # and the task prompt travels with every chunk
        q = c.embed(texts[:80], task="query")
        assert cos_dist(q, one_server(urls[0], texts[:80], task="query")).max() <= 1e-5


def _pgid(pid: int) -> int | None:
    """The process group of a live (not zombie) process, else None."""
    try:
        state, _ppid, pgrp = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[:3]
    except (OSError, ValueError):
        return None
    return None if state in ("Z", "X") else int(pgrp)


def one_server(url, texts, task=None):
    with EmbeddingClient(url, token_budget=1 << 20, max_chunk_seqs=4096) as one:
        return one.embed(texts, task=task)


@pytest.mark.server
def test_async_client_and_token_ids_on_real_servers(three, default_model_dir):
    from rose_ensemble.tokenization import TextTokenizer

    live = [s.grpc_url for s in three if s.proc.poll() is None]
    texts = mixed_texts(200, seed=3)
    tok = TextTokenizer.from_folder(default_model_dir)
    ids, lens = tok.encode(texts)
    token_lists = [a.tolist() for a in np.split(ids, np.cumsum(lens)[:-1])]

    async def main():
        async with AsyncEmbeddingClient(live, token_budget=300) as c:
            return await asyncio.gather(c.embed(texts), c.embed_tokens(token_lists))

    a, b = asyncio.run(main())
    ref = one_server(live[0], texts)
    assert cos_dist(a, ref).max() <= 1e-5 and cos_dist(b, ref).max() <= 1e-5

    # the tokenizer-backed count equals the server's own tokenization
    with EmbeddingClient(live, tokenizer=str(default_model_dir)) as c:
        assert c.count_tokens(texts) == lens.tolist()


def test_unreachable_servers_raise_a_clear_error():
    from support.ports import free_port
    urls = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    with EmbeddingClient(urls, backoff=0.01) as c:
        with pytest.raises(AllReplicasDown, match=f"all 2 replicas are down: {urls[0]} .*{urls[1]}"):
            c.embed(["hello"])
