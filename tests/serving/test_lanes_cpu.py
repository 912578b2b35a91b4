"""The lanes on an engine that runs each batch inside step() (the CPU), with a real CPU engine: bulk
batches hold about `bulk_batch_ms` of measured work (one sequence at least), a query that arrives
during a bulk batch gets the next batch to itself, a bulk request is not run whole inline past the
cap, nor run past it beside a query engine; with the time cap off, the token caps as on a GPU; the
setting's parsing and its refusal on a GPU."""
import threading

import numpy as np
import pytest

from rose_backend.config import ModelConfig
from rose_backend.engine.engine import Engine
from rose_backend.serving.lanes import CPU_BULK_BATCH_MS, BatchCost, LanePolicy, bulk_batch_seconds, runs_in_step
from rose_backend.serving.service import EmbeddingService
from rose_backend.serving.service_settings import ServiceSettings
from rose_backend.triton.model_settings import RoseSettings
from rose_testing.waiting import wait_until
from support.requests import uniform_request as request


@pytest.fixture(scope="module")
def engine(minilm_shaped_dir):
    return Engine(ModelConfig.from_folder(minilm_shaped_dir))


def expected(engine, r):
    return engine.embed([r.input_ids[r.offsets[i]:r.offsets[i + 1]].tolist() for i in range(r.num_seqs)])


class GatedEngine:
    """A real CPU engine (its device, so the service sees one that runs batches inside step())
    whose steps the test can hold at their start: step() waits while `gate` is clear."""

    def __init__(self, engine):
        self.engine, self.device = engine, engine.device
        self.gate = threading.Event()
        self.gate.set()
        self.batches = []                               # each step's PackedBatch
        self.waiting = threading.Event()                # a step is held at the gate

    def step(self, batch):
        self.batches.append(batch)
        if not self.gate.is_set():
            self.waiting.set()
            assert self.gate.wait(30), "a held step was never released"
        return self.engine.step(batch)


def service(eng, done, **settings):
    return EmbeddingService(eng, done.append,
                            ServiceSettings.of(RoseSettings(**settings), max_batch_tokens=256, max_batch_seqs=16, max_inflight=2))


def test_bulk_batches_hold_about_bulk_batch_ms_and_a_query_gets_the_next_batch(engine):
    eng, done = GatedEngine(engine), []
    # 1 ms of work: less than one 64-token sequence of this model, so one sequence a batch
    svc = service(eng, done, bulk_batch_ms="1")
    try:
        assert runs_in_step(eng) and svc.lanes.bulk_batch_s == 0.001
        bulk = request(1, 12, 64, lane="bulk")      # 768 tokens; fits no batch whole, nor inline
        eng.gate.clear()
        svc.submit(bulk)
        assert eng.waiting.wait(10)                  # the first bulk batch is held at its start
        q = request(2, 1, 20)
        svc.submit(q)                                # arrives while a bulk batch "runs"
        eng.gate.set()
        assert wait_until(lambda: len(done) == 2, 60)
        assert done.index(q) == 0
        lens = [int(b.num_seqs) for b in eng.batches]
        assert lens[0] == 1 and eng.batches[0].num_tokens == 64          # no cost measured yet: one sequence
        np.testing.assert_array_equal(eng.batches[1].input_ids, q.input_ids)   # the query alone, next
        assert lens[2:] == [1] * 11, lens                                 # then the bulk, a sequence a batch
        np.testing.assert_allclose(bulk.output, expected(engine, bulk), atol=1e-5)
        np.testing.assert_allclose(q.output, expected(engine, q), atol=1e-5)
        assert svc.lanes.cost.seconds > 0 and svc.lanes.cost.tokens > 0
    finally:
        eng.gate.set()
        svc.stop(10)


def test_a_bulk_request_within_the_batch_limits_is_not_run_whole_past_the_cap(engine):
    eng, done = GatedEngine(engine), []
    svc = service(eng, done, bulk_batch_ms="1")      # inline: the service's default
    try:
        bulk = request(3, 4, 64, lane="bulk")         # 256 tokens: one batch's budget
        svc.submit(bulk)
        assert wait_until(lambda: done == [bulk], 60)
        assert [b.num_seqs for b in eng.batches] == [1, 1, 1, 1]
        np.testing.assert_allclose(bulk.output, expected(engine, bulk), atol=1e-5)
        q = request(4, 1, 16)                          # a query still runs inline as one batch
        svc.submit(q)
        assert wait_until(lambda: len(done) == 2, 30) and eng.batches[-1].num_seqs == 1
    finally:
        svc.stop(10)


def test_the_time_cap_holds_beside_a_query_engine_too(engine):
    eng, done = GatedEngine(engine), []              # interactive_stream=on on a CPU instance
    svc = EmbeddingService(eng, done.append,
                           ServiceSettings.of(RoseSettings(bulk_batch_ms="1"), max_batch_tokens=256, max_batch_seqs=16, inline=False),
                           query_engine=Engine(engine.cfg, weights_from=engine))
    try:
        bulk = request(6, 6, 64, lane="bulk")
        svc.submit(bulk)
        assert wait_until(lambda: done == [bulk], 60)
        assert [b.num_seqs for b in eng.batches] == [1] * 6
        np.testing.assert_allclose(bulk.output, expected(engine, bulk), atol=1e-5)
    finally:
        svc.stop(10)


def test_with_the_time_cap_off_the_token_caps_apply_as_on_a_gpu(engine):
    eng, done = GatedEngine(engine), []
    svc = service(eng, done, bulk_batch_ms="0")
    try:
        assert svc.lanes.bulk_batch_s == 0 and svc.lanes.bulk_cap() is None
        bulk = request(5, 12, 64, lane="bulk")        # no query yet: full batches of 256 tokens
        svc.submit(bulk)
        assert wait_until(lambda: done == [bulk], 60)
        assert [b.num_tokens for b in eng.batches] == [256, 256, 256]
        np.testing.assert_allclose(bulk.output, expected(engine, bulk), atol=1e-5)
    finally:
        svc.stop(10)


def test_the_time_cap_policy():
    p = LanePolicy(bulk_batch_tokens=6144, bulk_max_inflight=2, interactive_recent_s=1.0, bulk_batch_s=0.1)
    assert p.bulk_cap() == 1 and p.bulk_room(100.0, False, 0) == 1      # nothing measured: one sequence
    p.ran(10, 0.0)                                                       # step() returned: its time is counted
    assert p.cost.tokens == 10 and p.cost.seconds > 0
    p.cost = BatchCost()
    p.cost.observe(1000, 0.5)                                            # 2 ms a token... then 1 ms
    p.cost.observe(1000, 1.0)
    assert p.bulk_cap() == int(0.1 * (1000 * 0.8 + 1000) / (0.5 * 0.8 + 1.0))   # 128 tokens in 100 ms
    assert p.bulk_room(100.0, False, 0) == 128                           # no query yet: the cap still holds
    p.seen("interactive", 100.0)
    assert p.bulk_room(100.5, True, 0) == 0                              # a query waits: its batch is its own
    assert p.bulk_room(100.5, False, 0) == 128
    p.bulk_batch_tokens = 64
    assert p.bulk_room(100.5, False, 0) == 64 and p.bulk_room(102.0, False, 0) == 128
    assert p.runs_alone("interactive", 10_000) and p.runs_alone("bulk", 128) and not p.runs_alone("bulk", 129)


def test_bulk_batch_ms_resolves_per_device_and_is_refused_on_a_gpu():
    assert bulk_batch_seconds("auto", serial=True) == CPU_BULK_BATCH_MS / 1e3
    assert bulk_batch_seconds("", serial=False) == 0.0 and bulk_batch_seconds("0", serial=False) == 0.0
    assert bulk_batch_seconds("250", serial=True) == 0.25 and bulk_batch_seconds("0", serial=True) == 0.0
    with pytest.raises(ValueError, match=r"'bulk_batch_ms' \(50\) applies to an instance on the CPU"):
        bulk_batch_seconds("50", serial=False)
    for bad in ("-5", "fast", "1.5"):
        with pytest.raises(ValueError, match=r"model 'rose': parameter 'bulk_batch_ms' must be auto or an integer"):
            RoseSettings.from_values({"bulk_batch_ms": bad})
    assert RoseSettings.from_values({"bulk_batch_ms": " 40 "}).bulk_batch_ms == "40"

    class Gpu:                                       # an engine on a GPU, as far as the lanes can tell
        class device:
            type = "cuda"
    with pytest.raises(ValueError, match="bulk_batch_ms"):
        EmbeddingService(Gpu(), lambda r: None, ServiceSettings.of(RoseSettings(bulk_batch_ms="50")))
    assert not runs_in_step(Gpu()) and LanePolicy.of(RoseSettings(), Gpu()).bulk_batch_s == 0.0
