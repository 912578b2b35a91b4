"""GPU suite for rerankers: the bge-reranker-v2-m3 shape (XLM-R large + classifier head) and the
Qwen3-Reranker-0.6B shape (Qwen3 0.6B, tied yes/no rows), random weights rounded to bf16, scored by
the engine in bf16 with CUDA graphs (eager, capture, replay) against the peer library in float32 on
the same weights (CrossEncoder.predict / the model card's code). Skipped without CUDA.

    source .gpu/enter.sh && python3 -m pytest tests/gpu/test_rerank_gpu.py -q -s
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rose_backend.config import ModelConfig
from rose_testing.reranker_folders import PeerReranker, write_reranker_folder

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DOC_WORDS = [0, 5, 64, 256, 1000, 30, 256, 3]       # empty, short, long, mixed in one batch
TOL = 3e-2                                          # |score difference|, bf16 engine vs float32 peer


@pytest.fixture(scope="module", params=["bge-reranker-v2-m3", "qwen3-reranker-0.6b"])
def folder(request, gpu_tmp):
    return write_reranker_folder(request.param, gpu_tmp / request.param, device="cuda")


def test_scores_in_graphs_match_the_float32_peer(folder):
    from rose_backend.engine.engine import Engine
    from rose_ensemble.pair_tokenization import PairTokenizer
    cfg = ModelConfig.from_folder(folder)
    assert cfg.is_reranker
    rng = np.random.default_rng(0)
    text = lambda n: " ".join(f"w{i}" for i in rng.integers(8, cfg.vocab_size, size=n))   # noqa: E731
    query, docs = text(12), [text(n) for n in DOC_WORDS]
    ids, lens, types = PairTokenizer.from_folder(folder).encode(query, docs)
    cu = np.concatenate([[0], np.cumsum(lens)])
    seqs = [ids[a:b] for a, b in zip(cu[:-1], cu[1:])]
    engine = Engine(cfg, device="cuda")                     # bf16, CUDA graphs (lazy capture)
    runs = [engine.embed(seqs)[:, 0] for _ in range(3)]     # eager, capture + replay, replay
    # the second run captures (its result is the captured run's), the third replays
    assert engine.stats.graph_captures >= 1 and engine.stats.graph_replays >= 1, engine.stats
    peer = PeerReranker(folder, "cuda", torch.float32)
    ref = peer.scores(query, docs)
    del peer
    torch.cuda.empty_cache()
    err = float(np.abs(runs[-1] - ref).max())
    replay_vs_eager = float(np.abs(runs[-1] - runs[0]).max())
    print(f"\n{folder.name}: pair tokens {lens.tolist()}; rose {np.round(runs[-1], 4).tolist()}; "
          f"peer {np.round(ref, 4).tolist()}; max |diff| {err:.2e}; replay vs eager {replay_vs_eager:.2e}")
    assert np.all(np.isfinite(runs[-1])) and np.all((runs[-1] >= 0) & (runs[-1] <= 1))
    assert replay_vs_eager < 1e-3
    assert err < TOL
