"""Text-embeddings-inference's HTTP API on the gateway, called as TEI's users call it: huggingface_hub's
InferenceClient (what LangChain's HuggingFaceEndpointEmbeddings and Haystack's TEI embedders use),
LlamaIndex's TextEmbeddingsInference, and raw HTTP for the routes and errors no client sends.
One gateway in front of the session's default server (minilm_shaped_dir, "query: " / "passage: "
prompts); vectors compared with sentence-transformers on the same folder."""
from __future__ import annotations

import httpx
import numpy as np
import pytest
from support.gateway import gateway_for

from rose_testing.compare import cos_dist

pytestmark = pytest.mark.server
KEY = "tei-key-123"
TEXTS = ["what is rose?", "Triton serves embeddings over gRPC.", "a third, somewhat longer sentence " * 4]


@pytest.fixture(scope="module")
def gateway(server, minilm_shaped_dir):
    with gateway_for(server.grpc_url, "tei", api_key=KEY, extra_args=["--model", str(minilm_shaped_dir),
                                                                      "--max-inputs", "8"]) as gw:
        yield gw


@pytest.fixture(scope="module")
def http(gateway):
    with httpx.Client(base_url=gateway.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as h:
        yield h


@pytest.fixture
def hub(gateway, monkeypatch):
    """huggingface_hub's InferenceClient on the gateway's URL. The suite runs with HF_HUB_OFFLINE=1,
    under which huggingface_hub refuses every request, this local one too: lifted for the call."""
    from huggingface_hub import InferenceClient, constants
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return InferenceClient(base_url=gateway.url, api_key=KEY, timeout=120)


def assert_close(got, want, tol=1e-4):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert got.shape == want.shape
    assert cos_dist(got, want).max() <= tol
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), np.linalg.norm(want, axis=1), atol=1e-4)


# --------------------------------------------------------------------------- the clients
def test_huggingface_hub_feature_extraction(hub, sentence_model):
    """InferenceClient(base_url).feature_extraction posts {"inputs", ...} to the base URL (POST /)."""
    assert_close(hub.feature_extraction(TEXTS), sentence_model.encode(TEXTS))
    one = hub.feature_extraction(TEXTS[1])
    assert one.shape == (1, 384)
    assert_close(one, sentence_model.encode(TEXTS[1:2]))
    query = hub.feature_extraction(TEXTS[:2], prompt_name="query", truncate=True)
    assert_close(query, sentence_model.encode(["query: " + t for t in TEXTS[:2]]))
    small = hub.feature_extraction(TEXTS[:2], dimensions=64)
    want = sentence_model.encode(TEXTS[:2])[:, :64]
    assert_close(small, want / np.linalg.norm(want, axis=1, keepdims=True))


def test_llama_index_text_embeddings_inference(gateway, sentence_model):
    """LlamaIndex's TextEmbeddingsInference posts {"inputs", "truncate"} to /embed, sync and async."""
    import asyncio
    from llama_index.embeddings.text_embeddings_inference import TextEmbeddingsInference
    emb = TextEmbeddingsInference(model_name="minilm", base_url=gateway.url, auth_token=KEY, timeout=120)
    assert_close(emb.get_text_embedding_batch(TEXTS), sentence_model.encode(TEXTS))
    assert_close([emb.get_query_embedding(TEXTS[0])], sentence_model.encode(TEXTS[:1]))
    assert_close(asyncio.run(emb.aget_text_embedding_batch(TEXTS[1:])), sentence_model.encode(TEXTS[1:]))


# --------------------------------------------------------------------------- /embed's fields
def test_embed_inputs_token_ids_mixed_and_truncation(http, sentence_model):
    ids = sentence_model.tokenizer(TEXTS)["input_ids"]
    want = sentence_model.encode(TEXTS)
    assert_close(http.post("/embed", json={"inputs": ids[0]}).json(), want[:1])          # one list of ids
    assert_close(http.post("/embed", json={"inputs": [TEXTS[0], ids[1], TEXTS[2]]}).json(), want)
    long = "red apples grow on old trees " * 50 + "blue rivers flow into the sea " * 50   # over 256 tokens
    cut = http.post("/embed", json={"inputs": long}).json()
    assert_close(cut, sentence_model.encode([long]))                                      # truncated on the right
    left = http.post("/embed", json={"inputs": [long], "truncation_direction": "left"}).json()
    tok = sentence_model.tokenizer
    tail = tok(long, add_special_tokens=False)["input_ids"][-(sentence_model.max_seq_length - 2):]
    assert_close(left, sentence_model.encode([tok.decode(tail)]))                        # the text's last tokens
    assert cos_dist(np.asarray(left, np.float32), np.asarray(cut, np.float32)).max() > 1e-3
    r = http.post("/embed", json={"inputs": long, "truncate": False})
    assert r.status_code == 422 and r.json()["error_type"] == "Validation" and "inputs[0]" in r.json()["error"]
    r = http.post("/embed", json={"inputs": [ids[0], long], "truncate": False})            # its index among all
    assert r.status_code == 422 and r.json()["error"].startswith("inputs[1] has")
    r = http.post("/embed", json={"inputs": ["a", ids[0] * 50], "truncate": False})
    assert r.status_code == 422 and r.json()["error"].startswith("inputs[1] has")


def test_embed_normalize_false_on_a_normalising_model(http, sentence_model):
    """The folder's Normalize module is part of the model in rose (docs/TEI.md): unit vectors."""
    got = np.asarray(http.post("/embed", json={"inputs": TEXTS, "normalize": False}).json(), np.float32)
    assert_close(got, sentence_model.encode(TEXTS))


def test_similarity(hub, sentence_model):
    got = hub.sentence_similarity(TEXTS[0], other_sentences=TEXTS[1:])
    want = sentence_model.encode(TEXTS)
    np.testing.assert_allclose(got, want[1:] @ want[0], atol=1e-4)


# --------------------------------------------------------------------------- tokenize, decode, info, health
def test_tokenize_and_decode(http, sentence_model):
    text = "Hello wörld!"
    got = http.post("/tokenize", json={"inputs": [text]}).json()
    ids = sentence_model.tokenizer(text)["input_ids"]
    assert [t["id"] for t in got[0]] == ids
    assert got[0][0] == {"id": ids[0], "text": "[CLS]", "special": True, "start": None, "stop": None}
    assert got[0][2] == {"id": ids[2], "text": "wörld", "special": False, "start": 6, "stop": 12}   # byte offsets
    plain = http.post("/tokenize", json={"inputs": text, "add_special_tokens": False, "prompt_name": "query"}).json()
    assert [t["id"] for t in plain[0]] == sentence_model.tokenizer("query: " + text, add_special_tokens=False)["input_ids"]
    assert http.post("/decode", json={"ids": ids}).json() == [sentence_model.tokenizer.decode(ids, skip_special_tokens=True)]
    both = http.post("/decode", json={"ids": [ids, ids[1:2]], "skip_special_tokens": False}).json()
    assert both == [sentence_model.tokenizer.decode(ids), sentence_model.tokenizer.decode(ids[1:2])]


def test_info_and_health(http, gateway, sentence_model):
    info = http.get("/info").json()
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["max_input_length"] == sentence_model.max_seq_length and info["max_client_batch_size"] == 8 and info["auto_truncate"] is True
    assert info["model_dtype"] and isinstance(info["max_batch_tokens"], int) and info["version"]
    assert httpx.get(gateway.url + "/info").status_code == 401                         # the key, as TEI
    assert httpx.get(gateway.url + "/health").status_code == 200
    assert httpx.get(gateway.url + "/").status_code == 200                             # TEI's GET / is health


# --------------------------------------------------------------------------- errors
BAD = [
    ("/embed", b'{"inputs": []}', 400, "Empty"),
    ("/embed", b'{"inputs": ""}', 400, "Empty"),
    ("/embed", b'{"inputs": ["a", "b", "c", "d", "e", "f", "g", "h", "i"]}', 413, "Validation"),   # --max-inputs 8
    ("/embed", b'{"inputs": 5}', 422, "Validation"),
    ("/embed", b'{"text": "a"}', 422, "Validation"),
    ("/embed", b'{"inputs": "a", ', 422, "Validation"),
    ("/embed", b'{"inputs": ["a", 3.5]}', 422, "Validation"),
    ("/embed", b'{"inputs": [[101, -1]]}', 422, "Validation"),
    ("/embed", b'{"inputs": "a", "dimensions": 0}', 422, "Validation"),
    ("/embed", b'{"inputs": "a", "dimensions": 385}', 422, "Validation"),
    ("/embed", b'{"inputs": "a", "normalize": "yes"}', 422, "Validation"),
    ("/embed", b'{"inputs": "a", "truncation_direction": "middle"}', 422, "Validation"),
    ("/embed", b'{"inputs": "a", "prompt_name": "nope"}', 422, "Validation"),
    ("/", b'{"inputs": []}', 400, "Empty"),
    ("/embed_sparse", b'{"inputs": "a"}', 424, "Backend"),            # no sparse head in this folder
    ("/embed_all", b'{"inputs": "a"}', 424, "Backend"),               # a normalising model
    ("/rerank", b'{"query": "q", "texts": ["a"]}', 424, "Backend"),  # no reranker served
    ("/rerank", b'{"query": "q", "texts": []}', 400, "Empty"),
    ("/tokenize", b'{"inputs": []}', 400, "Empty"),
    ("/decode", b'{"ids": [101, 99999999]}', 422, "Validation"),
    ("/decode", b'{"ids": [[101], []]}', 400, "Empty"),
    ("/similarity", b'{"inputs": {"source_sentence": "a", "sentences": []}}', 400, "Empty"),
]


@pytest.mark.parametrize("path,body,status,kind", BAD, ids=[f"{p}:{b[:40]!r}" for p, b, _, _ in BAD])
def test_errors_in_tei_format(http, path, body, status, kind):
    r = http.post(path, content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()
    assert set(err) == {"error", "error_type"} and err["error_type"] == kind and err["error"]


def test_auth_body_limit_and_hub_error(gateway, hub):
    r = httpx.post(gateway.url + "/embed", json={"inputs": "a"})
    assert r.status_code == 401 and r.json()["error_type"] == "Validation" and "API key" in r.json()["error"]
    r = httpx.post(gateway.url + "/embed", headers={"Authorization": f"Bearer {KEY}"},
                   json={"inputs": "x" * (9 << 20)})
    assert r.status_code == 413 and r.json()["error_type"] == "Validation"
    from huggingface_hub.errors import HfHubHTTPError
    with pytest.raises(HfHubHTTPError) as e:                     # the client shows TEI's "error" message
        hub.feature_extraction("a", prompt_name="nope")
    assert e.value.response.status_code == 422 and "prompt_name" in str(e.value)


def test_metrics_count_the_tei_routes(http, gateway):
    http.post("/embed", json={"inputs": "counted"})
    page = httpx.get(gateway.url + "/metrics").text
    assert 'endpoint="tei_embed"' in page and 'endpoint="tei_root"' in page


# --------------------------------------------------------------------------- a model that does not normalise
@pytest.fixture(scope="module")
def raw_model(shared_server, tmp_path_factory):
    """A tiny BERT folder with CLS pooling and no Normalize module, its server and gateway: /embed_all
    and normalize=false have their exact TEI meaning there."""
    from rose_testing.folders import make_folder
    from rose_testing.reference import Reference
    folder = make_folder("tiny-bert", tmp_path_factory.mktemp("tei-raw") / "bert", pooling="cls", normalize=False)
    srv = shared_server(None, model_dir=str(folder), name="tei-raw-bert")
    with gateway_for(srv.grpc_url, "tei-raw", extra_args=["--model", str(folder), "--workers", "1"]) as gw:
        with httpx.Client(base_url=gw.url, timeout=120) as h:
            yield Reference(folder), h


def test_embed_all_and_normalize_on_a_model_that_does_not_normalise(raw_model):
    from rose_testing.folders import ids_to_text
    ref, http = raw_model
    rng = np.random.default_rng(0)
    lists = [rng.integers(10, 1000, size=n).tolist() for n in (3, 17, 40)]
    texts = [ids_to_text(ids) for ids in lists]
    got = http.post("/embed_all", json={"inputs": texts}).json()
    assert [len(g) for g in got] == [3, 17, 40]
    for g, ids in zip(got, lists):
        np.testing.assert_allclose(np.asarray(g, np.float32), ref.hidden(ids).numpy(), atol=1e-4)
    raw = ref.embed(lists)                                                # CLS, not normalised
    np.testing.assert_allclose(http.post("/embed", json={"inputs": texts, "normalize": False}).json(), raw, atol=1e-4)
    unit = raw / np.linalg.norm(raw, axis=1, keepdims=True)
    np.testing.assert_allclose(http.post("/embed", json={"inputs": texts}).json(), unit, atol=1e-5)
    cut = http.post("/embed", json={"inputs": lists, "dimensions": 16, "normalize": False}).json()
    np.testing.assert_allclose(cut, raw[:, :16], atol=1e-4)
    cut = http.post("/embed", json={"inputs": lists, "dimensions": 16}).json()
    np.testing.assert_allclose(cut, raw[:, :16] / np.linalg.norm(raw[:, :16], axis=1, keepdims=True), atol=1e-5)
