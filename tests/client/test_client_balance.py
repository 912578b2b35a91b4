"""Balance on real servers: the skewed workload of docs/DESIGN.md, "Splitting and balancing" (two requests of 100 x 512
tokens among small ones), whole-request round robin against chunked least-loaded.

Each replica is one tritonserver with one CPU thread (OMP_NUM_THREADS=1; the session's `replicas`
of tests/conftest.py), so that on this 2-core machine two replicas are two independent workers, as
two GPUs would be. CI runs a scaled-down workload (128-token sequences, 25 per large request) beside
the other tests, and checks what holds under any load: the same embeddings either way, every token
sent once, and the chunks spread evenly where round robin gives one replica both large requests.
The makespans are a measurement, not a check: the full shape, on an otherwise idle machine, whose
numbers are in benchmarks/results/client-balance/minilm-cpu.json, is

    ROSE_BALANCE_FULL=1 .venv/bin/python -m pytest -q -s tests/client/test_client_balance.py

which writes tests/.logs/client_balance.json (a test never writes into benchmarks/results/; copy the
file there to replace the committed numbers).

(512 replaces the example's 4096-token sequences: the default model embeds at most 512).
"""
from __future__ import annotations

import json
import os
import platform
import threading
import time

import numpy as np
import pytest

from rose_client import EmbeddingClient, StreamConnection
from rose_testing.compare import cos_dist
from support.server import LOG_DIR

pytestmark = pytest.mark.server
FULL = os.environ.get("ROSE_BALANCE_FULL") == "1"
R = int(os.environ.get("ROSE_BALANCE_REPLICAS", "2"))
RESULT = LOG_DIR / "client_balance.json"        # copied by hand to benchmarks/results/client-balance/minilm-cpu.json when it replaces those numbers


def workload(full: bool) -> tuple[list[list[int]], int]:
    """(sequence lengths of each request, token budget): the skewed workload's requests, or a quarter-size copy."""
    if full:
        return [[512] * 100, [128] * 4, [512] * 100, [96] * 2, [512] * 8, [64] * 3], 2048
    return [[128] * 25, [32] * 4, [128] * 25, [24] * 2, [128] * 8, [16] * 3], 512


def token_ids(lengths, rng):
    return [np.concatenate([[101], rng.integers(1000, 30000, L - 2), [102]]).astype(np.int32) for L in lengths]


def round_robin(urls, reqs):
    """Each whole request to replica i % R, all at once; (makespan, tokens per replica, outputs)."""
    conns = [StreamConnection(u) for u in urls]
    load = [0] * len(urls)
    try:
        t0 = time.perf_counter()
        futs = []
        for i, seqs in enumerate(reqs):
            j = i % len(urls)
            load[j] += sum(map(len, seqs))
            futs.append(conns[j].infer("rose", [("INPUT_IDS", np.concatenate(seqs)),
                                                ("SEQ_LENS", np.array([len(s) for s in seqs], np.int32))]))
        outs = [f.result(900)["EMBEDDINGS"] for f in futs]
        return time.perf_counter() - t0, load, outs
    finally:
        for c in conns:
            c.close()


def chunked(urls, reqs, budget):
    """Every request a call of its own (concurrent callers) on one EmbeddingClient."""
    with EmbeddingClient(urls, token_budget=budget) as c:
        outs = [None] * len(reqs)
        threads = [threading.Thread(target=lambda i=i: outs.__setitem__(i, c.embed_tokens(reqs[i])))
                   for i in range(len(reqs))]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        makespan = time.perf_counter() - t0
        stats = c.stats()
    return makespan, [stats[u]["tokens"] for u in urls], [stats[u]["chunks"] for u in urls], outs


def test_chunked_least_loaded_balances_a_skewed_workload(replicas):
    shapes, budget = workload(FULL)
    rng = np.random.default_rng(0)
    reqs = [token_ids(s, rng) for s in shapes]
    total = sum(sum(s) for s in shapes)
    servers = [s for s in replicas if s.proc.poll() is None][:R]      # one-thread replicas (conftest)
    assert len(servers) == R, f"need {R} live replicas, have {len(servers)}"
    urls = [s.grpc_url for s in servers]
    for u in urls:                                       # warm every replica up
        with EmbeddingClient(u) as w:
            w.embed_tokens(token_ids([128] * 8, rng))
    rr_time, rr_load, rr_out = round_robin(urls, reqs)
    ch_time, ch_load, ch_chunks, ch_out = chunked(urls, reqs, budget)

    for a, b in zip(rr_out, ch_out):                        # the same embeddings either way
        assert a.shape == b.shape and cos_dist(a, b).max() <= 1e-5
    assert sum(ch_load) == total
    ratio = max(ch_load) / min(ch_load)
    report = {
        "workload": "skewed (docs/DESIGN.md), full" if FULL else "skewed (docs/DESIGN.md), scaled to a quarter (CI)",
        "requests": [f"{len(s)} x {s[0]}" for s in shapes], "total_tokens": total, "replicas": R,
        "replica": "tritonserver, all-MiniLM-L6-v2, CPU, OMP_NUM_THREADS=1",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores", "token_budget": budget,
        "round_robin_whole_requests": {"makespan_s": round(rr_time, 2), "replica_tokens": rr_load},
        "chunked_least_loaded": {"makespan_s": round(ch_time, 2), "replica_tokens": ch_load,
                                 "replica_chunks": ch_chunks, "busiest_over_least_busy": round(ratio, 3)},
        "makespan_speedup": round(rr_time / ch_time, 2),
        "command": "ROSE_BALANCE_FULL=1 .venv/bin/python -m pytest -q -s tests/client/test_client_balance.py",
    }
    print("\n" + json.dumps(report, indent=1))
    if FULL:
        RESULT.parent.mkdir(parents=True, exist_ok=True)
        RESULT.write_text(json.dumps(report, indent=1) + "\n")
    rr_ratio = max(rr_load) / min(rr_load)                   # both large requests on one replica
    assert rr_ratio > 10 and ratio <= 1.5, report
