"""TOKEN_COUNTS and TRUNCATED through a real tritonserver: `encode` (texts; asked by naming them or
with the request parameter outputs), `tokenize` and `rose` (asked by naming them), against
transformers' count of each untruncated text with its prompt."""
import numpy as np
import pytest

from rose_client import ServerError, StreamConnection

WORDS = "Paris is the capital of France and Berlin is the capital of Germany ".split()


@pytest.fixture(scope="module")
def hf_count(default_model_dir):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(default_model_dir))
    return lambda text: len(tok(text, truncation=False)["input_ids"])


def texts_of(lengths):
    return [" ".join(WORDS[i % len(WORDS)] for i in range(n)) for n in lengths]


def test_embed_counts_tokens_before_truncation(conn, hf_count):
    texts = texts_of([1, 40, 252, 253, 600, 3000])
    got = conn.infer("encode", [("TEXT", texts), ("TASK", ["query"])], parameters={"outputs": "token_counts,truncated"},
                     outputs=["EMBEDDINGS", "TOKEN_COUNTS", "TRUNCATED"]).result(300)
    want = [hf_count("query: " + t) for t in texts]                 # DEFAULT_TEST_PARAMS' query prompt
    assert got["TOKEN_COUNTS"].tolist() == want and got["TOKEN_COUNTS"].dtype == np.int32
    assert got["TRUNCATED"].tolist() == [n > 256 for n in want] and got["TRUNCATED"].dtype == np.bool_
    assert want[2:4] == [256, 257] and got["TRUNCATED"].tolist() == [False] * 3 + [True] * 3     # at the limit
    assert got["EMBEDDINGS"].shape == (6, 384)
    plain = conn.infer("embed", [("TEXT", texts), ("TASK", ["query"])]).result(300)
    assert set(plain) == {"EMBEDDINGS"}                                  # not asked: not sent
    np.testing.assert_array_equal(plain["EMBEDDINGS"], got["EMBEDDINGS"])


def test_one_of_the_two_alone(conn, hf_count):
    texts = texts_of([3, 400])
    got = conn.infer("encode", [("TEXT", texts)], parameters={"outputs": "truncated"}).result(120)
    assert set(got) == {"EMBEDDINGS", "TRUNCATED"} and got["TRUNCATED"].tolist() == [False, True]
    got = conn.infer("encode", [("TEXT", texts)], parameters={"outputs": "token_counts"}).result(120)
    assert set(got) == {"EMBEDDINGS", "TOKEN_COUNTS"} and got["TOKEN_COUNTS"].tolist() == [hf_count(t) for t in texts]


def test_a_text_over_max_text_bytes_is_marked_cut(conn, hf_count):
    huge = texts_of([20_000])[0]                                         # ~110 KB, over max_text_bytes=65536
    got = conn.infer("encode", [("TEXT", [huge, "short"])], parameters={"outputs": "token_counts,truncated"}).result(300)
    assert got["TRUNCATED"].tolist() == [True, False]
    assert 256 < got["TOKEN_COUNTS"][0] < hf_count(huge)                 # the bytes kept: a lower bound


def test_tokenize_gives_them_when_named(conn, hf_count):
    texts = texts_of([5, 500])
    got = conn.infer("tokenize", [("TEXT", texts)], outputs=["INPUT_IDS", "SEQ_LENS", "TOKEN_COUNTS", "TRUNCATED"]).result(60)
    assert got["SEQ_LENS"].tolist() == [hf_count(texts[0]), 256]
    assert got["TOKEN_COUNTS"].tolist() == [hf_count(t) for t in texts] and got["TRUNCATED"].tolist() == [False, True]
    assert set(conn.infer("tokenize", [("TEXT", texts)]).result(60)) == {"INPUT_IDS", "SEQ_LENS"}     # none named


def test_rose_counts_its_sequences_as_given(conn):
    ids, lens = np.array([101, 2000, 102, 101, 2001, 2002, 2003, 102], np.int32), np.array([3, 5], np.int32)
    got = conn.infer("rose", [("INPUT_IDS", ids), ("SEQ_LENS", lens)],
                     outputs=["EMBEDDINGS", "TOKEN_COUNTS", "TRUNCATED"]).result(60)
    assert got["TOKEN_COUNTS"].tolist() == [3, 5] and got["TRUNCATED"].tolist() == [False, False]
    given = conn.infer("rose", [("INPUT_IDS", ids), ("SEQ_LENS", lens), ("TOKEN_COUNTS", np.array([3, 900], np.int32))],
                       outputs=["EMBEDDINGS", "TOKEN_COUNTS", "TRUNCATED"]).result(60)
    assert given["TOKEN_COUNTS"].tolist() == [3, 900] and given["TRUNCATED"].tolist() == [False, True]
    with pytest.raises(ServerError, match=r"TOKEN_COUNTS\[1\] = 4 is below the 5 tokens in sequence 1"):
        conn.infer("rose", [("INPUT_IDS", ids), ("SEQ_LENS", lens),
                            ("TOKEN_COUNTS", np.array([3, 4], np.int32))]).result(60)
    assert set(conn.infer("rose", [("INPUT_IDS", ids), ("SEQ_LENS", lens)]).result(60)) == {"EMBEDDINGS"}


def test_a_reranker_refuses_token_inputs_and_late_chunking(reranker_server):
    _, srv = reranker_server("tiny-bert-ce")
    c = StreamConnection(srv.grpc_url)
    try:
        ids, lens = np.array([101, 2000, 102, 2001, 102], np.int32), np.array([5], np.int32)
        with pytest.raises(ServerError, match="TOKEN_CHUNKS: a reranker takes no late chunking or token counts"):
            c.infer("rose", [("INPUT_IDS", ids), ("SEQ_LENS", lens),
                             ("TOKEN_CHUNKS", np.array([-1, 0, -1, 0, -1], np.int32))]).result(60)
        with pytest.raises(ServerError, match="DOC_CHUNKS .late chunking. is not available for this model"):
            c.infer("tokenize", [("TEXT", ["a", "b"]), ("DOC_CHUNKS", np.array([2], np.int32))]).result(60)
        assert c.infer("rose", [("INPUT_IDS", ids), ("SEQ_LENS", lens)]).result(60)["SCORES"].shape == (1,)
    finally:
        c.close()
