"""rose-embed end to end against a real tritonserver: .txt/.jsonl/.parquet in, .npy/.parquet out,
and a run killed midway then resumed without recomputing what was written."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from rose_client import EmbeddingClient
from rose_testing.compare import cos_dist
from rose_client.cli import main
from support.metrics import metric, wait_idle

pytestmark = pytest.mark.server
ROOT = Path(__file__).resolve().parents[2]


def texts(n, seed=0):
    rng = np.random.default_rng(seed)
    words = "bulk embedding of many lines through three replicas with a progress bar and resume".split()
    return [f"line {i}: " + " ".join(rng.choice(words, size=int(rng.integers(2, 25)))) for i in range(n)]


def test_jsonl_to_parquet_and_parquet_to_npy(server, tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = texts(120, seed=1)
    with EmbeddingClient(server.grpc_url) as c:
        ref = c.embed(data, task="query")
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": i, "body": t}) + "\n" + ("\n" if i % 50 == 0 else "")
                           for i, t in enumerate(data)))
    out = tmp_path / "out.parquet"
    assert main([str(src), str(out), "--url", server.grpc_url, "--field", "body", "--task", "query",
                 "--block", "32", "--quiet"]) == 0
    table = pq.read_table(out)
    assert table.column("row").to_pylist() == list(range(120))
    emb = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
    assert emb.shape == (120, 384) and cos_dist(emb, ref).max() <= 1e-5
    assert not (tmp_path / "out.parquet.partial").exists()

    pq.write_table(pa.table({"text": data}), tmp_path / "in.parquet", row_group_size=50)
    assert main([str(tmp_path / "in.parquet"), str(tmp_path / "o.npy"), "--url", server.grpc_url,
                 "--task", "query", "--block", "40", "--quiet"]) == 0
    assert cos_dist(np.load(tmp_path / "o.npy"), ref).max() <= 1e-5

    # clear errors: a missing field, an existing output
    assert main([str(src), str(tmp_path / "x.npy"), "--url", server.grpc_url, "--quiet"]) == 2
    assert "no field 'text'" in capsys.readouterr().err
    assert main([str(tmp_path / "in.parquet"), str(tmp_path / "o.npy"), "--url", server.grpc_url]) == 2
    assert "exists; pass --overwrite" in capsys.readouterr().err


def test_txt_to_npy_killed_midway_then_resumed(server, tmp_path):
    n, block = 1000, 10                                 # 100 blocks: killed after 4 of them
    data = texts(n)
    src = tmp_path / "in.txt"
    src.write_text("\n".join(data) + "\n")
    full = tmp_path / "full.npy"
    r = subprocess.run([sys.executable, "-m", "rose_client.cli", str(src), str(full), "--url", server.grpc_url,
                        "--block", str(block)], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT / "client")},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "emb/s" in r.stderr and f"{n} embeddings (384-dim)" in r.stderr      # the tqdm bar and summary
    ref = np.load(full)
    assert ref.shape == (n, 384)

    out = tmp_path / "out.npy"
    partial = tmp_path / "out.npy.partial"
    cmd = [sys.executable, "-m", "rose_client.cli", str(src), str(out), "--url", server.grpc_url, "--block", str(block),
           "--concurrency", "2"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT / "client")},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(list(partial.glob("part-*.npy"))) < 4 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)                    # no chance to clean up: a crash, not a Ctrl-C
    proc.wait(30)
    written = sorted(partial.glob("part-*.npy"))
    assert 4 <= len(written) < n // block and not out.exists()
    for p in written:                                   # what was written is whole and correct
        k = int(p.stem.split("-")[1])
        assert cos_dist(np.load(p), ref[block * k:block * (k + 1)]).max() <= 1e-5

    # without --resume: refuses to clobber the partial run
    r = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT / "client")},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "pass --resume" in r.stderr

    r = subprocess.run(cmd + ["--resume"], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT / "client")},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    skipped = block * len(written)
    assert f"resuming at row {skipped} of {n}" in r.stderr
    assert f"{n - skipped} embedded in this run" in r.stderr                # nothing recomputed
    got = np.load(out)
    assert got.shape == (n, 384) and cos_dist(got, ref).max() <= 1e-5
    assert not partial.exists()

    r = subprocess.run(cmd + ["--resume"], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT / "client")},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "already complete" in r.stderr


def test_parquet_without_pyarrow_is_refused_before_any_work(tmp_path):
    """No pyarrow: .parquet in or out is refused at once, naming the fix, and leaves nothing behind."""
    src = tmp_path / "in.txt"
    src.write_text("one\ntwo\n")
    code = ("import sys; sys.modules['pyarrow'] = None; from rose_client.cli import main; "
            f"sys.exit(main([{str(src)!r}, {str(tmp_path / 'out.parquet')!r}, '--url', '127.0.0.1:1']))")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "needs pyarrow" in r.stderr and 'pip install "pyarrow>=14,<22"' in r.stderr, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


def test_failed_run_that_finished_no_block_leaves_no_partial(tmp_path, capsys):
    """Nothing answers: the run fails, and since no block was finished there is nothing to resume,
    so the next run needs neither --resume nor --overwrite."""
    from support.ports import free_port
    src = tmp_path / "in.txt"
    src.write_text("one\ntwo\n")
    url = f"127.0.0.1:{free_port()}"                  # nothing listens there
    assert main([str(src), str(tmp_path / "out.npy"), "--url", url, "--timeout", "10", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "Nothing was saved" in err and "is kept" not in err and "--resume" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]
    # an input error after the partial folder was made leaves nothing either
    (tmp_path / "empty.txt").write_text("")
    assert main([str(tmp_path / "empty.txt"), str(tmp_path / "e.npy"), "--url", url]) == 2
    assert not (tmp_path / "e.npy.partial").exists()


def test_the_progress_moves_with_every_chunk_answered(server):
    """rose-embed's bar is the client's on_rows: it moves as each chunk of a block is answered, long
    before the block (the unit that is saved) is whole."""
    seen = []
    with EmbeddingClient(server.grpc_url, token_budget=256, on_rows=seen.append) as c:
        c.embed(texts(400, seed=5))
    assert sum(seen) == 400 and len(seen) >= 4, seen


def test_ctrl_c_stops_promptly_and_keeps_every_finished_block(server, tmp_path):
    """SIGINT (Ctrl-C) midway: rose-embed exits within seconds (it does not wait for the blocks in
    flight), says how many rows are saved, and --resume then finishes with exactly the rest; also when
    it was started with SIGINT ignored."""
    # blocks 0-1 short texts (saved first), 2-3 of texts cut at 256 tokens (in flight at the signal:
    # 51k tokens, seconds of this CPU), 4 not yet sent
    n, block = 500, 100
    rows = texts(n, seed=3)
    rows[2 * block:4 * block] = [row + " and more" * 200 for row in rows[2 * block:4 * block]]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(rows) + "\n")
    out, partial = tmp_path / "out.npy", tmp_path / "out.npy.partial"
    cmd = [sys.executable, "-m", "rose_client.cli", str(src), str(out), "--url", server.grpc_url, "--block", str(block),
           "--concurrency", "2", "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "client")}
    # started with SIGINT ignored, as a shell's background job (`make test &`) starts its children
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    launched = time.monotonic()
    deadline = launched + 120
    while len(list(partial.glob("part-*.npy"))) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    t0, at_signal, ended = time.monotonic(), len(list(partial.glob("part-*.npy"))), proc.poll()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == 130, (f"{at_signal} parts seen {t0 - launched:.1f} s after the launch "
                                    f"(exit status then: {ended}); then {took:.1f} s to exit", err)
    assert took < 8, f"rose-embed took {took:.1f} s to stop after Ctrl-C"
    saved = len(list(partial.glob("part-*.npy")))
    assert saved >= 2 and f"{saved * block} of {n} rows are saved" in err, err
    # the two blocks in flight at the signal were dropped, not waited for (a block's seconds > the exit)
    assert saved <= at_signal + 1 < n // block, (at_signal, saved)
    r = subprocess.run(cmd + ["--resume"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert f"{n - saved * block} embedded in this run" in r.stderr
    assert np.load(out).shape == (n, 384)


def test_rose_embed_sends_its_work_in_the_bulk_lane(server, tmp_path):
    """rose-embed's requests are bulk by default (queries sent beside an indexing job go first),
    --lane interactive overrides; the server's per-lane batch counters see which."""

    def lane_batches(lane):
        return metric(server, "rose_lane_batches_total", lane=lane)

    src = tmp_path / "in.txt"
    src.write_text("\n".join(texts(40, seed=5)) + "\n")
    def settled():
        """Both lanes' counts once they hold still for two turns of the once-a-second refresh (the
        test before may have left abandoned blocks computing, and each series has its own turn)."""
        wait_idle(server)
        now, deadline = {k: lane_batches(k) for k in ("bulk", "interactive")}, time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, "the lane counters never held still"
            time.sleep(2.0)
            later = {k: lane_batches(k) for k in ("bulk", "interactive")}
            if later == now:
                return now
            now = later

    for lane, args in (("bulk", []), ("interactive", ["--lane", "interactive"])):
        before = settled()
        assert main([str(src), str(tmp_path / f"{lane}.npy"), "--url", server.grpc_url, "--quiet", *args]) == 0
        deadline = time.monotonic() + 10            # metrics are polled by the server, not pushed
        while lane_batches(lane) == before[lane] and time.monotonic() < deadline:
            time.sleep(0.2)
        other = "interactive" if lane == "bulk" else "bulk"
        assert lane_batches(lane) > before[lane] and lane_batches(other) == before[other], lane
