"""BGE-M3 shape on the GPU: the sparse and ColBERT heads (bf16 encoder, float32 heads; eager, captured
and replayed graphs) against a float32 Hugging Face reference with the same heads, and the dense
rows of a batch with heads equal to those of the same batch without them.

    PYTHONPATH=. python3 -m pytest -q tests/gpu/test_m3_gpu.py -s
"""
import numpy as np
import pytest
import torch

from rose_backend.config import ModelConfig
from rose_backend.engine.batch import PackedBatch
from rose_backend.engine.engine import Engine
from rose_testing.compare import cos_dist
from rose_testing.folders import make_folder
from rose_testing.m3_folders import center_sparse_bias, write_heads
from rose_testing.reference import Reference


def cos_gap(a, b) -> float:
    return float(cos_dist(a, b).max())


@pytest.fixture(scope="module")
def folder(gpu_tmp):
    path = make_folder("bge-m3", gpu_tmp / "bge-m3-heads", device="cuda")
    if not (path / "colbert_linear.pt").exists():
        write_heads(path, 1024, 1024, seed=0)
        print(f"sparse head centred: {center_sparse_bias(path, 'cuda'):.0%} of tokens > 0")
    return path


def reference_tokens(ref: Reference, heads, token_lists):
    """Per token, float32: relu(sparse_linear(h)) [T] and normalize(colbert_linear(h)) [T, Dc], and
    the scale of the sparse head's input, |w| x the mean |h| (its bias aside)."""
    sparse, colbert, norms = [], [], []
    with torch.inference_mode():
        for ids in token_lists:
            h = ref.hidden(ids).to("cuda")
            s, c = heads(h)
            sparse.append(s.cpu().numpy())
            colbert.append(c.cpu().numpy())
            norms.append(h.norm(dim=-1).cpu().numpy())
    scale = float(heads.sparse_w.norm()) * float(np.concatenate(norms).mean())
    return np.concatenate(sparse), np.concatenate(colbert), scale


def test_bge_m3_heads_against_float32_reference(folder):
    cfg = ModelConfig.from_folder(folder)
    eng = Engine(cfg, device="cuda")
    assert eng.heads is not None and eng.heads.colbert_dim == 1024
    rng = np.random.default_rng(0)
    lens = np.array([128, 512, 7, 300, 1, 64], dtype=np.int32)
    ids = rng.integers(4, cfg.vocab_size - 1, size=int(lens.sum()), dtype=np.int32)
    token_lists = np.split(ids, np.cumsum(lens)[:-1])
    ref = Reference(cfg.model_dir, device="cuda")
    ref_dense = ref.embed(token_lists)
    ref_sparse, ref_colbert, scale = reference_tokens(ref, eng.heads, token_lists)
    assert 0.2 < (ref_sparse > 0).mean() < 0.8, "the sparse head is not centred: the check would see one sign only"
    report = []
    for attempt in ("eager", "capture", "replay"):
        lt = eng.step(PackedBatch(ids, lens, frozenset({"sparse", "colbert"})))
        dense = lt.synchronize()
        sp, cb = lt.extras["sparse"], lt.extras["colbert"]
        assert sp.shape == ref_sparse.shape and cb.shape == ref_colbert.shape
        d_gap, c_gap = cos_gap(dense, ref_dense), cos_gap(cb, ref_colbert)
        # the bias centres w . h, a large common value (a random encoder's tokens all point one way):
        # bf16 errors are relative to w . h, so they are measured against |w| |h|
        s_err = float(np.abs(sp - ref_sparse).max() / scale)
        report.append((attempt, d_gap, c_gap, s_err))
        print(f"{attempt}: dense 1-cos {d_gap:.2e}, ColBERT worst 1-cos {c_gap:.2e}, sparse max err {s_err:.2e}")
        assert d_gap <= 1e-3 and c_gap <= 2e-3 and s_err <= 1e-2, report
        clear = ref_sparse > 0.1 * ref_sparse.max()                    # kept by the reference, not borderline
        assert (sp[clear] > 0).all() and (sp[ref_sparse == 0] <= 0.1 * ref_sparse.max()).all()
        np.testing.assert_allclose(np.linalg.norm(cb, axis=1), 1.0, atol=1e-4)
    assert eng.last_key[-1] == "m3" and eng.stats.graph_replays >= 1
    plain = eng.step(PackedBatch(ids, lens)).synchronize()          # the dense-only graph of this shape
    assert eng.last_key[-1] != "m3"
    assert cos_gap(plain, dense) <= 1e-6
