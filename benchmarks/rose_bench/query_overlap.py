"""A query beside bulk batches, engine level: how long a short query on the query lane's engine takes
while the main engine keeps bulk batches in flight, per variant of what the bulk batches run.

    source benchmarks/gpu/enter_bench.sh && python3 -m rose_bench query-overlap --out $OUT \\
        --models bge-m3,pplx-embed --variants "default:;varlen:engine.attention=torch_varlen"

The query lane (rose_backend/serving/query_lane.py) runs interactive batches on a second Engine on
the same weights, on a CUDA stream of higher priority, beside the bulk batches. How much that shortens
a query depends on whether the GPU lets the query's kernels in while a bulk kernel runs, which
depends on the bulk kernels (persistent kernels hold every SM until they end; a kernel launched with
programmatic dependent launch is resident before the one before it ends). This bench isolates that
from the server: per model and variant, one process of its own (settings read at import or at capture
then apply), both engines built as `rose` builds them, and after warming both:
- queries alone: `--queries` single 1 x `--query-len` batches on the query engine, one after another;
- bulk alone: `--bulk-seqs` x `--bulk-len` batches on the main engine, `--inflight` in flight, for
  `--seconds`;
- both: the bulk loop as before while one query is launched every `--period-ms` from the same thread
  (as the service's scheduler launches both), each timed from its launch to its result on the host.
A variant is NAME:SETTING,... with SETTING engine.attention=BACKEND (both engines' attention),
engine.flashinfer_pdl=on|off|default (layers/fused.py's flashinfer_pdl: flashinfer's norms and
SiLU-and-mul with or without programmatic dependent launch) or env.VAR=VALUE (e.g.
env.ROSE_ATTENTION_EXCLUDE=flashinfer_fa3; env.ROSE_MAIN_ENGINE_SMS=120: the main engine on a green
context of 120 SMs). `--trace MODEL/VARIANT,...`: for those cells, a torch
profiler trace of `--trace-ms` of the `both` phase (<out>/trace-MODEL-VARIANT.json: both streams' kernels).
Results: <out>/query_overlap.json (command, git commit, machine, date), rewritten after every cell.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

import numpy as np

from rose_bench.record import cuda_available, latency_ms, log, run_record, save_json
from rose_bench.tail import parse_variant

ENGINE_SETTINGS = ("attention", "flashinfer_pdl")      # a variant's engine.* settings
FLASHINFER_PDL = {"default": None, "on": True, "off": False}


def build_engines(folder: Path, device: str, attention: str | None):
    """The main engine and the query lane's engine on its weights, with rose's options for each."""
    from rose_backend.config import ModelConfig
    from rose_backend.engine.engine import Engine
    from rose_backend.engine.options import EngineOptions
    from rose_backend.triton.engine_options import query_options
    cfg = ModelConfig.from_folder(str(folder))
    main = Engine(cfg, device, EngineOptions(attention=attention))
    query = Engine(cfg, device, query_options(main.options, main.budget.total), weights_from=main)
    return cfg, main, query


def backend_of(engine, batch) -> str:
    """The attention backend `engine` runs `batch` with (chosen per graph bucket)."""
    s, t = batch.num_seqs, batch.num_tokens
    return engine.backend_for(*(engine.graphs.key_for(s, t) if engine.graphs_on else (s, t)))


def run_loop(main, query, bulk, q_batch, seconds: float, inflight: int, period_s: float) -> dict:
    """Bulk batches kept `inflight` deep on `main` for `seconds`; with `query`, one query every
    period_s from this thread. Returns the queries' latencies (ms) and the bulk sequences per second."""
    pending: deque = deque()
    lat: list[float] = []
    done_seqs, q = 0, None
    t0 = time.perf_counter()
    t_end, next_q = t0 + seconds, t0
    while True:
        now = time.perf_counter()
        if now >= t_end and q is None:
            break
        while now < t_end and len(pending) < inflight:
            pending.append(main.step(bulk))
        if query is not None and q is None and now >= next_q and now < t_end:
            q, next_q = (query.step(q_batch), now), max(next_q + period_s, now)
        if q is not None and q[0].ready():
            q[0].synchronize()
            lat.append((time.perf_counter() - q[1]) * 1e3)
            q = None
        if pending and pending[0].ready():
            pending.popleft().synchronize()
            done_seqs += bulk.num_seqs
    for lt in pending:
        lt.synchronize()
    return {"query": latency_ms(lat), "bulk_seqs_per_s": round(done_seqs / (time.perf_counter() - t0), 1)}


def checked_variant(variant: str) -> tuple[str, dict]:
    """A variant's name and engine settings; ValueError naming what it cannot take."""
    name, params, counts, _ = parse_variant(variant)
    eng = params.get("engine", {})
    unknown = sorted(set(eng) - set(ENGINE_SETTINGS)) + sorted(f"{m}.*" for m in set(params) - {"engine"}) + \
        sorted(f"{m}.count" for m in counts)
    if unknown:
        raise ValueError(f"variant {name!r}: unknown setting(s) {unknown}; it takes engine.attention, "
                         f"engine.flashinfer_pdl and env.VAR")
    if eng.get("flashinfer_pdl", "default") not in FLASHINFER_PDL:
        raise ValueError(f"variant {name!r}: engine.flashinfer_pdl is one of {', '.join(FLASHINFER_PDL)}, "
                         f"got {eng['flashinfer_pdl']!r}")
    return name, eng


def one(model: str, variant: str, args) -> dict:
    """One model and variant in this process (its environment already set by the parent)."""
    from rose_backend.engine.batch import PackedBatch
    from rose_testing.folders import make_folder
    from rose_backend.layers import fused
    name, eng = checked_variant(variant)
    fused.flashinfer_pdl = FLASHINFER_PDL[eng.get("flashinfer_pdl", "default")]
    device = "cuda" if cuda_available() else "cpu"
    folder = make_folder(model, Path(args.folders) / model, device=device)
    cfg, main, query = build_engines(folder, device, eng.get("attention"))
    rng = np.random.default_rng(0)
    bulk = PackedBatch.filler(args.bulk_seqs, args.bulk_seqs * args.bulk_len, cfg.vocab_size, rng)
    q_batch = PackedBatch.filler(1, args.query_len, cfg.vocab_size, rng)
    t0 = time.perf_counter()
    main.precapture([(bulk.num_seqs, bulk.num_tokens)])
    query.precapture([(1, args.query_len)])
    res = {"variant": variant, "warm_s": round(time.perf_counter() - t0, 1),
           "backends": {"bulk": backend_of(main, bulk), "query": backend_of(query, q_batch)},
           "main_engine_sms": main.streams.sms}
    alone = []
    for _ in range(args.queries):
        t = time.perf_counter()
        query.step(q_batch).synchronize()
        alone.append((time.perf_counter() - t) * 1e3)
    res["queries_alone"] = latency_ms(alone)
    res["bulk_alone"] = run_loop(main, None, bulk, q_batch, args.seconds, args.inflight, 0)
    res["both"] = run_loop(main, query, bulk, q_batch, args.seconds, args.inflight, args.period_ms / 1e3)
    res["both"]["bulk_vs_alone"] = round(res["both"]["bulk_seqs_per_s"] / max(res["bulk_alone"]["bulk_seqs_per_s"], 1e-9), 3)
    if f"{model}/{name}" in args.trace.split(",") and device == "cuda":
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            run_loop(main, query, bulk, q_batch, args.trace_ms / 1e3, args.inflight, args.period_ms / 1e3)
        path = Path(args.out) / f"trace-{model}-{name}.json"
        prof.export_chrome_trace(str(path))
        res["trace"] = {"file": path.name, **trace_summary(json.loads(path.read_text()))}
    return res


def trace_summary(trace: dict) -> dict:
    """From a profiler trace of the `both` phase (chrome trace JSON): the bulk stream (the one whose
    kernels ran longest) and the query stream's kernels, and how much of the query kernels' time a
    bulk kernel ran beside them. Near 0: a query kernel starts only once the bulk kernel before it has
    left the SMs (queries wait a bulk batch's kernels out); near 1: they share the GPU."""
    streams: dict = {}
    for e in trace.get("traceEvents", []):
        if e.get("cat") == "kernel" and "dur" in e:
            streams.setdefault(e.get("args", {}).get("stream"), []).append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    if len(streams) < 2:
        return {"streams": len(streams)}
    bulk_id = max(streams, key=lambda k: sum(b - a for a, b in streams[k]))
    union: list[list[float]] = []
    for a, b in sorted(streams[bulk_id]):
        if union and a <= union[-1][1]:
            union[-1][1] = max(union[-1][1], b)
        else:
            union.append([a, b])
    starts = [u[0] for u in union]
    query = sorted(k for sid in streams if sid != bulk_id for k in streams[sid])
    shared = started_beside = 0.0
    for a, b in query:
        i = max(0, int(np.searchsorted(starts, a, side="right")) - 1)
        started_beside += bool(union and union[i][0] <= a < union[i][1])
        while i < len(union) and union[i][0] < b:
            shared += max(0.0, min(b, union[i][1]) - max(a, union[i][0]))
            i += 1
    busy = sum(b - a for a, b in query)
    return {"bulk_kernels": len(streams[bulk_id]),
            "bulk_kernel_mean_us": round(sum(b - a for a, b in streams[bulk_id]) / len(streams[bulk_id]), 1),
            "query_kernels": len(query), "query_kernel_mean_us": round(busy / max(len(query), 1), 1),
            "query_time_beside_bulk": round(shared / busy, 3) if busy else None,
            "query_kernels_started_beside_bulk": round(started_beside / max(len(query), 1), 3)}


def table(result: dict) -> str:
    lines = ["| model | variant | bulk / query attention | query alone p50 / p99 ms | both: query p50 / p99 / max ms "
             "| bulk seq/s alone | both: bulk vs alone | query kernel time beside bulk (trace) |",
             "|---|---|---|---|---|---|---|---|"]
    for key, r in result["cells"].items():
        model, name = key.split("/", 1)
        if "error" in r:
            lines.append(f"| {model} | {name} | {r['error'][:120]} | | | | | |")
            continue
        a, b = r["queries_alone"], r["both"]["query"]
        lines.append(f"| {model} | {name} | {r['backends']['bulk']} / {r['backends']['query']} "
                     f"| {a.get('p50_ms')} / {a.get('p99_ms')} | {b.get('p50_ms')} / {b.get('p99_ms')} / {b.get('max_ms')} "
                     f"| {r['bulk_alone']['bulk_seqs_per_s']} | {r['both']['bulk_vs_alone']} "
                     f"| {r.get('trace', {}).get('query_time_beside_bulk', '')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/rose-query-overlap")
    ap.add_argument("--models", default="bge-m3,pplx-embed")
    ap.add_argument("--variants", default="default:;varlen:engine.attention=torch_varlen")
    ap.add_argument("--query-len", type=int, default=128)
    ap.add_argument("--queries", type=int, default=200, help="queries alone")
    ap.add_argument("--period-ms", type=float, default=20.0, help="one query this often beside the bulk batches")
    ap.add_argument("--bulk-seqs", type=int, default=32)
    ap.add_argument("--bulk-len", type=int, default=512)
    ap.add_argument("--inflight", type=int, default=2, help="bulk batches in flight (rose's max_inflight)")
    ap.add_argument("--seconds", type=float, default=5.0, help="each of the bulk-alone and both phases")
    ap.add_argument("--trace", default="", metavar="MODEL/VARIANT,...", help="cells to trace (GPU)")
    ap.add_argument("--trace-ms", type=float, default=200.0)
    ap.add_argument("--folders", default="/tmp/rose-folders")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per (model, variant) process")
    ap.add_argument("--git-commit", default=None, help="recorded in the JSON where .git is not available")
    ap.add_argument("--one", nargs=2, metavar=("MODEL", "VARIANT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    for variant in filter(None, args.variants.split(";")):
        try:
            checked_variant(variant)
        except ValueError as e:
            ap.error(str(e))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.one:
        print("RESULT " + json.dumps(one(*args.one, args)), flush=True)
        return 0
    device = "cuda" if cuda_available() else "cpu"
    result = {**run_record(args.git_commit, device),
              "settings": {k: v for k, v in vars(args).items() if k not in ("out", "one", "git_commit")}, "cells": {}}
    t_start = time.monotonic()
    passthrough = list(argv if argv is not None else sys.argv[1:])
    for model in args.models.split(","):
        for variant in filter(None, args.variants.split(";")):
            name, _, _, env = parse_variant(variant)
            cmd = [sys.executable, "-m", "rose_bench", "query-overlap", *passthrough, "--one", model, variant]
            try:
                proc = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=args.timeout)
                lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
                text = (proc.stdout + proc.stderr).strip()
                cell = json.loads(lines[-1][7:]) if lines else {
                    "variant": variant, "error": f"exit {proc.returncode}: {text.splitlines()[-1] if text else ''}",
                    "log": text[-1500:]}
            except subprocess.TimeoutExpired:
                cell = {"variant": variant, "error": f"timed out after {args.timeout} s"}
            result["cells"][f"{model}/{name}"] = cell
            log(f"{model}/{name}: " + json.dumps({k: v for k, v in cell.items() if k not in ("variant", "log")})[:400])
            save_json(out / "query_overlap.json", result, t_start)
    print(table(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
