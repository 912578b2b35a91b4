"""Token-level outputs taken per piece as batches are collected (serving/outputs.collect_piece):
the same arrays as built from the whole request at once, however the request is cut into batches."""
import functools
import threading

import numpy as np
import pytest

from rose_backend.config import ModelConfig
from rose_backend.engine.engine import Engine
from rose_backend.engine.staging import Slot
from rose_backend.serving.outputs import (OutputOptions, build_outputs, collect_piece, colbert_outputs,
                                          sparse_outputs)
from rose_backend.serving.scheduler import Request
from rose_backend.serving.service import EmbeddingService
from rose_backend.serving.service_settings import ServiceSettings
from rose_testing.waiting import wait_until

ALL = OutputOptions(frozenset({"EMBEDDINGS", "SPARSE_IDS", "SPARSE_WEIGHTS", "SPARSE_LENS", "COLBERT", "COLBERT_LENS"}),
                    frozenset({"sparse", "colbert"}))
SKIP = np.array([0, 2], dtype=np.int32)


def _request(rng, lens):
    lens = np.asarray(lens, dtype=np.int32)
    ids = rng.integers(0, 9, size=int(lens.sum())).astype(np.int32)         # many repeats, specials 0 and 2
    return Request(ids, lens, token_outputs=ALL.token_outputs, options=ALL)


@pytest.mark.parametrize("lens, cuts", [([7], [1]), ([5, 1, 9, 4], [4]), ([5, 1, 9, 4], [1, 3, 4]),
                                        ([3, 8, 2, 6, 1], [2, 5]), ([1, 1], [1, 2])])
def test_pieces_give_the_whole_requests_arrays(lens, cuts):
    rng = np.random.default_rng(sum(lens))
    r = _request(rng, lens)
    w = rng.normal(size=r.num_tokens).astype(np.float32)
    vecs = rng.normal(size=(r.num_tokens, 3)).astype(np.float32)
    first = 0
    for last in cuts:                                  # batches deliver consecutive sequences
        t0, t1 = r.offsets[first], r.offsets[last]
        collect_piece(r, first, last, {"sparse": w[t0:t1].copy(), "colbert": vecs[t0:t1].copy()}, SKIP)
        first = last
    r.output = np.zeros((r.num_seqs, 2), np.float32)
    got = dict(build_outputs(r, ALL, False, None))
    ids, weights, sp_lens = sparse_outputs(r.input_ids, r.seq_lens, w, SKIP)
    np.testing.assert_array_equal(got["SPARSE_IDS"], ids)
    np.testing.assert_array_equal(got["SPARSE_WEIGHTS"], weights)
    np.testing.assert_array_equal(got["SPARSE_LENS"], sp_lens)
    cb, cb_lens = colbert_outputs(vecs, r.seq_lens)
    cu = r.offsets
    np.testing.assert_array_equal(cb, np.concatenate([vecs[cu[i] + 1:cu[i + 1]] for i in range(r.num_seqs)]))
    np.testing.assert_array_equal(got["COLBERT"], cb)
    np.testing.assert_array_equal(got["COLBERT_LENS"], cb_lens)
    assert got["COLBERT"].flags.c_contiguous and got["COLBERT"].dtype == np.float32


def test_sparse_outputs_against_a_loop_with_empty_sequences_of_weights():
    rng = np.random.default_rng(5)
    lens = np.array([4, 3, 6], dtype=np.int32)
    ids = rng.integers(0, 6, size=int(lens.sum())).astype(np.int32)
    w = rng.normal(size=ids.size).astype(np.float32)
    w[4:7] = -1.0                                                      # the second sequence keeps nothing
    got_ids, got_w, got_lens = sparse_outputs(ids, lens, w, SKIP)
    start = 0
    for s, n in enumerate(lens):
        want = {}
        for i, x in zip(ids[start:start + n], w[start:start + n]):
            if i not in SKIP and x > 0 and x > want.get(int(i), 0):
                want[int(i)] = float(x)
        a = int(got_lens[:s].sum())
        assert dict(zip(got_ids[a:a + got_lens[s]].tolist(), got_w[a:a + got_lens[s]].tolist())) == want
        start += n
    assert got_lens[1] == 0 and got_w.dtype == np.float32 and got_ids.dtype == np.int32
    empty = sparse_outputs(ids[:2], lens[:1] * 0 + 2, -np.ones(2, np.float32), SKIP)
    assert [a.size for a in empty] == [0, 0, 1] and empty[2][0] == 0


def test_slot_host_buffers_are_reused_and_grown():
    slot = Slot(16, 2, 4, pinned=False)
    import torch
    a = slot.extras_host({"colbert": torch.zeros(300, 8)})["colbert"]
    b = slot.extras_host({"colbert": torch.zeros(1000, 8)})["colbert"]
    assert a.shape == (300, 8) and b.shape == (1000, 8) and a.data_ptr() == b.data_ptr()   # 1024 rows held
    c = slot.extras_host({"colbert": torch.zeros(1500, 8)})["colbert"]
    assert c.shape == (1500, 8) and slot.extras["colbert"].shape == (2048, 8)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from rose_testing.m3_folders import make_m3_folder
    folder = make_m3_folder(tmp_path_factory.mktemp("m3") / "model", colbert_dim=24, max_positions=64,
                            max_seq_length=64)
    return Engine(ModelConfig.from_folder(folder))


def test_service_split_requests_equal_one_batch(engine):
    """A request cut into 16-token batches among others answers as the engine's one-batch pass."""
    rng = np.random.default_rng(0)
    reqs = [_request(rng, rng.integers(1, 12, size=n)) for n in (1, 5, 3)]
    for r in reqs:
        r.input_ids = rng.integers(4, 200, size=r.num_tokens).astype(np.int32)
    done, where = [], []
    lock = threading.Lock()

    def answer(r):      # on the loop thread: the token rows may be views of the engine's reused buffers
        with lock:
            done.append((r, dict(build_outputs(r, ALL, engine.cfg.normalize, None))))
            where.append(threading.current_thread().name)

    svc = EmbeddingService(engine, answer, ServiceSettings(max_batch_tokens=16, max_batch_seqs=3, inline=False),
                           on_piece=functools.partial(collect_piece, skip_ids=SKIP))
    try:
        for r in reqs:
            svc.submit(r)
        assert wait_until(lambda: len(done) == len(reqs), 60)
    finally:
        svc.stop(5)
    assert set(where) == {"rose-scheduler"}
    for r, got in done:
        assert r.error is None
        from rose_backend.engine.batch import PackedBatch
        whole = engine.step(PackedBatch(r.input_ids, r.seq_lens, frozenset({"sparse", "colbert"})))
        np.testing.assert_allclose(got["EMBEDDINGS"], whole.synchronize(), atol=1e-5)
        ids, w, lens = sparse_outputs(r.input_ids, r.seq_lens, whole.extras["sparse"], SKIP)
        np.testing.assert_array_equal(got["SPARSE_IDS"], ids)
        np.testing.assert_allclose(got["SPARSE_WEIGHTS"], w, atol=1e-5)
        np.testing.assert_allclose(got["COLBERT"], colbert_outputs(whole.extras["colbert"], r.seq_lens)[0], atol=1e-5)


def test_token_outputs_without_a_handler_are_refused(engine):
    svc = EmbeddingService(engine, lambda r: None, ServiceSettings(inline=False))
    rng = np.random.default_rng(1)
    try:
        with pytest.raises(ValueError, match="no on_piece handler"):
            svc.submit(_request(rng, [4, 3]))
    finally:
        svc.stop(5)
