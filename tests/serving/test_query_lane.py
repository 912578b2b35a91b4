"""The query lane (serving/query_lane.py, interactive_stream=on): a second engine on the main
engine's weights takes the interactive batches while bulk batches are in flight, so a query is
answered before the bulk batches ahead of it finish, and bulk batches fill the whole budget; with no
bulk in flight, interactive batches run on the main engine as before. Real CPU engines, whose batches
the test holds "in flight" (test_lanes.HeldEngine) as a GPU's stay while the device runs them."""
import threading

import numpy as np
import pytest
from test_lanes import HeldEngine, expected

from rose_backend.config import ModelConfig
from rose_backend.engine.engine import Engine
from rose_backend.serving.service import EmbeddingService
from rose_backend.serving.service_settings import ServiceSettings
from rose_backend.triton.model_settings import RoseSettings
from rose_testing.waiting import wait_until
from support.requests import uniform_request as request


@pytest.fixture(scope="module")
def engines(minilm_shaped_dir):
    main = Engine(ModelConfig.from_folder(minilm_shaped_dir))
    return main, Engine(main.cfg, weights_from=main)


def service(main, query, done):
    return EmbeddingService(main, done.append,
                            ServiceSettings.of(RoseSettings(), max_batch_tokens=256, max_batch_seqs=16, max_inflight=2, inline=False),
                            query_engine=query)


def test_the_query_engine_runs_the_main_engines_weights_with_buffers_of_its_own(engines):
    main, query = engines
    assert query.model is main.model and query.heads is main.heads
    assert query.graphs is not main.graphs and query._static is not main._static and query._slots is not main._slots
    assert query.budget.weights == 0 and main.budget.weights > 0     # the weights are counted once
    seqs = [[101, 2054, 2003, 1996, 3007, 102], [101, 7592, 102]]
    np.testing.assert_array_equal(query.embed(seqs), main.embed(seqs))


def test_a_query_is_answered_beside_bulk_batches_in_flight(engines):
    main, query = engines
    held_main, held_query, done = HeldEngine(main), HeldEngine(query, hold=False), []
    svc = service(held_main, held_query, done)
    try:
        bulk = request(2, 12, 64, lane="bulk")              # 768 tokens: three batches of the whole budget
        svc.submit(bulk)
        assert wait_until(lambda: len(held_main.batches) == 2, 10)   # max_inflight: two in flight, held
        assert [b.num_tokens for b in held_main.batches] == [256, 256]   # no bulk cap beside the query lane
        q = request(3, 1, 20)
        svc.submit(q)
        assert wait_until(lambda: q in done, 10), "the query waited for the bulk batches in flight"
        assert len(held_query.batches) == 1 and len(held_main.batches) == 2 and bulk not in done
        np.testing.assert_array_equal(held_query.batches[0].input_ids, q.input_ids)
        held_main.release_all()
        assert wait_until(lambda: bulk in done, 30)
        np.testing.assert_allclose(bulk.output, expected(main, bulk), atol=1e-5)    # every row, in order
        np.testing.assert_allclose(q.output, expected(main, q), atol=1e-5)
        assert svc.scheduler.stats.batches["bulk"] == 3 and svc.scheduler.stats.batches["interactive"] == 1
    finally:
        held_main.release_all()
        svc.stop(10)


def test_with_no_bulk_in_flight_queries_run_on_the_main_engine(engines):
    main, query = engines
    held_main, held_query, done = HeldEngine(main, hold=False), HeldEngine(query, hold=False), []
    svc = service(held_main, held_query, done)
    try:
        reqs = [request(10 + i, 2, 30) for i in range(6)]
        for r in reqs:
            svc.submit(r)
        assert wait_until(lambda: len(done) == len(reqs), 30)
        for r in reqs:
            np.testing.assert_allclose(r.output, expected(main, r), atol=1e-5)
        assert held_main.batches and not held_query.batches
    finally:
        svc.stop(10)


class GatedFirstStep:
    """A HeldEngine whose first step waits at a gate: requests submitted meanwhile are all queued
    when the loop thread next forms batches."""

    def __init__(self, held):
        self.held, self.gate, self.entered, self._first = held, threading.Event(), threading.Event(), True

    def __getattr__(self, name):
        return getattr(self.held, name)

    def step(self, batch):
        if self._first:
            self._first = False
            self.entered.set()
            assert self.gate.wait(30)
        return self.held.step(batch)


def test_with_the_main_engine_full_and_no_bulk_queries_wait_for_its_slots(engines):
    """Concurrent queries and no bulk: with the main engine's two slots full, the next query waits
    for one of them; the query engine takes nothing (it is for queries beside bulk work)."""
    main, query = engines
    held_main, held_query, done = HeldEngine(main), HeldEngine(query, hold=False), []
    gated = GatedFirstStep(held_main)
    svc = service(gated, held_query, done)
    try:
        reqs = [request(20 + i, 1, 200) for i in range(3)]       # one batch each (256-token budget)
        svc.submit(reqs[0])
        assert gated.entered.wait(10)                          # its step waits at the gate
        for r in reqs[1:]:
            svc.submit(r)
        gated.gate.set()
        assert wait_until(lambda: len(held_main.batches) == 2, 10)
        assert not wait_until(lambda: bool(done or held_query.batches), 0.5)
        held_main.release_all()
        assert wait_until(lambda: len(done) == 3, 30)
        assert not held_query.batches and len(held_main.batches) == 3
        for r in reqs:
            np.testing.assert_allclose(r.output, expected(main, r), atol=1e-5)
    finally:
        gated.gate.set()
        held_main.release_all()
        svc.stop(10)


def test_the_setting_is_auto_on_or_off():
    assert RoseSettings().interactive_stream == "auto"                     # on with a GPU
    assert RoseSettings.from_values({"interactive_stream": "on"}).interactive_stream == "on"
    with pytest.raises(ValueError, match="'interactive_stream' must be auto, on or off, got 'yes'"):
        RoseSettings.from_values({"interactive_stream": "yes"})
