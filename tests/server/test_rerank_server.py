"""Rerankers served end to end by a real tritonserver (CPU): `rerank`, `tokenize` pairs, `rose` scores.

One server per reranker kind (a module-scoped parametrized fixture: BERT cross-encoder, XLM-R
cross-encoder, Qwen3-Reranker), each on a random-weight folder from rose_testing, compared
with sentence-transformers' CrossEncoder.predict / the Qwen3-Reranker model card's code within 1e-4.
"""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from rose_testing.reranker_folders import reference_scores, words

pytestmark = pytest.mark.server

KINDS = ("tiny-bert-ce", "tiny-xlmr-ce", "tiny-qwen3-reranker")


@pytest.fixture(scope="module", params=KINDS)
def served(request, reranker_server):
    """Each kind's session server (conftest's reranker_server: small batches, so one request's pairs
    are spread over several forward passes)."""
    folder, srv = reranker_server(request.param)
    return request.param, folder, srv


@pytest.fixture
def client(served):
    from rose_client import EmbeddingClient
    c = EmbeddingClient(served[2].grpc_url, token_budget=1024)
    yield c
    c.close()


def _texts(name: str, rng: np.random.Generator, lengths) -> list[str]:
    if name == "tiny-bert-ce":                     # the real BERT vocabulary
        vocab = "the a rose server flower garden query passage red blue river city paris france capital of is".split()
        return [" ".join(rng.choice(vocab, size=n)) for n in lengths]
    return [words(rng, n) for n in lengths]


def test_scores_match_peer_library_mixed_lengths_and_empty(served, client):
    name, folder, _ = served
    rng = np.random.default_rng(1)
    query = _texts(name, rng, [6])[0]
    docs = _texts(name, rng, [0, 1, 3, 40, 300, 7, 0, 120])   # empty, short, over-long (cut), mixed
    got = client.rerank(query, docs)
    ref = reference_scores(folder, query, docs)
    assert got.shape == (len(docs),) and got.dtype == np.float32
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=0)
    assert np.ptp(ref) > 1e-3                                  # the scores tell documents apart


def test_thousand_documents_in_one_call(served, client):
    name, folder, _ = served
    rng = np.random.default_rng(2)
    query = _texts(name, rng, [5])[0]
    docs = _texts(name, rng, rng.integers(0, 60, size=1000))
    got = client.rerank(query, docs)
    ref = reference_scores(folder, query, docs, batch_size=64)
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=0)
    top = client.rerank(query, docs, top_k=5, return_documents=True)
    order = np.argsort(-got, kind="stable")[:5]
    assert [i for i, _, _ in top] == order.tolist()
    assert [d for _, _, d in top] == [docs[i] for i in order]
    np.testing.assert_allclose([s for _, s, _ in top], got[order], atol=1e-6)


def test_rerank_ensemble_directly_and_async_client(served):
    from rose_client import AsyncEmbeddingClient
    from rose_client.transport import StreamConnection
    name, folder, srv = served
    rng = np.random.default_rng(3)
    query, *docs = _texts(name, rng, [4, 10, 20, 0])
    conn = StreamConnection(srv.grpc_url)
    try:
        out = conn.infer("rerank", [("QUERY", [query]), ("DOCUMENTS", docs)]).result(60)
    finally:
        conn.close()
    ref = reference_scores(folder, query, docs)
    np.testing.assert_allclose(out["SCORES"], ref, atol=1e-4, rtol=0)

    async def go():
        async with AsyncEmbeddingClient(srv.grpc_url) as c:
            return await c.rerank(query, docs, top_k=2)
    top = asyncio.run(go())
    assert [i for i, _ in top] == np.argsort(-ref, kind="stable")[:2].tolist()


def test_tokenize_pairs_and_rose_scores(served):
    """`tokenize` makes the pairs (segment ids for BERT), `rose` scores them from token ids."""
    from rose_client.transport import StreamConnection
    name, folder, srv = served
    rng = np.random.default_rng(4)
    query, *docs = _texts(name, rng, [4, 10, 30])
    conn = StreamConnection(srv.grpc_url)
    try:
        tok = conn.infer("tokenize", [("QUERY", [query]), ("DOCUMENTS", docs)]).result(60)
        ids, lens, types = tok["INPUT_IDS"], tok["SEQ_LENS"], tok["TOKEN_TYPE_IDS"]
        assert len(lens) == 2 and ids.shape == types.shape == (lens.sum(),)
        assert (types.max() == 1) == (name == "tiny-bert-ce")
        scores = conn.infer("rose", [("INPUT_IDS", ids), ("SEQ_LENS", lens), ("TOKEN_TYPE_IDS", types)]).result(60)
        np.testing.assert_allclose(scores["SCORES"], reference_scores(folder, query, docs), atol=1e-4, rtol=0)
        if name == "tiny-bert-ce":           # without segment ids the BERT scores change
            plain = conn.infer("rose", [("INPUT_IDS", ids), ("SEQ_LENS", lens)]).result(60)["SCORES"]
            assert np.abs(plain - scores["SCORES"]).max() > 1e-4
        with pytest.raises(Exception, match="TOKEN_TYPE_IDS"):
            conn.infer("rose", [("INPUT_IDS", ids), ("SEQ_LENS", lens), ("TOKEN_TYPE_IDS", types + 2)]).result(60)
        with pytest.raises(Exception, match="TOKEN_TYPE_IDS holds"):
            conn.infer("rose", [("INPUT_IDS", ids), ("SEQ_LENS", lens), ("TOKEN_TYPE_IDS", types[:-1])]).result(60)
    finally:
        conn.close()


def test_bad_requests_get_clear_errors_and_the_server_keeps_serving(served, client):
    from rose_client.transport import ServerError, StreamConnection
    name, folder, srv = served
    rng = np.random.default_rng(5)
    long_query = _texts(name, rng, [400])[0]
    with pytest.raises(ServerError, match="the query is too long"):
        client.rerank(long_query, ["a document"])
    with pytest.raises(ServerError, match=r"QUERY\[0\] is an empty string"):
        client.rerank("", ["a document"])
    if name != "tiny-qwen3-reranker":
        with pytest.raises(ServerError, match="takes no INSTRUCTION"):
            client.rerank("a query", ["a document"], instruction="be strict")
    # one stream each: answers that Triton 2.51 writes at once (refusals, `tokenize`'s) can abort it
    # when they meet another write on one stream (gRPC's proto_buffer_writer.h:65 "!byte_buffer->Valid()";
    # docs/OPERATIONS.md, "A Python stub dies"), a server bug this test is not about
    for model, inputs, message in (("rerank", [("QUERY", ["q"])], "missing input DOCUMENTS"),
                                   ("tokenize", [("QUERY", ["a", "b"]), ("DOCUMENTS", ["d"])],
                                    "unexpected shape for input .QUERY.")):
        conn = StreamConnection(srv.grpc_url)
        try:
            with pytest.raises(Exception, match=message):
                conn.infer(model, inputs).result(60)
        finally:
            conn.close()
    assert client.rerank("a query", []).shape == (0,)
    query, doc = _texts(name, rng, [3, 5])
    np.testing.assert_allclose(client.rerank(query, [doc]), reference_scores(folder, query, [doc]), atol=1e-4)


def test_qwen3_instruction_changes_scores_as_the_card_does(served, client):
    name, folder, _ = served
    if name != "tiny-qwen3-reranker":
        pytest.skip("only Qwen3-Reranker takes an instruction")
    rng = np.random.default_rng(6)
    query, *docs = _texts(name, rng, [4, 10, 25, 0])
    got = client.rerank(query, docs, instruction="w11 w12 w13")
    ref = reference_scores(folder, query, docs, instruction="w11 w12 w13")
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=0)
    assert np.abs(got - reference_scores(folder, query, docs)).max() > 1e-5


def test_served_models_follow_the_folder_kind(served):
    """A reranker folder serves rerank, tokenize and rose, and no `embed`."""
    srv = served[2]
    assert srv._http("/v2/models/rerank/ready") == 200
    assert srv._http("/v2/models/embed/ready") != 200
