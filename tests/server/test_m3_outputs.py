"""BGE-M3's dense + sparse + ColBERT outputs end to end (one real tritonserver for the module),
against FlagEmbedding's own BGEM3FlagModel (M3Embedder) on a small random-weight XLM-R folder with
random heads (rose_testing/m3_folders.py).

FlagEmbedding is imported without its package __init__: FlagEmbedding 1.4.2's __init__ imports
every reranker, and one of them (modeling_minicpm_reranker) imports
transformers.modeling_attn_mask_utils, which transformers 5 no longer has. The embedder code
used here (inference/embedder/encoder_only/m3.py and what it imports) is FlagEmbedding's own.
"""
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from support.server import M3_MAX_LEN

from rose_testing.m3_folders import flag_m3

from rose_client import EmbeddingClient, ServerError, StreamConnection

pytestmark = pytest.mark.server

MAX_LEN = M3_MAX_LEN          # the session's M3 folder (conftest's m3_deployment)
TEXTS = [
    "the rose is a flower",
    "the rose the rose the rose is red red red",                    # repeated ids: max weight per id
    # special tokens written in the text (not <pad>: Hugging Face's XLM-R numbers the positions after
    # a pad id differently, a difference of the encoder's position ids, not of these outputs)
    "<s> special tokens </s> in <mask> text <unk>",
    " ".join(["hybrid search with lexical weight and dense vector"] * 12),   # truncated at MAX_LEN
    "a",
    "unknown characters 日本語 and é",
    "late interaction colbert model server token",
]


@pytest.fixture(scope="module")
def folder(m3_deployment):
    return m3_deployment[0]


@pytest.fixture(scope="module")
def reference(folder):
    return flag_m3(folder, MAX_LEN)          # FlagEmbedding is pinned in the `test` extra: no skip


@pytest.fixture(scope="module")
def ranges(m3_deployment):
    """The int8 / uint8 calibration ranges the server was given (conftest's m3_deployment)."""
    return m3_deployment[1]


@pytest.fixture(scope="module")
def m3_server(m3_deployment):
    return m3_deployment[2]


@pytest.fixture
def m3(m3_server):
    c = EmbeddingClient(m3_server.grpc_url, token_budget=48)
    yield c
    c.close()


def expected(reference, texts):
    return reference.encode(texts, max_length=MAX_LEN, return_dense=True, return_sparse=True,
                            return_colbert_vecs=True)


def check_sparse(ours, ref):
    for i, (o, r) in enumerate(zip(ours, ref)):
        r = {int(k): float(v) for k, v in r.items()}
        assert set(o) == set(r), f"input {i}: token ids differ: {sorted(set(o) ^ set(r))}"
        assert all(abs(o[k] - r[k]) <= 1e-4 for k in r), f"input {i}: weights differ"


def check_colbert(ours, ref):
    for i, (o, r) in enumerate(zip(ours, ref)):
        assert o.shape == r.shape, f"input {i}: {o.shape} vs {r.shape}"
        cos = np.sum(o * r, axis=1) / (np.linalg.norm(o, axis=1) * np.linalg.norm(r, axis=1))
        assert (1 - cos).max() <= 1e-4, f"input {i}"
        np.testing.assert_allclose(np.linalg.norm(o, axis=1), 1.0, atol=1e-5)


def test_all_three_outputs_match_flagembedding(m3, reference):
    ours = m3.encode(TEXTS, sparse=True, colbert=True)
    ref = expected(reference, TEXTS)
    dense_gap = 1 - np.sum(ours.dense * ref["dense_vecs"], axis=1)
    assert ours.dense.shape == ref["dense_vecs"].shape and dense_gap.max() <= 1e-4
    check_sparse(ours.sparse, ref["lexical_weights"])
    check_colbert(ours.colbert, ref["colbert_vecs"])
    assert any(len(s) < len(set(t.split())) for s, t in zip(ours.sparse, TEXTS))   # repeats collapsed
    assert ours.colbert[3].shape[0] == MAX_LEN - 1                                   # truncated, CLS dropped
    assert not any(k in (0, 1, 2, 3) for s in ours.sparse for k in s)               # cls/pad/eos/unk skipped


def test_sparse_only_and_colbert_only(m3, reference):
    ref = expected(reference, TEXTS)
    only_sparse = m3.encode(TEXTS, dense=False, sparse=True)
    assert only_sparse.dense is None and only_sparse.colbert is None
    check_sparse(only_sparse.sparse, ref["lexical_weights"])
    only_colbert = m3.encode(TEXTS, dense=False, colbert=True)
    assert only_colbert.sparse is None
    check_colbert(only_colbert.colbert, ref["colbert_vecs"])


def test_mixed_batches_some_requests_ask_for_sparse(m3_server, reference):
    """Concurrent requests share batches (64-token budget); each gets exactly what it asked for."""
    texts = [f"{TEXTS[i % len(TEXTS)]} {i}" for i in range(24)]
    ref = expected(reference, texts)
    kinds = [("dense", "sparse", "colbert", "all")[i % 4] for i in range(len(texts))]
    clients = [EmbeddingClient(m3_server.grpc_url) for _ in range(4)]
    start = threading.Barrier(len(texts))

    def one(i):
        c, k = clients[i % 4], kinds[i]
        start.wait()
        if k == "dense":
            return c.embed([texts[i]])
        return c.encode([texts[i]], dense=k == "all", sparse=k in ("sparse", "all"), colbert=k in ("colbert", "all"))

    try:
        with ThreadPoolExecutor(len(texts)) as pool:
            results = list(pool.map(one, range(len(texts))))
    finally:
        for c in clients:
            c.close()
    for i, (k, r) in enumerate(zip(kinds, results)):
        if k == "dense":
            assert 1 - float(r[0] @ ref["dense_vecs"][i]) <= 1e-4
            continue
        assert (r.sparse is not None) == (k in ("sparse", "all"))
        assert (r.colbert is not None) == (k in ("colbert", "all"))
        if r.sparse is not None:
            check_sparse(r.sparse, [ref["lexical_weights"][i]])
        if r.colbert is not None:
            check_colbert(r.colbert, [ref["colbert_vecs"][i]])


def test_rose_decides_by_requested_outputs(m3_server, m3, folder):
    """Straight to `rose`: the requested outputs decide; naming none (Triton: all) means dense only."""
    from rose_ensemble.tokenization import TextTokenizer
    ids, lens = TextTokenizer.from_folder(folder).encode(TEXTS[:3])
    conn = StreamConnection(m3_server.grpc_url)
    try:
        inputs = [("INPUT_IDS", ids), ("SEQ_LENS", lens)]
        only = conn.infer("rose", inputs, outputs=["SPARSE_IDS", "SPARSE_WEIGHTS", "SPARSE_LENS"]).result(60)
        assert set(only) == {"SPARSE_IDS", "SPARSE_WEIGHTS", "SPARSE_LENS"}
        via_embed = m3.encode(TEXTS[:3], dense=False, sparse=True).sparse
        ends = np.cumsum(only["SPARSE_LENS"])[:-1]
        got = [dict(zip(i.tolist(), w.tolist())) for i, w in zip(np.split(only["SPARSE_IDS"], ends),
                                                               np.split(only["SPARSE_WEIGHTS"], ends))]
        assert got == via_embed
        assert set(conn.infer("rose", inputs).result(60)) == {"EMBEDDINGS"}
        old_style = conn.infer("embed", [("TEXT", TEXTS[:2])]).result(60)       # no outputs named
        assert set(old_style) == {"EMBEDDINGS"}
    finally:
        conn.close()


def test_dimensions_and_encodings(m3, ranges):
    from sentence_transformers.quantization import quantize_embeddings
    full = m3.embed(TEXTS)
    for d in (16, 63):
        cut = m3.embed(TEXTS, dimensions=d)
        want = full[:, :d] / np.linalg.norm(full[:, :d], axis=1, keepdims=True)
        np.testing.assert_allclose(cut, want, atol=1e-6)
    for enc, dtype in (("binary", np.int8), ("ubinary", np.uint8)):
        got = m3.embed(TEXTS, encoding=enc)
        assert got.dtype == dtype and got.shape == (len(TEXTS), 8)
        np.testing.assert_array_equal(got, quantize_embeddings(full, enc))
    for enc in ("int8", "uint8"):
        got = m3.embed(TEXTS, encoding=enc)
        np.testing.assert_array_equal(got, quantize_embeddings(full, enc, ranges=ranges))
    half = m3.embed(TEXTS, encoding="float16")
    assert half.dtype == np.float16
    np.testing.assert_array_equal(half, full.astype(np.float16))
    with pytest.raises(ServerError, match="calibration ranges have 64 dimensions"):
        m3.embed(TEXTS, dimensions=32, encoding="int8")
    with pytest.raises(ServerError, match="DIMENSIONS is 65"):
        m3.embed(TEXTS, dimensions=65)


def test_cli_writes_sparse_and_colbert_to_parquet(m3_server, m3, tmp_path):
    import pyarrow.parquet as pq
    from rose_client.cli import main
    texts = [f"{TEXTS[i % len(TEXTS)]} line {i}" for i in range(20)]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(texts) + "\n")
    out = tmp_path / "out.parquet"
    assert main([str(src), str(out), "--url", m3_server.grpc_url, "--sparse", "--colbert", "--block", "6",
                 "--quiet"]) == 0
    t = pq.read_table(out)
    assert t.column_names == ["row", "embedding", "sparse_ids", "sparse_weights", "colbert"]
    want = m3.encode(texts, sparse=True, colbert=True)
    assert t.column("row").to_pylist() == list(range(len(texts)))
    np.testing.assert_allclose(np.stack(t.column("embedding").to_numpy(zero_copy_only=False)), want.dense, atol=1e-6)
    for i, (ids, w, cb) in enumerate(zip(t.column("sparse_ids").to_pylist(), t.column("sparse_weights").to_pylist(),
                                         t.column("colbert").to_pylist())):
        assert dict(zip(ids, w)) == pytest.approx(want.sparse[i], abs=1e-6)
        np.testing.assert_allclose(np.array(cb, dtype=np.float32), want.colbert[i], atol=1e-6)
    assert main([str(src), str(tmp_path / "x.npy"), "--url", m3_server.grpc_url, "--sparse", "--quiet"]) == 2


def test_asyncio_client_encode_equals_the_sync_one(m3_server, m3):
    import asyncio
    from rose_client import AsyncEmbeddingClient

    async def go():
        async with AsyncEmbeddingClient(m3_server.grpc_url, token_budget=48) as ac:
            return await ac.encode(TEXTS, sparse=True, colbert=True), await ac.embed(TEXTS, dimensions=8)
    got, short = asyncio.run(go())
    want = m3.encode(TEXTS, sparse=True, colbert=True)
    np.testing.assert_allclose(got.dense, want.dense, atol=1e-6)
    assert all(g == pytest.approx(w, abs=1e-6) for g, w in zip(got.sparse, want.sparse))
    assert all(np.allclose(g, w, atol=1e-6) for g, w in zip(got.colbert, want.colbert))
    np.testing.assert_allclose(short, m3.embed(TEXTS, dimensions=8), atol=1e-6)
