"""GPU suite: no answer holds another request's rows, on CUDA, through the engine's pinned ring, the
lone path, the service's inline and loop-thread paths and the query lane's engine (its own static
buffers and graphs on the same weights). Each row is held against a float32 reference of the same
folder on the CPU (1 - cos <= 1e-3); rows of different requests are much further apart than that."""
import numpy as np
import pytest
import torch

from rose_backend.config import ModelConfig
from rose_backend.engine.batch import PackedBatch
from rose_backend.engine.engine import Engine
from rose_backend.engine.options import EngineOptions
from rose_backend.serving.service import EmbeddingService
from rose_backend.serving.service_settings import ServiceSettings
from rose_testing.cross_talk import ServiceClient, distinct_requests, reference_rows, run_clients

VOCAB = (1000, 30000)
MAX_COS_DIST = 1e-3


@pytest.fixture(scope="module")
def cfg(gpu_tmp):
    """A random BERT folder (no model package needed on the GPU host): 30,522 ids, 2 layers."""
    from rose_testing.folders import make_folder
    return ModelConfig.from_folder(make_folder("tiny-bert", gpu_tmp / "cross-talk-bert", vocab_size=30522,
                                               hidden_size=128, num_attention_heads=4, intermediate_size=256))


@pytest.fixture(scope="module")
def reference(cfg):
    eager = Engine(cfg, "cpu", EngineOptions(graphs=False))
    return lambda requests: reference_rows(eager.embed, requests)


@pytest.mark.parametrize("max_inflight", [1, 2])
def test_handles_keep_their_own_rows_on_cuda(cfg, reference, max_inflight):
    """One configuration stepped back to back with one handle more than the ring holds, synchronized
    in launch order and in reverse, after the configuration's graph is captured."""
    engine = Engine(cfg, "cuda", EngineOptions(max_inflight=max_inflight))
    engine.precapture([(2, 64)])
    requests = distinct_requests(1, 24, VOCAB, max_seqs=2, lengths=(5, 30))
    want = reference(requests)
    for reverse in (False, True):
        for start in range(0, len(requests), max_inflight + 1):
            group = requests[start:start + max_inflight + 1]
            order = [(r, engine.step(PackedBatch.of_lists(r))) for r in group]
            for req, handle in reversed(order) if reverse else order:
                got = handle.synchronize()
                ref = np.stack([want[tuple(s)] for s in req])
                cos = (got * ref).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(ref, axis=1)
                assert (1 - cos).max() <= MAX_COS_DIST
    assert engine.stats.graph_replays > 0


@pytest.mark.parametrize("query_lane", [False, True])
@pytest.mark.parametrize("inline", [False, True])
@pytest.mark.parametrize("batch_seqs", [1, 8])
def test_many_clients_get_their_own_rows_on_cuda(cfg, reference, query_lane, inline, batch_seqs):
    """One client (the lone path), then bursts of eight, through the service on CUDA with graphs;
    with the query lane, interactive batches also run on the lane's engine beside the main one."""
    engine = Engine(cfg, "cuda")
    query = Engine(cfg, "cuda", EngineOptions(max_inflight=1), weights_from=engine) if query_lane else None
    configs = [(1, 64), (2, 64), (4, 128)]
    engine.precapture(configs)
    if query is not None:
        query.precapture(configs)
    requests = distinct_requests(2, 24 + 6 * 24, VOCAB, max_seqs=3 if batch_seqs > 1 else 1, lengths=(3, 60))
    client = ServiceClient()
    svc = client.service = EmbeddingService(engine, client.on_complete, ServiceSettings(
        inline=inline, max_batch_tokens=256, max_batch_seqs=batch_seqs), query_engine=query)
    try:
        reports = [run_clients(client.embed, requests[:24], clients=1, pause_s=0.003)]
        for start in range(24, len(requests), 24):
            reports.append(run_clients(client.embed, requests[start:start + 24], clients=8))
    finally:
        svc.stop(10)
    for report in reports:
        report.check(reference(report.requests), max_cos_dist=MAX_COS_DIST)
    assert svc.stats.completed == len(requests)
    if inline:
        assert svc.stats.lone > 0
    torch.cuda.synchronize()
