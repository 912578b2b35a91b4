"""Engine on the CPU: the bucketed static-buffer path (stand-in graphs) equals plain eager, the
pinned ring never hands back another batch's rows, and backend selection follows the table."""
import json

import numpy as np
import pytest
import torch

from rose_backend.config import ModelConfig
from rose_backend.engine.backend_table import BackendTable
from rose_backend.engine.batch import PackedBatch
from rose_backend.engine.engine import Engine
from rose_backend.engine.options import EngineOptions
from rose_backend.layers.attention import (AttentionMetadata, AttentionShape, SdpaLoopBackend,
                                           available_backends, make_backend, unavailable_reason)


@pytest.fixture(scope="module")
def cfg(minilm_shaped_dir):
    return ModelConfig.from_folder(minilm_shaped_dir)


@pytest.fixture(scope="module")
def eager(cfg):
    return Engine(cfg)


def _batch(rng, cfg, max_seqs=9, max_len=120):
    lens = rng.integers(1, max_len, size=rng.integers(1, max_seqs + 1)).astype(np.int32)
    return PackedBatch(rng.integers(0, cfg.vocab_size, size=int(lens.sum())).astype(np.int32), lens)


def test_graph_path_matches_eager_over_random_batches(cfg, eager):
    g = Engine(cfg, options=EngineOptions(graphs=True, max_tokens=1024, max_seqs=16))
    rng = np.random.default_rng(0)
    batches = [_batch(rng, cfg) for _ in range(6)]
    for rep in range(3):                           # eager, capture, replay for each configuration
        for b in batches:
            ref = eager.step(b).synchronize()
            got = g.step(b).synchronize()
            assert got.shape == ref.shape
            assert 1 - (ref * got).sum(1).min() / 1.0 < 1e-5  # normalized embeddings
            np.testing.assert_allclose(got, ref, atol=1e-5)
    st = g.stats
    assert st.batches == 18 and st.eager_runs + st.graph_captures + st.graph_replays == 18
    assert st.graph_captures == len({g.graphs.key_for(b.num_seqs, b.num_tokens) for b in batches})
    assert st.padded_tokens >= st.tokens


def test_unbucketed_batch_runs_eager(cfg, eager):
    g = Engine(cfg, options=EngineOptions(graphs=True, max_tokens=128, max_seqs=2))
    b = _batch(np.random.default_rng(1), cfg, max_seqs=5, max_len=100)
    b = PackedBatch(np.concatenate([b.input_ids, b.input_ids]), np.concatenate([b.seq_lens, b.seq_lens]))
    np.testing.assert_allclose(g.step(b).synchronize(), eager.step(b).synchronize(), atol=1e-5)
    assert g.stats.eager_runs == 1 and not g.graphs.entries


def test_ring_detaches_unsynchronized_handles(cfg):
    g = Engine(cfg, options=EngineOptions(graphs=True, max_tokens=512, max_seqs=4, max_inflight=1))
    rng = np.random.default_rng(2)
    bs = [_batch(rng, cfg, max_seqs=3, max_len=50) for _ in range(5)]
    handles = [g.step(b) for b in bs]              # more outstanding than max_inflight
    ref = Engine(cfg)
    for b, h in zip(bs, handles):
        assert h.ready()
        np.testing.assert_allclose(h.synchronize(), ref.step(b).synchronize(), atol=1e-5)


def test_empty_and_too_long(cfg, eager):
    assert eager.step(PackedBatch(np.zeros(0, np.int32), np.zeros(0, np.int32))).synchronize().shape == (0, 384)
    n = eager.max_len + 1
    with pytest.raises(ValueError, match="longer than"):
        eager.step(PackedBatch(np.zeros(n, np.int32), np.array([n], np.int32)))


def test_sdpa_loop_skips_empty_sequences():
    shape = AttentionShape(4, 2, 8, torch.float32)
    be = make_backend("sdpa_loop", shape, "cpu")
    q, k, v = torch.randn(10, 4, 8), torch.randn(10, 2, 8), torch.randn(10, 2, 8)
    cu = torch.tensor([0, 3, 3, 10], dtype=torch.int32)
    be.plan(AttentionMetadata(cu, 7, [3, 0, 7]))
    out = be.run(q, k, v)
    be.plan(AttentionMetadata(cu, 7, [3, 7]))
    torch.testing.assert_close(out, be.run(q, k, v))


def test_gpu_backends_say_why_not_on_cpu():
    shape = AttentionShape(16, 16, 64, torch.bfloat16)
    assert available_backends(shape, "cpu") == ["sdpa_loop"]
    for name in ("torch_varlen", "flashinfer", "flashinfer_fa3", "flash_attn4"):
        assert unavailable_reason(name, shape, "cpu")
    with pytest.raises(ValueError, match="cannot run here"):
        make_backend("flashinfer", shape, "cpu")
    assert "unknown" in unavailable_reason("nope", shape, "cpu")


def test_backend_table_choice(tmp_path):
    data = {"shapes": {"h16kv16d64": [
        {"seqs": 1, "tokens": 128, "us": {"flashinfer": 10.0, "torch_varlen": 12.0}},
        {"seqs": 64, "tokens": 32768, "us": {"flashinfer": 900.0, "torch_varlen": 800.0}}]}}
    p = tmp_path / "t.json"
    p.write_text(json.dumps(data))
    t = BackendTable.load(p)
    both = ["flashinfer", "torch_varlen"]
    assert t.choose("h16kv16d64", 1, 192, both) == "flashinfer"
    assert t.choose("h16kv16d64", 128, 51200, both) == "torch_varlen"
    assert t.choose("h16kv16d64", 1, 128, ["torch_varlen"]) == "torch_varlen"   # only what runs here
    assert t.choose("h12kv12d32", 1, 128, both) == "torch_varlen"                # no cell: preference
    assert BackendTable.load(tmp_path / "missing.json").choose("x", 1, 64, ["sdpa_loop"]) == "sdpa_loop"
    # the host's plan time counts once per batch, the kernel time once per layer
    plan = {"flashinfer": 300.0, "torch_varlen": 0.0}
    assert t.choose("h16kv16d64", 1, 128, both, layers=24, plan_us=plan) == "torch_varlen"    # 540 > 288
    assert t.choose("h16kv16d64", 1, 128, both, layers=200, plan_us=plan) == "flashinfer"     # 2300 < 2400


def test_backend_table_interpolates_between_token_counts(tmp_path):
    """A configuration between two measured token counts takes both into account (log-log), not the
    nearer alone: the H200's BGE-M3 cells at 2,048 and 8,192 tokens put fa3 ahead at 4,096 by more than
    its host plan, while the 2,048 cell alone did not."""
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"shapes": {"h16kv16d64": [
        {"seqs": 1, "tokens": 2048, "us": {"flashinfer_fa3": 55.72, "torch_varlen": 61.67}},
        {"seqs": 1, "tokens": 8192, "us": {"flashinfer_fa3": 583.25, "torch_varlen": 874.32}},
        {"seqs": 16, "tokens": 8192, "us": {"flashinfer_fa3": 100.0, "torch_varlen": 90.0}}]}}))
    t = BackendTable.load(p)
    both = ["flashinfer_fa3", "torch_varlen"]
    plan = {"flashinfer_fa3": 330.0}
    est = t.estimate("h16kv16d64", 1, 4096)
    assert est["torch_varlen"] == pytest.approx((61.67 * 874.32) ** 0.5)      # halfway in log tokens
    assert est["flashinfer_fa3"] == pytest.approx((55.72 * 583.25) ** 0.5)
    assert t.choose("h16kv16d64", 1, 4096, both, layers=24, plan_us=plan) == "flashinfer_fa3"
    assert t.choose("h16kv16d64", 1, 2048, both, layers=24, plan_us=plan) == "torch_varlen"   # 143 < 330
    assert t.estimate("h16kv16d64", 1, 512) == {"flashinfer_fa3": 55.72, "torch_varlen": 61.67}   # past the end
    assert t.estimate("h16kv16d64", 12, 8192) == {"flashinfer_fa3": 100.0, "torch_varlen": 90.0}  # nearest seqs


def test_engine_uses_cpu_backend(cfg, eager):
    assert eager.backend_for(1, 128) == "sdpa_loop"
    assert isinstance(eager.model.attn, SdpaLoopBackend)


def test_max_seqlen_bound_joins_the_key_for_grid_backends(cfg, eager):
    from rose_backend.layers.attention import register_backend

    @register_backend
    class BoundLoop(SdpaLoopBackend):          # a CPU stand-in for a varlen kernel
        name = "test_bound_loop"
        graph_max_seqlen = True

        def plan(self, meta):
            assert meta.max_seqlen >= max(meta.lens())
            super().plan(meta)

    g = Engine(cfg, options=EngineOptions(graphs=True, attention="test_bound_loop", max_tokens=1024, max_seqs=8))
    short = PackedBatch(np.arange(3, 63, dtype=np.int32), np.array([30, 30], np.int32))       # longest 30
    long_ = PackedBatch(np.arange(3, 63, dtype=np.int32), np.array([5, 55], np.int32))        # longest 55
    keys = []
    for b in (short, short, short, long_):
        np.testing.assert_allclose(g.step(b).synchronize(), eager.step(b).synchronize(), atol=1e-5)
        keys.append(g.last_key)
    assert keys[0] == (2, 64, 64) and keys[3] == (2, 64, 64)    # dummy of 4 and both lengths < 64
    b = PackedBatch(np.arange(3, 203, dtype=np.int32), np.array([150, 50], np.int32))
    g.step(b).synchronize()
    assert g.last_key == (2, 256, 256)
    assert g.stats.graph_captures == 1 and g.stats.graph_replays == 2


def test_the_lone_path_replays_a_captured_graph_and_equals_step(cfg, eager, monkeypatch):
    """A lone sequence has no lone run before its configuration is captured (step() runs it eagerly,
    then captures it); after that run_lone gives the same row as an eager pass, for every length of
    the bucket and past the small layouts' templates, and counts as a replayed batch."""
    from rose_backend.engine import lone, staging
    for module in (lone, staging):                      # layouts past 128 tokens are staged without a template
        monkeypatch.setattr(module, "LONE_TEMPLATE_MAX_TOKENS", 128)
    g = Engine(cfg, options=EngineOptions(graphs=True, max_tokens=512, max_seqs=4))
    rng = np.random.default_rng(3)
    for length, others in ((100, (65, 128)), (300, (257, 320))):         # buckets 128 and 320
        ids = rng.integers(0, cfg.vocab_size, size=length).astype(np.int32)
        assert g.lone.run_for(length) is None
        for _ in range(2):                                                 # eager, then capture
            g.step(PackedBatch(ids, np.array([length], np.int32))).synchronize()
        for n in (length, *others):
            x = rng.integers(0, cfg.vocab_size, size=n).astype(np.int32)
            run = g.lone.run_for(n)
            assert run is not None and run.tokens == n
            before = g.stats.graph_replays
            row = g.lone.run(run, x)
            assert row.shape == (1, cfg.embedding_dim) and g.stats.graph_replays == before + 1
            np.testing.assert_allclose(row, eager.embed([x.tolist()]), atol=2e-5, err_msg=str(n))
    assert Engine(cfg).lone.run_for(100) is None                              # no graphs: no lone path
