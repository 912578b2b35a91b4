"""TEI's /embed_sparse (and /embed) on the gateway in front of the session's BGE-M3-shaped server
(conftest's m3_deployment), against FlagEmbedding's BGEM3FlagModel lexical weights and dense vectors."""
from __future__ import annotations

import httpx
import numpy as np
import pytest
from support.gateway import gateway_for
from support.server import M3_MAX_LEN

from rose_testing.m3_folders import flag_m3

pytestmark = pytest.mark.server
TEXTS = ["the rose is a flower", "the rose the rose the rose is red red red", "a",
         " ".join(["hybrid search with lexical weight and dense vector"] * 12)]       # truncated at M3_MAX_LEN


@pytest.fixture(scope="module")
def served(m3_deployment):
    folder, _, srv = m3_deployment
    with gateway_for(srv.grpc_url, "tei-m3", extra_args=["--model", str(folder)]) as gw:
        with httpx.Client(base_url=gw.url, timeout=120) as http:
            yield folder, http


@pytest.fixture(scope="module")
def reference(served):
    ref = flag_m3(served[0], M3_MAX_LEN).encode(TEXTS, max_length=M3_MAX_LEN, return_dense=True, return_sparse=True,
                                    return_colbert_vecs=False)
    return ref["dense_vecs"], [{int(k): float(v) for k, v in w.items()} for w in ref["lexical_weights"]]


def test_embed_sparse_matches_flagembedding_lexical_weights(served, reference):
    _, http = served
    got = http.post("/embed_sparse", json={"inputs": TEXTS}).json()
    assert len(got) == len(TEXTS)
    for i, (ours, want) in enumerate(zip(got, reference[1])):
        assert [v["index"] for v in ours] == sorted(want), f"input {i}"              # TEI: ascending index
        np.testing.assert_allclose([v["value"] for v in ours], [want[k] for k in sorted(want)], atol=1e-4)
    ids = http.post("/tokenize", json={"inputs": TEXTS[0]}).json()[0]
    by_ids = http.post("/embed_sparse", json={"inputs": [t["id"] for t in ids]}).json()
    assert [v["index"] for v in by_ids[0]] == [v["index"] for v in got[0]]
    np.testing.assert_allclose([v["value"] for v in by_ids[0]], [v["value"] for v in got[0]], atol=1e-5)


def test_embed_matches_flagembedding_dense(served, reference):
    got = np.asarray(served[1].post("/embed", json={"inputs": TEXTS}).json(), np.float32)
    assert got.shape == reference[0].shape
    assert (1 - np.sum(got * reference[0], axis=1)).max() <= 1e-4
