"""Late chunking through a real tritonserver: `embed` with TEXT holding every document's chunks end to
end and DOC_CHUNKS their counts, against transformers (rose_testing/late_reference.py) on
the default model; long documents run in windows; bad requests get errors naming what is wrong,
and requests on one stream are answered in order, each with its own vectors."""
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from rose_client import ServerError, StreamConnection
from rose_testing.compare import cos_dist
from rose_testing.late_reference import late_chunk_reference

SENTENCES = ["Paris is the capital of France. ", "It lies on the Seine, ", "and its museums are famous. ",
             "Berlin is the capital of Germany; ", "its wall fell in 1989. "]
LONG = SENTENCES * 14                      # about 700 tokens: three windows of 256 for all-MiniLM-L6-v2
DOCUMENTS = [SENTENCES[:3], LONG, ["A one-chunk document."]]


@pytest.fixture(scope="module")
def reference(minilm_shaped_dir):
    from rose_testing.reference import Reference
    return Reference(minilm_shaped_dir)


def late(conn, documents, task=None, parameters=None, outputs=None, model="embed"):
    inputs = [("TEXT", [c for d in documents for c in d]), ("DOC_CHUNKS", np.array([len(d) for d in documents], np.int32))]
    if task:
        inputs.append(("TASK", [task]))
    return conn.infer(model, inputs, outputs=outputs, parameters=parameters)


def test_chunk_vectors_match_transformers(conn, minilm_shaped_dir, reference):
    got = late(conn, DOCUMENTS, task="query", outputs=["EMBEDDINGS", "TOKEN_COUNTS", "TRUNCATED"],
               model="encode").result(300)
    want = np.concatenate(late_chunk_reference(minilm_shaped_dir, DOCUMENTS, prompt="query: ", window=256,
                                               overlap=64, reference=reference))
    assert got["EMBEDDINGS"].shape == (3 + len(LONG) + 1, 384)
    assert cos_dist(got["EMBEDDINGS"], want).max() < 1e-5
    assert got["TOKEN_COUNTS"].dtype == np.int32 and got["TOKEN_COUNTS"].min() >= 1
    assert not got["TRUNCATED"].any()
    # the same long document chunk by chunk, sent alone, differs: each vector carries its context
    alone = conn.infer("embed", [("TEXT", LONG[:5]), ("TASK", ["query"])]).result(120)["EMBEDDINGS"]
    assert cos_dist(got["EMBEDDINGS"][3:8], alone).min() > 1e-3


def test_dimensions_apply_to_chunk_vectors(conn):
    full = late(conn, DOCUMENTS[:1]).result(120)["EMBEDDINGS"]
    cut = conn.infer("embed", [("TEXT", DOCUMENTS[0]), ("DOC_CHUNKS", np.array([3], np.int32)),
                               ("DIMENSIONS", np.array([64], np.int32))]).result(120)["EMBEDDINGS"]
    want = full[:, :64] / np.linalg.norm(full[:, :64], axis=1, keepdims=True)
    np.testing.assert_allclose(cut, want, atol=1e-6)


def test_requests_on_one_stream_keep_their_order(conn):
    docs = [[f"Document {i} starts here. ", f"It has {i} as its number. ", "The end."] for i in range(6)]

    def send(i, d):
        return late(conn, [d]) if i % 2 == 0 else conn.infer("embed", [("TEXT", d)])
    alone = [send(i, d).result(120)["EMBEDDINGS"] for i, d in enumerate(docs)]       # one at a time
    together = [f.result(300)["EMBEDDINGS"] for f in [send(i, d) for i, d in enumerate(docs)]]
    for i in range(6):
        np.testing.assert_allclose(together[i], alone[i], atol=1e-5)
        assert cos_dist(together[i], alone[(i + 1) % 6]).max() > 1e-4


@pytest.mark.parametrize("texts, counts, message", [
    (["Paris is big", "", " indeed"], [3], r"TEXT\[1\] \(document 0, chunk 1\) has no token of its own"),
    (["one", "two"], [1, 2], "DOC_CHUNKS sum to 3 chunks but TEXT holds 2 texts"),
    (["one", "two"], [2, 0], r"DOC_CHUNKS\[1\] is 0"),
    (["x" * 70_000], [1], r"document 0 \(TEXT\[0:1\]\) holds 70000 bytes; late chunking takes documents of at most"),
])
def test_bad_late_chunking_requests_are_named(conn, texts, counts, message):
    with pytest.raises(ServerError, match=message) as e:
        conn.infer("embed", [("TEXT", texts), ("DOC_CHUNKS", np.array(counts, np.int32))]).result(120)
    assert not e.value.retryable
    assert late(conn, DOCUMENTS[:1]).result(120)["EMBEDDINGS"].shape == (3, 384)     # still serving


def test_rose_checks_token_chunks(conn):
    ids, lens = np.array([101, 2000, 2001, 102], np.int32), np.array([4], np.int32)
    for chunks, message in (([-1, 0, 0], "TOKEN_CHUNKS holds 3 values but INPUT_IDS holds 4"),
                            ([-1, 0, 2, -1], "chunk 1 has no token in TOKEN_CHUNKS"),
                            ([-1, -1, -1, -1], "TOKEN_CHUNKS gives no token a chunk"),
                            ([-2, 0, 0, -1], r"TOKEN_CHUNKS\[0\] = -2")):
        with pytest.raises(ServerError, match=message):
            conn.infer("rose", [("INPUT_IDS", ids), ("SEQ_LENS", lens),
                                ("TOKEN_CHUNKS", np.array(chunks, np.int32))]).result(60)
    got = conn.infer("rose", [("INPUT_IDS", ids), ("SEQ_LENS", lens),
                              ("TOKEN_CHUNKS", np.array([-1, 0, 1, -1], np.int32))]).result(60)
    assert got["EMBEDDINGS"].shape == (2, 384)


def test_a_plain_tritonclient_stream_gets_chunk_vectors(server):
    import queue
    answers: queue.Queue = queue.Queue()
    c = grpcclient.InferenceServerClient(server.grpc_url)
    c.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        chunks = np.array([s.encode() for s in SENTENCES], dtype=object)
        text = grpcclient.InferInput("TEXT", [len(SENTENCES)], "BYTES")
        text.set_data_from_numpy(chunks)
        counts = grpcclient.InferInput("DOC_CHUNKS", [2], "INT32")
        counts.set_data_from_numpy(np.array([2, 3], np.int32))
        c.async_stream_infer("embed", [text, counts])
        result, error = answers.get(timeout=120)
        assert error is None, error
        assert result.as_numpy("EMBEDDINGS").shape == (5, 384)
    finally:
        c.stop_stream()
        c.close()


def test_the_overlap_is_a_tokenize_parameter(shared_server, minilm_shaped_dir, reference):
    srv = shared_server({"tokenize": {"late_chunk_overlap": "16", "max_seq_length": "128"}},
                        model_dir=str(minilm_shaped_dir), name="late-overlap")
    c = StreamConnection(srv.grpc_url)
    try:
        got = late(c, [LONG]).result(300)["EMBEDDINGS"]
    finally:
        c.close()
    want = late_chunk_reference(minilm_shaped_dir, [LONG], window=128, overlap=16, reference=reference)[0]
    assert cos_dist(got, want).max() < 1e-5
    other = late_chunk_reference(minilm_shaped_dir, [LONG], window=128, overlap=64, reference=reference)[0]
    assert cos_dist(got, other).max() > 1e-4                    # the overlap changes the vectors


def test_client_functions(server, conn, minilm_shaped_dir):
    from rose_client import EmbeddingClient
    from rose_client.dispatch import Chunk
    from rose_client.late_chunks import document_chunks, embed_counted, embed_late_chunks

    raw = late(conn, DOCUMENTS, task="query").result(300)["EMBEDDINGS"]
    vectors = embed_late_chunks(conn, DOCUMENTS, task="query")
    assert [v.shape[0] for v in vectors] == [len(d) for d in DOCUMENTS]
    np.testing.assert_array_equal(np.concatenate(vectors), raw)
    counted = embed_late_chunks(conn, DOCUMENTS, task="query", counts=True)
    assert [c.shape for c in counted.token_counts] == [(len(d),) for d in DOCUMENTS]
    assert not any(t.any() for t in counted.truncated)
    with pytest.raises(TypeError, match="each a list of its chunks"):
        embed_late_chunks(conn, ["a document given as a string"])
    # through EmbeddingClient's balancing and retries: whole documents per request, in order
    client = EmbeddingClient(server.grpc_url, token_budget=64)
    try:
        chunks = document_chunks(client, DOCUMENTS, "query", Chunk)
        assert len(chunks) == 3                         # each document its own request on this budget
        got = client.embed_late_chunks(DOCUMENTS, task="query", lane="bulk")
        assert [g.shape[0] for g in got] == [len(d) for d in DOCUMENTS]
        for a, b in zip(got, vectors):
            np.testing.assert_allclose(a, b, atol=1e-6)
        with_counts = client.embed_late_chunks(DOCUMENTS, task="query", counts=True)
        for a, b in zip(with_counts.token_counts, counted.token_counts):
            np.testing.assert_array_equal(a, b)
    finally:
        client.close()
    texts = ["short", " ".join(["word"] * 400)]
    c = embed_counted(conn, texts)
    assert c.vectors.shape == (2, 384) and c.truncated.tolist() == [False, True] and c.token_counts[1] == 402
    client = EmbeddingClient(server.grpc_url, token_budget=64)      # texts split over requests, counts joined
    try:
        cc = client.embed_counted(texts)
        np.testing.assert_allclose(cc.vectors, c.vectors, atol=1e-6)
        assert cc.truncated.tolist() == [False, True] and cc.token_counts.tolist() == c.token_counts.tolist()
    finally:
        client.close()

    import asyncio

    from rose_client import AsyncEmbeddingClient

    async def twin():
        async with AsyncEmbeddingClient(server.grpc_url, token_budget=64) as ac:
            return await ac.embed_late_chunks(DOCUMENTS, task="query"), await ac.embed_counted(texts)
    got, cc = asyncio.run(twin())
    for a, b in zip(got, vectors):
        np.testing.assert_allclose(a, b, atol=1e-6)
    assert cc.token_counts.tolist() == c.token_counts.tolist()
