"""DIMENSIONS and ENCODING on the default model (no BGE-M3 heads), against sentence-transformers'
truncate_dim and quantize_embeddings, through the session's tritonserver; and the clear errors
for what this folder cannot give (sparse / ColBERT, int8 without calibration ranges)."""
import numpy as np
import pytest

from rose_client import ServerError, StreamConnection
from rose_testing.compare import cos_dist

pytestmark = pytest.mark.server

TEXTS = ["what is rose?", "a server for embeddings", "naïve café 日本語", "x", "Matryoshka " * 50]


def test_dimensions_match_sentence_transformers_truncate_dim(client, minilm_shaped_dir):
    from sentence_transformers import SentenceTransformer
    for d in (32, 128, 383):
        ref = SentenceTransformer(str(minilm_shaped_dir), device="cpu", truncate_dim=d).encode(
            TEXTS, normalize_embeddings=True)
        ours = client.embed(TEXTS, dimensions=d)
        assert ours.shape == (len(TEXTS), d)
        assert cos_dist(ours, ref).max() <= 1e-4
        np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("encoding,dtype,width", [("binary", np.int8, 48), ("ubinary", np.uint8, 48),
                                                  ("float16", np.float16, 384)])
def test_encodings_bit_for_bit(client, encoding, dtype, width):
    from sentence_transformers.util import quantize_embeddings
    full = client.embed(TEXTS)
    got = client.embed(TEXTS, encoding=encoding)
    assert got.dtype == dtype and got.shape == (len(TEXTS), width)
    want = full.astype(np.float16) if encoding == "float16" else quantize_embeddings(full, encoding)
    np.testing.assert_array_equal(got, want)
    cut = client.embed(TEXTS, dimensions=64, encoding=encoding)      # DIMENSIONS first, then ENCODING
    trunc = client.embed(TEXTS, dimensions=64)
    want = trunc.astype(np.float16) if encoding == "float16" else quantize_embeddings(trunc, encoding)
    np.testing.assert_array_equal(cut, want)


@pytest.mark.parametrize("kwargs,message", [
    (dict(sparse=True), "sparse outputs need BGE-M3's heads"),
    (dict(colbert=True, dense=False), "colbert outputs need BGE-M3's heads"),
    (dict(encoding="int8"), "ENCODING int8 needs calibration ranges"),
    (dict(dimensions=385), "DIMENSIONS is 385; this model's embeddings have 1..384"),
])
def test_what_this_folder_cannot_give_is_a_clear_error(client, kwargs, message):
    with pytest.raises(ServerError, match=message) as e:
        client.encode(TEXTS, **kwargs)
    assert not e.value.retryable
    assert client.embed(TEXTS[:1]).shape == (1, 384)           # and the server keeps serving


def test_bad_encoding_and_outputs_parameter_are_refused(server):
    conn = StreamConnection(server.grpc_url)
    try:
        with pytest.raises(ServerError, match="ENCODING 'int4' is not one of"):
            conn.infer("embed", [("TEXT", ["a"]), ("ENCODING", ["int4"])]).result(60)
        with pytest.raises(ServerError, match="request parameter 'outputs' takes sparse, colbert"):
            conn.infer("embed", [("TEXT", ["a"])], parameters={"outputs": "bm25"}).result(60)
        with pytest.raises(ServerError, match="DIMENSIONS is 0"):
            conn.infer("rose", [("INPUT_IDS", np.array([101, 102], np.int32)), ("SEQ_LENS", np.array([2], np.int32)),
                                ("DIMENSIONS", np.array([0], np.int32))]).result(60)
    finally:
        conn.close()
