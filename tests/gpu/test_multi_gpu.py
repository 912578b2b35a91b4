"""Two GPUs (nvidia-h200-x2): an engine on the second GPU serves from the scheduler's own thread,
whose current CUDA device starts as GPU 0, and agrees with the same model on GPU 0. This is what one
Triton instance per GPU does (instance_group without a kind): Triton kernels, flashinfer and graph
replay launch on the thread's current device, so the scheduler thread must bind the engine's.
Skipped with fewer than two GPUs."""
import threading

import numpy as np
import pytest
import torch

from rose_backend.config import ModelConfig
from rose_backend.engine.engine import Engine
from rose_backend.serving.scheduler import Request
from rose_backend.serving.service import EmbeddingService
from rose_backend.serving.service_settings import ServiceSettings
from rose_testing.folders import make_folder
from rose_testing.compare import cos_dist

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")]


def _serve(engine: Engine, requests: list[Request]) -> list[np.ndarray]:
    done, finished = [], threading.Event()

    def on_complete(r):
        done.append(r)
        if len(done) == len(requests):
            finished.set()

    svc = EmbeddingService(engine, on_complete, ServiceSettings(max_batch_tokens=4096, max_batch_seqs=16))
    try:
        for r in requests:
            svc.submit(r)
        assert finished.wait(300), f"{len(done)} of {len(requests)} requests answered"
    finally:
        svc.stop()
    for r in requests:
        assert r.error is None, r.error
    return [r.output for r in requests]


def _requests(rng) -> list[Request]:
    out = []
    for _ in range(12):
        lens = rng.integers(1, 300, size=int(rng.integers(1, 9))).astype(np.int32)
        out.append(Request(rng.integers(1000, 20000, size=int(lens.sum())).astype(np.int32), lens))
    return out


def test_engine_on_second_gpu_serves_from_scheduler_thread(tmp_path):
    cfg = ModelConfig.from_folder(make_folder("bge-m3", tmp_path / "bge-m3-2-layers", device="cuda", num_hidden_layers=2))
    torch.cuda.set_device(0)                       # the thread that builds the engine starts on GPU 0
    results = []
    for dev in ("cuda:0", "cuda:1"):
        eng = Engine(cfg, device=dev)
        assert eng.device == torch.device(dev)
        torch.cuda.set_device(0)
        results.append(np.concatenate(_serve(eng, _requests(np.random.default_rng(7)))))
        assert eng.stats.batches > 0
        del eng
    assert cos_dist(*results).max() < 1e-3
