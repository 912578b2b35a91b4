"""TEI's /rerank (and POST / on a reranker) on the gateway in front of the session's BERT
cross-encoder server (conftest's reranker_server), against sentence-transformers' CrossEncoder.predict
in TEI's order; the Cohere shape still answered on the same route."""
from __future__ import annotations

import httpx
import numpy as np
import pytest
from support.gateway import gateway_for

from rose_testing.reranker_folders import reference_scores

pytestmark = pytest.mark.server
QUERY = "what is the capital of france"
DOCS = ["paris is the capital of france", "the river flows through the city", "",
        "a red rose in the garden", "paris is the capital of france", "blue flower"]


@pytest.fixture(scope="module")
def served(reranker_server):
    folder, srv = reranker_server("tiny-bert-ce")
    with gateway_for(srv.grpc_url, "tei-rerank", extra_args=["--model", str(folder)]) as gw:
        with httpx.Client(base_url=gw.url, timeout=120) as http:
            yield folder, http


def test_rerank_matches_cross_encoder_in_teis_order(served):
    folder, http = served
    want = reference_scores(folder, QUERY, DOCS)
    got = http.post("/rerank", json={"query": QUERY, "texts": DOCS}).json()
    assert sorted(r["index"] for r in got) == list(range(len(DOCS))) and all("text" not in r for r in got)
    scores = np.array([r["score"] for r in got], np.float32)
    np.testing.assert_allclose(scores, want[[r["index"] for r in got]], atol=1e-4)
    assert np.all(np.diff(scores) <= 0)                                   # best first
    with_text = http.post("/", json={"query": QUERY, "texts": DOCS, "return_text": True}).json()
    assert [(r["index"], r["text"]) for r in with_text] == [(r["index"], DOCS[r["index"]]) for r in got]


def test_equal_scores_in_teis_order():
    """TEI sorts ascending (a stable sort) and reverses: of equal scores the later index comes first."""
    from rose_gateway.tei_requests import tei_order
    assert tei_order(np.array([0.5, 0.9, 0.5, 0.1, 0.9], np.float32)) == [4, 1, 2, 0, 3]


def test_root_dispatches_by_kind_and_cohere_shape_still_served(served):
    _, http = served
    r = http.post("/", json={"inputs": "a text"})                         # a reranker's / is rerank, as TEI's
    assert r.status_code == 422 and r.json()["error_type"] == "Validation" and "query" in r.json()["error"]
    cohere = http.post("/rerank", json={"query": QUERY, "documents": DOCS[:2], "top_n": 1}).json()
    assert cohere["results"][0]["index"] == 0 and "relevance_score" in cohere["results"][0]
    info = http.get("/info").json()
    assert info["model_type"] == {"reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}}


@pytest.mark.parametrize("path,body,status,field", [
    ("/rerank", {"query": QUERY, "texts": DOCS, "raw_scores": True}, 422, "raw_scores"),
    ("/rerank", {"query": QUERY, "texts": DOCS, "truncate": False}, 422, "truncate"),
    ("/rerank", {"query": QUERY, "texts": DOCS, "truncation_direction": "left"}, 422, "truncation_direction"),
    ("/rerank", {"query": QUERY, "texts": ["a", 3]}, 422, "texts[1]"),
    ("/rerank", {"texts": ["a"]}, 422, "query"),
    ("/embed", {"inputs": "a"}, 424, "embedding model"),
    ("/embed_sparse", {"inputs": "a"}, 424, "embedding model"),
])
def test_refusals_name_the_field(served, path, body, status, field):
    r = served[1].post(path, json=body)
    assert r.status_code == status and field in r.json()["error"], r.text
