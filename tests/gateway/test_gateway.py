"""The OpenAI-compatible gateway (rose_gateway) in front of a real tritonserver, called with the
official `openai` package and with raw HTTP for what the SDK would refuse to send."""
from __future__ import annotations

import base64

import httpx
import numpy as np
import openai
import pytest
from support.gateway import gateway_for

from rose_testing.compare import cos_dist

pytestmark = pytest.mark.server
KEY = "test-key-123"
MODEL = "all-MiniLM-L6-v2"
TEXTS = ["what is rose?", "Triton serves embeddings over gRPC.", "a third, somewhat longer sentence " * 4]


@pytest.fixture(scope="module")
def gateway(server):
    """The gateway in front of the session's default server (its "query" / "passage" prompts)."""
    with gateway_for(server.grpc_url, "gateway", api_key=KEY) as gw:
        yield gw


@pytest.fixture(scope="module")
def oa(gateway):
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def http(gateway):
    with httpx.Client(base_url=gateway.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as h:
        yield h


def rows(resp) -> np.ndarray:
    return np.array([d.embedding for d in sorted(resp.data, key=lambda d: d.index)], dtype=np.float32)


def assert_close(got, want):
    assert np.asarray(got).shape == np.asarray(want).shape
    assert cos_dist(got, want).max() <= 1e-4


def token_counts(sentence_model, texts) -> list[int]:
    ids = sentence_model.tokenizer(texts, truncation=True, max_length=sentence_model.max_seq_length)["input_ids"]
    return [len(i) for i in ids]


# --------------------------------------------------------------------------- input forms, formats
def test_list_of_strings_float(oa, sentence_model):
    resp = oa.embeddings.create(input=TEXTS, model=MODEL, encoding_format="float")
    assert resp.model == MODEL and resp.object == "list" and [d.index for d in resp.data] == [0, 1, 2]
    assert_close(rows(resp), sentence_model.encode(TEXTS))
    assert resp.usage.prompt_tokens == resp.usage.total_tokens == sum(token_counts(sentence_model, TEXTS))


def test_one_string_base64(oa, sentence_model):
    resp = oa.embeddings.create(input=TEXTS[1], model=MODEL, encoding_format="base64")
    raw = base64.b64decode(resp.data[0].embedding)
    assert len(raw) == 384 * 4
    assert_close(np.frombuffer(raw, "<f4")[None], sentence_model.encode(TEXTS[1:2]))
    assert resp.usage.prompt_tokens == token_counts(sentence_model, TEXTS[1:2])[0]


def test_sdk_default_encoding(oa, sentence_model):
    """Without encoding_format the SDK asks for base64 and decodes it itself."""
    resp = oa.embeddings.create(input=TEXTS, model=MODEL)
    assert_close(rows(resp), sentence_model.encode(TEXTS))


@pytest.mark.parametrize("encoding", ["float", "base64"])
def test_token_ids(oa, sentence_model, encoding):
    ids = sentence_model.tokenizer(TEXTS)["input_ids"]
    want = sentence_model.encode(TEXTS)
    many = oa.embeddings.create(input=ids, model=MODEL, encoding_format=encoding)
    one = oa.embeddings.create(input=ids[0], model=MODEL, encoding_format=encoding)
    decode = ((lambda r: rows(r)) if encoding == "float" else
              (lambda r: np.stack([np.frombuffer(base64.b64decode(d.embedding), "<f4") for d in r.data])))
    assert_close(decode(many), want)
    assert_close(decode(one), want[:1])
    assert many.usage.prompt_tokens == sum(len(i) for i in ids) and one.usage.prompt_tokens == len(ids[0])


def test_task_prompt_and_long_text(oa, sentence_model):
    long = "many words in a long text " * 100                 # over max_seq_length (256): truncated
    resp = oa.embeddings.create(input=["what is rose?", long], model=MODEL, encoding_format="float",
                                extra_body={"task": "query"})
    want = sentence_model.encode(["what is rose?", long], prompt="query: ")
    assert_close(rows(resp), want)
    assert resp.usage.prompt_tokens == sum(token_counts(sentence_model, ["query: what is rose?", "query: " + long]))


def test_dimensions(oa, sentence_model):
    resp = oa.embeddings.create(input=TEXTS, model=MODEL, dimensions=64, encoding_format="float")
    full = sentence_model.encode(TEXTS)[:, :64]
    got = rows(resp)
    assert got.shape == (3, 64)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-5)
    assert_close(got, full / np.linalg.norm(full, axis=1, keepdims=True))
    ids = sentence_model.tokenizer(TEXTS)["input_ids"]              # token ids: cut in the gateway
    assert_close(rows(oa.embeddings.create(input=ids, model=MODEL, dimensions=64, encoding_format="float")),
                 full / np.linalg.norm(full, axis=1, keepdims=True))
    for inp in (TEXTS, ids):
        with pytest.raises(openai.BadRequestError) as e:
            oa.embeddings.create(input=inp, model=MODEL, dimensions=1000)
        assert e.value.body["param"] == "dimensions" and "384" in e.value.body["message"]


def test_dimensions_refused_for_a_model_that_does_not_normalise():
    from rose_gateway.embeddings import cut_dimensions
    from rose_gateway.errors import ApiError
    emb = np.ones((2, 8), np.float32)
    with pytest.raises(ApiError) as e:
        cut_dimensions(emb, 4, normalizes=False)
    assert e.value.status == 400 and e.value.param == "dimensions" and "normalise" in e.value.message
    assert cut_dimensions(emb, None, normalizes=False) is emb


# --------------------------------------------------------------------------- API key, routes
def test_api_key(gateway):
    good = openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEY, max_retries=0)
    assert len(good.embeddings.create(input="hi", model=MODEL).data) == 1
    bad = openai.OpenAI(base_url=gateway.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.embeddings.create(input="hi", model=MODEL)
    assert e.value.status_code == 401 and "API key" in e.value.body["message"]
    r = httpx.post(gateway.url + "/v1/embeddings", json={"input": "hi"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(gateway.url + "/health").status_code == 200        # health and metrics need no key


def test_models_health_metrics(oa, http):
    assert [m.id for m in oa.models.list().data][0] == MODEL
    health = http.get("/health").json()
    assert health["status"] == "ready" and all(v == "ready" for v in health["replicas"].values())
    metrics = http.get("/metrics").text
    assert 'rose_gateway_requests_total{endpoint="embeddings",status="200"}' in metrics
    assert "rose_gateway_request_duration_seconds_bucket" in metrics


def test_unknown_model_and_route(oa, http):
    with pytest.raises(openai.NotFoundError) as e:
        oa.embeddings.create(input="hi", model="text-embedding-3-small")
    assert e.value.body["param"] == "model" and MODEL in e.value.body["message"]
    r = http.get("/v1/nothing")
    assert r.status_code == 404 and "/v1/embeddings" in r.json()["error"]["message"]


def test_rerank_without_a_reranker(http):
    r = http.post("/v1/rerank", json={"query": "q", "documents": ["a", "b"]})
    if r.status_code == 404:
        assert "reranker" in r.json()["error"]["message"]
    else:                                      # a `rerank` model is served: its answer's shape
        assert r.status_code == 200
        results = r.json()["results"]
        assert sorted(x["index"] for x in results) == [0, 1]
        assert results[0]["relevance_score"] >= results[1]["relevance_score"]


# --------------------------------------------------------------------------- bad requests
BAD = [
    (b'{"input": "a", ', 400, "body", "not valid JSON"),
    (b'[1, 2]', 400, "body", "JSON object"),
    (b'{"model": "x"}', 400, "input", "missing field 'input'"),
    (b'{"input": 5}', 400, "input", "must be a string or a list"),
    (b'{"input": ""}', 400, "input", "empty string"),
    (b'{"input": []}', 400, "input", "empty list"),
    (b'{"input": ["a", ""]}', 400, "input[1]", "empty string"),
    (b'{"input": ["a", 3]}', 400, "input[1]", "only strings"),
    (b'{"input": [1.5]}', 400, "input[0]", "must hold strings"),
    (b'{"input": [[101, "x"]]}', 400, "input[0]", "not a token id"),
    (b'{"input": [[101, 102], []]}', 400, "input[1]", "empty list of token ids"),
    (b'{"input": [-3, 5]}', 400, "input", "not a token id"),
    (b'{"input": "a", "encoding_format": "int8"}', 400, "encoding_format", "'float' or 'base64'"),
    (b'{"input": "a", "dimensions": "64"}', 400, "dimensions", "positive integer"),
    (b'{"input": "a", "dimensions": 0}', 400, "dimensions", "positive integer"),
    (b'{"input": "a", "truncate": "yes"}', 400, "truncate", "true or false"),
    (b'{"input": "a", "model": 7}', 400, "model", "must be a string"),
    (b'{"input": "a", "task": "nope"}', 400, "task", "unknown task"),
    (b'{"input": [[101, 99999999, 102]]}', 400, "input", "outside the vocabulary"),
]


@pytest.mark.parametrize("body,status,param,words", BAD, ids=[b[0].decode()[:40] for b in BAD])
def test_bad_request(http, body, status, param, words):
    r = http.post("/v1/embeddings", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err
    assert "Traceback" not in r.text
    assert http.post("/v1/embeddings", json={"input": "still serving"}).status_code == 200


def test_truncate_false_refuses_a_long_text(http):
    r = http.post("/v1/embeddings", json={"input": ["short", "word " * 400], "truncate": False})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input[1]"
    assert "at most 256" in r.json()["error"]["message"]
    r = http.post("/v1/embeddings", json={"input": [[101] + [2000] * 300 + [102]], "truncate": False})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input[0]"
    ok = http.post("/v1/embeddings", json={"input": [[101] + [2000] * 300 + [102]]})   # truncate: true
    assert ok.status_code == 200 and ok.json()["usage"]["prompt_tokens"] == 256


def test_ten_thousand_inputs(http):
    r = http.post("/v1/embeddings", json={"input": ["x"] * 10_000})
    assert r.status_code == 413
    err = r.json()["error"]
    assert err["param"] == "input" and "10000 items" in err["message"] and "2048" in err["message"]
    assert http.post("/v1/embeddings", json={"input": ["still serving"] * 8}).status_code == 200


def test_ten_megabyte_body(http):
    r = http.post("/v1/embeddings", json={"input": "a" * (10 << 20)})
    assert r.status_code == 413 and "limit" in r.json()["error"]["message"]
    # without a Content-Length (chunked upload): cut off while reading
    r = http.post("/v1/embeddings", content=iter([b'{"input": "'] + [b"a" * (1 << 20)] * 10 + [b'"}']),
                  headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    assert http.post("/v1/embeddings", json={"input": "still serving"}).status_code == 200


def test_concurrent_requests_keep_order(gateway, sentence_model):
    import concurrent.futures as cf
    texts = [f"text number {i} about embeddings" for i in range(24)]
    want = sentence_model.encode(texts)
    oa = openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    with cf.ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda t: rows(oa.embeddings.create(input=t, model=MODEL, encoding_format="float"))[0],
                            texts))
    assert_close(np.stack(got), want)
