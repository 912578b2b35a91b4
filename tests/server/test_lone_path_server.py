"""The lone path through a real tritonserver: a one-sequence query on an idle `rose` instance is
replayed and answered inside execute() (EmbeddingService.run_lone), and gives the batch path's answer.

The server runs `inline_execute=true` with (stand-in) graphs on the CPU, as a GPU instance runs by
default; `precapture` 1:64 captures the one-sequence configuration of up to 64 tokens before READY.
Which path a request took is read from the `rose_lone_requests_total` counter, never from a timing.
"""
from __future__ import annotations

import time

import numpy as np
import pytest
from support.metrics import metric
from support.requests import random_ids

from rose_client import EmbeddingClient, ServerError
from rose_testing.compare import cos_dist
from rose_testing.waiting import wait_until

pytestmark = pytest.mark.server
LONE_PARAMS = {"rose": {"inline_execute": "true", "cuda_graphs": "on", "precapture": "1:64",
                        "max_batch_tokens": "512", "max_batch_seqs": "32"}}


@pytest.fixture(scope="module")
def lone_server(shared_server, minilm_shaped_dir):
    return shared_server(LONE_PARAMS, model_dir=str(minilm_shaped_dir), name="lone")


def lone_count(srv, expected: float | None = None) -> float:
    """rose_lone_requests_total once the polled metrics (refreshed every second) show `expected`, or
    (None) once it holds still over a refresh: what earlier requests left."""
    if expected is not None:
        wait_until(lambda: metric(srv, "rose_lone_requests_total") == expected, 15, interval=0.2)
        return metric(srv, "rose_lone_requests_total")
    last = metric(srv, "rose_lone_requests_total")
    while True:
        time.sleep(1.2)
        now = metric(srv, "rose_lone_requests_total")
        if now == last:
            return now
        last = now


def test_lone_queries_take_the_lone_path_and_answer_as_the_batch_path(lone_server, server):
    before = lone_count(lone_server)
    rng = np.random.default_rng(5)
    queries = [random_ids(rng, 1, n)[0].tolist() for n in (5, 33, 64)]
    with EmbeddingClient(lone_server.grpc_url) as lone, EmbeddingClient(server.grpc_url) as batch:
        got = np.concatenate([lone.embed_tokens([q]) for q in queries])       # one at a time
        want = batch.embed_tokens(queries)                                    # the session server, batched
    assert cos_dist(got, want).max() <= 1e-5
    assert lone_count(lone_server, before + len(queries)) == before + len(queries)


def test_what_the_lone_path_does_not_take_goes_the_batch_way(lone_server, server):
    """Two sequences, an option (DIMENSIONS) and a configuration not yet captured (65 tokens) still
    answer correctly; none of them is counted as lone."""
    rng = np.random.default_rng(6)
    two = [random_ids(rng, 1, 20)[0].tolist(), random_ids(rng, 1, 30)[0].tolist()]
    longer = random_ids(rng, 1, 65)[0].tolist()
    with EmbeddingClient(lone_server.grpc_url) as lone, EmbeddingClient(server.grpc_url) as batch:
        before = lone_count(lone_server)
        assert cos_dist(lone.embed_tokens(two), batch.embed_tokens(two)).max() <= 1e-5
        cut, full = lone.embed_tokens([two[0]], dimensions=64), batch.embed_tokens([two[0]])
        assert cut.shape == (1, 64) and cos_dist(cut, full[:, :64]).max() <= 1e-5
        assert cos_dist(lone.embed_tokens([longer]), batch.embed_tokens([longer])).max() <= 1e-5
        assert lone_count(lone_server) == before


def test_bad_input_is_refused_before_the_lone_path(lone_server):
    with EmbeddingClient(lone_server.grpc_url) as c, pytest.raises(ServerError, match=r"outside the vocabulary"):
        c.embed_tokens([[101, 10 ** 6, 102]])
    with EmbeddingClient(lone_server.grpc_url) as c:                         # and it keeps serving
        assert c.embed_tokens([[101, 2000, 102]]).shape == (1, 384)


def test_a_one_text_embed_takes_the_lone_path_too(lone_server, sentence_model):
    """The `embed` ensemble hands `rose` the ids and lengths alone, so one text is a lone query."""
    before = lone_count(lone_server)
    texts = ["a query about embeddings", "another one"]
    with EmbeddingClient(lone_server.grpc_url) as c:
        got = np.concatenate([c.embed([t]) for t in texts])
    assert cos_dist(got, sentence_model.encode(texts)).max() <= 1e-4
    assert lone_count(lone_server, before + 2) == before + 2


@pytest.mark.parametrize("which", ["lone", "default"])
def test_many_clients_get_their_own_rows(which, lone_server, server, minilm_shaped_dir):
    """The cross-talk checker through a real server: one client with pauses (the lone path on the
    lone server), then bursts of eight clients; every answer against its own request's rows from an
    in-process eager engine. `lone`: inline_execute with graphs; `default`: neither (the CPU's auto)."""
    import threading

    from rose_backend.config import ModelConfig
    from rose_backend.engine.engine import Engine
    from rose_backend.engine.options import EngineOptions
    from rose_testing.cross_talk import distinct_requests, reference_rows, run_clients

    srv = lone_server if which == "lone" else server
    requests = distinct_requests(7, 16 + 4 * 32, (1000, 30000), max_seqs=2, lengths=(3, 60))
    local, clients = threading.local(), []

    def embed(seqs):
        if not hasattr(local, "client"):
            local.client = EmbeddingClient(srv.grpc_url)
            clients.append(local.client)
        return local.client.embed_tokens(seqs)

    before = lone_count(srv)
    try:
        reports = [run_clients(embed, requests[:16], clients=1, pause_s=0.01)]
        for start in range(16, len(requests), 32):
            reports.append(run_clients(embed, requests[start:start + 32], clients=8))
    finally:
        for c in clients:
            c.close()
    eager = Engine(ModelConfig.from_folder(minilm_shaped_dir), "cpu", EngineOptions(graphs=False))
    for report in reports:
        report.check(reference_rows(eager.embed, report.requests))
    if which == "lone":
        assert lone_count(srv) > before                 # the lone path was among those checked
