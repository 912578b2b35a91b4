"""The service's inline path (a request arriving at an idle service is launched on the submitting
thread, and a lone one is run whole there: waited for and answered, no hand-over), its responder threads (a batch's answers sent side by side) and its stage timing, with a real CPU
engine."""
import json
import threading
import time

import numpy as np
import pytest

from rose_backend.config import ModelConfig
from rose_backend.engine.engine import Engine
from rose_backend.engine.options import EngineOptions
from rose_backend.serving.service import EmbeddingService
from rose_backend.serving.service_settings import ServiceSettings
from rose_backend.serving import whole_runs
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


def test_a_lone_request_is_run_whole_on_the_submitting_thread(engine):
    """Launched, waited for, sliced and answered by the thread that submitted it: submit() returns
    with the answer sent, and no other thread of the service touched it."""
    gate = Gate(engine)
    gate.open.set()
    done, where = [], []
    svc = EmbeddingService(gate, lambda r: (done.append(r), where.append(threading.current_thread().name)))
    try:
        me = threading.current_thread().name
        for i, r in enumerate([request(0), request(1, n=1)]):
            if i:
                time.sleep(0.01)                      # well past backlog_us (150 us): a lone request again
            svc.submit(r)
            assert done[-1] is r and where[-1] == me and gate.threads[-1] == me     # answered before submit returned
            want = engine.embed([r.input_ids[j * 12:(j + 1) * 12].tolist() for j in range(r.num_seqs)])
            np.testing.assert_allclose(r.output, want, atol=1e-5)
        assert svc.stats.whole_inline == 2 and svc.stats.completed == 2 and svc.stats.batches == 2
    finally:
        svc.stop(5)


def test_a_request_of_a_backlog_is_launched_here_and_answered_by_the_loop(engine):
    """One that comes within backlog_us of the previous submit() returning (a backlog in Triton's
    queue) is launched by the submitting thread, which returns at once; the loop thread answers it,
    so requests behind it can batch. backlog_us=None never runs one whole."""
    gate = Gate(engine)
    gate.open.set()
    for backlog_us, whole in ((60_000_000, 1), (None, 0)):
        done, where = [], {}
        svc = EmbeddingService(gate,
                               lambda r: (done.append(r), where.__setitem__(id(r), threading.current_thread().name)),
                               ServiceSettings(backlog_us=backlog_us))
        try:
            first, second = request(2), request(3)
            svc.submit(first)
            assert wait_until(lambda: len(done) == 1, 30)
            svc.submit(second)                        # right after submit() returned: a backlog
            assert gate.threads[-1] == threading.current_thread().name           # launched here
            assert wait_until(lambda: len(done) == 2, 30) and where[id(second)] == "rose-scheduler"
            assert svc.stats.whole_inline == whole and second.error is None
        finally:
            svc.stop(5)


def test_a_request_sent_after_the_answer_is_no_sign_of_concurrent_traffic(engine):
    """One client at a time: the next request comes once the caller has its answer, which the loop
    thread may still be finishing (Triton's send returns after the caller has it). That request is
    answered, and counted as no sign of concurrent traffic (which would stop whole runs)."""
    gate = Gate(engine)
    gate.open.set()
    done, where = [], {}

    def answer(r):
        done.append(r)
        where[id(r)] = threading.current_thread().name
        if len(done) == 2:
            time.sleep(0.2)                           # the caller has its answer; the send still returns

    svc = EmbeddingService(gate, answer, ServiceSettings(backlog_us=50_000))
    try:
        svc.submit(request(19))                       # run whole
        svc.submit(request(20))                       # a backlog: the loop thread answers it
        assert svc.whole_runs.backlogs == 1
        assert wait_until(lambda: len(done) == 2, 30) and where[id(done[1])] == "rose-scheduler"
        second = request(21)
        svc.submit(second)                            # the loop thread still sends the first
        assert wait_until(lambda: len(done) == 3, 30) and second.error is None
        assert svc.whole_runs.concurrent_arrivals == 0
        np.testing.assert_allclose(second.output, engine.embed([second.input_ids[j * 12:(j + 1) * 12].tolist()
                                                                for j in range(3)]), atol=1e-5)
    finally:
        svc.stop(5)


def test_a_request_arriving_right_after_an_answer_waits_for_the_loop_thread_and_runs_inline(engine):
    """The loop thread's last step after an answer (popping its batch) is waited for, up to
    IDLE_WAIT_S: the request is launched on the submitting thread, not queued."""
    gate = Gate(engine)
    gate.open.set()
    done = []
    svc = EmbeddingService(gate, done.append, ServiceSettings(backlog_us=50_000))
    try:
        for seed in range(8):
            svc.submit(request(seed))                 # a backlog each: launched here, answered by the loop
            assert wait_until(lambda: len(done) == seed + 1, 30)
        assert gate.threads == [threading.current_thread().name] * 8
        assert svc.whole_runs.concurrent_arrivals == 0 and svc.stats.whole_inline == 1
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
        assert svc.whole_runs.concurrent_arrivals == 6
    finally:
        gate.open.set()
        svc.stop(5)


def test_requests_arriving_during_an_inline_step_queue_and_keep_their_order(engine):
    gate = Gate(engine)
    done = []
    svc = EmbeddingService(gate, done.append, ServiceSettings(response_threads=0))    # answers in computing order
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
        svc = EmbeddingService(gate, done.append, ServiceSettings(**kw))
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
    svc = EmbeddingService(engine, lambda r: None, ServiceSettings(response_threads=0), clock=clock)
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


def test_a_batch_is_answered_by_the_responders_and_a_lone_request_by_its_caller(engine, monkeypatch):
    monkeypatch.setattr(whole_runs, "BATCH_HOLD_S", 1.0)    # the hold outlasts a loaded machine's pauses
    gate = Gate(engine)
    done, where, lock = [], {}, threading.Lock()
    first, later = request(40), [request(41 + i, n=1) for i in range(6)]
    # the first two of the batch's answers wait for each other: only two responders at once get past
    # (one alone waits out the timeout, and the side-by-side check below then fails)
    meet, met = threading.Barrier(2, timeout=10), []

    def answer(r):
        if any(r is x for x in later[:2]):
            try:
                meet.wait()
                met.append(r)
            except threading.BrokenBarrierError:
                pass
        time.sleep(0.01)                         # a send: the GIL is free meanwhile
        with lock:
            done.append(r)
            where.setdefault(id(r), []).append(threading.current_thread().name)

    svc = EmbeddingService(gate, answer, ServiceSettings(response_threads=3))
    try:
        t = pooled_behind_an_inline_step(svc, gate, first, later)   # pooled: batched together
        gate.open.set()
        t.join(30)
        assert wait_until(lambda: len(done) == 7, 30)
        assert all(len(where[id(r)]) == 1 and r.error is None for r in [first] + later)   # once each
        assert {where[id(r)][0] for r in later} <= {f"rose-responder-{i}" for i in range(3)}
        assert len(met) == 2 and where[id(later[0])] != where[id(later[1])]               # side by side
        soon = request(49)                       # concurrent traffic just now: launched here, not run whole
        svc.submit(soon)
        assert wait_until(lambda: len(done) == 8, 30) and where[id(soon)] != [threading.current_thread().name]
        for i, r in enumerate(later):
            np.testing.assert_allclose(r.output, engine.embed([r.input_ids.tolist()]), atol=1e-5, err_msg=str(i))
        time.sleep(whole_runs.BATCH_HOLD_S + 0.05)
        lone = request(50)                       # idle for BATCH_HOLD_S: no hand-over at all
        svc.submit(lone)
        assert len(done) == 9 and where[id(lone)] == [threading.current_thread().name]
    finally:
        gate.open.set()
        svc.stop(5)


def test_stop_returns_after_every_handed_over_answer_is_sent(engine):
    gate = Gate(engine)
    done = []
    svc = EmbeddingService(gate, lambda r: (time.sleep(0.05), done.append(r)), ServiceSettings(response_threads=2))
    t = pooled_behind_an_inline_step(svc, gate, request(60), [request(61 + i, n=1) for i in range(8)])
    gate.open.set()
    t.join(30)
    svc.stop(30)                                 # 9 answers of 50 ms each on two threads: not all sent yet
    assert len(done) == 9 and len({id(r) for r in done}) == 9
    assert not any(th.is_alive() for th in svc.done.responders.threads)


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


def test_run_lone_answers_one_sequence_on_the_calling_thread_once_its_graph_is_captured(minilm_shaped_dir):
    """EmbeddingService.run_lone: not taken before the configuration's graph exists, nor while
    anything is in flight or queued, nor for a request of a backlog; taken, it answers on the
    calling thread with the same row as the batch path and counts the request."""
    engine = Engine(ModelConfig.from_folder(minilm_shaped_dir),
                    options=EngineOptions(graphs=True, max_tokens=512, max_seqs=8))
    rows = []
    svc = EmbeddingService(engine, lambda r: None, ServiceSettings(backlog_us=200_000))
    try:
        r = request(70, n=1, length=40)
        assert not svc.run_lone(r.input_ids, rows.append)               # no graph yet
        for seed in (71, 72):                                            # eager, then captured
            svc.submit(request(seed, n=1, length=40))
        time.sleep(0.25)
        me, where = threading.current_thread().name, []
        assert svc.run_lone(r.input_ids, lambda row: (rows.append(row.copy()), where.append(threading.current_thread().name)))
        assert not svc.run_lone(r.input_ids, rows.append)               # right after the last: a backlog
        assert where == [me] and svc.stats.lone == 1 and svc.stats.completed == 3
        np.testing.assert_allclose(rows[-1], engine.embed([r.input_ids.tolist()]), atol=2e-5)
        gate = Gate(engine)                                              # a batch in flight: not taken
        svc.engine = gate
        t = threading.Thread(target=svc.submit, args=(request(73, n=2),))
        t.start()
        assert gate.entered.wait(10)
        time.sleep(0.25)
        assert not svc.run_lone(r.input_ids, rows.append)
        gate.open.set()
        t.join(30)
        svc.engine = engine
        time.sleep(0.25)
        assert svc.run_lone(r.input_ids, rows.append) and svc.stats.lone == 2
    finally:
        svc.stop(5)

