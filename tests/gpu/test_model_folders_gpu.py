"""GPU suite for the sentence-transformers chain and the fallback engine: a Dense chain on the native
engine in bf16 (eager, captured, replayed: the chain inside the CUDA graph) and fallback families
(electra, t5 with sentence-t5's chain, gpt2) in bf16, their micro-batches captured and replayed, each
against sentence-transformers in float32 on the same weights. Skipped without CUDA.

    python3 -m pytest tests/gpu/test_model_folders_gpu.py -q
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rose_backend.config import ModelConfig
from rose_backend.engine.factory import build_engine
from rose_backend.engine.options import EngineOptions
from rose_testing.compare import cos_dist
from rose_testing.fallback_folders import fallback_folder
from rose_testing.folders import make_folder, random_ids
from rose_testing.st_folders import Dense, chain_folder, words

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

LENS = [1, 37, 128, 5, 64, 90, 3]
TOL = 2e-3                                   # 1 - cos, bf16 against float32


def reference(folder, seqs):
    from sentence_transformers import SentenceTransformer
    model = SentenceTransformer(str(folder), device="cuda", model_kwargs={"dtype": torch.float32})
    return model.encode([words(s) for s in seqs], batch_size=len(seqs))


def run_three_times(cfg, seqs, want, **options):
    engine, choice = build_engine(cfg, "cuda", EngineOptions(**options))
    for _ in range(3):                       # eager, capture, replay
        got = engine.embed(seqs)
        assert got.shape == want.shape and np.isfinite(got).all()
        assert cos_dist(got, want).max() <= TOL, cos_dist(got, want)
    return engine, choice


def test_native_engine_runs_the_dense_chain_in_its_graph(gpu_tmp, tmp_path):
    base = make_folder("tiny-bert", gpu_tmp / "chain-bert", device="cuda")
    folder = chain_folder(tmp_path / "m", transformer=base, pooling=("cls", "mean", "max", "weightedmean"),
                          dense=[Dense(128, "Identity", bias=False), Dense(48, "Tanh")])
    cfg = ModelConfig.from_folder(folder)
    seqs = [random_ids(np.random.default_rng(1), cfg.vocab_size, n).tolist() for n in LENS]
    engine, choice = run_three_times(cfg, seqs, reference(folder, seqs))
    assert choice.native and engine.stats.graph_captures > 0 and engine.stats.graph_replays > 0


@pytest.mark.parametrize("model_type,pooling,dense", [
    ("electra", ("mean",), []), ("t5", ("mean",), [Dense(48, "Identity", bias=False)]),
    ("gpt2", ("lasttoken",), [])])
def test_fallback_engine_captures_its_micro_batches(tmp_path, model_type, pooling, dense):
    base = fallback_folder(model_type, tmp_path / "base")
    folder = chain_folder(tmp_path / "m", transformer=base, pooling=pooling, dense=dense)
    cfg = ModelConfig.from_folder(folder)
    seqs = [random_ids(np.random.default_rng(2), 1000, n).tolist() for n in LENS]
    engine, choice = run_three_times(cfg, seqs, reference(folder, seqs), max_tokens=256, max_seqs=4)
    assert not choice.native and engine.dtype == torch.bfloat16
    st = engine.stats
    assert st.graph_captures > 0 and st.graph_replays > 0, st        # the forward pass was captured
