"""GPU suite for the native families (rose_backend/models): each at its published width (layers trimmed)
with random weights, through the real Engine in bf16 (eager, CUDA-graph capture, replay; every CUDA
attention backend that runs the family's attention: windows, position bias; torch and fused kernels),
against transformers in float32 on the same weights (rose_testing.reference), 1 - cos <= 1e-3.
Lengths cross each family's sliding window. Skipped without CUDA.

    source .gpu/enter.sh && python3 -m pytest tests/gpu/test_families_gpu.py -q
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rose_backend.config import ModelConfig
from rose_backend.engine.engine import Engine
from rose_backend.engine.options import EngineOptions
from rose_backend.layers import fused
from rose_backend.layers.attention import available_backends, backend_class
from rose_backend.models.registry import attention_shape
from rose_testing.compare import cos_dist
from rose_testing.folders import make_folder, random_ids
from rose_testing.reference import Reference

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TOL = 1e-3                                  # 1 - cos, bf16 against float32
# shape (rose_testing.folders SHAPES) -> (config.json overrides, sequence lengths)
CASES = {
    "all-mpnet-base-v2": ({"num_hidden_layers": 6}, [1, 37, 384, 200, 64]),                     # position bias
    "distilbert-base": ({}, [1, 37, 128, 512, 64]),
    "gte-modernbert-base": ({"num_hidden_layers": 6}, [1, 37, 300, 1000, 64]),                  # window 64 each side
    "embeddinggemma-300m": ({"num_hidden_layers": 12}, [1, 37, 700, 1500, 64]),                 # window 256 each side
    "gte-qwen2-1.5b": ({"num_hidden_layers": 4}, [1, 37, 300, 1000, 64]),                       # causal, q/k/v bias
    "e5-mistral-7b": ({"num_hidden_layers": 2, "sliding_window": 256}, [1, 37, 300, 1000, 64]),  # causal window
    "llama-3.2-1b": ({"num_hidden_layers": 4, "is_causal": False}, [1, 37, 300, 1000, 64]),      # llama3 RoPE
}


@pytest.fixture(scope="module", params=list(CASES))
def family(request, gpu_tmp):
    """A folder of the shape, two sets of sequences of the same lengths and their float32 reference."""
    overrides, lens = CASES[request.param]
    path = make_folder(request.param, gpu_tmp / f"family-{request.param}", device="cuda", **overrides)
    cfg = ModelConfig.from_folder(path)
    rng = np.random.default_rng(1)
    runs = [[random_ids(rng, cfg.vocab_size, min(n, cfg.max_seq_length)).tolist() for n in lens] for _ in range(2)]
    ref = Reference(path, device="cuda")
    wants = [ref.embed(seqs) for seqs in runs]
    ref.close()
    yield cfg, runs, wants
    torch.cuda.empty_cache()


@pytest.mark.parametrize("kernels", ["torch", "fused"])
def test_family_bf16_eager_and_graph_match_float32(family, kernels, monkeypatch):
    cfg, runs, wants = family
    monkeypatch.setattr(fused, "enabled", kernels == "fused")
    shape = attention_shape(cfg, torch.bfloat16)
    names = [n for n in available_backends(shape, "cuda") if n != "sdpa_loop"] or ["sdpa_loop"]   # MPNet: the loop
    for name in names:
        eng = Engine(cfg, "cuda", EngineOptions(attention=name))
        for _ in range(3):                                 # eager, capture, replay (eager thrice without graphs)
            got = eng.embed(runs[0])
            assert cos_dist(got, wants[0]).max() <= TOL, (name, cos_dist(got, wants[0]))
        got = eng.embed(runs[1])                           # new ids of the same lengths through the same buffers
        assert cos_dist(got, wants[1]).max() <= TOL, (name, cos_dist(got, wants[1]))
        if backend_class(name).supports_cuda_graphs:
            assert (eng.stats.eager_runs, eng.stats.graph_captures, eng.stats.graph_replays) == (1, 1, 2), eng.stats
        del eng
        torch.cuda.empty_cache()
