"""End to end through a real tritonserver, over gRPC streams: correctness, isolation, bad input."""
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from rose_client import EmbeddingClient, ServerError, StreamConnection
from rose_testing.compare import cos_dist
from rose_testing.waiting import wait_until
from support.perf_analyzer import WINDOWS, perf_analyzer_sh

pytestmark = pytest.mark.server
ROOT = Path(__file__).resolve().parents[2]

VARIED = ["a", "word", "The Eiffel Tower is in Paris. " * 60, "naïve café, Grüße, 日本語のテキスト",
          "emoji 🚀🔥👍🏽 and ZWJ 👩‍👩‍👧", "tabs\tand\nnewlines", "UPPER lower MiXeD 12345 3.14159",
          "x", "a somewhat longer sentence about retrieval augmented generation and embeddings"]


def test_embed_matches_sentence_transformers(client, sentence_model):
    ours = client.embed(VARIED)
    ref = sentence_model.encode(VARIED)
    assert ours.shape == (len(VARIED), 384) and ours.dtype == np.float32
    assert cos_dist(ours, ref).max() <= 1e-4
    for i, t in enumerate(VARIED[:4]):                    # one text per request too
        assert cos_dist(client.embed([t])[0], ref[i]) <= 1e-4


def test_many_mixed_texts_in_one_request_keep_their_order(client, sentence_model):
    rng = np.random.default_rng(0)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    texts = [" ".join(rng.choice(words, size=int(n))) for n in rng.integers(1, 150, size=60)]
    ours = client.embed(texts)                           # spans many batches (budget 512 tokens)
    assert cos_dist(ours, sentence_model.encode(texts)).max() <= 1e-4


def test_task_prompt_is_applied(client, sentence_model):
    texts = ["what is the tallest mountain", "how do embeddings work"]
    ours = client.embed(texts, task="query")
    ref = sentence_model.encode(texts, prompt="query: ")
    assert cos_dist(ours, ref).max() <= 1e-4
    assert cos_dist(ours, client.embed(texts)).min() > 1e-3     # the prompt changes the vectors


def test_rose_with_token_ids_equals_the_ensemble(client, default_model_dir):
    from rose_ensemble.tokenization import TextTokenizer
    tok = TextTokenizer.from_folder(default_model_dir)
    ids, lens = tok.encode(VARIED)
    token_lists = [a.tolist() for a in np.split(ids, np.cumsum(lens)[:-1])]
    np.testing.assert_allclose(client.embed_tokens(token_lists), client.embed(VARIED), rtol=1e-5, atol=1e-6)


def test_32_concurrent_streams_get_their_own_answers(server, sentence_model):
    n_streams, per_stream = 32, 4
    texts = {(s, j): f"stream {s} request {j}: " + "lorem ipsum " * ((s * 7 + j * 13) % 12 + 1)
             for s in range(n_streams) for j in range(per_stream)}
    keys = list(texts)
    ref = dict(zip(keys, sentence_model.encode([texts[k] for k in keys])))
    results, errors = {}, []

    def run(s):
        conn = StreamConnection(server.grpc_url)
        try:
            futs = []
            for j in range(per_stream):             # requests of 1..3 texts, all in flight at once
                group = [(s, j)] + [(s, (j + d) % per_stream) for d in range(1, j % 3 + 1)]
                futs.append((group, conn.infer("embed", [("TEXT", [texts[k] for k in group])])))
            for group, f in futs:
                results[(s, group[0][1])] = (group, f.result(120)["EMBEDDINGS"])
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)
        finally:
            conn.close()

    threads = [threading.Thread(target=run, args=(s,)) for s in range(n_streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    assert len(results) == n_streams * per_stream
    for group, emb in results.values():
        assert emb.shape == (len(group), 384)
        assert cos_dist(emb, np.stack([ref[k] for k in group])).max() <= 1e-4


BAD_TEXT = [
    ([], "TEXT is empty"),
    ([b"fine", b""], r"TEXT\[1\] is an empty string"),
    ([b"ok", b"\xc3\x28 broken"], r"TEXT\[1\] is not valid UTF-8"),
]


@pytest.mark.parametrize("texts,message", BAD_TEXT)
def test_bad_text_gets_a_clear_error_and_the_server_keeps_serving(client, texts, message):
    with pytest.raises(ServerError, match=message) as e:
        client.embed(texts)
    assert "inputs 0..-1" not in str(e.value)                 # an empty call names no input range
    assert client.embed(["still serving"]).shape == (1, 384)


def test_unknown_task_is_named(client):
    with pytest.raises(ServerError, match="unknown task / prompt name 'summarize'.*'passage', 'query'"):
        client.embed(["x"], task="summarize")


BAD_TOKENS = [
    (np.array([101, 102], np.int32), np.array([3], np.int32), "SEQ_LENS sum to 3 but INPUT_IDS holds 2"),
    (np.array([101, 102], np.int32), np.array([3, -1], np.int32), r"SEQ_LENS\[1\] is -1"),
    (np.array([101, 102], np.int32), np.array([0, 2], np.int32), r"SEQ_LENS\[0\] is 0"),
    (np.array([101, 30522, 102], np.int32), np.array([3], np.int32), r"INPUT_IDS\[1\] = 30522 is outside the vocabulary"),
    (np.array([-5, 7, 102], np.int32), np.array([3], np.int32), r"INPUT_IDS\[0\] = -5 is outside"),
    (np.zeros(0, np.int32), np.zeros(0, np.int32), "SEQ_LENS is empty"),
    (np.full(600, 7, np.int32), np.array([600], np.int32), "sequence 0 has 600 tokens; this model embeds at most 512"),
    (np.array([101, 102], np.int64), np.array([2], np.int32), "INPUT_IDS"),                 # wrong dtype
    (np.array([101, 102], np.int32), np.array([2.0], np.float32), "SEQ_LENS"),              # wrong dtype
]


@pytest.mark.parametrize("ids,lens,message", BAD_TOKENS)
def test_bad_tokens_get_a_clear_error_and_the_server_keeps_serving(server, ids, lens, message):
    conn = StreamConnection(server.grpc_url)
    try:
        with pytest.raises(ServerError, match=message):
            conn.infer("rose", [("INPUT_IDS", ids), ("SEQ_LENS", lens)]).result(60)
        ok = conn.infer("rose", [("INPUT_IDS", np.array([101, 7592, 102], np.int32)),
                                 ("SEQ_LENS", np.array([3], np.int32))]).result(60)
        assert ok["EMBEDDINGS"].shape == (1, 384)
    finally:
        conn.close()


def test_bad_request_among_good_ones_on_one_stream(server):
    """Errors go to the request that caused them; neighbours on the same stream are unaffected."""
    conn = StreamConnection(server.grpc_url)
    try:
        good = [conn.infer("rose", [("INPUT_IDS", np.array([101, i + 1000, 102], np.int32)),
                                    ("SEQ_LENS", np.array([3], np.int32))]) for i in range(5)]
        bad = conn.infer("rose", [("INPUT_IDS", np.array([1, 2], np.int32)), ("SEQ_LENS", np.array([5], np.int32))])
        more = [conn.infer("rose", [("INPUT_IDS", np.array([101, i + 2000, 102], np.int32)),
                                    ("SEQ_LENS", np.array([3], np.int32))]) for i in range(5)]
        with pytest.raises(ServerError, match="SEQ_LENS sum to 5"):
            bad.result(60)
        outs = [f.result(60)["EMBEDDINGS"][0] for f in good + more]
        assert len({o.tobytes() for o in outs}) == 10          # ten distinct answers, none swapped
    finally:
        conn.close()


def test_metrics_are_exported(server, client):
    client.embed(["count me"])
    names = ("rose_batches_total", "rose_batch_tokens_total", "rose_queue_tokens", "rose_graph_replays_total")

    def scraped() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.ports.metrics}/metrics", timeout=5) as r:
            return r.read().decode()

    def batches(text: str) -> list[float]:
        return [float(line.split()[-1]) for line in text.splitlines() if line.startswith("rose_batches_total{")]

    # the metrics refresh once a second: until they show the request (or 10 s)
    wait_until(lambda: all(n in (t := scraped()) for n in names) and sum(batches(t)) >= 1, 10, interval=0.1)
    text = scraped()
    for name in names:
        assert name in text, name
    assert batches(text) and batches(text)[0] >= 1


def test_launcher_serves_and_stops_on_sigterm(tmp_path, shipped_sentence_model):
    """What `make serve` runs, on the shipped repository and the default model: ready, answers a
    client with sentence-transformers' embeddings of the real weights, the command of its ready message and README's example run as printed, the HTTP gateway
    it starts answers; SIGTERM stops the server and the gateway, and the launcher exits cleanly."""
    import httpx
    from support.ports import free_port, free_ports
    ports, gport = free_ports(), free_port()
    env = dict(os.environ)
    proc = subprocess.Popen([sys.executable, "-m", "rose_backend.launch", "--grpc-port", str(ports.grpc),
                             "--http-port", str(ports.http), "--metrics-port", str(ports.metrics),
                             "--gateway-port", str(gport)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True, start_new_session=True)
    gateway = f"http://127.0.0.1:{gport}"
    lines = []
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
            lines.append(line)
            if line.startswith("rose: serving"):
                break
        assert any(l.startswith("rose: serving") for l in lines), "".join(lines[-30:])
        with EmbeddingClient(f"127.0.0.1:{ports.grpc}") as c:
            ours = c.embed(VARIED)
        assert ours.shape == (len(VARIED), 384)
        assert cos_dist(ours, shipped_sentence_model.encode(VARIED)).max() <= 1e-4
        # the command the ready message prints works as printed, from another folder, with no
        # PYTHONPATH and no virtual environment activated
        command = proc.stdout.readline().strip()
        clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        r = subprocess.run(command, shell=True, cwd=tmp_path, env=clean, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and r.stdout.strip() == "(1, 384)", (command, r.stdout, r.stderr[-2000:])
        # README's "Calling it" example runs as written against the shipped deployment (only the
        # port differs), task="query" included
        readme = (ROOT / "README.md").read_text()
        block = re.search(r"## Calling it\n.*?```python\n(.*?)```", readme, re.S).group(1)
        assert 'task="query"' in block and "127.0.0.1:8001" in block
        code = block.replace("127.0.0.1:8001", f"127.0.0.1:{ports.grpc}") + "\nprint(docs.shape, query.shape, ids.shape)\n"
        r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=clean, capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        assert r.stdout.strip() == "(2, 384) (1, 384) (1, 384)", r.stdout
        # the OpenAI-compatible gateway in front of it (ready once the launcher printed its message)
        assert httpx.get(gateway + "/health", timeout=30).status_code == 200
        r = httpx.post(gateway + "/v1/embeddings", json={"input": "hello", "model": "all-MiniLM-L6-v2"}, timeout=60)
        assert r.status_code == 200 and len(r.json()["data"][0]["embedding"]) == 384
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(90) == 0
        with pytest.raises(httpx.ConnectError):
            httpx.get(gateway + "/health", timeout=5)                 # the gateway stopped with the server
    finally:
        if proc.poll() is None:            # a failed check: the launcher stops its server and gateway
            proc.send_signal(signal.SIGTERM)   # (each in its own session, out of reach of killpg)
            try:
                proc.wait(90)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def test_perf_analyzer_script_takes_url_then_perf_analyzer_options(server):
    """README's command line, against a deployment started without any key: the URL, then
    perf_analyzer's own options (no input file between). perf_analyzer reads the model's config,
    which Triton serves to whoever may infer."""
    r = perf_analyzer_sh(server.grpc_url, "--concurrency-range", "1:2", *WINDOWS)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    assert "Concurrency: 1," in r.stdout and "Concurrency: 2," in r.stdout, r.stdout[-2000:]
    assert "Composing models:" not in r.stdout          # `rose` itself, not the ensemble


def test_perf_analyzer_measures_embed_with_a_text_input_file(server):
    """The model follows the input file: a TEXT file goes to `embed` (the ensemble), no key needed."""
    r = perf_analyzer_sh(server.grpc_url, str(ROOT / "benchmarks" / "inputs" / "embed_1x128w.json"), *WINDOWS)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    assert re.search(r"Throughput: [0-9.]+ infer/sec", r.stdout), r.stdout[-2000:]
    assert "Composing models:" in r.stdout and "tokenize_batched, version" in r.stdout, r.stdout[-2000:]
