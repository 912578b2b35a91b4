"""The lanes through a real tritonserver (CPU, gRPC streams): the request parameter `lane` on `rose`
and through the `embed` and `rerank` ensembles, which forward request parameters to their steps;
a query overtakes bulk work queued before it; the per-lane metrics; with the shipped settings and
weights, queries are answered while one huge `embed` is being computed (bulk_batch_ms)."""
from __future__ import annotations

import time

import numpy as np
import pytest

from rose_client.transport import ServerError, StreamConnection
from rose_testing.waiting import wait_until
from rose_testing.compare import cos_dist
from support.metrics import metric, series, wait_idle
from support.requests import rose_inputs

pytestmark = pytest.mark.server

LANE_ERROR = r"request parameter 'lane' must be one of interactive, bulk, got 'fast'"


ids_request = rose_inputs


def lane_value(srv, name: str, lane: str, model: str = "rose", le: str | None = None) -> float:
    return metric(srv, name, lane=lane, model=model, **({"le": le} if le else {}))


@pytest.mark.parametrize("lane,n,overtakes", [
    ("bulk", 32, True),              # named bulk: the query goes first
    (None, 18, True),                # 9216 tokens > bulk_threshold_tokens (8192): bulk by size
    ("interactive", 32, False)])     # one lane: first come, first served
def test_a_query_overtakes_bulk_queued_before_it(server, lane, n, overtakes):
    big_conn, q_conn = StreamConnection(server.grpc_url), StreamConnection(server.grpc_url)
    finished: dict[str, float] = {}
    try:
        big_inputs, q_inputs = ids_request(n, n, 512), ids_request(1, 1, 16)
        sent = time.monotonic()
        big = big_conn.infer("rose", big_inputs, parameters={"lane": lane} if lane else None)
        big.add_done_callback(lambda f: finished.setdefault("big", time.monotonic()))
        time.sleep(0.1)                                      # the big request is admitted first
        q = q_conn.infer("rose", q_inputs)
        q.add_done_callback(lambda f: finished.setdefault("query", time.monotonic()))
        big_emb, q_emb = big.result(300)["EMBEDDINGS"], q.result(300)["EMBEDDINGS"]
        if overtakes:      # answered batches before the big request (it takes 18 or more batches of 512)
            assert finished["query"] < finished["big"] - 0.1, finished
        else:              # behind the big request (in its last batch at the earliest): answered in the
            # last quarter of the big request's time, whatever the host's speed (the big answer's
            # assembly may still finish after the query's)
            assert finished["query"] > sent + 0.75 * (finished["big"] - sent), (sent, finished)
        # nothing lost or reordered: the same rows as the requests sent alone, without a lane
        np.testing.assert_allclose(big_emb, big_conn.infer("rose", big_inputs).result(300)["EMBEDDINGS"], atol=1e-5)
        np.testing.assert_allclose(q_emb, q_conn.infer("rose", q_inputs).result(60)["EMBEDDINGS"], atol=1e-5)
        assert big_emb.shape == (n, 384)
    finally:
        big_conn.close()
        q_conn.close()


def test_embed_forwards_the_lane_and_the_metrics_count_it(server):
    conn = StreamConnection(server.grpc_url)
    try:
        time.sleep(1.5)                                       # each series refreshed once a second
        before = lane_value(server, "rose_lane_batches_total", "bulk")
        waits_before = lane_value(server, "rose_lane_wait_seconds_count", "bulk")
        texts = [f"document number {i} about roses and servers" for i in range(20)]
        plain = conn.infer("embed", [("TEXT", texts)]).result(120)["EMBEDDINGS"]
        bulk = conn.infer("embed", [("TEXT", texts)], parameters={"lane": "bulk"}).result(120)["EMBEDDINGS"]
        np.testing.assert_allclose(bulk, plain, atol=1e-5)
        with pytest.raises(ServerError, match=LANE_ERROR):
            conn.infer("embed", [("TEXT", texts)], parameters={"lane": "fast"}).result(60)
        with pytest.raises(ServerError, match=LANE_ERROR):
            conn.infer("rose", ids_request(2, 1, 8), parameters={"lane": "fast"}).result(60)
        assert conn.infer("embed", [("TEXT", ["still serving"])]).result(60)["EMBEDDINGS"].shape == (1, 384)
        wait_until(lambda: lane_value(server, "rose_lane_batches_total", "bulk") >= before + 1
                   and lane_value(server, "rose_lane_wait_seconds_count", "bulk") == waits_before + 1
                   and lane_value(server, "rose_lane_wait_seconds_bucket", "bulk", le="+Inf") == waits_before + 1
                   and lane_value(server, "rose_lane_wait_seconds_count", "interactive") >= 2
                   and lane_value(server, "rose_lane_queue_tokens", "bulk") == 0, 10, interval=0.2)
        # (each series is sent on its own turn of the once-a-second refresh, so the queue gauge can
        # still show the bulk request's 108 tokens a moment after the counters show it done)
        assert lane_value(server, "rose_lane_batches_total", "bulk") >= before + 1
        assert lane_value(server, "rose_lane_wait_seconds_count", "bulk") == waits_before + 1
        assert lane_value(server, "rose_lane_wait_seconds_bucket", "bulk", le="+Inf") == waits_before + 1
        assert lane_value(server, "rose_lane_wait_seconds_count", "interactive") >= 2
        assert lane_value(server, "rose_lane_queue_tokens", "bulk") == 0
        assert any(labels.get("lane") for labels, _ in series(server, "rose_lane_queue_tokens"))
    finally:
        conn.close()


def test_rerank_forwards_the_lane(reranker_server):
    from rose_testing.reranker_folders import words
    _, srv = reranker_server("tiny-xlmr-ce")
    rng = np.random.default_rng(3)
    query, docs = words(rng, 5), [words(rng, k) for k in (3, 40, 12, 7)]
    inputs = [("QUERY", [query]), ("DOCUMENTS", docs)]          # ~100 tokens: one batch
    wait_idle(srv)                                               # the session server's counts hold still
    before = lane_value(srv, "rose_lane_batches_total", "bulk")
    conn = StreamConnection(srv.grpc_url)
    try:
        plain = conn.infer("rerank", inputs).result(120)["SCORES"]
        bulk = conn.infer("rerank", inputs, parameters={"lane": "bulk"}).result(120)["SCORES"]
        np.testing.assert_allclose(bulk, plain, atol=1e-6)
        with pytest.raises(ServerError, match=LANE_ERROR):
            conn.infer("rerank", inputs, parameters={"lane": "fast"}).result(60)
        np.testing.assert_allclose(conn.infer("rerank", inputs).result(60)["SCORES"], plain, atol=1e-6)
        wait_until(lambda: lane_value(srv, "rose_lane_batches_total", "bulk") > before, 10, interval=0.2)
        assert lane_value(srv, "rose_lane_batches_total", "bulk") == before + 1
    finally:
        conn.close()


N_HUGE = 36                # x 256 tokens: 9,216 > the shipped bulk_threshold_tokens (8,192)
WORDS = ("rose garden server query index vector model token batch answer river city music school house "
         "world people system film season number state government university region early second").split()


def test_queries_are_answered_while_a_huge_embed_is_computed_on_the_shipped_settings(shared_server,
                                                                                     shipped_sentence_model):
    """The shipped repository as it is (bulk_batch_ms auto: 100 ms on the CPU) serving all-MiniLM-L6-v2's
    real weights: one `embed` of 36 texts of 8,000 characters (9,216 tokens after truncation at 256:
    over bulk_threshold_tokens, 8,192, so bulk by size; seconds of this machine's CPU, several times
    what the queries take). Queries sent once its forward passes have begun are each answered while it
    is still being computed (with bulk_batch_ms=0 its first batch held all its tokens, no query being
    recent, and each query waited for all of it); its rows match sentence-transformers."""
    srv = shared_server(None, name="shipped")
    rng = np.random.default_rng(8)
    texts = [" ".join(WORDS[i] for i in rng.integers(0, len(WORDS), 1600))[:8000] for _ in range(N_HUGE)]
    big_conn, q_conn = StreamConnection(srv.grpc_url), StreamConnection(srv.grpc_url)
    try:
        q_conn.infer("embed", [("TEXT", ["warm"])]).result(60)
        before = lane_value(srv, "rose_lane_batches_total", "bulk")        # the warm-up request is interactive
        big = big_conn.infer("embed", [("TEXT", texts)])  # no lane named: bulk by size
        # its first bulk batch counted (the metrics refresh about once a second): its passes have
        # begun, and it is bulk (were it not, this would wait until it was done and the test fail)
        assert wait_until(lambda: big.done() or lane_value(srv, "rose_lane_batches_total", "bulk") > before, 120,
                          interval=0.05)
        queries, answers, answered_while_running = [f"query {i} about {WORDS[i]}" for i in range(3)], [], []
        for text in queries:                               # one after another, each once the last is answered
            answers.append(q_conn.infer("embed", [("TEXT", [text])]).result(120)["EMBEDDINGS"][0])
            answered_while_running.append(not big.done())
        emb = big.result(600)["EMBEDDINGS"]
        assert answered_while_running == [True] * 3, answered_while_running
        assert emb.shape == (N_HUGE, 384)
        assert cos_dist(emb, shipped_sentence_model.encode(texts)).max() <= 1e-4
        assert cos_dist(np.stack(answers), shipped_sentence_model.encode(queries)).max() <= 1e-4
    finally:
        big_conn.close()
        q_conn.close()


def test_every_scrape_of_the_wait_histogram_is_one_snapshot(server):
    """Under load (four clients of short requests, one of bulk ones), each of many scrapes of
    rose_lane_wait_seconds agrees with itself: per lane and instance the buckets never fall as `le`
    grows, the +Inf bucket is _count, and counts only grow from one scrape to the next."""
    import threading

    from support.metrics import scrape
    stop, errors = threading.Event(), []

    def client(n: int, length: int, lane: str | None) -> None:
        conn = StreamConnection(server.grpc_url)
        try:
            i = 0
            while not stop.is_set():
                conn.infer("rose", ids_request(i, n, length), parameters={"lane": lane} if lane else None).result(120)
                i += 1
        except Exception as e:              # reported below: the load must run
            errors.append(e)
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(1, 16, None)) for _ in range(4)]
    threads.append(threading.Thread(target=client, args=(8, 256, "bulk")))
    for t in threads:
        t.start()
    snapshots = []
    try:
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            snapshots.append(scrape(server))
            time.sleep(0.02)
    finally:
        stop.set()
        for t in threads:
            t.join(150)
    assert not errors, errors
    last: dict = {}
    name = "rose_lane_wait_seconds"
    for text in snapshots:
        hist: dict = {}
        for line in text.splitlines():
            if not line.startswith(name) or line.startswith("#"):
                continue
            head, value = line.rsplit(" ", 1)
            labels = dict(part.split("=", 1) for part in head[head.index("{") + 1:-1].split(","))
            labels = {k: v.strip('"') for k, v in labels.items()}
            key = (labels.get("model"), labels.get("lane"))
            h = hist.setdefault(key, {"buckets": []})
            if head.startswith(name + "_bucket"):
                le = labels["le"]
                h["buckets"].append((float("inf") if le == "+Inf" else float(le), float(value)))
            elif head.startswith(name + "_count"):
                h["count"] = float(value)
        assert hist, text
        for key, h in hist.items():
            counts = [c for _, c in sorted(h["buckets"])]
            assert counts == sorted(counts), (key, sorted(h["buckets"]))
            assert counts[-1] == h["count"], (key, counts[-1], h["count"])
            assert h["count"] >= last.get(key, 0), (key, h["count"], last.get(key))
            last[key] = h["count"]
    assert last[("rose", "interactive")] > 0 and last[("rose", "bulk")] > 0, last
