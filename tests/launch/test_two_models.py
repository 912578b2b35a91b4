"""An embedding model and a reranker in one deployment (`make serve MODEL=... RERANKER=...`).

One launch, as `make serve` runs it, of the default model (all-MiniLM-L6-v2) with a random-weight BERT
cross-encoder beside it: `embed` answers as sentence-transformers (1 - cos <= 1e-5) and `rerank` as
CrossEncoder.predict (1e-4), through rose_client on its gRPC port and through its gateway; each `rose`
engine counts its own work in the metrics; the generated repository goes when the launch stops.
A --reranker folder that is not a reranker is refused in one line.
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from rose_testing.compare import cos_dist
from rose_testing.waiting import wait_until
from support.metrics import metric

pytestmark = pytest.mark.server

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["Paris is the capital of France.", "the rose is a flower", "a", "search servers answer queries fast " * 30]
QUERY = "capital of france"
DOCS = ["paris is the capital of france", "a red rose in the garden", "", "the river city " * 60,
        "berlin is in germany", "query passage server", "blue"]


@pytest.fixture(scope="module")
def reranker_folder(tmp_path_factory):
    from rose_testing.reranker_folders import write_reranker_folder
    return write_reranker_folder("tiny-bert-ce", tmp_path_factory.mktemp("two-models") / "cross-encoder")


@pytest.fixture(scope="module")
def launch(reranker_folder):
    from support.launcher import LauncherRun
    with LauncherRun("--reranker", str(reranker_folder)) as run:
        assert run.wait_for("HTTP (OpenAI-compatible)", 300), run.output
        yield run
        if run.proc.poll() is None:               # stopped, not killed: it removes its generated repository
            run.terminate()


def test_no_served_config_names_a_local_folder(launch, reranker_folder, default_model_dir):
    """Model configs are open to inference callers: the generated repository names the reranker
    folder by $ROSE_RERANKER_DIR (the server's environment), not by its path."""
    import json
    import tritonclient.grpc as grpcclient
    client = grpcclient.InferenceServerClient(launch.grpc_url)
    try:
        configs = {m: json.dumps(client.get_model_config(m, as_json=True)) for m in ("rose", "rerank_rose",
                                                                                        "tokenize", "rerank_tokenize")}
    finally:
        client.close()
    for model, text in configs.items():
        assert str(reranker_folder) not in text and str(default_model_dir) not in text, (model, text)
    assert "$ROSE_RERANKER_DIR" in configs["rerank_rose"]


def _cosine_gap(got: np.ndarray, ref: np.ndarray) -> float:
    return float(cos_dist(got, ref).max())


def _sequences(launch, model: str) -> float:
    """rose_sequences_total of one `rose` engine (the metrics' model label)."""
    return metric(launch, "rose_sequences_total", model=model)


def _settled(launch, models: tuple[str, ...], timeout: float = 30.0) -> dict[str, float]:
    """The counts once they hold still over more than one refresh period (each is sent once a second)."""
    end, last = time.monotonic() + timeout, {m: _sequences(launch, m) for m in models}
    while time.monotonic() < end:
        time.sleep(1.5)
        now = {m: _sequences(launch, m) for m in models}
        if now == last:
            return now
        last = now
    raise AssertionError(f"the sequence counts of {models} did not settle")


def _wait_sequences(launch, model: str, expected: float, timeout: float = 20.0) -> float:
    wait_until(lambda: _sequences(launch, model) == expected, timeout, interval=0.25)
    return _sequences(launch, model)


def test_the_banner_names_both_models(launch, reranker_folder, default_model_dir):
    line = next(l for l in launch.lines if l.startswith("rose: serving"))
    assert f"{default_model_dir} and the reranker {reranker_folder}" in line, line
    assert "embed (text), rerank (query, documents)" in line, line
    assert any('.rerank("what is rose?"' in l for l in launch.lines), launch.output
    assert any(f"{launch.gateway_url}/v1/embeddings" in l and "/v1/rerank" in l for l in launch.lines), launch.output


def test_embed_and_rerank_on_one_server_match_the_peer_libraries(launch, reranker_folder, shipped_sentence_model):
    from rose_testing.reranker_folders import reference_scores
    from rose_client import EmbeddingClient
    with EmbeddingClient(launch.grpc_url) as client:
        emb = client.embed(TEXTS)
        scores = client.rerank(QUERY, DOCS)
        top = client.rerank(QUERY, DOCS, top_k=3)
    ref = shipped_sentence_model.encode(TEXTS, convert_to_numpy=True)
    assert emb.shape == (len(TEXTS), 384)
    assert _cosine_gap(emb, ref) <= 1e-5
    ref_scores = reference_scores(reranker_folder, QUERY, DOCS)
    assert scores.shape == (len(DOCS),) and scores.dtype == np.float32
    np.testing.assert_allclose(scores, ref_scores, atol=1e-4, rtol=0)
    assert np.ptp(ref_scores) > 1e-3                          # the scores tell documents apart
    assert [i for i, _ in top] == np.argsort(-ref_scores, kind="stable")[:3].tolist()


def test_each_engine_counts_its_own_work(launch):
    """rose's metrics carry the model: a rerank call counts on `rerank_rose` only, an embed call on `rose`
    (a rerank counted on `rose` too would keep it from its embed's count; an embed counted on
    `rerank_rose`, from the rerank's once both have had a refresh period more)."""
    from rose_client import EmbeddingClient
    before = _settled(launch, ("rose", "rerank_rose"))
    with EmbeddingClient(launch.grpc_url) as client:
        client.rerank(QUERY, DOCS)
        assert _wait_sequences(launch, "rerank_rose", before["rerank_rose"] + len(DOCS)) == \
            before["rerank_rose"] + len(DOCS)
        client.embed(TEXTS)
        assert _wait_sequences(launch, "rose", before["rose"] + len(TEXTS)) == before["rose"] + len(TEXTS)
    time.sleep(1.5)                                           # one more refresh period
    assert _sequences(launch, "rose") == before["rose"] + len(TEXTS)
    assert _sequences(launch, "rerank_rose") == before["rerank_rose"] + len(DOCS)


def test_the_gateway_serves_both(launch, reranker_folder, shipped_sentence_model):
    import httpx
    from rose_testing.reranker_folders import reference_scores
    gw = launch.gateway_url
    assert httpx.get(gw + "/health", timeout=30).json()["status"] == "ready"
    models = httpx.get(gw + "/v1/models", timeout=30).json()
    assert [m["id"] for m in models["data"]] == ["all-MiniLM-L6-v2", "rerank"], models
    r = httpx.post(gw + "/v1/embeddings", json={"input": TEXTS, "model": "all-MiniLM-L6-v2"}, timeout=60)
    assert r.status_code == 200, r.text
    got = np.array([d["embedding"] for d in r.json()["data"]], np.float32)
    assert _cosine_gap(got, shipped_sentence_model.encode(TEXTS, convert_to_numpy=True)) <= 1e-5
    r = httpx.post(gw + "/v1/rerank", json={"query": QUERY, "documents": [d or " " for d in DOCS]}, timeout=60)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    ref = reference_scores(reranker_folder, QUERY, [d or " " for d in DOCS])
    assert [x["index"] for x in results] == np.argsort(-ref, kind="stable").tolist()
    np.testing.assert_allclose([x["relevance_score"] for x in results], np.sort(ref)[::-1], atol=1e-4, rtol=0)


def test_the_generated_repository_goes_with_the_launch(launch):
    made = list(Path(tempfile.gettempdir()).glob(f"rose-models-{launch.proc.pid}-*"))
    assert len(made) == 1 and (made[0] / "model_repository" / "rerank_rose" / "config.pbtxt").exists(), made
    code, _ = launch.terminate()
    assert code == 0, launch.output[-3000:]
    assert not made[0].exists()


def _refused(*args: str) -> str:
    """The launcher's one line on stderr for a pair of folders it does not serve (exit 1, no traceback)."""
    from support.ports import free_ports
    ports = free_ports()
    r = subprocess.run([sys.executable, "-m", "rose_backend.launch", *args, "--gateway-port", "0",
                        "--grpc-port", str(ports.grpc), "--http-port", str(ports.http),
                        "--metrics-port", str(ports.metrics)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    return r.stderr


def test_a_reranker_folder_that_is_no_reranker_is_refused(default_model_dir):
    assert (f"rose: the reranker folder {default_model_dir} is not a reranker (config.json architectures: "
            "['BertModel'])") in _refused("--reranker", str(default_model_dir))


def test_a_reranker_beside_a_model_that_is_no_embedder_is_refused(reranker_folder):
    assert (f"rose: --reranker is served beside an embedding model, but the model folder {reranker_folder} is a "
            "cross-encoder") in _refused("--model", str(reranker_folder), "--reranker", str(reranker_folder))


def test_make_serve_passes_the_reranker():
    r = subprocess.run(["make", "-n", "serve", "RERANKER=/models/cross encoder", "MODEL=/models/embedder"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert '--model "/models/embedder" --reranker "/models/cross encoder"' in r.stdout, r.stdout
    plain = subprocess.run(["make", "-n", "serve"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "rose_backend.launch" in plain.stdout and "--reranker" not in plain.stdout, plain.stdout
