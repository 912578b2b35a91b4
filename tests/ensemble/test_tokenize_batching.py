"""`tokenize_batched` (the `embed` ensemble's tokenizer): requests that wait while it is busy are
tokenized together in one Rust call, each gets exactly its own ids, bad ones their own error.

The batcher runs here with the default model's real tokenizer (no server); the rest against a real
tritonserver over gRPC, compared with the Hugging Face tokenizer and sentence-transformers.
"""
import re
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from rose_backend.serving.outcomes import CANCELLED, SHUTTING_DOWN, ShuttingDown
from rose_testing.compare import cos_dist
from rose_client import ServerError, StreamConnection
from rose_ensemble.tokenization import InputError, TextTokenizer
from rose_ensemble.tokenize_batcher import Job, TokenizeBatcher
from rose_testing.waiting import wait_until
from support.metrics import metric

WORDS = "rose serves text embeddings on triton with ragged batches and no padding anywhere at all".split()


def text(i: int) -> str:
    rng = np.random.default_rng(i)
    return " ".join(rng.choice(WORDS, size=int(rng.integers(1, 40))))


@pytest.fixture(scope="module")
def tok(default_model_dir):
    return TextTokenizer.from_folder(default_model_dir)


@pytest.fixture(scope="module")
def hf(default_model_dir):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(default_model_dir))


class Recorder:
    """run_batch = the real tokenizer, held at a gate on demand (to make the batcher busy)."""

    def __init__(self, tok):
        self.tok, self.calls, self.threads = tok, [], []
        self.gate = threading.Event()
        self.gate.set()
        self.answers: list = []
        self.answered_on: list = []
        self.lock = threading.Lock()

    def run(self, requests):
        self.gate.wait(30)
        self.calls.append(len(requests))
        self.threads.append(threading.current_thread().name)
        for texts in requests:
            if any("BAD" in t for t in texts):
                raise InputError(f"bad text {texts}")
        return self.tok.encode_requests(requests)

    def answer(self, job, result, error):
        with self.lock:
            self.answers.append((job.handle, result, error))
            self.answered_on.append(threading.current_thread().name)


def test_a_lone_request_is_encoded_and_answered_on_the_calling_thread(tok, hf):
    rec = Recorder(tok)
    b = TokenizeBatcher(rec.run, rec.answer)
    try:
        b.submit(Job(["hello world"], "a"))
        me = threading.current_thread().name
        assert rec.threads == [me] and rec.answered_on == [me]          # no thread hop at all
        (handle, (ids, lens), error), = rec.answers
        assert handle == "a" and error is None
        assert ids.tolist() == hf("hello world")["input_ids"] and lens.tolist() == [ids.size]
        assert b.stats.answered_inline == 1
    finally:
        b.stop(5)
    assert not b._thread.is_alive()


def test_back_to_back_requests_leave_the_answer_to_the_worker(tok, hf):
    """A request handed over right after the previous execute() returned (a backlog in Triton's
    queue) is encoded at once, and answered by the worker, so that execute() returns early."""
    rec = Recorder(tok)
    b = TokenizeBatcher(rec.run, rec.answer, backlog_gap_us=1e12)    # every gap counts as a backlog
    try:
        b.submit(Job(["hello world"], "a"))
        assert rec.threads == [threading.current_thread().name]
        assert _wait(lambda: rec.answered_on == ["rose-tokenize"])
        assert rec.answers[0][1][0].tolist() == hf("hello world")["input_ids"] and b.stats.answered_inline == 0
    finally:
        b.stop(5)


def test_requests_waiting_while_busy_share_one_call_in_order(tok, hf):
    rec = Recorder(tok)
    b = TokenizeBatcher(rec.run, rec.answer)
    rec.gate.clear()
    first = threading.Thread(target=b.submit, args=(Job([text(0)], 0),))
    first.start()                                           # runs inline, held at the gate
    assert _wait(lambda: b.busy)
    for i in range(1, 9):                                   # these queue
        b.submit(Job([text(i), text(100 + i)] if i % 2 else [text(i)], i))
    assert b.queued == 8
    rec.gate.set()
    first.join(10)
    b.stop(10)
    assert not b._thread.is_alive()
    assert rec.calls == [1, 8] and b.stats.largest == 8 and b.stats.jobs == 9
    assert [h for h, _, _ in rec.answers] == list(range(9))        # each once, in arrival order
    for i, (ids, lens), err in rec.answers:
        texts = [text(i), text(100 + i)] if i % 2 else [text(i)]
        want = hf(texts)["input_ids"]
        assert err is None and lens.tolist() == [len(w) for w in want]
        assert ids.tolist() == [t for w in want for t in w]


def test_a_bad_request_in_a_batch_gets_its_error_and_the_others_their_ids(tok, hf):
    rec = Recorder(tok)
    b = TokenizeBatcher(rec.run, rec.answer)
    rec.gate.clear()
    threading.Thread(target=b.submit, args=(Job(["x"], 0),)).start()
    assert _wait(lambda: b.busy)
    for i, t in enumerate(["good one", "BAD one", "good two"], start=1):
        b.submit(Job([t], i))
    rec.gate.set()
    b.stop(10)
    got = {h: (r, e) for h, r, e in rec.answers}
    assert sorted(got) == [0, 1, 2, 3]
    assert isinstance(got[2][1], InputError) and got[2][0] is None
    for h, t in ((1, "good one"), (3, "good two")):
        assert got[h][1] is None and got[h][0][0].tolist() == hf(t)["input_ids"]


def test_cancelled_and_shutdown_requests_are_answered_not_tokenized(tok):
    rec = Recorder(tok)
    b = TokenizeBatcher(rec.run, rec.answer)
    rec.gate.clear()
    first = threading.Thread(target=b.submit, args=(Job(["x"], 0),))
    first.start()
    assert _wait(lambda: b.busy)
    b.submit(Job(["gone"], 1, is_cancelled=lambda: True))
    b.submit(Job(["stays"], 2))
    stopper = threading.Thread(target=b.stop, args=(0.3,))    # time runs out while the gate is shut
    stopper.start()
    time.sleep(0.1)
    with pytest.raises(ShuttingDown):
        b.submit(Job(["late"], 3))
    stopper.join(10)
    assert not b._thread.is_alive()
    rec.gate.set()                       # the job encoding inline meanwhile is answered by its caller
    first.join(10)
    got = {h: e for h, _, e in rec.answers}
    assert sorted(got) == [0, 1, 2] and got[0] is None and got[1] == got[2] == SHUTTING_DOWN


def test_a_cancelled_request_is_not_encoded(tok):
    rec = Recorder(tok)
    b = TokenizeBatcher(rec.run, rec.answer)
    rec.gate.clear()
    threading.Thread(target=b.submit, args=(Job(["x"], 0),)).start()
    assert _wait(lambda: b.busy)
    b.submit(Job(["gone"], 1, is_cancelled=lambda: True))
    b.submit(Job(["stays"], 2))
    rec.gate.set()
    b.stop(10)
    got = {h: e for h, _, e in rec.answers}
    assert got == {0: None, 1: CANCELLED, 2: None} and rec.calls == [1, 1] and b.stats.cancelled == 1


def _wait(pred, timeout=10.0):
    return wait_until(pred, timeout, interval=0.005)


# ---- through a real tritonserver ----------------------------------------------------------------

def _metric(server, name: str) -> float:
    return metric(server, name, model="tokenize_batched")


@pytest.fixture(scope="module")
def batching_server(shared_server, minilm_shaped_dir):
    """The shipped deployment (serving minilm_shaped_dir) with a 20 ms backlog window: on this shared 2-core machine Triton's
    hand-over between requests can exceed the default 250 us, which would answer each inline."""
    return shared_server({"tokenize": {"batch_backlog_us": "20000"}}, model_dir=str(minilm_shaped_dir), name="batching")


def test_concurrent_requests_get_their_own_ids_and_share_rust_calls(batching_server, hf, sentence_model):
    """16 threads, each pipelining its requests on its own stream: `tokenize_batched` ids equal the
    HF tokenizer's, `embed` vectors equal sentence-transformers', and Rust calls held several requests."""
    server = batching_server
    calls0, jobs0 = _metric(server, "rose_tokenize_encode_calls_total"), _metric(server, "rose_tokenize_encoded_requests_total")
    texts = [text(1000 + i) * (1 + i % 5) for i in range(64)]
    ref = sentence_model.encode(texts)

    def client(c: int) -> list[str]:
        conn, bad = StreamConnection(server.grpc_url), []
        mine = list(range(c, len(texts), 16))
        try:
            pairs = {k: [texts[k], texts[(k + 1) % len(texts)]] for k in mine}
            toks = {k: conn.infer("tokenize_batched", [("TEXT", pairs[k])]) for k in mine}     # all in flight
            embs = {k: conn.infer("embed", [("TEXT", [texts[k]])]) for k in mine}
            for k in mine:
                out = toks[k].result(120)
                want = hf(pairs[k], truncation=True, max_length=sentence_model.max_seq_length)["input_ids"]
                if out["SEQ_LENS"].tolist() != [len(w) for w in want] or \
                        out["INPUT_IDS"].tolist() != [t for w in want for t in w]:
                    bad.append(f"tokenize_batched {k}")
                if cos_dist(embs[k].result(120)["EMBEDDINGS"][0], ref[k]) > 1e-4:
                    bad.append(f"embed {k}")
        finally:
            conn.close()
        return bad

    with ThreadPoolExecutor(16) as pool:
        wrong = [w for ws in pool.map(client, range(16)) for w in ws]
    assert not wrong, wrong
    time.sleep(1.5)                                     # the model's counters reach Triton once a second
    calls, jobs = _metric(server, "rose_tokenize_encode_calls_total") - calls0, \
        _metric(server, "rose_tokenize_encoded_requests_total") - jobs0
    assert jobs == 2 * len(texts) and calls < jobs, (calls, jobs)         # some call held several requests
    wait_until(lambda: _metric(server, "rose_tokenize_largest_batch") > 1, 10, interval=0.2)   # polled per instance
    assert _metric(server, "rose_tokenize_largest_batch") > 1


def test_bad_requests_among_good_ones_get_their_own_errors(server, hf):
    def one(i: int):
        conn = StreamConnection(server.grpc_url)
        try:
            inputs = [("TEXT", [b"ok \xc0\xaf"])] if i % 4 == 1 else \
                [("TEXT", ["fine"]), ("TASK", ["nope"])] if i % 4 == 3 else [("TEXT", [text(i)])]
            try:
                out = conn.infer("embed" if i % 2 else "tokenize_batched", inputs).result(120)
            except ServerError as e:
                return i, str(e)
            return i, out
        finally:
            conn.close()

    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(one, range(48)))
    for i, out in results:
        if i % 4 == 1:
            assert re.search(r"tokenize: TEXT\[0\] is not valid UTF-8", out), out
        elif i % 4 == 3:
            assert "unknown task / prompt name 'nope'" in out, out
        elif i % 2 == 0:
            assert out["INPUT_IDS"].tolist() == hf(text(i))["input_ids"], i


def test_options_pass_through_to_rose_and_tokenize_keeps_http(server, client):
    """DIMENSIONS / ENCODING reach `rose` through the decoupled step; `tokenize` still answers HTTP
    (to the admin key: Triton's HTTP inference is the deployment's own)."""
    full = client.embed(["a b c"])
    assert client.embed(["a b c"], dimensions=64).shape == (1, 64)
    np.testing.assert_allclose(client.embed(["a b c"], dimensions=64)[0],
                               full[0, :64] / np.linalg.norm(full[0, :64]), atol=1e-5)
    body = b'{"inputs": [{"name": "TEXT", "shape": [1], "datatype": "BYTES", "data": ["hello world"]}]}'
    req = urllib.request.Request(f"http://127.0.0.1:{server.ports.http}/v2/models/tokenize/infer", body,
                                 headers={"admin-key": server.admin_key})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert b'"data":[101,7592,2088,102]' in r.read()


def test_server_stop_with_the_batcher_busy_leaves_nothing_behind(minilm_shaped_dir):
    """Requests pipelined into `tokenize_batched` and `embed`, then the server stopped: every request
    answered, exit code 0, no stub process and no /dev/shm segment of that server left."""
    from support import leftovers
    from support.server import running_server
    with running_server(str(minilm_shaped_dir), name="tokbatch-stop") as srv:
        conn = StreamConnection(srv.grpc_url)
        try:
            futs = [conn.infer("tokenize_batched" if i % 2 else "embed", [("TEXT", [text(i)])]) for i in range(40)]
            assert all(f.result(120) is not None for f in futs)
        finally:
            conn.close()
        prefix, code = srv.shm_prefix, srv.stop()          # a test about stopping stops its server itself
    assert code == 0
    procs, segs = leftovers.wait_gone({prefix}, 10.0)
    assert not procs and not segs, (procs, segs)
