"""The FCFS batch former within one lane, without a server or a model (two lanes: test_scheduler_lanes.py)."""
import numpy as np
import pytest

from rose_backend.serving.scheduler import Request, Scheduler
from support.requests import drain, filled_request


req = filled_request


def test_first_come_first_served_across_requests():
    s = Scheduler(max_batch_tokens=1000, max_batch_seqs=64)
    a, b, c = req(9, tag=1), req(512, 512, 512, tag=2), req(180, 180, 180, 180, tag=3)
    for r in (a, b, c):
        s.add(r)
    batches = drain(s)
    order = [p.request.handle for bt in batches for p in bt.pieces]
    assert order == sorted(order), "requests must be served in arrival order"
    assert batches[0].pieces[0].request is a and batches[0].pieces[0].first == 0


def test_budget_and_sequence_cap_hold():
    s = Scheduler(max_batch_tokens=300, max_batch_seqs=3)
    s.add(req(*([100] * 10)))
    batches = drain(s)
    assert [b.num_seqs for b in batches] == [3, 3, 3, 1]
    assert all(b.num_tokens <= 300 for b in batches)


def test_sequence_longer_than_budget_goes_alone():
    s = Scheduler(max_batch_tokens=100, max_batch_seqs=8)
    s.add(req(10, 500, 10))
    batches = drain(s)
    assert [b.num_tokens for b in batches] == [10, 500, 10]


def test_request_split_across_batches_keeps_order_and_rows():
    s = Scheduler(max_batch_tokens=64, max_batch_seqs=4)
    r = Request(np.arange(10 * 20, dtype=np.int32), np.full(10, 20, np.int32))
    s.add(r)
    batches = drain(s)
    firsts = [(p.first, p.last) for b in batches for p in b.pieces]
    assert firsts == [(0, 3), (3, 6), (6, 9), (9, 10)]
    packed = np.concatenate([b.pack().input_ids for b in batches])
    np.testing.assert_array_equal(packed, r.input_ids)


def test_short_request_arriving_first_is_never_behind_a_long_one():
    s = Scheduler(max_batch_tokens=512, max_batch_seqs=64)
    short, long_ = req(9, tag="q"), req(*([512] * 20), tag="long", lane="interactive")
    s.add(short)
    s.add(long_)
    first = s.next_batch()
    assert first.pieces[0].request is short
    assert first.num_tokens == 9          # the long request does not ride along past the budget
    # FCFS: a request that arrives later is served after everything queued before it, never before.
    late = req(7, tag="late", lane="interactive")
    s.add(late)
    rest = drain(s)
    assert rest[-1].pieces[-1].request is late
    assert all(p.request is long_ for b in rest[:-1] for p in b.pieces)


def test_pack_concatenates_pieces_in_row_order():
    s = Scheduler(max_batch_tokens=1000, max_batch_seqs=64)
    a, b = req(3, 2, tag=5), req(4, tag=6)
    s.add(a)
    s.add(b)
    batch = s.next_batch()
    packed = batch.pack()
    np.testing.assert_array_equal(packed.seq_lens, [3, 2, 4])
    np.testing.assert_array_equal(packed.input_ids, [5] * 5 + [6] * 4)
    assert [p.row for p in batch.pieces] == [0, 2]


def test_queued_tokens_accounting():
    s = Scheduler(max_batch_tokens=100, max_batch_seqs=64)
    s.add(req(60, 60))
    s.add(req(30))
    assert s.queued_tokens == 150
    s.next_batch()
    assert s.queued_tokens == 90
    drain(s)
    assert s.queued_tokens == 0


def test_cancelled_requests_leave_the_pool_uncomputed():
    s = Scheduler(max_batch_tokens=100, max_batch_seqs=64, cancel_check_after=0.0)
    gone = req(50, tag="gone")
    gone.is_cancelled = lambda: True
    kept = req(50, tag="kept")
    s.add(gone)
    s.add(kept)
    batches = drain(s)
    assert [p.request for b in batches for p in b.pieces] == [kept]
    assert s.take_cancelled() == [gone]
    assert s.queued_tokens == 0


def test_rejects_bad_limits():
    with pytest.raises(ValueError, match="must be positive"):
        Scheduler(0, 8)
