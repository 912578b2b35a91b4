"""The service's inline path (a request arriving at an idle service runs on the submitting thread),
its responder threads (a batch's answers sent side by side) and its stage timing, with a real CPU
engine."""
import json
import threading
import time

import numpy as np
import pytest

from rose_backend.config import ModelConfig
from rose_backend.engine.engine import Engine
from rose_backend.serving.service import EmbeddingService
from rose_testing.waiting import wait_until
from rose_backend.serving.stage_clock import StageClock
from support.requests import uniform_request


@pytest.fixture(scope="module")
def engine(minilm_shaped_dir):
    return Engine(ModelConfig.from_folder(minilm_shaped_dir))


def request(seed, n=3, length=12):
    return uniform_request(seed, n, length)


class Gate:
    """A real engine whose step waits until the test opens the gate (to hold a batch in launch)."""

    def __init__(self, engine):
        self.engine, self.open, self.entered, self.threads = engine, threading.Event(), threading.Event(), []

    def step(self, batch):
        self.threads.append(threading.current_thread().name)
        self.entered.set()
        assert self.open.wait(30)
        return self.engine.step(batch)


def pooled_behind_an_inline_step(svc, gate, first, later) -> threading.Thread:
    """`first` launched inline from thread "caller-1" and held at the gate; `later` submitted
    meanwhile (so they wait in the pool). The caller opens the gate and joins the thread."""
    t = threading.Thread(target=svc.submit, args=(first,), name="caller-1")
    t.start()
    assert gate.entered.wait(10)
    for r in later:
        svc.submit(r)
    return t


def test_idle_request_is_launched_by_the_submitting_thread_and_answered_by_the_loop(engine):
    gate = Gate(engine)
    gate.open.set()
    done, where = [], []
    svc = EmbeddingService(gate, lambda r: (done.append(r), where.append(threading.current_thread().name)))
    try:
        r = request(0)
        svc.submit(r)
        assert gate.threads == [threading.current_thread().name]          # launched here, no hand-over
        assert wait_until(lambda: done == [r], 30) and where == ["rose-scheduler"]
        want = engine.embed([r.input_ids[i * 12:(i + 1) * 12].tolist() for i in range(3)])
        np.testing.assert_allclose(r.output, want, atol=1e-5)
        assert svc.stats.completed == 1 and svc.stats.batches == 1
    finally:
        svc.stop(5)


def test_a_concurrent_load_still_forms_batches(engine):
    """Requests submitted while an inline launch is in flight are pooled and batched together."""
    gate = Gate(engine)
    done = []
    svc = EmbeddingService(gate, done.append)
    try:
        t = pooled_behind_an_inline_step(svc, gate, request(30), [request(31 + i, n=1) for i in range(6)])
        gate.open.set()
        t.join(30)
        assert wait_until(lambda: len(done) == 7, 30)
        assert svc.stats.batches < 7                      # the six pooled requests shared batches
    finally:
        gate.open.set()
        svc.stop(5)


def test_requests_arriving_during_an_inline_step_queue_and_keep_their_order(engine):
    gate = Gate(engine)
    done = []
    svc = EmbeddingService(gate, done.append, response_threads=0)    # answers in computing order
    first, later = request(1), [request(i) for i in range(2, 6)]
    try:
        t = pooled_behind_an_inline_step(svc, gate, first, later)   # the engine is busy inline: pooled
        assert done == [] and svc.scheduler.has_work()
        gate.open.set()
        t.join(30)
        assert wait_until(lambda: len(done) == 5, 30)
        assert done == [first] + later and all(r.error is None for r in done)
        assert gate.threads[0] == "caller-1" and set(gate.threads[1:]) == {"rose-scheduler"}
    finally:
        gate.open.set()
        svc.stop(5)


def test_inline_off_and_oversized_requests_use_the_scheduler_thread(engine):
    gate = Gate(engine)
    gate.open.set()
    for kw, r in (({"inline": False}, request(7)), ({"max_batch_tokens": 16}, request(8))):
        done = []
        svc = EmbeddingService(gate, done.append, **kw)
        try:
            gate.threads.clear()
            svc.submit(r)
            assert wait_until(lambda: done == [r], 30) and r.error is None
            assert set(gate.threads) == {"rose-scheduler"}
        finally:
            svc.stop(5)


def test_stage_clock_times_every_stage_of_a_request(engine, tmp_path, monkeypatch):
    monkeypatch.setenv("ROSE_STAGE_TIMES", str(tmp_path))
    clock = StageClock.from_env("rose")
    engine.mark_stages = True
    svc = EmbeddingService(engine, lambda r: None, clock=clock, response_threads=0)
    try:
        for i in range(5):
            r = request(20 + i)
            clock.mark(r, "received")
            svc.submit(r)
    finally:
        svc.stop(5)
        engine.mark_stages = False
    clock.write()
    (path,) = tmp_path.glob("rose_*[0-9].json")
    summary = json.loads(path.read_text())
    stages = ["received", "scheduled", "launched", "copy_queued", "result_on_host", "sliced"]
    assert list(summary) == stages[1:] + ["total"]
    assert all(s["n"] == 5 and s["p50_us"] >= 0 for s in summary.values())
    parts = sum(s["mean_us"] for k, s in summary.items() if k != "total")
    assert abs(parts - summary["total"]["mean_us"]) < 1.0          # the stages add up to the whole
    # ... and each request's own marks, in order, on the clock other processes use
    lines = [json.loads(line) for line in path.with_suffix(".marks.jsonl").read_text().splitlines()]
    assert len(lines) == 5 and all([m[0] for m in d["marks"]] == stages for d in lines)
    assert all(a[1] <= b[1] for d in lines for a, b in zip(d["marks"], d["marks"][1:]))
    assert abs(lines[-1]["marks"][-1][1] - time.clock_gettime_ns(time.CLOCK_MONOTONIC)) < 60e9


def test_a_batch_is_answered_by_the_responders_and_a_lone_request_by_the_loop_thread(engine):
    gate = Gate(engine)
    done, where, lock = [], {}, threading.Lock()

    def answer(r):
        time.sleep(0.01)                         # a send: the GIL is free meanwhile
        with lock:
            done.append(r)
            where.setdefault(id(r), []).append(threading.current_thread().name)

    svc = EmbeddingService(gate, answer, response_threads=3)
    first, later = request(40), [request(41 + i, n=1) for i in range(6)]
    try:
        t = pooled_behind_an_inline_step(svc, gate, first, later)   # pooled: batched together
        gate.open.set()
        t.join(30)
        assert wait_until(lambda: len(done) == 7, 30)
        assert all(len(where[id(r)]) == 1 and r.error is None for r in [first] + later)   # once each
        assert {where[id(r)][0] for r in later} <= {f"rose-responder-{i}" for i in range(3)}
        assert len({where[id(r)][0] for r in later}) > 1                                 # side by side
        for i, r in enumerate(later):
            np.testing.assert_allclose(r.output, engine.embed([r.input_ids.tolist()]), atol=1e-5, err_msg=str(i))
        lone = request(50)                       # the service is idle again: no hand-over
        svc.submit(lone)
        assert wait_until(lambda: len(done) == 8, 30) and where[id(lone)] == ["rose-scheduler"]
    finally:
        gate.open.set()
        svc.stop(5)


def test_stop_returns_after_every_handed_over_answer_is_sent(engine):
    gate = Gate(engine)
    done = []
    svc = EmbeddingService(gate, lambda r: (time.sleep(0.05), done.append(r)), response_threads=2)
    t = pooled_behind_an_inline_step(svc, gate, request(60), [request(61 + i, n=1) for i in range(8)])
    gate.open.set()
    t.join(30)
    svc.stop(30)                                 # 9 answers of 50 ms each on two threads: not all sent yet
    assert len(done) == 9 and len({id(r) for r in done}) == 9
    assert not any(th.is_alive() for th in svc._responders.threads)


def test_host_memory_is_trimmed_when_idle_and_under_a_load_only_rarely(monkeypatch):
    from rose_backend.serving import memory
    now = [100.0]
    monkeypatch.setattr(memory.time, "monotonic", lambda: now[0])
    trims = {}
    for mode in memory.HostMemoryTrimmer.MODES:
        now[0] = 100.0
        t = memory.HostMemoryTrimmer(mode, interval=1.0, busy_factor=30)
        if t._trim is not None:
            t._trim = lambda _pad: None                   # glibc's malloc_trim, not called in the test
        trims[mode] = []
        for step in range(1, 121):                        # two minutes, a check every second
            now[0] = 100.0 + step
            before = t.trims
            t.maybe_trim(idle=step > 90)                  # busy for 90 s, then idle
            if t.trims > before:
                trims[mode].append(step)
    if memory.HostMemoryTrimmer("idle")._trim is None:
        pytest.skip("not glibc: nothing is trimmed")
    assert trims["off"] == []
    assert trims["periodic"] == list(range(1, 121))
    assert trims["idle"] == [30, 60, 90] + list(range(91, 121))     # busy: every 30 s; idle: every second
    with pytest.raises(ValueError, match="idle, periodic, off"):
        memory.HostMemoryTrimmer("sometimes")
