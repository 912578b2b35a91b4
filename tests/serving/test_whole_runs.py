"""WholeRuns: which inline requests run whole (waited for and answered on the submitting thread),
on a clock the test sets."""
import pytest

from rose_backend.serving import whole_runs
from rose_backend.serving.lanes import BULK, INTERACTIVE
from rose_backend.serving.whole_runs import BACKLOG_HOLD_S, BATCH_HOLD_S, WholeRuns

US = 1000


@pytest.fixture
def clock(monkeypatch):
    now = [10**12]
    monkeypatch.setattr(whole_runs.time, "perf_counter_ns", lambda: now[0])
    return now


def test_a_backlog_holds_whole_runs_briefly_and_concurrent_traffic_longer(clock):
    runs = WholeRuns(backlog_us=250)
    assert runs.allowed(INTERACTIVE) and not runs.allowed(BULK)
    runs.returned()
    clock[0] += 300 * US                                   # one client: its next request, 300 us later
    assert runs.allowed(INTERACTIVE)
    runs.returned()
    clock[0] += 100 * US                                   # queued in Triton: a backlog
    assert not runs.allowed(INTERACTIVE) and runs.backlogs == 1
    clock[0] += int(BACKLOG_HOLD_S * 1e9) - 200 * US       # the hold, counted from the backlog
    assert not runs.allowed(INTERACTIVE)
    clock[0] += 300 * US
    assert runs.allowed(INTERACTIVE)
    runs.concurrent()                                      # a request came while another was unanswered
    clock[0] += int(BATCH_HOLD_S * 1e9) - 1000 * US
    runs.returned()
    clock[0] += 100 * US                                   # a backlog near its end extends it
    assert not runs.allowed(INTERACTIVE) and runs.backlogs == 2 and runs.concurrent_arrivals == 1
    clock[0] += int(BACKLOG_HOLD_S * 1e9)
    assert runs.allowed(INTERACTIVE)


def test_no_backlog_window_never_runs_whole(clock):
    runs = WholeRuns(backlog_us=None)
    assert not runs.allowed(INTERACTIVE)
