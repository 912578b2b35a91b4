"""Soak: 16 concurrent streams against a real CPU tritonserver for 6 s (CI) or 5 minutes (slow); the
session's shared default server (tests/conftest.py), which other tests have used before.

Each stream sends requests back to back (texts through `embed`, token ids straight to `rose`,
1 to 8 sequences each) for the whole time. Passes with zero errors, every answer correct (compared
with sentence-transformers), and the server's resident memory (tritonserver and its Python stubs)
growing less than 10% from the end of the warm-up to the end. Numbers go to tests/.logs/soak-*.json.
"""
import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from rose_client import StreamConnection
from rose_testing.compare import cos_dist

pytestmark = pytest.mark.server

STREAMS = 16


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of a process and all of its descendants (from /proc)."""
    return sum(rss for rss, _ in tree_rss(pid).values())


def tree_rss(pid: int) -> dict[str, tuple[int, int]]:
    """{"pid name": (VmRSS bytes, RssShmem bytes)} of a process and all of its descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = {}, [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            with open(f"/proc/{p}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            kib = lambda k: int(fields.get(k, "0 kB").split()[0]) * 1024      # noqa: E731
            out[f"{p} {fields['Name'].strip()}"] = (kib("VmRSS"), kib("RssShmem"))
        except (OSError, KeyError, ValueError):
            pass
    return out


# CI's run is a 6 s smoke of the soak (3 s of warm-up, then 3 s measured: texts of 1-60 words, 85
# requests in all on the idle 2-core machine); the 8-minute soak under faults is rose_bench soak, on the H200
@pytest.mark.parametrize("minutes", [0.1, pytest.param(5, marks=pytest.mark.slow)])
def test_soak(minutes, server, sentence_model, default_model_dir):
    from rose_ensemble.tokenization import TextTokenizer
    from support.server import LOG_DIR

    rng = np.random.default_rng(int(minutes * 60))
    words = "alpha beta gamma delta rose tulip ivy triton embedding server batch token 日本 café 🚀".split()
    pool = [" ".join(rng.choice(words, size=int(n))) for n in rng.integers(1, 60, size=96)]
    ref = sentence_model.encode(pool)
    tok = TextTokenizer.from_folder(default_model_dir)
    ids, lens = tok.encode(pool)
    token_lists = np.split(ids, np.cumsum(lens)[:-1])

    duration = minutes * 60.0
    warmup = max(3.0, duration * 0.2)
    counts = {"requests": 0, "sequences": 0, "errors": 0, "wrong": 0}
    errors: list[str] = []
    lock = threading.Lock()
    srv = server
    stop_at = time.monotonic() + duration

    def stream(s: int):
        r = np.random.default_rng(1000 + s)
        conn = StreamConnection(srv.grpc_url)
        try:
            while time.monotonic() < stop_at:
                pick = r.choice(len(pool), size=int(r.integers(1, 9)), replace=False)
                if r.random() < 0.5:
                    fut = conn.infer("embed", [("TEXT", [pool[i] for i in pick])])
                else:
                    fut = conn.infer("rose", [("INPUT_IDS", np.concatenate([token_lists[i] for i in pick])),
                                              ("SEQ_LENS", lens[pick])])
                try:
                    emb = fut.result(120)["EMBEDDINGS"]
                except Exception as e:
                    with lock:
                        counts["errors"] += 1
                        errors.append(f"{type(e).__name__}: {e}")
                    continue
                b = ref[pick]
                dist = cos_dist(emb, b) if emb.shape == b.shape else np.ones(1)
                with lock:
                    counts["requests"] += 1
                    counts["sequences"] += len(pick)
                    counts["wrong"] += int(emb.shape != b.shape or dist.max() > 1e-4)
        finally:
            conn.close()

    threads = [threading.Thread(target=stream, args=(s,), daemon=True) for s in range(STREAMS)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(warmup)
    per_process_start = tree_rss(srv.proc.pid)
    rss_start = sum(r for r, _ in per_process_start.values())
    requests_at_start = counts["requests"]
    samples = [rss_start]
    while time.monotonic() < stop_at:
        time.sleep(min(10.0, max(0.0, stop_at - time.monotonic())))
        samples.append(tree_rss_bytes(srv.proc.pid))
    for t in threads:
        t.join(180)
    elapsed = time.monotonic() - t0
    per_process_end = tree_rss(srv.proc.pid)
    rss_end = sum(r for r, _ in per_process_end.values())

    growth = (rss_end - rss_start) / rss_start
    report = dict(minutes=minutes, streams=STREAMS, seconds=round(elapsed, 1), **counts,
                  requests_per_s=round(counts["requests"] / elapsed, 1),
                  requests_after_warmup=counts["requests"] - requests_at_start,
                  rss_start_mib=round(rss_start / 2**20, 1), rss_end_mib=round(rss_end / 2**20, 1),
                  rss_max_mib=round(max(samples + [rss_end]) / 2**20, 1), rss_growth_pct=round(100 * growth, 2),
                  rss_samples_mib=[round(x / 2**20) for x in samples],
                  per_process_mib={k: {"start": [round(x / 2**20, 1) for x in per_process_start.get(k, (0, 0))],
                                       "end": [round(x / 2**20, 1) for x in v]}      # [rss, of which shmem]
                                   for k, v in per_process_end.items()})
    LOG_DIR.mkdir(exist_ok=True)
    Path(LOG_DIR / f"soak-{minutes}m.json").write_text(json.dumps(report, indent=1))
    print("soak:", report)
    assert counts["errors"] == 0, errors[:5]
    assert counts["wrong"] == 0
    assert counts["requests"] > STREAMS * minutes * 4           # the streams really ran
    assert growth < 0.10, report
