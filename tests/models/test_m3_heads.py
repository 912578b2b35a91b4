"""BGE-M3 heads without a server: loading (plain tensors only), the engine's graph path, and the
per-request sparse / ColBERT post-processing against a plain loop over FlagEmbedding's rules."""
import numpy as np
import pytest
import torch

from rose_backend.config import ModelConfig
from rose_backend.engine.batch import PackedBatch
from rose_backend.engine.engine import Engine
from rose_backend.engine.options import EngineOptions
from rose_backend.models.m3_heads import HeadsMissing, M3Heads
from rose_backend.serving.outputs import colbert_outputs, sparse_outputs
from rose_testing.m3_folders import make_m3_folder, write_heads


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_m3_folder(tmp_path_factory.mktemp("m3h") / "model", max_seq_length=32)


def test_pt_and_safetensors_heads_are_the_same(folder, tmp_path):
    write_heads(tmp_path, 64, 64, seed=0, head_format="safetensors")
    a = M3Heads.from_folder(folder, 64, "cpu")
    b = M3Heads.from_folder(tmp_path, 64, "cpu")
    h = torch.randn(10, 64)
    for x, y in zip(a(h), b(h)):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


class Payload:                      # anything but a tensor must not be unpickled
    def __reduce__(self):
        return (print, ("unpickled!",))


@pytest.mark.parametrize("content,message", [
    ({"weight": torch.zeros(1, 64), "bias": torch.zeros(1), "x": Payload()}, "not a plain tensor file"),
    ([torch.zeros(1, 64)], "expected a state dict of tensors"),
    ({"weight": torch.zeros(1, 32), "bias": torch.zeros(1)}, "do not fit hidden size 64"),
])
def test_head_files_hold_plain_tensors_only(folder, tmp_path, content, message):
    write_heads(tmp_path, 64, 64)
    torch.save(content, tmp_path / "sparse_linear.pt")
    with pytest.raises(ValueError, match=message):
        M3Heads.from_folder(tmp_path, 64, "cpu")


def test_one_head_alone_is_refused(tmp_path):
    write_heads(tmp_path, 64, 64)
    (tmp_path / "colbert_linear.pt").unlink()
    with pytest.raises(ValueError, match="not colbert_linear"):
        M3Heads.from_folder(tmp_path, 64, "cpu")


def _batch(want, seed=0):
    rng = np.random.default_rng(seed)
    lens = np.array([5, 17, 1, 30], dtype=np.int32)
    ids = rng.integers(4, 200, size=int(lens.sum()), dtype=np.int32)
    return PackedBatch(ids, lens, frozenset(want))


def test_graph_path_matches_the_eager_path_and_keeps_dense_graphs_apart(folder):
    cfg = ModelConfig.from_folder(folder)
    eager = Engine(cfg, options=EngineOptions(graphs=False))
    graphed = Engine(cfg, options=EngineOptions(graphs=True, max_tokens=256, max_seqs=8))   # CPU stand-in graphs
    want = ("sparse", "colbert")
    ref = eager.step(_batch(want))
    ref_emb = ref.synchronize()
    for i in range(3):                                                # eager, capture, replay
        lt = graphed.step(_batch(want))
        np.testing.assert_allclose(lt.synchronize(), ref_emb, atol=1e-5)
        assert graphed.last_key[-1] == "m3"
        for k in want:
            np.testing.assert_allclose(lt.extras[k], ref.extras[k], atol=1e-5)
    dense = graphed.step(_batch(()))
    assert graphed.last_key[-1] != "m3" and dense.extras == {}
    np.testing.assert_allclose(dense.synchronize(), ref_emb, atol=1e-5)
    assert graphed.stats.graph_captures == 1                          # the dense configuration: eager so far


def test_engine_without_heads_refuses_token_outputs(tmp_path):
    folder = make_m3_folder(tmp_path / "noheads", head_format=None)
    eng = Engine(ModelConfig.from_folder(folder))
    assert eng.heads is None
    with pytest.raises(HeadsMissing, match="no sparse_linear / colbert_linear heads"):
        eng.step(_batch(("sparse",)))


def test_sparse_and_colbert_post_processing_against_a_loop():
    rng = np.random.default_rng(3)
    lens = np.array([6, 1, 9, 4], dtype=np.int32)
    ids = rng.integers(0, 8, size=int(lens.sum())).astype(np.int32)      # many repeats, specials 0..3
    w = rng.normal(size=ids.size).astype(np.float32)
    skip = np.array([0, 2], dtype=np.int32)
    got_ids, got_w, got_lens = sparse_outputs(ids, lens, w, skip)
    start = 0
    for s, n in enumerate(lens):                       # FlagEmbedding's _process_token_weights
        want = {}
        for i, x in zip(ids[start:start + n], w[start:start + n]):
            if i not in skip and x > 0 and x > want.get(int(i), 0):
                want[int(i)] = float(x)
        a = int(got_lens[:s].sum())
        assert dict(zip(got_ids[a:a + got_lens[s]].tolist(), got_w[a:a + got_lens[s]].tolist())) == want
        start += n
    vecs = rng.normal(size=(int(lens.sum()), 3)).astype(np.float32)
    cb, cb_lens = colbert_outputs(vecs, lens)
    assert cb_lens.tolist() == [5, 0, 8, 3]
    cu = np.concatenate([[0], np.cumsum(lens)])
    np.testing.assert_array_equal(cb, np.concatenate([vecs[cu[i] + 1:cu[i + 1]] for i in range(len(lens))]))
    pieces = [(cu[2], vecs[cu[2]:]), (0, vecs[:cu[2]])]              # batches' views, out of order
    np.testing.assert_array_equal(colbert_outputs(pieces, lens)[0], cb)
