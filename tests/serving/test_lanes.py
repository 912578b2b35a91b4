"""The service's two lanes with a real CPU engine: while interactive traffic is recent, bulk batches
are capped and bulk batches in flight limited, an interactive request launches while a bulk batch
is still in flight, nothing is lost or reordered; and the lane parameter's parsing."""
import threading
import time

import numpy as np
import pytest

from rose_backend.config import ModelConfig
from rose_backend.engine.engine import Engine
from rose_backend.serving.lanes import LanePolicy, parse_lane
from rose_backend.serving.service import EmbeddingService
from rose_backend.serving.service_settings import ServiceSettings
from rose_backend.triton.model_settings import RoseSettings
from rose_testing.waiting import wait_until
from support.requests import uniform_request


@pytest.fixture(scope="module")
def engine(minilm_shaped_dir):
    return Engine(ModelConfig.from_folder(minilm_shaped_dir))


request = uniform_request


def expected(engine, r):
    return engine.embed([r.input_ids[r.offsets[i]:r.offsets[i + 1]].tolist() for i in range(r.num_seqs)])


class HeldHandle:
    def __init__(self, inner, done: threading.Event):
        self.inner, self.done = inner, done

    def ready(self):
        return self.done.is_set() and self.inner.ready()

    def synchronize(self):
        assert self.done.wait(30), "a held batch was never released"
        return self.inner.synchronize()

    @property
    def extras(self):
        return getattr(self.inner, "extras", None)


class HeldEngine:
    """A real engine whose batches stay "in flight" (not ready) until the test releases them, as a
    GPU's batches stay in flight while the device runs them."""

    def __init__(self, engine, hold=True):
        self.engine, self.hold = engine, hold
        self.batches, self.released = [], []          # each step's PackedBatch, its release event
        self.stepped = threading.Condition()

    def step(self, batch):
        done = threading.Event()
        handle = HeldHandle(self.engine.step(batch), done)
        with self.stepped:                 # hold read under the lock release_all() takes: a batch
            if not self.hold:              # stepped while it releases is released too
                done.set()
            self.batches.append(batch)
            self.released.append(done)
            self.stepped.notify_all()
        return handle

    def release_all(self):
        with self.stepped:
            self.hold = False
            for e in self.released:
                e.set()


def service(eng, done, **lanes):
    settings = RoseSettings(**{"bulk_batch_tokens": 6144, "bulk_max_inflight": 2, "interactive_recent_ms": 1000,
                               **lanes})
    return EmbeddingService(eng, done.append,
                            ServiceSettings.of(settings, max_batch_tokens=256, max_batch_seqs=16, max_inflight=2, inline=False))


def test_an_interactive_request_launches_while_a_bulk_batch_is_in_flight(engine):
    eng, done = HeldEngine(engine, hold=False), []
    svc = service(eng, done, bulk_max_inflight=1)
    try:
        warm = request(1, 1, 16)                   # interactive traffic: now recent
        svc.submit(warm)
        assert wait_until(lambda: done == [warm], 30)
        eng.hold = True
        bulk = request(2, 12, 64, lane="bulk")     # 768 tokens: three batches of 256
        svc.submit(bulk)
        assert wait_until(lambda: len(eng.batches) == 2, 10)
        time.sleep(0.3)
        assert len(eng.batches) == 2, "a second bulk batch went in flight beside the first"
        q = request(3, 1, 20)
        svc.submit(q)                              # the loop is waiting on the bulk batch: q goes now
        assert wait_until(lambda: len(eng.batches) == 3, 10)
        np.testing.assert_array_equal(eng.batches[2].input_ids, q.input_ids)     # q alone, bulk held back
        assert not eng.released[1].is_set() and done == [warm]
        eng.release_all()
        assert wait_until(lambda: len(done) == 3, 60)
        assert done.index(q) < done.index(bulk)
        np.testing.assert_allclose(bulk.output, expected(engine, bulk), atol=1e-5)   # every row, in order
        np.testing.assert_allclose(q.output, expected(engine, q), atol=1e-5)
        st = svc.scheduler.stats
        assert st.batches["interactive"] == 2 and st.batches["bulk"] == 3 and st.waits == {"interactive": 2, "bulk": 1}
    finally:
        eng.release_all()
        svc.stop(10)


def test_bulk_batches_are_capped_while_interactive_traffic_is_recent(engine):
    eng, done = HeldEngine(engine, hold=False), []
    svc = service(eng, done, bulk_batch_tokens=64, interactive_recent_ms=2000)
    try:
        bulk = request(4, 8, 64, lane="bulk")      # 512 tokens, no interactive traffic yet: full batches
        svc.submit(bulk)
        assert wait_until(lambda: bulk in done, 30)
        assert [int(b.seq_lens.sum()) for b in eng.batches] == [256, 256]
        q = request(5, 1, 16)
        svc.submit(q)
        assert wait_until(lambda: q in done, 30)
        n = len(eng.batches)
        bulk2 = request(6, 8, 64, lane="bulk")     # right after a query: at most 64 bulk tokens a batch
        svc.submit(bulk2)
        assert wait_until(lambda: bulk2 in done, 60)
        capped = [int(b.seq_lens.sum()) for b in eng.batches[n:]]
        assert capped == [64] * 8, capped
        time.sleep(2.1)                            # interactive_recent_ms has passed: full batches again
        n = len(eng.batches)
        bulk3 = request(7, 8, 64, lane="bulk")
        svc.submit(bulk3)
        assert wait_until(lambda: bulk3 in done, 30)
        assert [int(b.seq_lens.sum()) for b in eng.batches[n:]] == [256, 256]
        for r in (bulk, bulk2, bulk3):
            np.testing.assert_allclose(r.output, expected(engine, r), atol=1e-5)
    finally:
        svc.stop(10)


def test_a_query_rides_in_a_bulk_batch_within_the_cap(engine):
    eng, done = HeldEngine(engine), []
    svc = service(eng, done, bulk_batch_tokens=128)
    try:
        bulk = request(8, 16, 64, lane="bulk")     # 1024 tokens
        svc.submit(bulk)
        assert wait_until(lambda: len(eng.batches) == 2, 10)      # two full bulk batches in flight
        q = request(9, 1, 32)
        svc.submit(q)
        eng.released[0].set()                      # one slot frees: the next batch is q, then capped bulk
        assert wait_until(lambda: len(eng.batches) == 3, 10)
        third = eng.batches[2]
        np.testing.assert_array_equal(third.input_ids[:32], q.input_ids)
        assert list(third.seq_lens) == [32, 64, 64]                # q first, then 128 bulk tokens
        eng.release_all()
        assert wait_until(lambda: len(done) == 2, 60)
        np.testing.assert_allclose(bulk.output, expected(engine, bulk), atol=1e-5)
        np.testing.assert_allclose(q.output, expected(engine, q), atol=1e-5)
    finally:
        eng.release_all()
        svc.stop(10)


def test_stop_drains_bulk_held_back(engine):
    eng, done = HeldEngine(engine, hold=False), []
    svc = service(eng, done, bulk_max_inflight=1)
    q = request(10, 1, 16)
    svc.submit(q)
    assert wait_until(lambda: done == [q], 30)
    eng.hold = True
    bulk = request(11, 12, 64, lane="bulk")
    svc.submit(bulk)
    assert wait_until(lambda: len(eng.batches) == 2, 10)
    t = threading.Thread(target=svc.stop, args=(30,))
    t.start()
    time.sleep(0.2)
    eng.release_all()
    t.join(60)
    assert not t.is_alive() and done == [q, bulk] and bulk.error is None
    np.testing.assert_allclose(bulk.output, expected(engine, bulk), atol=1e-5)


def test_a_full_pool_of_bulk_refuses_bulk_but_admits_queries(engine):
    from rose_backend.serving.outcomes import Overloaded
    eng, done = HeldEngine(engine), []
    svc = EmbeddingService(eng, done.append,
                           ServiceSettings(max_batch_tokens=256, max_batch_seqs=16, max_queued_tokens=1024, inline=False))
    try:
        first = request(12, 16, 64, lane="bulk")           # 1024 tokens: 512 in flight, 512 queued
        svc.submit(first)
        assert wait_until(lambda: len(eng.batches) == 2, 10)
        svc.submit(request(13, 8, 64, lane="bulk"))        # 1024 queued now
        with pytest.raises(Overloaded, match="max_queued_tokens=1024"):
            svc.submit(request(14, 1, 64, lane="bulk"))
        q = request(15, 1, 64)
        svc.submit(q)                                      # counts the interactive tokens only
        eng.release_all()
        assert wait_until(lambda: len(done) == 3, 60) and all(r.error is None for r in done)
        assert done.index(q) < 2                           # ahead of the bulk queued before it
    finally:
        eng.release_all()
        svc.stop(10)


def test_lane_parameter_parsing():
    assert parse_lane(None) is None and parse_lane("bulk") == "bulk" and parse_lane(" Interactive ") == "interactive"
    from rose_backend.triton.request_inputs import request_parameters

    class Req:                                          # Triton's request.parameters(): a JSON object
        def __init__(self, raw):
            self.raw = raw

        def parameters(self):
            return self.raw

    def lane_of(raw):
        return parse_lane(request_parameters(Req(raw)).get("lane"))
    assert lane_of('{"lane": "bulk", "outputs": "sparse"}') == "bulk"
    assert lane_of("{}") is None and lane_of('{"outputs": "sparse"}') is None and lane_of("") is None
    for bad in ("fast", "", 3):
        with pytest.raises(ValueError, match=r"'lane' must be one of interactive, bulk, got"):
            parse_lane(bad)
    with pytest.raises(ValueError, match="'lane'"):
        lane_of('{"lane": "batch"}')


def test_lane_policy():
    p = LanePolicy(bulk_batch_tokens=4096, bulk_max_inflight=1, interactive_recent_s=1.0)
    assert p.bulk_room(100.0, False, 0) is None                    # no interactive traffic yet
    p.seen("bulk", 100.0)
    assert p.bulk_room(100.0, False, 1) is None
    p.seen("interactive", 100.0)
    assert p.bulk_room(100.5, False, 0) == 4096 and p.bulk_room(100.5, False, 1) == 0
    assert p.bulk_room(101.5, False, 1) is None                    # no longer recent
    assert p.bulk_room(101.5, True, 0) == 4096                     # interactive waiting in the pool


def test_settings_refuse_a_bad_share():
    with pytest.raises(ValueError, match="'bulk_min_share' must be between 0 and 1"):
        RoseSettings.from_values({"bulk_min_share": "2"})
    with pytest.raises(ValueError, match="'bulk_min_share' must be a number"):
        RoseSettings.from_values({"bulk_min_share": "a quarter"})
    assert RoseSettings.from_values({"bulk_min_share": "0.5"}).bulk_min_share == 0.5
