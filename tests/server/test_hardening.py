"""Hardening: limits, bad input, cancellation, overload, out of memory, shutdown.

The service-level tests run a real CPU Engine without a server (out of memory is injected by a
thin wrapper, since a CPU cannot run out of GPU memory); the rest run against real tritonservers
(tests/support/server.py) and check what a client sees over gRPC streams.
"""
import signal
import threading
import time
from collections import Counter

import numpy as np
import pytest
import torch

from rose_backend.config import ModelConfig
from rose_backend.engine.batch import PackedBatch
from rose_backend.engine.engine import Engine
from rose_backend.serving.scheduler import Request, ScheduledBatch, Scheduler
from rose_backend.serving.outcomes import CANCELLED, SHUTTING_DOWN, Overloaded, ShuttingDown, is_out_of_memory
from rose_backend.serving.service import EmbeddingService
from rose_backend.serving.service_settings import ServiceSettings
from rose_testing.waiting import wait_until
from rose_client import ConnectionLost, ServerError, StreamConnection
from rose_testing.compare import cos_dist
from support.metrics import metric
from support.requests import random_request, run_service

HELLO = (np.array([101, 7592, 102], np.int32), np.array([3], np.int32))     # "[CLS] hello [SEP]"


# ---- the service, with a real CPU engine ------------------------------------------------------

@pytest.fixture(scope="module")
def engine(minilm_shaped_dir):
    return Engine(ModelConfig.from_folder(minilm_shaped_dir))


class OutOfMemoryOver:
    """Fault injection: a real engine whose step() raises torch.cuda.OutOfMemoryError (what a GPU
    raises) for any batch of more than `max_tokens` tokens, as a GPU with that little memory would."""

    def __init__(self, engine, max_tokens: int, error=torch.cuda.OutOfMemoryError):
        self.engine, self.max_tokens, self.error = engine, max_tokens, error
        self.refused, self.ran = 0, []

    def step(self, batch: PackedBatch):
        if batch.num_tokens > self.max_tokens:
            self.refused += 1
            raise self.error(f"CUDA out of memory. Tried to allocate {batch.num_tokens} MiB (injected)")
        self.ran.append(batch.num_tokens)
        return self.engine.step(batch)


class Slow:
    """A real engine that takes at least `seconds` per batch (to have work in flight on demand)."""

    def __init__(self, engine, seconds: float):
        self.engine, self.seconds, self.sequences = engine, seconds, 0

    def step(self, batch: PackedBatch):
        time.sleep(self.seconds)
        self.sequences += batch.num_seqs
        return self.engine.step(batch)




def reference(engine, r: Request) -> np.ndarray:
    """One sequence at a time through the plain engine."""
    return np.concatenate([engine.embed([r.input_ids[r.offsets[i]:r.offsets[i + 1]].tolist()])
                           for i in range(r.num_seqs)])


@pytest.mark.parametrize("error", [torch.cuda.OutOfMemoryError, lambda m: RuntimeError(m.replace("CUDA o", "o"))])
def test_out_of_memory_batch_is_split_and_retried(engine, error):
    rng = np.random.default_rng(1)
    requests = [random_request(rng, n) for n in (7, 1, 12, 3)]
    oom = OutOfMemoryOver(engine, max_tokens=150, error=error)
    svc, done = run_service(oom, requests, max_batch_tokens=2048, max_batch_seqs=64)
    assert oom.refused >= 1 and svc.stats.oom_splits >= 1
    assert all(t <= 150 for t in oom.ran)
    assert all(r.error is None for r in done), [r.error for r in done]
    for r in requests:
        np.testing.assert_allclose(r.output, reference(engine, r), atol=2e-5)
    # and the service keeps serving batches that fit, at full size
    svc2, done2 = run_service(oom, [random_request(rng, 2, max_len=20)], max_batch_tokens=2048)
    assert done2[0].error is None and svc2.stats.oom_splits == 0


def test_a_single_sequence_that_does_not_fit_fails_alone(engine):
    rng = np.random.default_rng(2)
    small = random_request(rng, 4, max_len=20)
    big = Request(np.full(300, 2000, np.int32), np.array([300], np.int32))       # over the 200-token "memory"
    mixed = Request(np.full(310, 2001, np.int32), np.array([10, 300], np.int32))  # one fits, one does not
    after = random_request(rng, 3, max_len=20)
    oom = OutOfMemoryOver(engine, max_tokens=200)
    svc, done = run_service(oom, [small, big, mixed, after], max_batch_tokens=4096)
    assert small.error is None and after.error is None
    np.testing.assert_allclose(after.output, reference(engine, after), atol=2e-5)
    for r in (big, mixed):
        assert r.error is not None and "out of memory" in r.error and "300 tokens" in r.error
    assert sorted(map(id, done)) == sorted(map(id, [small, big, mixed, after]))   # one answer each


def test_other_engine_errors_fail_the_batch_not_the_service(engine):
    class Broken:
        calls = 0

        def step(self, batch):
            Broken.calls += 1
            if Broken.calls == 1:
                raise ValueError("boom")
            return engine.step(batch)

    rng = np.random.default_rng(3)
    a, b = random_request(rng, 2), random_request(rng, 2)
    svc = EmbeddingService(Broken(), lambda r: None, ServiceSettings(max_batch_tokens=4096))
    try:
        svc.submit(a)
        assert wait_until(lambda: a.finished, 30)
        svc.submit(b)
        assert wait_until(lambda: b.finished, 30)
    finally:
        svc.stop(5)
    assert "boom" in a.error and b.error is None


def test_is_out_of_memory():
    assert is_out_of_memory(torch.cuda.OutOfMemoryError("CUDA out of memory"))
    assert is_out_of_memory(RuntimeError("HIP out of memory"))
    assert not is_out_of_memory(RuntimeError("shape mismatch"))
    assert not is_out_of_memory(ValueError("out of memory"))       # only the runtime's own errors


def test_split_keeps_rows_and_balances_tokens():
    s = Scheduler(max_batch_tokens=10_000, max_batch_seqs=64)
    a = Request(np.arange(30, dtype=np.int32), np.array([10, 10, 10], np.int32))
    b = Request(np.arange(100, 150, dtype=np.int32), np.array([20, 30], np.int32))
    s.add(a)
    s.add(b)
    batch = s.next_batch()
    first, second = batch.split()
    assert (first.num_seqs, second.num_seqs) == (3, 2) and first.num_tokens + second.num_tokens == 80
    together = np.concatenate([first.pack().input_ids, second.pack().input_ids])
    np.testing.assert_array_equal(together, batch.pack().input_ids)
    assert [p.row for p in second.pieces] == [0]
    one, two = ScheduledBatch.of(second.pieces).split()                        # inside one request
    assert (one.pieces[0].first, one.pieces[0].last, two.pieces[0].first, two.pieces[0].row) == (0, 1, 1, 0)


def test_cancelled_request_leaves_the_pool_and_is_not_computed(engine):
    slow = Slow(engine, 0.05)
    done = []
    svc = EmbeddingService(slow, done.append, ServiceSettings(max_batch_tokens=64, max_batch_seqs=4))
    flag = threading.Event()
    try:
        r = Request(np.full(200 * 16, 2000, np.int32), np.full(200, 16, np.int32), is_cancelled=flag.is_set)
        svc.submit(r)
        assert wait_until(lambda: slow.sequences >= 8, 30)
        flag.set()
        assert wait_until(lambda: r.finished, 10)
        assert r.error == CANCELLED and r.error_kind == "cancelled" and done == [r]
        computed = slow.sequences
        time.sleep(0.3)
        assert slow.sequences <= computed + 8 and computed < 60      # not computed further
        assert svc.queued_tokens == 0 and svc.stats.cancelled == 1
        ok = Request(*HELLO)
        svc.submit(ok)
        assert wait_until(lambda: ok.finished, 10) and ok.error is None
    finally:
        svc.stop(5)
    assert done.count(r) == 1                                          # nothing after FINAL
    assert r.handle is None and r.is_cancelled is None                 # the caller's objects let go


def test_overloaded_answers_at_once(engine):
    slow = Slow(engine, 0.2)
    svc = EmbeddingService(slow, lambda r: None,
                           ServiceSettings(max_batch_tokens=64, max_batch_seqs=4, max_queued_tokens=500))
    try:
        svc.submit(Request(np.full(400, 2000, np.int32), np.full(25, 16, np.int32)))
        t0 = time.monotonic()
        with pytest.raises(Overloaded, match=r"overloaded.*max_queued_tokens=500.*retry later"):
            svc.submit(Request(np.full(200, 2000, np.int32), np.full(2, 100, np.int32)))
        assert time.monotonic() - t0 < 0.1
    finally:
        svc.stop(0.1)


def test_stop_answers_every_request_within_the_drain_time(engine):
    slow = Slow(engine, 0.1)
    done = []
    # inline off: submitted one by one to an idle service, each request would run on this thread
    svc = EmbeddingService(slow, done.append, ServiceSettings(max_batch_tokens=64, max_batch_seqs=4, inline=False))
    requests = [Request(np.full(64, 2000 + i, np.int32), np.full(4, 16, np.int32)) for i in range(40)]
    for r in requests:
        svc.submit(r)
    time.sleep(0.25)
    t0 = time.monotonic()
    svc.stop(timeout=0.5)                   # 40 batches of 0.1 s cannot finish in 0.5 s
    assert time.monotonic() - t0 < 2.0
    assert not svc._thread.is_alive()
    assert sorted(map(id, done)) == sorted(map(id, requests))          # every request, exactly once
    outcome = Counter("ok" if r.error is None else r.error for r in requests)
    assert outcome["ok"] >= 2 and outcome[SHUTTING_DOWN] >= 20, outcome
    assert all(r.error_kind == "unavailable" for r in requests if r.error)
    with pytest.raises(ShuttingDown, match="retry later"):
        svc.submit(Request(*HELLO))


# ---- against real tritonservers -------------------------------------------------------------

def assert_error_then_serving(url, model, inputs, message):
    """The request gets an error matching `message`; the same stream then still answers."""
    conn = StreamConnection(url)
    try:
        with pytest.raises(ServerError, match=message):
            conn.infer(model, inputs).result(60)
        assert conn.infer("rose", rose_inputs(*HELLO)).result(60)["EMBEDDINGS"].shape == (1, 384)
    finally:
        conn.close()


def rose_inputs(ids, lens):
    return [("INPUT_IDS", ids), ("SEQ_LENS", lens)]


def outcome(fut, timeout=120):
    try:
        return fut.result(timeout)
    except Exception as e:
        return e


@pytest.fixture(scope="module")
def limited(minilm_shaped_dir):
    """A server with small limits, so that each one is easy to cross."""
    from support.server import running_server
    params = {"rose": {"max_batch_tokens": "256", "max_batch_seqs": "8", "max_queued_tokens": "2048",
                       "max_request_seqs": "16", "max_request_tokens": "1024"},
              "tokenize": {"max_request_texts": "8", "max_text_bytes": "2000"}}
    with running_server(str(minilm_shaped_dir), params=params, name="limited") as srv:
        yield srv


LIMITS = [
    ("rose", rose_inputs(np.full(17, 2000, np.int32), np.ones(17, np.int32)),
     "the request has 17 sequences; the limit is max_request_seqs=16"),
    ("rose", rose_inputs(np.full(1100, 2000, np.int32), np.full(10, 110, np.int32)),
     "the request has 1100 tokens; the limit is max_request_tokens=1024"),
    ("embed", [("TEXT", ["x"] * 9)], "the request has 9 texts; the limit is max_request_texts=8"),
    ("tokenize", [("TEXT", ["x"] * 9)], "max_request_texts=8"),
    ("embed", [("TEXT", ["word"] * 300 + [""])], "the request has 301 texts; the limit is max_request_texts=8"),
]


@pytest.mark.server
@pytest.mark.parametrize("model,inputs,message", LIMITS)
def test_limits_are_named_with_their_values(limited, model, inputs, message):
    assert_error_then_serving(limited.grpc_url, model, inputs, message)


@pytest.mark.server
def test_text_over_max_text_bytes_is_cut_not_refused(limited, sentence_model):
    conn = StreamConnection(limited.grpc_url)
    try:
        long = "naïve café " * 1_000_000                                   # 13 MB; cut to 2000 bytes
        cut = long.encode()[:2000].decode("utf-8", errors="ignore")
        got = conn.infer("embed", [("TEXT", [long, "short"])]).result(120)["EMBEDDINGS"]
        assert cos_dist(got, sentence_model.encode([cut, "short"])).max() <= 1e-4
    finally:
        conn.close()


@pytest.mark.server
def test_overloaded_server_answers_at_once_and_recovers(limited):
    """max_queued_tokens=2048: of 40 requests of 512 tokens sent at once, most are refused at once
    with an "overloaded ... retry later" error; retried with backoff, every one succeeds."""
    conn = StreamConnection(limited.grpc_url)
    try:
        reqs = [rose_inputs(np.full(512, 2000 + i, np.int32), np.full(8, 64, np.int32)) for i in range(40)]
        t0 = time.monotonic()
        futs = [conn.infer("rose", r) for r in reqs]
        times = {}
        for i, f in enumerate(futs):
            f.add_done_callback(lambda _f, i=i: times.setdefault(i, time.monotonic() - t0))
        results = [outcome(f) for f in futs]
        refused = [i for i, r in enumerate(results) if isinstance(r, Exception)]
        served = [i for i, r in enumerate(results) if not isinstance(r, Exception)]
        assert len(refused) >= 10 and len(served) >= 4, (len(refused), len(served))
        for i in refused:
            assert isinstance(results[i], ServerError), results[i]
            msg = str(results[i])
            assert "overloaded" in msg and "retry later" in msg and "max_queued_tokens=2048" in msg, msg
        # refusals do not wait for the queue: they come back long before the last served request
        assert max(times[i] for i in refused) < max(times[i] for i in served)
        assert min(times[i] for i in refused) < 1.0
        # the client's side: retry with backoff until each is served
        for i in refused:
            delay = 0.05
            for _ in range(30):
                r = outcome(conn.infer("rose", reqs[i]))
                if not isinstance(r, Exception):
                    break
                assert "retry later" in str(r)
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
            assert not isinstance(r, Exception), r
            emb = r["EMBEDDINGS"]                       # 8 copies of one sequence: 8 equal rows
            assert emb.shape == (8, 384) and np.abs(emb - emb[0]).max() < 1e-5
    finally:
        conn.close()


@pytest.mark.server
def test_cancelled_stream_work_leaves_the_pool_uncomputed(server):
    """A client that goes away (closes its stream) mid-request: the rest of its sequences are not
    computed, and the next caller is not kept waiting behind them."""
    before = metric(server, "rose_sequences_total")
    cancelled_before = metric(server, "rose_requests_cancelled_total")
    n = 4000                                                     # ~1M tokens: most of a minute of CPU work
    conn = StreamConnection(server.grpc_url)
    fut = conn.infer("rose", rose_inputs(np.full(n * 256, 2000, np.int32), np.full(n, 256, np.int32)))
    t0 = time.monotonic()
    while metric(server, "rose_sequences_total") == before and time.monotonic() - t0 < 30:
        time.sleep(0.2)                                          # until it is being computed
    conn.close()
    with pytest.raises(ConnectionLost):
        fut.result(10)
    time.sleep(2.5)                                              # metrics refresh once a second
    computed = metric(server, "rose_sequences_total") - before
    assert 0 < computed < n * 0.1, computed
    assert metric(server, "rose_requests_cancelled_total") == cancelled_before + 1
    assert metric(server, "rose_queue_tokens") == 0
    time.sleep(1.5)
    assert metric(server, "rose_sequences_total") - before == computed     # nothing more computed
    other = StreamConnection(server.grpc_url)
    try:
        t0 = time.monotonic()
        assert other.infer("rose", rose_inputs(*HELLO)).result(30)["EMBEDDINGS"].shape == (1, 384)
        assert time.monotonic() - t0 < 5
    finally:
        other.close()


def raw_stream(url, requests, settle=1.0):
    """Send (model, inputs) requests on one raw gRPC stream; return {request id: [responses]}
    collected until every id was answered and `settle` more seconds passed."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    from rose_client.transport import serialize_bytes
    msgs = []
    for i, (model, inputs) in enumerate(requests):
        m = service_pb2.ModelInferRequest(model_name=model, id=str(i))
        for name, value in inputs:
            t = m.inputs.add()
            t.name = name
            if isinstance(value, np.ndarray):
                t.datatype, raw = {"int32": "INT32", "int64": "INT64", "float32": "FP32"}[str(value.dtype)], value.tobytes()
                t.shape.extend(value.shape)
            else:
                t.datatype, raw = "BYTES", serialize_bytes(value)
                t.shape.append(len(value))
            m.raw_input_contents.append(raw)
        msgs.append(m)
    done = threading.Event()

    def gen():
        yield from msgs
        done.wait(120)

    channel = grpc.insecure_channel(url)
    got: dict[str, list] = {}
    try:
        stream = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(gen(), timeout=120)
        deadline = None
        for resp in stream:
            got.setdefault(resp.infer_response.id, []).append(resp)
            if deadline is None and len(got) == len(requests):
                deadline = threading.Timer(settle, done.set)
                deadline.start()
        return got
    except grpc.RpcError:
        return got                                   # the stream ends when gen() returns
    finally:
        done.set()
        channel.close()


@pytest.mark.server
def test_every_request_gets_exactly_one_final_response(limited):
    ok = rose_inputs(*HELLO)
    reqs = [("rose", ok), ("rose", rose_inputs(np.array([1, 2], np.int32), np.array([5], np.int32))),
            ("embed", [("TEXT", ["fine", ""])]), ("embed", [("TEXT", ["a text"])])]
    reqs += [("rose", rose_inputs(np.full(512, 2000 + i, np.int32), np.full(8, 64, np.int32))) for i in range(12)]
    got = raw_stream(limited.grpc_url, reqs)
    assert sorted(got, key=int) == [str(i) for i in range(len(reqs))]
    kinds = Counter()
    for rid, responses in got.items():
        assert len(responses) == 1, (rid, [r.error_message for r in responses])
        final = responses[0].infer_response.parameters["triton_final_response"].bool_param
        assert final, rid
        msg = responses[0].error_message
        kinds["ok" if not msg else "overloaded" if "overloaded" in msg else "error"] += 1
    assert kinds["error"] == 2 and kinds["ok"] >= 4, kinds


@pytest.mark.server
def test_sigterm_answers_requests_in_flight_then_exits():
    """SIGTERM with work in flight: every admitted request gets its embeddings, requests sent
    after the signal get an explicit error at once, and the server exits soon after (clients close
    their streams once answered; see docs/OPERATIONS.md for streams left open)."""
    from support.server import running_server
    # a drain time the in-flight work fits in even on a loaded CPU: the stop is bounded by
    # drain_timeout_s + 2 s (tests/launch/test_supervision.py), and this test is about answering everything
    params = {"rose": {"max_batch_tokens": "512", "max_batch_seqs": "8", "drain_timeout_s": "60"}}
    with running_server(params=params, name="sigterm", exit_timeout=None) as srv:
        conns = [StreamConnection(srv.grpc_url) for _ in range(4)]
        try:
            futs = [conns[i % 4].infer("rose", rose_inputs(np.full(512, 2000 + i, np.int32), np.full(4, 128, np.int32)))
                    for i in range(16)]                                # 16 batches, ~2 s of this CPU alone
            futs.append(conns[0].infer("embed", [("TEXT", ["in flight"] * 4)]))
            time.sleep(0.5)
            assert sum(f.done() for f in futs) < len(futs) // 2       # most are still in flight
            t0 = time.monotonic()
            srv.proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            late = [c.infer("rose", rose_inputs(*HELLO)) for c in conns] + [conns[1].infer("embed", [("TEXT", ["late"])])]
            for f in late:
                e = outcome(f, 10)
                assert isinstance(e, (ServerError, ConnectionLost)), e           # explicit, and at once
            results = [outcome(f, 60) for f in futs]
            errors = [r for r in results if isinstance(r, Exception)]
            assert not errors, errors[:3]
            assert all(r["EMBEDDINGS"].shape[1] == 384 for r in results)
        finally:
            for c in conns:
                c.close()
        code = srv.proc.wait(30)
        elapsed = time.monotonic() - t0
        assert code == 0 and elapsed < 30, (code, elapsed)


# Bad input beyond tests/server/test_server.py's battery: (model, inputs, what the error must say).
BIG = 2_100
BAD = [
    ("rose", [("INPUT_IDS", np.array([[101, 102]], np.int32)), ("SEQ_LENS", np.array([2], np.int32))], "shape"),
    ("rose", [("INPUT_IDS", ["101", "102"]), ("SEQ_LENS", np.array([2], np.int32))], "'INPUT_IDS' data-type is 'BYTES', but model 'rose' expects 'INT32'"),
    ("rose", [("INPUT_IDS", np.array([101, 102], np.int32))], "SEQ_LENS|expected 2 inputs"),
    # Triton names the unknown input (its wording depends on whether the model has optional inputs)
    ("rose", rose_inputs(*HELLO) + [("NORMALIZE", np.array([1], np.int32))], "unexpected inference input 'NORMALIZE'"),
    ("rose", rose_inputs(np.full(4097, 2000, np.int32), np.ones(4097, np.int32)), "max_request_seqs=4096"),
    ("rose", rose_inputs(np.full(BIG * 500, 2000, np.int32), np.full(BIG, 500, np.int32)),
     "1050000 tokens; the limit is max_request_tokens=1048576"),
    ("rose", rose_inputs(np.array([101, 102], np.int32), np.array([2**31 - 1, 2**31 - 1], np.int32)),
     "SEQ_LENS sum to 4294967294 but INPUT_IDS holds 2"),
    ("rose", rose_inputs(np.array([101, 2**31 - 1], np.int32), np.array([2], np.int32)), "outside the vocabulary"),
    ("embed", [("TEXT", ["x"]), ("TASK", ["query", "passage"])], "TASK|shape"),
    ("embed", [("TEXT", ["x"]), ("TASK", [b"\xff\xfe"])], "unknown task / prompt name"),
    ("embed", [("TEXT", np.array([1, 2], np.int32))], "'TEXT' data-type is 'INT32', but model 'embed' expects 'BYTES'"),
    ("embed", [("TASK", ["query"])], "missing input TEXT"),          # hung before (see embed/config.pbtxt)
    ("embed", [], "missing input TEXT"),
    ("embed", [("TEXT", ["x"]), ("TRUNCATE", ["no"])], "TRUNCATE"),
    ("embed", [("TEXT", ["x"] * 4097)], "the request has 4097 texts; the limit is max_request_texts=4096"),
    ("embed", [("TEXT", [b"ok", b"\xed\xa0\x80 surrogate"])], r"TEXT\[1\] is not valid UTF-8"),
    ("embed", [("TEXT", [b"ok", b"cut \xe2\x82"])], r"TEXT\[1\] is not valid UTF-8"),
    ("tokenize", [("TEXT", [b"\xc0\xaf"])], r"TEXT\[0\] is not valid UTF-8"),
    ("nonexistent", [("TEXT", ["x"])], "unknown model|not found"),
]


@pytest.mark.server
@pytest.mark.parametrize("model,inputs,message", BAD, ids=[f"{m}-{i}" for i, (m, _, _) in enumerate(BAD)])
def test_bad_input_battery(server, model, inputs, message):
    assert_error_then_serving(server.grpc_url, model, inputs, message)


ODD_BUT_VALID = [["   "], ["\x00 nul bytes \x00"], ["\u200b\u200d zero width"], ["🚀" * 5000],
                 ["a"] * 4096, ["mot é " * 2_000_000]]                            # the last: 14 MB, cut


@pytest.mark.server
@pytest.mark.parametrize("texts", ODD_BUT_VALID, ids=["spaces", "nul", "zero-width", "emoji", "4096-texts", "14MB"])
def test_odd_but_valid_texts_are_embedded(server, sentence_model, texts):
    conn = StreamConnection(server.grpc_url)
    try:
        t0 = time.monotonic()
        got = conn.infer("embed", [("TEXT", texts)]).result(120)["EMBEDDINGS"]
        elapsed = time.monotonic() - t0
        assert got.shape == (len(texts), 384) and np.isfinite(got).all()
        head = [t.encode()[:65536].decode("utf-8", errors="ignore") for t in texts[:4]]
        assert cos_dist(got[:4], sentence_model.encode(head)).max() <= 1e-4
        if len(texts[0]) > 1_000_000:
            assert elapsed < 10, elapsed                  # cut before tokenizing: no 14 MB tokenization
    finally:
        conn.close()


# ---- security defaults --------------------------------------------------------------------------

def test_pickle_only_model_folder_is_refused(tmp_path, default_model_dir):
    import shutil

    from rose_backend.config import ModelConfig, ModelFolderError
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(default_model_dir / name, tmp_path / name)
    (tmp_path / "pytorch_model.bin").write_bytes(b"not unpickled")
    with pytest.raises(ModelFolderError, match="only pickle weight files.*safetensors only"):
        ModelConfig.from_folder(tmp_path)
    (tmp_path / "pytorch_model.bin").unlink()
    with pytest.raises(ModelFolderError, match="no \\*.safetensors"):
        ModelConfig.from_folder(tmp_path)


def test_server_binds_loopback_by_default():
    from rose_backend.launch.triton_install import TritonInstall
    from rose_backend.launch.tritonserver import TritonProcess
    cmd = TritonProcess().command(TritonInstall(binary="tritonserver", backend_dir=None))
    for flag in ("--grpc-address=127.0.0.1", "--http-address=127.0.0.1", "--metrics-address=127.0.0.1"):
        assert flag in cmd


def test_remote_code_is_trusted_only_where_the_operator_opted_in():
    """A folder's own modeling code runs only through the fallback engine, which hands transformers
    the operator's opt-in (engine/choice.py: the `rose` parameter trust_remote_code, off by default):
    models/transformers_model.py is the one place that hands it to transformers, and nothing passes
    it as a literal True.
    The opt-in itself is tested on a real server (tests/server/test_model_folders.py)."""
    import re
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    passing = {}
    for folder in ("rose_backend", "ensemble", "model_repository", "gateway"):
        for f in (root / folder).rglob("*.py"):
            text = f.read_text()
            assert not re.search(r"trust_remote_code\s*=\s*True", text), f
            if re.search(r"[\"']trust_remote_code[\"']\s*:", text) or re.search(r"\(\S*trust_remote_code\s*=", text):
                passing[f.relative_to(root).as_posix()] = True
    assert set(passing) <= {"rose_backend/models/transformers_model.py"}, passing
    from rose_backend.engine.choice import trust_remote_code
    assert trust_remote_code("", {}) is False