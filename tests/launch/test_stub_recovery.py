"""A Python stub killed (kill -9) under a steady load, each kind in turn, in one deployment as `make
serve` runs it: the launcher with its gateway, serving minilm_shaped_dir with a random-weight
cross-encoder beside it, so that every kind of stub is there (tokenize, tokenize_batched, rose,
encode, rerank_tokenize, rerank_rose; rose_backend/launch/stub_watch.py). For each: the requests in
flight get an error within 2 s, nothing wrong is answered (every answer equals sentence-transformers'
or CrossEncoder's, and no failure is reported as bad input), Triton's /v2/health/ready and the
gateway's /health turn not ready within 2 s and ready again, correct answers come again within
RECOVERY_S, and the launcher says so in one line and counts it in rose_server_restarts_total. A
second death within the window stops the launcher with exit code 1 and the reason, leaving nothing
behind. The server itself killed (a crash) is answered, seen and recovered the same way. One launch:
one server start, then one restart per kind (the window is WINDOW_S here, so that the kinds can
follow each other). How the work is done and seen: rose_testing/stub_kill.py.
"""
from __future__ import annotations

import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from rose_backend.launch.connections import children
from rose_testing.stub_kill import Target, Workload, kill_under_load
from support import leftovers
from support.launcher import LauncherRun
from support.metrics import metric
from support.server import repository_with

pytestmark = pytest.mark.server

WINDOW_S = 3.0              # --stub-death-window of this deployment (60 s by default)
INFLIGHT_ERROR_S = 2.0      # the requests a dead stub held get their error within this
UNREADY_S = 2.0             # ... and readiness says not ready within this
RECOVERY_S = 20.0           # correct answers again within this of the death, on the CPU
LOAD_S = 1.0                # the steady load before each kill (kill_under_load's load_s)
TEXTS = ["Paris is the capital of France.", "the rose is a flower", "a", "search servers answer queries fast " * 30]
BIG_TEXTS = [f"document {i}: " + " ".join(f"word{(i * 7 + j) % 97} rose server" for j in range(120))
             for i in range(32)]
QUERY = "capital of france"
DOCS = ["paris is the capital of france", "a red rose in the garden", "berlin is in germany", "blue"]
BIG_DOCS = [f"passage {i} " + "the river city of lights " * 30 for i in range(24)]


@dataclass
class Deployment:
    run: LauncherRun
    work: Workload
    recovered_at: float = 0.0
    restarts: int = 0

    def stub(self, model: str) -> int:
        """The pid of model's stub, or of the server itself for "tritonserver"."""
        found = [p for p, c in self.run.processes().items()
                 if (c.split()[0].endswith("/tritonserver") if model == "tritonserver" else
                     "triton_python_backend_stub" in c and f"/{model}/1/model.py" in c)]
        assert len(found) == 1, (model, self.run.processes())
        return found[0]


@pytest.fixture(scope="module")
def deployment(minilm_shaped_dir, sentence_model, tmp_path_factory):
    from rose_testing.reranker_folders import reference_scores, write_reranker_folder
    tmp = tmp_path_factory.mktemp("stub-recovery")
    reranker = write_reranker_folder("tiny-bert-ce", tmp / "cross-encoder")
    repo = repository_with(None, tmp)                   # one instance of each tokenize model
    work = Workload(TEXTS, sentence_model.encode(TEXTS), BIG_TEXTS, sentence_model.encode(BIG_TEXTS),
                    QUERY, DOCS, reference_scores(reranker, QUERY, DOCS), BIG_DOCS,
                    reference_scores(reranker, QUERY, BIG_DOCS))
    with LauncherRun("--model", str(minilm_shaped_dir), "--reranker", str(reranker), "--repository", str(repo),
                     "--stub-death-window", str(WINDOW_S), env={"GATEWAY_WORKERS": "2"}) as run:
        assert run.wait_for("HTTP (OpenAI-compatible)", 300), run.output[-3000:]
        yield Deployment(run, work)
        if run.proc.poll() is None:
            run.terminate()


def restarted_line(victim: str) -> re.Pattern:
    what = (r"tritonserver itself \(pid \d+, killed by SIGKILL\)" if victim == "tritonserver" else
            rf"the Python stub of model '{victim}' \(instance \S+, pid \d+\)")
    return re.compile(rf"rose: tritonserver on port \d+ was restarted because {what} died; it serves again "
                      rf"([0-9.]+) s after the death")


def kill_and_recover(dep: Deployment, victim: str):
    """Kill the victim's stub under load (WINDOW_S after the last recovery) and check what was seen."""
    run = dep.run
    assert run.proc.poll() is None, run.output[-3000:]
    # the kill comes more than LOAD_S after kill_under_load starts (the steady load runs that long
    # first): the window's wait is spent under it
    time.sleep(max(0.0, dep.recovered_at + WINDOW_S + 0.5 - LOAD_S - time.monotonic()))
    pid, after = dep.stub(victim), len(run.lines)
    pattern = restarted_line(victim)
    target = Target(run.grpc_url, f"http://127.0.0.1:{run.ports.http}", run.gateway_url)
    seen = kill_under_load(target, pid, victim, dep.work, load_s=LOAD_S,
                           until=lambda: any(pattern.search(ln) for ln in run.lines[after:]))
    dep.restarts += 1
    print(victim, seen.summary())
    assert seen.until_s is not None, f"no restart line for {victim}:\n" + "".join(run.lines[after:])[-3000:]
    dep.recovered_at = seen.killed_at + seen.until_s          # when the launcher said it serves again
    assert not seen.wrong, seen.wrong
    errors = seen.inflight_errors
    assert errors, f"no request was in flight when {victim}'s stub died: {seen.inflight}"
    assert max(a.done for a in errors) <= INFLIGHT_ERROR_S, [(a.channel, a.done, a.error) for a in errors]
    assert all("UNAVAILABLE" in a.error or "not healthy" in a.error for a in errors), [a.error for a in errors]
    assert seen.triton_unready_s is not None and seen.triton_unready_s <= UNREADY_S, seen.probes[:20]
    assert seen.gateway_unready_s is not None and seen.gateway_unready_s <= UNREADY_S, seen.probes[:20]
    assert seen.triton_ready_again_s is not None and seen.gateway_ready_again_s is not None, seen.probes[-20:]
    assert seen.probes[-1][1:] == (200, 200), seen.probes[-20:]
    assert seen.first_correct_s is not None and seen.first_correct_s <= RECOVERY_S, seen.summary()
    lines = [m for m in map(pattern.search, run.lines[after:]) if m]
    assert len(lines) == 1 and float(lines[0].group(1)) <= RECOVERY_S, run.lines[after:]
    assert metric(run, "rose_server_restarts_total") == dep.restarts
    server = next(p for p, c in run.processes().items() if c.split()[0].endswith("/tritonserver"))
    assert "admin-key=***" in (Path(f"/proc/{server}/cmdline").read_text()), "the new server's keys are not hidden"
    return seen


@pytest.mark.parametrize("victim", ["rose", "tokenize", "tokenize_batched", "encode", "rerank_rose", "tritonserver"])
def test_a_killed_stub_is_answered_unready_and_recovered(deployment, victim):
    kill_and_recover(deployment, victim)


def test_a_killed_gateway_worker_is_counted_once(deployment):
    """/health's workers: a worker killed with SIGKILL is started again by the gateway; serving never
    counts more than started (the dead worker's mark)."""
    run = deployment.run
    gateway = next(p for p in children(run.proc.pid) if "rose_gateway" in run.processes().get(p, ""))
    workers = children(gateway)
    assert workers, run.processes()
    os.kill(workers[0], signal.SIGKILL)
    counts, end = [], time.monotonic() + 30
    while time.monotonic() < end:
        health = httpx.get(run.gateway_url + "/health", timeout=10).json()
        counts.append(health.get("workers"))
        if workers[0] not in children(gateway) and counts[-1] == {"serving": len(workers), "started": len(workers)}:
            break
        time.sleep(0.2)
    assert all(c is None or c["serving"] <= c["started"] for c in counts), counts
    assert counts[-1] == {"serving": len(workers), "started": len(workers)}, counts


def test_a_second_death_within_the_window_stops_the_launcher(deployment):
    """The last kind recovered as the others; its server is then killed again at once: the launcher
    exits 1 saying why, and leaves nothing behind."""
    kill_and_recover(deployment, "rerank_tokenize")
    run = deployment.run
    after = len(run.lines)
    os.kill(deployment.stub("rose"), signal.SIGKILL)
    assert run.proc.wait(60) == 1, run.output[-3000:]
    out = "".join(run.lines[after:])
    assert re.search(r"rose: the Python stub of model 'rose' \(instance rose_0_0, pid \d+\) of tritonserver on port "
                     rf"\d+ died [0-9.]+ s after a restarted server served again \(a second stub death within "
                     rf"{WINDOW_S:g} s\); stopping, for a supervisor to replace this deployment", out), out[-3000:]
    procs, segs = leftovers.wait_gone(run.prefixes, 10.0)
    assert not procs and not segs, (procs, segs)
