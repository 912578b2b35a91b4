"""Where the tail of a concurrent load comes from: `embed` with long texts from many clients, each
request followed through the server, for one or more server variants (a server of its own each).

    source benchmarks/gpu/enter_bench.sh && python3 -m rose_bench tail --out OUT --models bge-m3 \
        --variants "sync:rose.response_threads=0;threads4:rose.response_threads=4"

Per variant:
- a warm-up load first (`--warmup-ms`; 0: none): the first batches of each new (sequences, tokens)
  configuration run eagerly and then capture a CUDA graph (milliseconds each, once), which is the
  server starting up, not its steady state; the forward passes run eagerly and the graphs captured
  during the warm-up and during the measurement are both recorded (rose's metrics).
- perf_analyzer, gRPC streaming, `--clients` concurrent clients, `--words`-word texts: p50, p90, p99,
  requests per second (its CSV), and each request's latency (--profile-export-file) for the
  client-side percentiles and the p99 / p50 ratio (the goal is <= 1.25).
- Triton's own trace (level TIMESTAMPS, every request; `--trace off` leaves it out): each `embed`
  request with its `tokenize_batched` and `rose` steps, cut into segments (ensemble hand-over,
  tokenize queue, tokenize execute, hand-over, rose queue, rose execute, rose until released,
  back to the ensemble's end).
- The stage clocks of `rose` and `tokenize_batched` (ROSE_STAGE_TIMES, with each request's marks),
  joined to the trace: a `rose` request's marks belong to the trace whose execute() holds its
  "received" mark (one instance: execute() calls do not overlap). Both clocks are CLOCK_MONOTONIC.
- For the requests of the measurement (the warm-up's left out) at or below the median and for the
  slowest 1% (by the ensemble's time in the server), the mean of every segment and stage, side by
  side: what grows in the tail.

A variant is NAME:SETTING,SETTING...; a SETTING is `MODEL.PARAM=VALUE` (a config.pbtxt parameter,
e.g. rose.max_inflight=1), `MODEL.count=N` (instance count) or `env.VAR=VALUE` (the server's
environment, e.g. env.TOKENIZERS_PARALLELISM=false). Random-weight folders at the real shapes
(the bench's WordLevel tokenizer: a 512-word text is 512 tokens plus specials).
Results: <out>/tail.json (command, commit, machine, date), rewritten after every variant.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from rose_backend.launch.deployment import DEFAULT_REPOSITORY, free_ports, repository_copy
from rose_backend.launch.tritonserver import ServerOptions, TritonProcess
from rose_testing.folders import make_folder
from rose_bench.host_path import text_input, triton_metric
from rose_bench.perf import run_perf_analyzer
from rose_bench.record import cuda_available, run_record
from rose_bench.trace_join import batch_sizes, compare_bands, ensemble_timelines, join_marks, read_marks, read_trace


def parse_variant(text: str) -> tuple[str, dict, dict, dict]:
    """"name:rose.response_threads=0,tokenize_batched.count=4,env.X=1" -> (name, params, counts, env)."""
    name, _, rest = text.partition(":")
    params: dict[str, dict[str, str]] = {}
    counts: dict[str, int] = {}
    env: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        model, dot, param = key.partition(".")
        if not eq or not dot:
            raise ValueError(f"variant {name!r}: {item!r} is not MODEL.PARAM=VALUE, MODEL.count=N or env.VAR=VALUE")
        if model == "env":
            env[param] = value
        elif param == "count":
            counts[model] = int(value)
        else:
            params.setdefault(model, {})[param] = value
    return name.strip(), params, counts, env


def client_latencies(export: Path) -> dict:
    """perf_analyzer's --profile-export-file: each request's latency to its first response, and
    where in the measurement the slowest 1% came (share in its first fifth: bunched at the start
    means start-up work, spread evenly means steady state)."""
    if not export.exists():
        return {"error": "no profile export"}
    data = json.loads(export.read_text())
    lat, times = [], []
    for exp in data.get("experiments", []):
        for r in exp.get("requests", []):
            if r.get("response_timestamps"):
                lat.append((r["response_timestamps"][0] - r["timestamp"]) / 1e6)
                times.append(r["timestamp"])
    if not lat:
        return {"error": "no requests in the profile export"}
    a, t = np.array(lat), np.array(times, dtype=np.float64)
    p50, p99 = np.percentile(a, 50), np.percentile(a, 99)
    first_fifth = t <= t.min() + (t.max() - t.min()) / 5
    return {"n": int(a.size), "p50_ms": round(float(p50), 3), "p90_ms": round(float(np.percentile(a, 90)), 3),
            "p99_ms": round(float(p99), 3), "max_ms": round(float(a.max()), 3), "p99_over_p50": round(float(p99 / p50), 3),
            "slowest_1pct_share_in_first_fifth": round(float(first_fifth[a >= p99].mean()), 3)}


ROSE_COUNTERS = ("rose_eager_runs_total", "rose_graph_captures_total", "rose_batches_total")


def rose_counters(srv: TritonProcess) -> dict:
    url = f"http://127.0.0.1:{srv.ports.metrics}/metrics"
    time.sleep(1.5)                                        # rose's metrics: each refreshed once a second
    return {k.removeprefix("rose_").removesuffix("_total"): triton_metric(url, k, "rose") for k in ROSE_COUNTERS}


def counter_delta(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in before}


def one_variant(folder: Path, model: str, variant: str, work: Path, args) -> dict:
    name, params, counts, env_extra = parse_variant(variant)
    tag = f"{model}-{name}"
    stage_dir = work / f"stages-{tag}"
    shutil.rmtree(stage_dir, ignore_errors=True)
    repo = repository_copy(DEFAULT_REPOSITORY, work / f"repo-{tag}", params, instances=counts)
    trace = work / f"trace-{tag}.json"
    for f in work.glob(trace.name + "*"):
        f.unlink()
    extra = []
    if args.trace == "on":
        extra = ["--trace-config", f"triton,file={trace}", "--trace-config", "level=TIMESTAMPS",
                 "--trace-config", "rate=1", "--trace-config", "count=-1", "--trace-config", "log-frequency=0"]
    env = dict(os.environ, ROSE_STAGE_TIMES=str(stage_dir), **env_extra)
    srv = TritonProcess(str(folder), repo, free_ports(), log_file=work / f"triton-{tag}.log", env=env,
                        options=ServerOptions(extra_args=tuple(extra)))
    out: dict = {"variant": variant}
    measured_from = 0
    t0 = time.monotonic()
    srv.start()
    try:
        srv.wait_ready(timeout=600)
        out["ready_s"] = round(time.monotonic() - t0, 1)
        vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
        export = work / f"profile-{tag}.json"
        export.unlink(missing_ok=True)
        texts = text_input(work / f"text_{model}_{args.words}.json", vocab, args.words)
        c0 = rose_counters(srv)
        if args.warmup_ms:
            warm = run_perf_analyzer(srv.grpc_url, "embed", texts, work / f"pa-{tag}-warmup.csv", args.warmup_ms // 3,
                                     timeout=120, concurrency=args.clients, extra=["--max-trials", "3"])
            c1 = rose_counters(srv)
            out["warmup"] = {k: warm.get(k) for k in ("p50_ms", "p99_ms", "infer_per_s", "error") if k in warm}
            out["warmup"]["rose"] = counter_delta(c0, c1)
            c0 = c1
        measured_from = time.monotonic_ns()              # the trace and the marks cover the warm-up too
        out["perf_analyzer"] = run_perf_analyzer(
            srv.grpc_url, "embed", texts, work / f"pa-{tag}.csv", args.interval_ms, timeout=300,
            concurrency=args.clients, extra=["--profile-export-file", str(export)])
        out["client"] = client_latencies(export)
        out["client"]["rose_during_measurement"] = counter_delta(c0, rose_counters(srv))
    finally:
        out["server_exit_code"] = srv.stop()
    rows = []
    if args.trace == "on":
        try:
            rows = [r for r in ensemble_timelines(read_trace(trace)) if r["start_ns"] >= measured_from]
        except (OSError, ValueError) as e:
            out["trace_error"] = f"{type(e).__name__}: {e}"
    rose_marks = [m for m in read_marks(stage_dir, "rose") if m[0][1] >= measured_from]
    out["rose_batches"] = batch_sizes(rose_marks)
    if rows:
        out["traced_requests"] = len(rows)
        out["rose_marks_joined"] = join_marks(rows, rose_marks, "rose")
        out["server_side"] = compare_bands(rows)
    out["stages"] = {p.name.split(".")[0]: json.loads(p.read_text()) for p in sorted(stage_dir.glob("*[0-9].json"))}
    return out


def print_variant(key: str, res: dict) -> None:
    pa, cl = res.get("perf_analyzer", {}), res.get("client", {})
    print(f"\n== {key}: perf_analyzer p50 {pa.get('p50_ms')} p99 {pa.get('p99_ms')} ms, {pa.get('infer_per_s')} req/s; "
          f"each request: p50 {cl.get('p50_ms')} p99 {cl.get('p99_ms')} max {cl.get('max_ms')} ms, "
          f"p99/p50 {cl.get('p99_over_p50')}, slowest 1% in the first fifth {cl.get('slowest_1pct_share_in_first_fifth')}; "
          f"rose during it {cl.get('rose_during_measurement')}; warm-up {res.get('warmup')}; "
          f"batches {res.get('rose_batches')}", flush=True)
    side = res.get("server_side")
    if side:
        print(f"   in the server (trace): p50 {side['p50_us']} us, p99 {side['p99_us']} us; mean us "
              f"(median and below | slowest 1%):")
        for f, v in side["mean_us"].items():
            print(f"   {f:42s} {v['median_and_below']!s:>10} {v['slowest_1pct']!s:>10}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/rose-tail")
    ap.add_argument("--models", default="bge-m3")
    ap.add_argument("--variants", default="sync:rose.response_threads=0;threads4:rose.response_threads=4",
                    help="NAME:SETTING,...;NAME2:... (see the module's help)")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--words", type=int, default=512)
    ap.add_argument("--interval-ms", type=int, default=3000)
    ap.add_argument("--warmup-ms", type=int, default=6000, help="load before measuring (0: none)")
    ap.add_argument("--trace", choices=("on", "off"), default="on")
    ap.add_argument("--work", default="/tmp/rose-tail-work")
    ap.add_argument("--git-commit", default=None, help="recorded in the JSON where .git is not available")
    args = ap.parse_args(argv)
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    cuda = cuda_available()
    result = {**run_record(args.git_commit, "cuda" if cuda else "cpu"), "clients": args.clients,
              "words": args.words, "runs": {}}
    for model in args.models.split(","):
        folder = make_folder(model, Path(args.work) / "folders" / model, device="cuda" if cuda else "cpu")
        for variant in filter(None, args.variants.split(";")):
            key = f"{model}/{variant.split(':')[0]}"
            try:
                result["runs"][key] = one_variant(folder, model, variant, work, args)
            except Exception as e:
                result["runs"][key] = {"variant": variant, "error": f"{type(e).__name__}: {e}"}
            print_variant(key, result["runs"][key])
            (out / "tail.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
