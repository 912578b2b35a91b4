"""Fuzzing the gRPC inputs of `rose`, `embed` and `tokenize` (hypothesis) against a real server.

Every request must come back with a valid result (the right shape, finite, unit-norm rows) or a
clear error (a ServerError with a message); never a hang, a broken stream or a dead server. Afterwards
a normal request still returns correct embeddings.
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rose_client import ServerError

pytestmark = pytest.mark.server

FUZZ = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

VOCAB = 30522
DTYPES = [np.int32, np.int32, np.int32, np.int64, np.float32, np.bool_, "bytes"]


def check(fut, rows=None):
    """A valid result or a clear error; returns the embeddings or None."""
    try:
        out = fut.result(120)
    except ServerError as e:
        assert len(str(e).split(": ", 1)[-1]) > 5, e                   # a message, not just a code
        return None
    emb = out["EMBEDDINGS"]
    assert emb.dtype == np.float32 and emb.ndim == 2 and emb.shape[1] == 384
    if rows is not None:
        assert emb.shape[0] == rows
    assert np.isfinite(emb).all()
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-4)
    return emb


def array(draw, dtype, values, shape_kind):
    if dtype == "bytes":                                  # sent as Triton BYTES
        return [str(v) for v in values]
    data = np.asarray(values).astype(dtype)
    if shape_kind == "2d" and data.size:
        data = data.reshape(1, -1)
    elif shape_kind == "scalar-ish" and data.size:
        data = data[:1].reshape(1, 1)
    return data


@st.composite
def token_requests(draw):
    n = draw(st.integers(0, 12))
    lens = draw(st.lists(st.integers(-3, 600), min_size=n, max_size=n))
    ids_len = max(0, sum(max(x, 0) for x in lens) + draw(st.sampled_from([0, 0, 0, -1, 1, 7])))
    lo, hi = draw(st.sampled_from([(0, VOCAB), (0, VOCAB), (-5, VOCAB + 5), (VOCAB, 2**31 - 1)]))
    ids = draw(st.lists(st.integers(lo, hi - 1), min_size=min(ids_len, 50), max_size=min(ids_len, 50)))
    ids = (ids * (ids_len // max(len(ids), 1) + 1))[:ids_len] if ids else [0] * ids_len
    id_arr = array(draw, draw(st.sampled_from(DTYPES)), ids, draw(st.sampled_from(["1d"] * 4 + ["2d"])))
    len_arr = array(draw, draw(st.sampled_from(DTYPES)), lens, draw(st.sampled_from(["1d"] * 4 + ["2d", "scalar-ish"])))
    inputs = [("INPUT_IDS", id_arr), ("SEQ_LENS", len_arr)]
    drop = draw(st.sampled_from([None] * 6 + ["INPUT_IDS", "SEQ_LENS"]))
    inputs = [x for x in inputs if x[0] != drop]
    if draw(st.integers(0, 9)) == 0:
        inputs.append(("EXTRA", np.zeros(1, np.int32)))
    return inputs, n


@given(token_requests())
@FUZZ
def test_fuzz_rose(conn, req):
    inputs, n = req
    check(conn.infer("rose", inputs), rows=n)


text_items = st.one_of(
    st.text(max_size=300),
    st.binary(max_size=300),
    st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=50).map(lambda s: s * 200),
)


@st.composite
def text_requests(draw):
    texts = draw(st.lists(text_items, max_size=10))
    inputs = [("TEXT", texts)]
    if draw(st.booleans()):
        inputs.append(("TASK", draw(st.sampled_from([["query"], ["passage"], [""], ["nope"], [b"\xff"], ["a", "b"]]))))
    if draw(st.integers(0, 9)) == 0:
        inputs = inputs[1:]                       # no TEXT at all
    if draw(st.integers(0, 9)) == 0:
        inputs.append(("INPUT_IDS", np.array([1, 2], np.int32)))
    return inputs, len(texts)


@given(text_requests())
@FUZZ
def test_fuzz_embed(conn, req):
    inputs, n = req
    check(conn.infer("embed", inputs), rows=n)


def test_normal_requests_are_still_correct_after_fuzzing(conn, sentence_model):
    texts = ["still correct after the fuzzing", "naïve café 日本語"]
    got = check(conn.infer("embed", [("TEXT", texts)]), rows=2)
    ref = sentence_model.encode(texts)
    cos = (got * ref).sum(1) / np.linalg.norm(ref, axis=1)
    assert (1 - cos).max() <= 1e-4
