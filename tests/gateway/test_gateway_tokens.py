"""The gateway tokenizes texts itself and sends their ids straight to `rose`: its answers against
the gRPC `embed` ensemble on the same server (1 - cos <= 1e-6, the same tokens), on the default
model and on random-weight folders of both families (BERT WordPiece-less WordLevel, Qwen3 with its
query prompt and appended end token); its ids against `tokenize`'s; `truncated` marks; late
chunking against `embed` with DOC_CHUNKS; the `lane` field; several workers on one port."""
from __future__ import annotations

import base64
import time

import httpx
import numpy as np
import openai
import pytest
from support.gateway import gateway_for
from support.server import TritonProcess, running_server
from support.metrics import metric, wait_idle

from rose_testing.compare import cos_dist
from rose_client import EmbeddingClient, StreamConnection
from rose_client.late_chunks import embed_counted, embed_late_chunks

pytestmark = pytest.mark.server
LONG = "many words in a long text about embedding servers " * 60            # over 256 tokens: cut
HUGE = "word " * 14_000                                                      # over max_text_bytes (65536)
TEXTS = ["what is rose?", "Triton serves embeddings over gRPC.", LONG]
DOCUMENT = ["Paris is the capital of France. ", "It lies on the Seine, ", "and its museums are famous. ",
            "The Louvre holds the Mona Lisa."]


@pytest.fixture(scope="module")
def gw(server):
    with gateway_for(server.grpc_url, "tokens", extra_args=["--workers", "2"]) as g:
        yield g


def post(gw, payload: dict) -> httpx.Response:
    return httpx.post(gw.url + "/v1/embeddings", json=payload, timeout=120)


def vectors(body: dict) -> np.ndarray:
    def one(e):
        return np.frombuffer(base64.b64decode(e), "<f4") if isinstance(e, str) else np.asarray(e, np.float32)
    return np.stack([one(d["embedding"]) for d in sorted(body["data"], key=lambda d: d["index"])])


def tokenized(conn, texts, task=None) -> dict:
    """`tokenize`'s answer (conn, a StreamConnection, asks it on a stream of its own: Triton 2.51
    aborts when one stream mixes it with a decoupled model)."""
    return conn.infer("tokenize", [("TEXT", texts)] + ([("TASK", [task])] if task else []),
                      ["INPUT_IDS", "SEQ_LENS", "TOKEN_COUNTS", "TRUNCATED"]).result(120)


def assert_same_as_embed(gw, conn, texts, task=None, dimensions=None, encoding="float"):
    payload = {"input": texts, "encoding_format": encoding, **({"task": task} if task else {}),
               **({"dimensions": dimensions} if dimensions else {})}
    r = post(gw, payload)
    assert r.status_code == 200, r.text
    body = r.json()
    inputs = [("TEXT", texts)] + ([("TASK", [task])] if task else []) + \
        ([("DIMENSIONS", np.array([dimensions], np.int32))] if dimensions else [])
    want = conn.infer("embed", inputs, ["EMBEDDINGS"]).result(120)["EMBEDDINGS"]
    got = vectors(body)
    assert got.shape == want.shape and cos_dist(got, want).max() <= 1e-6, cos_dist(got, want).max()
    t = tokenized(conn, texts, task)
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] == int(t["SEQ_LENS"].sum())
    assert [bool(d.get("truncated", False)) for d in body["data"]] == t["TRUNCATED"].tolist()
    assert all(d.get("truncated", True) is True for d in body["data"])      # marked true, or absent
    return body


# --------------------------------------------------------------------------- default model
@pytest.mark.parametrize("task,dimensions,encoding", [(None, None, "float"), ("query", None, "base64"),
                                                      ("passage", 64, "float"), ("query", 100, "base64")])
def test_texts_as_embed_answers_them(gw, conn, task, dimensions, encoding):
    assert_same_as_embed(gw, conn, TEXTS, task, dimensions, encoding)


def test_one_text_a_huge_one_and_many(gw, conn):
    body = assert_same_as_embed(gw, conn, [HUGE, "short"])
    assert body["data"][0]["truncated"] is True and "truncated" not in body["data"][1]
    assert_same_as_embed(gw, conn, ["a single text"])
    assert_same_as_embed(gw, conn, [f"text {i} " + "word " * (i % 150) for i in range(80)])     # chunked: ~3.5k tokens


def test_the_ids_are_tokenizes(server, conn):
    """The gateway's own tokenization, fed the deployment's settings as Triton reports them."""
    import asyncio

    from rose_gateway.tokens import ModelInfo
    from rose_gateway.triton_state import TritonState

    async def config():
        state = TritonState([server.grpc_url])
        try:
            return await state.tokenize_config()
        finally:
            await state.close()

    model = ModelInfo(None)
    model.use_server_settings(asyncio.run(config()))
    assert model.server_settings_known and model.prompts["query"] == "query: "
    texts = TEXTS + [HUGE, "ünïcödé text ✓"]
    for task in (None, "query"):
        toks, want = model.tokenize(texts, task, True), tokenized(conn, texts, task)
        np.testing.assert_array_equal(toks.ids, want["INPUT_IDS"])
        np.testing.assert_array_equal(toks.lens, want["SEQ_LENS"])
        np.testing.assert_array_equal(toks.truncated, want["TRUNCATED"])


def test_openai_client_sees_the_same_vectors(gw, conn):
    oa = openai.OpenAI(base_url=gw.url + "/v1", api_key="none", max_retries=0, timeout=120)
    resp = oa.embeddings.create(input=TEXTS, model="all-MiniLM-L6-v2", extra_body={"task": "query"})
    got = np.array([d.embedding for d in resp.data], np.float32)
    want = conn.infer("embed", [("TEXT", TEXTS), ("TASK", ["query"])]).result(120)["EMBEDDINGS"]
    assert cos_dist(got, want).max() <= 1e-6
    assert [getattr(d, "truncated", None) for d in resp.data] == [None, None, True]


def test_truncate_false_and_unknown_task(gw):
    r = post(gw, {"input": ["short", HUGE], "truncate": False})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input[1]"
    assert "max_text_bytes" in r.json()["error"]["message"]
    r = post(gw, {"input": "x", "task": "nope"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "task" and "'query'" in r.json()["error"]["message"]
    assert post(gw, {"input": "still serving"}).status_code == 200


# --------------------------------------------------------------------------- late chunking
@pytest.mark.parametrize("task,dimensions", [(None, None), ("query", 64)])
def test_late_chunking_as_embed_with_doc_chunks(gw, conn, task, dimensions):
    long_doc = DOCUMENT + [f"Sentence {i} says more about the city and its river. " for i in range(60)]
    for doc in (DOCUMENT, long_doc):                   # the long one runs in windows of 256 tokens
        r = post(gw, {"input": doc, "late_chunking": True, **({"task": task} if task else {}),
                      **({"dimensions": dimensions} if dimensions else {})})
        assert r.status_code == 200, r.text
        got = vectors(r.json())
        want = embed_late_chunks(conn, [doc], task=task)[0]
        if dimensions:
            want = want[:, :dimensions] / np.linalg.norm(want[:, :dimensions], axis=1, keepdims=True)
        assert got.shape == want.shape and cos_dist(got, want).max() <= 1e-6, cos_dist(got, want).max()
        assert not any("truncated" in d for d in r.json()["data"])


def test_late_chunking_refusals(gw):
    r = post(gw, {"input": ["Paris is big. ", "   "], "late_chunking": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input[1]"
    assert "no token of its own" in r.json()["error"]["message"]
    r = post(gw, {"input": [[101, 2000, 102]], "late_chunking": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "late_chunking"
    r = post(gw, {"input": ["a", "b"], "late_chunking": "yes"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "late_chunking"
    assert post(gw, {"input": "still serving"}).status_code == 200


# --------------------------------------------------------------------------- lanes
def test_the_lane_reaches_rose(gw, server):
    """Counts the bulk-lane admissions of the worker's own session server (no other test uses it
    meanwhile), once the counts of the tests before have settled."""
    wait_idle(server)
    before = _lane_count(server, "bulk")
    r = post(gw, {"input": "a short text, interactive by its size", "lane": "bulk"})
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 15                   # the metrics port is polled: a few seconds late
    while _lane_count(server, "bulk") < before + 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _lane_count(server, "bulk") == before + 1
    r = post(gw, {"input": "x", "lane": "fast"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "lane" and "interactive" in r.json()["error"]["message"]
    assert post(gw, {"input": "y", "lane": "interactive"}).status_code == 200


def test_rerank_takes_the_lane_field():
    from rose_gateway.errors import ApiError
    from rose_gateway.rerank import parse_rerank_request
    assert parse_rerank_request({"query": "q", "documents": ["a"], "lane": "bulk"}, 8).lane == "bulk"
    assert parse_rerank_request({"query": "q", "documents": ["a"]}, 8).lane is None
    with pytest.raises(ApiError) as e:
        parse_rerank_request({"query": "q", "documents": ["a"], "lane": 3}, 8)
    assert e.value.status == 400 and e.value.param == "lane" and "'interactive' or 'bulk'" in e.value.message


def _lane_count(server, lane: str) -> float:
    return metric(server, "rose_lane_wait_seconds_count", lane=lane)


def test_client_lane(server):
    import asyncio

    from rose_client import AsyncEmbeddingClient
    with EmbeddingClient(server.grpc_url) as c:
        a = c.embed(["lanes"], lane="bulk")
        b = c.embed_tokens([[101, 7592, 102]], lane="interactive")
        assert a.shape == b.shape == (1, 384)
        with pytest.raises(ValueError, match="lane must be one of"):
            c.embed(["x"], lane="fast")

    async def run():
        async with AsyncEmbeddingClient(server.grpc_url) as ac:
            return await ac.embed(["lanes"], lane="bulk")
    np.testing.assert_allclose(asyncio.run(run()), a, atol=1e-6)


# --------------------------------------------------------------------------- workers
def test_several_workers_share_the_port_and_the_metrics(gw):
    health = httpx.get(gw.url + "/health", timeout=30).json()
    assert health["workers"]["started"] == 2 and health["tokenizes_texts"] is True
    before = _requests_200(gw)
    for i in range(40):                                  # new connections: spread over both workers
        assert post(gw, {"input": f"request {i}"}).status_code == 200
    assert _requests_200(gw) == before + 40              # summed over the workers, whichever answers
    assert httpx.get(gw.url + "/health", timeout=30).json()["workers"]["serving"] == 2


def _requests_200(gw) -> float:
    import re
    text = httpx.get(gw.url + "/metrics", timeout=30).text
    m = re.search(r'^rose_gateway_requests_total{endpoint="embeddings",status="200"} ([0-9.e+]+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


class ConfigUnderAdminKey(TritonProcess):
    """A Triton whose operator keeps model configurations under the admin key (a gateway started on
    its own in front of a server it does not control)."""

    def command(self, install):
        return super().command(install) + [f"--grpc-restricted-protocol=model-config:admin-key={self.admin_key}"]


def test_without_the_tokenize_settings_texts_go_through_embed(minilm_shaped_dir):
    """The tokenize settings are Triton's model config: a gateway that cannot read them sends texts
    to `embed` (the same answers, counted with the folder's tokenizer), and says so on /health."""
    with running_server(str(minilm_shaped_dir), name="config-under-admin-key", process=ConfigUnderAdminKey) as server, \
            gateway_for(server.grpc_url, "tokens-no-config", extra_args=["--workers", "1"]) as g:
        conn = StreamConnection(server.grpc_url)
        try:
            check_texts_through_embed(g, conn)
        finally:
            conn.close()


def check_texts_through_embed(g, conn) -> None:
    assert httpx.get(g.url + "/health", timeout=30).json()["tokenizes_texts"] is False
    r = post(g, {"input": TEXTS[:2], "task": "query"})
    assert r.status_code == 200, r.text
    want = conn.infer("embed", [("TEXT", TEXTS[:2]), ("TASK", ["query"])]).result(120)["EMBEDDINGS"]
    assert cos_dist(vectors(r.json()), want).max() <= 1e-6
    r = post(g, {"input": DOCUMENT, "late_chunking": True})
    assert r.status_code == 503 and "tokenize settings" in r.json()["error"]["message"]


# --------------------------------------------------------------------------- random-weight folders
@pytest.fixture(scope="module")
def deployments(shared_server, qwen3_deployment, tmp_path_factory):
    """{name: (folder, server)}: a tiny BERT folder, and the session's Qwen3-Embedding one."""
    from rose_testing.folders import make_folder
    bert = make_folder("tiny-bert", tmp_path_factory.mktemp("gateway-folders") / "bert")
    return {"tiny-bert": (bert, shared_server(None, model_dir=str(bert), name="gw-tiny-bert")),
            "qwen3-embedding": qwen3_deployment}


@pytest.mark.parametrize("name", ["tiny-bert", "qwen3-embedding"])
def test_random_weight_folders(deployments, name):
    from rose_testing.folders import ids_to_text
    from rose_testing.qwen3 import WORDS
    folder, srv = deployments[name]
    rng = np.random.default_rng(0)
    if name == "tiny-bert":
        texts = [ids_to_text(rng.integers(10, 1000, size=n)) for n in (3, 40, 700)]
    else:
        texts = [" ".join(rng.choice(WORDS, size=n)) for n in (3, 40, 700)]
    with gateway_for(srv.grpc_url, f"tokens-{name}", extra_args=["--model", str(folder), "--workers", "1"]) as g:
        c = StreamConnection(srv.grpc_url)
        try:
            for task in (None, "query"):
                assert_same_as_embed(g, c, texts, task)
            assert_same_as_embed(g, c, texts, None, 16, "base64")
            counted = embed_counted(c, texts)
            assert counted.truncated.tolist()[-1] is True
        finally:
            c.close()


def test_workers_that_cannot_start_stop_the_gateway(tmp_path):
    """A worker that dies while starting stops them all (exit 1); a port in use is refused before any starts."""
    import socket
    import subprocess
    import sys

    from support.ports import free_port
    from rose_backend.launch.gateway import REPO_ROOT
    env = {"PYTHONPATH": ":".join(str(REPO_ROOT / p) for p in ("gateway", "client", "ensemble", "."))}
    port = free_port()
    cmd = [sys.executable, "-m", "rose_gateway", "--workers", "2", "--port", str(port),
           "--triton-urls", "127.0.0.1:1"]
    bad = subprocess.run(cmd + ["--model", str(tmp_path / "no-such-folder")], capture_output=True, text=True,
                         timeout=120, env=env)
    assert bad.returncode == 1 and "while starting; stopping" in bad.stderr, bad.stderr[-2000:]
    with socket.socket() as held:
        held.bind(("127.0.0.1", port))
        held.listen()
        busy = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert busy.returncode == 1 and "already in use" in busy.stderr, busy.stderr[-2000:]
    assert not list(tmp_path.iterdir())
