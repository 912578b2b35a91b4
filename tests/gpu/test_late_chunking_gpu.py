"""Late chunking on CUDA: hidden-state batches through the engine's CUDA graphs (eager, capture,
replay under a key of their own), pooled per span as rose's serving path pools them, against the
float32 transformers reference on random-weight folders of both families, windows included; dense-
only batches keep their own graphs."""
import functools
import threading

import numpy as np
import pytest

from rose_backend.config import ModelConfig
from rose_backend.engine.engine import Engine
from rose_backend.engine.options import EngineOptions
from rose_backend.serving.outputs import OutputOptions, build_outputs, collect_piece, with_token_inputs
from rose_backend.serving.scheduler import Request
from rose_backend.serving.service import EmbeddingService
from rose_backend.serving.service_settings import ServiceSettings
from rose_backend.serving.validation import RequestLimits
from rose_testing.compare import cos_dist
from rose_testing.late_reference import late_chunk_reference
from rose_ensemble.late_chunks import LateChunker
from rose_ensemble.tokenization import TextTokenizer

ASK = OutputOptions(frozenset({"EMBEDDINGS"}), frozenset())


@pytest.fixture(scope="module")
def folders(gpu_tmp):
    from rose_testing.folders import make_folder
    from rose_testing.qwen3 import write_qwen3_folder
    return {"bert": make_folder("tiny-bert", gpu_tmp / "late-bert"),
            "xlmr-cls": make_folder("tiny-xlm-roberta", gpu_tmp / "late-xlmr"),
            "pplx": write_qwen3_folder(gpu_tmp / "late-pplx", style="pplx-embed")}


def documents_for(name, rng):
    if name == "pplx":
        from rose_testing.qwen3 import WORDS
        words = [WORDS[i] for i in rng.integers(0, len(WORDS), size=200)]
    else:
        words = [f"w{i}" for i in rng.integers(4, 1000, size=200)]
    parts = np.array_split(np.arange(len(words)), 8)
    long = [" ".join(words[i] for i in p) + " " for p in parts]
    return [long, long[:2], [" ".join(words[:9])]]


@pytest.mark.parametrize("name", ["bert", "xlmr-cls", "pplx"])
def test_chunk_vectors_on_cuda_match_transformers(folders, name):
    folder = folders[name]
    cfg = ModelConfig.from_folder(folder)
    tok = TextTokenizer.from_folder(folder, max_seq_length=64)
    documents = documents_for(name, np.random.default_rng(5))
    plan = LateChunker(tok, 16).plan(documents)
    engine = Engine(cfg, "cuda", EngineOptions(graphs=True))
    done = threading.Event()
    service = EmbeddingService(engine, lambda r: done.set(), ServiceSettings(max_batch_tokens=128, max_batch_seqs=4),
                               on_piece=functools.partial(collect_piece, skip_ids=None))
    limits = RequestLimits(max_seq_len=cfg.max_positions, vocab_size=cfg.vocab_size)
    want = np.concatenate(late_chunk_reference(folder, documents, window=64, overlap=16))
    try:
        for attempt in range(3):                       # eager, capture, replay of each configuration
            opts = with_token_inputs(ASK, {"TOKEN_CHUNKS": plan.token_chunks}, plan.seq_lens, limits)
            r = Request(plan.input_ids, plan.seq_lens, token_outputs=opts.token_outputs, options=opts)
            done.clear()
            service.submit(r)
            assert done.wait(120) and r.error is None, r.error
            got = dict(build_outputs(r, opts, cfg.normalize, None))["EMBEDDINGS"]
            assert cos_dist(got, want).max() < 1e-3, (attempt, cos_dist(got, want).max())
        assert engine.stats.graph_replays > 0 and engine.last_key[-1] == "hidden"
        engine.embed([plan.input_ids[:10].tolist()])
        assert "hidden" not in engine.last_key
    finally:
        service.stop(10)
