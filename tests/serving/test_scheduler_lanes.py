"""The batch former's two lanes, without a server or a model: interactive first in every batch,
first come first served within a lane, bulk's share while interactive work waits, the cap on bulk."""
import numpy as np
import pytest

from rose_backend.serving.lanes import WAIT_BUCKETS_S
from rose_backend.serving.scheduler import Scheduler
from support.requests import drain, filled_request


req = filled_request


def order(batches):
    return [(p.request.handle, p.first, p.last) for b in batches for p in b.pieces]


def test_a_request_without_lane_is_bulk_only_above_the_threshold():
    s = Scheduler(1000, 64, bulk_threshold_tokens=100)
    at, above, named = req(50, 50), req(50, 51), req(5, lane="bulk")
    for r in (at, above, named):
        s.add(r)
    assert (at.lane, above.lane, named.lane) == ("interactive", "bulk", "bulk")
    assert s.lane_tokens == {"interactive": 100, "bulk": 106} and s.queued_tokens == 206
    assert s.lane_seqs == {"interactive": 2, "bulk": 3}


def test_interactive_arriving_later_goes_first_in_the_next_batch():
    s = Scheduler(1000, 64)
    bulk = req(*([200] * 20), tag="bulk", lane="bulk")
    s.add(bulk)
    first = s.next_batch()
    assert order([first]) == [("bulk", 0, 5)]
    q1, q2 = req(9, tag="q1"), req(30, 30, tag="q2")
    s.add(q1)
    s.add(q2)
    second = s.next_batch()
    # interactive first, in arrival order, then bulk fills the budget where it left off
    assert order([second]) == [("q1", 0, 1), ("q2", 0, 2), ("bulk", 5, 9)]
    assert [p.row for p in second.pieces] == [0, 1, 3]
    assert second.num_tokens == 69 + 800 and second.num_tokens <= 1000
    rest = drain(s)
    assert order(rest) == [("bulk", 9, 14), ("bulk", 14, 19), ("bulk", 19, 20)]
    assert s.queued_tokens == 0 and s.lane_tokens == {"interactive": 0, "bulk": 0}
    packed = np.concatenate([b.pack().seq_lens for b in [first, second, *rest]])
    assert packed.sum() == bulk.num_tokens + q1.num_tokens + q2.num_tokens


@pytest.mark.parametrize("share,want", [
    (0.0, ["i0", "i1", "i2", "i3", "b0", "b1", "b2", "b3"]),          # strict priority
    (0.25, ["i0", "i1", "i2", "b0", "i3", "b1", "b2", "b3"])])        # bulk's quarter of the first batch
def test_first_come_first_served_within_each_lane(share, want):
    s = Scheduler(256, 64, bulk_min_share=share)
    rs = [req(64, tag=f"b{i}", lane="bulk") for i in range(4)] + [req(64, tag=f"i{i}") for i in range(4)]
    for r in rs:
        s.add(r)
    batches = drain(s)
    assert [h for h, _, _ in order(batches)] == want and [b.num_tokens for b in batches] == [256, 256]


def test_bulk_keeps_its_share_while_interactive_work_waits():
    s = Scheduler(1000, 64, bulk_min_share=0.25)
    bulk = req(*([50] * 40), tag="bulk", lane="bulk")
    s.add(bulk)
    for i in range(60):                            # 3000 interactive tokens: three batches' worth
        s.add(req(50, tag=f"q{i}"))
    batches = drain(s, bulk_tokens=0)              # the service would hold bulk back: the share still goes
    while_waiting = batches[:3]
    for b in while_waiting:
        bulk_tokens = sum(50 * (p.last - p.first) for p in b.pieces if p.request is bulk)
        assert bulk_tokens >= 250 and b.num_tokens <= 1000, order([b])
    # the interactive requests still come in arrival order, and every sequence once
    inter = [h for h, _, _ in order(batches) if h != "bulk"]
    assert inter == [f"q{i}" for i in range(60)]
    assert sum(p.last - p.first for b in batches for p in b.pieces if p.request is bulk) <= 40


def test_bulk_share_holds_the_sequence_cap_too():
    s = Scheduler(10_000, 8, bulk_min_share=0.25)
    s.add(req(*([10] * 10), tag="bulk", lane="bulk"))
    for i in range(20):
        s.add(req(10, tag=f"q{i}"))
    b = s.next_batch(bulk_tokens=0)
    assert [h for h, _, _ in order([b])].count("bulk") == 1 and b.num_seqs == 8
    assert sum(p.last - p.first for p in b.pieces if p.request.handle == "bulk") == 2      # ceil(0.25 x 8)


def test_no_share_while_interactive_fits_in_the_batch():
    s = Scheduler(1000, 64, bulk_min_share=0.25)
    s.add(req(*([100] * 10), tag="bulk", lane="bulk"))
    s.add(req(128, tag="q"))
    b = s.next_batch(bulk_tokens=0)                # held back, and the query fits: the query alone
    assert order([b]) == [("q", 0, 1)]
    assert s.next_batch(bulk_tokens=0) is None     # nothing launchable; the bulk waits
    assert s.has_work("bulk") and not s.has_work("interactive")


def test_bulk_cap_limits_a_batch_but_not_a_lone_long_sequence():
    s = Scheduler(4096, 64)
    s.add(req(*([512] * 16), tag="bulk", lane="bulk"))
    assert [b.num_tokens for b in drain(s, bulk_tokens=1024)][:3] == [1024, 1024, 1024]
    s.add(req(3000, tag="long", lane="bulk"))
    assert s.next_batch(bulk_tokens=1024).num_tokens == 3000          # alone, as with one lane
    s.add(req(3000, tag="long2", lane="bulk"))
    s.add(req(100, tag="q"))
    b = s.next_batch(bulk_tokens=1024)
    assert order([b]) == [("q", 0, 1)]                                 # it does not ride past the cap


def test_a_hard_bulk_cap_bounds_full_batches_and_the_share_but_not_one_sequence():
    s = Scheduler(1000, 64, bulk_min_share=0.25)
    s.add(req(*([50] * 40), tag="bulk", lane="bulk"))
    assert s.next_batch(bulk_cap=120).num_tokens == 100                # no room given: the cap alone
    assert s.next_batch(bulk_tokens=500, bulk_cap=120).num_tokens == 100
    for i in range(30):                                                # 1500 interactive tokens waiting
        s.add(req(50, tag=f"q{i}"))
    b = s.next_batch(bulk_tokens=0, bulk_cap=120)                      # the share (250) within the cap
    assert sum(50 * (p.last - p.first) for p in b.pieces if p.request.handle == "bulk") == 100
    assert b.num_tokens == 850 + 100                                   # interactive: the budget less the capped share
    s2 = Scheduler(1000, 64, bulk_min_share=0.25)
    s2.add(req(300, tag="long", lane="bulk"))
    for i in range(30):
        s2.add(req(50, tag=f"q{i}"))
    b = s2.next_batch(bulk_tokens=0, bulk_cap=120)                     # one sequence over the cap still goes
    assert [h for h, _, _ in order([b])].count("long") == 1 and b.num_tokens == 300 + 14 * 50


def test_waits_are_recorded_once_per_request_in_its_lane():
    s = Scheduler(100, 64)
    big, q = req(*([50] * 4), lane="bulk"), req(10)
    s.add(big)
    s.add(q)
    drain(s)
    st = s.stats
    assert st.waits == {"interactive": 1, "bulk": 1}
    assert sum(st.wait_histogram("bulk")[0]) == 1 and sum(st.wait_histogram("interactive")[0][:-1]) == 1
    assert 0 <= st.wait_sum_s["bulk"] < 5


def test_cancelled_requests_leave_either_lane_uncomputed():
    s = Scheduler(100, 64, cancel_check_after=0.0)
    gone_b, gone_i = req(50, tag="gb", lane="bulk"), req(50, tag="gi")
    gone_b.is_cancelled = gone_i.is_cancelled = lambda: True
    kept = req(50, tag="kept", lane="bulk")
    for r in (gone_b, gone_i, kept):
        s.add(r)
    assert [h for h, _, _ in order(drain(s))] == ["kept"]
    assert {r.handle for r in s.take_cancelled()} == {"gb", "gi"}
    assert s.queued_tokens == 0 and s.lane_tokens == {"interactive": 0, "bulk": 0}
    assert s.lane_seqs == {"interactive": 0, "bulk": 0}


def test_remove_keeps_the_lane_counts():
    s = Scheduler(100, 64)
    r = req(*([40] * 5), lane="bulk")
    s.add(r)
    s.next_batch()                                   # two sequences scheduled
    s.remove(r)
    assert s.queued_tokens == 0 and s.lane_tokens["bulk"] == 0 and s.lane_seqs["bulk"] == 0
    assert not s.has_work() and s.waiting() == []


def test_rejects_a_bad_share():
    with pytest.raises(ValueError, match="bulk_min_share"):
        Scheduler(100, 8, bulk_min_share=1.5)


def test_wait_histogram_counts_and_sums_per_bucket_and_lane():
    from rose_backend.serving.lanes import LaneStats
    st = LaneStats()
    for s in (0.0005, 0.001, 0.004, 0.04, 20.0):
        st.waited("bulk", s)
    st.waited("interactive", 0.002)
    counts, sums = st.wait_histogram("bulk")
    assert len(counts) == len(sums) == len(WAIT_BUCKETS_S) + 1 and sum(counts) == 5 == st.waits["bulk"]
    at_most = {b: sum(c for c, hi in zip(counts, WAIT_BUCKETS_S) if hi <= b) for b in WAIT_BUCKETS_S}
    assert at_most[0.001] == 2                                   # le is inclusive
    assert at_most[0.005] == 3 and at_most[10.0] == 4 and counts[-1] == 1 and sums[-1] == 20.0
    i = WAIT_BUCKETS_S.index(0.001)
    assert abs(sums[i] - 0.0015) < 1e-12 and abs(sum(sums) - 20.0455) < 1e-9
    assert sum(st.wait_histogram("interactive")[0]) == 1 and abs(st.wait_sum_s["bulk"] - 20.0455) < 1e-9
