"""No answer holds another request's rows: the engine's handles and the service's paths, on the CPU,
with every accepted combination of graphs (cuda_graphs) and inline launches (inline_execute).

With graphs on, the CPU runs the bucketed static buffers as a GPU does (stand-in graphs replay
into one static output per configuration), so a handle that kept a view of that output instead of
its own rows would hold the next batch's rows once that batch ran."""
import numpy as np
import pytest

from rose_backend.config import ModelConfig
from rose_backend.engine.batch import PackedBatch
from rose_backend.engine.engine import Engine
from rose_backend.engine.options import EngineOptions
from rose_backend.serving.service import EmbeddingService
from rose_backend.serving.service_settings import ServiceSettings
from rose_testing.cross_talk import ServiceClient, distinct_requests, reference_rows, run_clients

VOCAB = (1000, 30000)


@pytest.fixture(scope="module")
def cfg(minilm_shaped_dir):
    return ModelConfig.from_folder(minilm_shaped_dir)


@pytest.fixture(scope="module")
def reference(cfg):
    eager = Engine(cfg, "cpu", EngineOptions(graphs=False))
    return lambda requests: reference_rows(eager.embed, requests)


@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("max_inflight", [1, 2])
def test_handles_keep_their_own_rows(cfg, reference, graphs, max_inflight):
    """Batches of one configuration stepped back to back, up to one more handle held than the
    engine's ring (the slow detach path), synchronized in launch order and in reverse."""
    engine = Engine(cfg, "cpu", EngineOptions(graphs=graphs, max_inflight=max_inflight))
    requests = distinct_requests(1, 12, VOCAB, max_seqs=2, lengths=(5, 30))     # one (2, 64) configuration
    want = reference(requests)
    for reverse in (False, True):
        for start in range(0, len(requests), max_inflight + 1):
            group = requests[start:start + max_inflight + 1]
            handles = [engine.step(PackedBatch.of_lists(r)) for r in group]
            order = list(zip(group, handles))
            for req, handle in reversed(order) if reverse else order:
                got = handle.synchronize()
                np.testing.assert_allclose(got, np.stack([want[tuple(s)] for s in req]), atol=1e-5, rtol=1e-4)
    assert engine.stats.graph_replays > 0 if graphs else engine.stats.graph_replays == 0


@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("inline", [False, True])
@pytest.mark.parametrize("batch_seqs", [1, 8])
def test_many_clients_get_their_own_rows_through_the_service(cfg, reference, graphs, inline, batch_seqs):
    """One client, then bursts of eight at once, through every path the service has: the lone path
    and whole inline runs while requests come one at a time; at each burst's start an inline launch
    answered by the loop thread, then the loop thread's batches. Each answer is held against its own
    request's reference rows. With one sequence a batch, every batch of short sequences runs the same
    configuration (one static output), the case where a kept view would show the next batch's rows."""
    engine = Engine(cfg, "cpu", EngineOptions(graphs=graphs))
    engine.precapture([(1, 64), (2, 64), (4, 128)] if graphs else [])
    requests = distinct_requests(2, 24 + 6 * 24, VOCAB, max_seqs=3 if batch_seqs > 1 else 1, lengths=(3, 60))
    client = ServiceClient()
    svc = client.service = EmbeddingService(engine, client.on_complete, ServiceSettings(
        inline=inline, max_batch_tokens=256, max_batch_seqs=batch_seqs))
    try:
        reports = [run_clients(client.embed, requests[:24], clients=1, pause_s=0.003)]     # no backlog
        for start in range(24, len(requests), 24):                    # the service idle between bursts
            reports.append(run_clients(client.embed, requests[start:start + 24], clients=8))
    finally:
        svc.stop(10)
    for report in reports:
        report.check(reference(report.requests))
    stats = svc.stats
    assert stats.completed == len(requests)
    if inline and graphs:
        assert stats.lone > 0                      # the lone path was among those checked
    if not inline:
        assert stats.lone == 0 and stats.whole_inline == 0
