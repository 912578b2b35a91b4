"""Host path of one request through Triton: perf_analyzer latency of `rose` (token ids) and `embed`
(one text) at concurrency 1, and where the time goes per stage (ROSE_STAGE_TIMES, see
rose_backend/serving/stage_clock.py), for each model shape and each `inline_execute` setting. The
stages are given for the whole server and, per perf_analyzer run, from the `rose` requests whose
marks fall inside that run's time window (`stages_by_run`: what grows with the input, at each of
`--lengths`).
In the same server: `floor` (benchmarks/repositories/floor: the same request, one GPU round trip and
no engine), i.e. what Triton's Python backend costs around any GPU model on this host. Then, in a
server of its own, `embed` with 512-word texts from 16 concurrent clients (p50, p99, throughput).

    source benchmarks/gpu/enter_bench.sh && python3 -m rose_bench host-path --out OUT \
        --models bge-m3,pplx-embed --inline bge-m3=true,false [--lengths 128,512,4096,8192]

Random-weight folders at the real shapes (the bench's WordLevel tokenizer: text "w12 w34" is ids
[12, 34], so a 128-word text is the same 128 tokens as the `rose` id request). Results:
<out>/host_path.json (command, commit, machine, date; written after every server).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

from rose_backend.launch.deployment import DEFAULT_REPOSITORY, free_ports, repository_copy, served_models
from rose_backend.launch.tritonserver import TritonProcess
from rose_testing.folders import ids_to_text, make_folder, random_ids
from rose_bench.perf import run_perf_analyzer, write_input_data
from rose_bench.record import cuda_available, repo_root, run_record

FLOOR_REPOSITORY = repo_root() / "benchmarks" / "repositories" / "floor"


def text_input(path: Path, vocab: int, words: int, variants: int = 16) -> Path:
    rng = np.random.default_rng(words)
    data = [{"TEXT": {"content": [ids_to_text(random_ids(rng, vocab, words))], "shape": [1]}} for _ in range(variants)]
    path.write_text(json.dumps({"data": data}))
    return path


def triton_metric(url: str, name: str, model: str) -> float:
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    m = re.search(rf'^{name}{{model="{model}",version="1"}} ([0-9.e+]+)$', text, re.M)
    return float(m.group(1)) if m else float("nan")


def rose_counters(url: str) -> dict[str, float]:
    """The `rose` model's own counters of the lone path and of the signs of concurrent traffic."""
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    out = {}
    for name in ("rose_lone_requests_total", "rose_whole_inline_requests_total", "rose_backlog_arrivals_total",
                 "rose_concurrent_arrivals_total"):
        out[name] = sum(float(v) for v in re.findall(rf'^{name}{{[^}}]*model="rose"[^}}]*}} ([0-9.e+]+)$', text, re.M))
    return out


def arrival_gaps(inside: list[list]) -> dict:
    """From requests' marks (received first, sent last): how long after the previous request's answer
    was sent each request reached execute() (p10 / p50 / p90 us, only where that answer came first),
    and the share that took the lone path (no "scheduled" stage)."""
    inside = sorted(inside, key=lambda m: m[0][1])
    gaps = [b[0][1] - a[-1][1] for a, b in zip(inside, inside[1:]) if a[-1][0] == "sent" and a[-1][1] <= b[0][1]]
    out = {"lone_share": round(sum(all(s != "scheduled" for s, _ in m) for m in inside) / max(1, len(inside)), 3)}
    if gaps:
        out.update({f"gap_after_sent_p{q}_us": round(float(np.percentile(gaps, q)) / 1e3, 1) for q in (10, 50, 90)})
    return out


def stages_in_windows(stage_dir: Path, model: str, windows: dict[str, tuple[int, int]]) -> dict:
    """{run: {stage: p50_us, ..., "n": requests, arrival_gaps()}} from `model`'s marks whose first
    mark lies in the run's [start, end) perf_counter_ns window (the server's clock and ours are both
    CLOCK_MONOTONIC)."""
    from rose_bench.trace_join import read_marks
    marks = read_marks(stage_dir, model)
    out = {}
    for run, (t0, t1) in windows.items():
        rows: dict[str, list[float]] = {}
        inside = [m for m in marks if m and t0 <= m[0][1] < t1]
        for m in inside:
            for (_, a), (stage, b) in zip(m, m[1:]):
                rows.setdefault(stage, []).append((b - a) / 1e3)
            rows.setdefault("total", []).append((m[-1][1] - m[0][1]) / 1e3)
        if inside:
            out[run] = {"n": len(inside), **{k: round(float(np.median(v)), 1) for k, v in rows.items()},
                        **arrival_gaps(inside)}
    return out


def one_server(folder: Path, model: str, inline: str, work: Path, interval_ms: int,
               lengths: tuple[int, ...] = (128, 512), embed_words: tuple[int, ...] = (128,),
               rose_params: dict | None = None, concurrency: tuple[int, ...] = (1,)) -> dict:
    stage_dir = work / f"stages-{model}-{inline}"
    shutil.rmtree(stage_dir, ignore_errors=True)
    repo = repository_copy(DEFAULT_REPOSITORY, work / f"repo-{model}-{inline}",
                           {"rose": {"inline_execute": inline, "precapture": ",".join(f"1:{n}" for n in lengths),
                                     **(rose_params or {})}})
    shutil.copytree(FLOOR_REPOSITORY / "floor", repo / "floor", ignore=shutil.ignore_patterns("__pycache__"))
    ports = free_ports()
    srv = TritonProcess(str(folder), repo, ports, log_file=work / f"triton-{model}-{inline}.log",
                        env=dict(os.environ, ROSE_STAGE_TIMES=str(stage_dir)),
                        models=served_models(str(folder)) + ("floor",))
    t0 = time.monotonic()
    srv.start()
    out: dict = {"inline_execute": inline, "rose_params": rose_params or {}}
    try:
        srv.wait_ready(timeout=420)
        out["ready_s"] = round(time.monotonic() - t0, 1)
        vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
        ids = {n: write_input_data(work / f"ids_{model}_{n}.json", vocab, n) for n in lengths}
        runs = {f"rose 1x{n} ids" + (f" c{c}" if c > 1 else ""): ("rose", ids[n], c) for c in concurrency for n in lengths}
        runs.update({f"floor 1x{n} ids": ("floor", ids[n], 1) for n in lengths if n <= 512})
        for w in embed_words:
            runs[f"embed one {w}-word text"] = ("embed", text_input(work / f"text_{model}_{w}.json", vocab, w), 1)
        metrics = f"http://127.0.0.1:{ports.metrics}/metrics"
        step = "tokenize_batched" if (repo / "tokenize_batched").exists() else "tokenize"   # embed's tokenizer
        windows = {}
        for name, (served, data, clients) in runs.items():
            t_run = time.perf_counter_ns()
            before = {k: triton_metric(metrics, k, step) for k in
                      ("nv_inference_compute_infer_duration_us", "nv_inference_queue_duration_us", "nv_inference_request_success")}
            counted = rose_counters(metrics) if served == "rose" else None
            res = run_perf_analyzer(srv.grpc_url, served, data, work / f"pa-{model}-{inline}-{len(out)}.csv", interval_ms,
                                    concurrency=clients)
            if counted is not None:
                res["rose_counters"] = {k: v - counted[k] for k, v in rose_counters(metrics).items()}
            if served == "embed":
                after = {k: triton_metric(metrics, k, step) for k in before}
                n = after["nv_inference_request_success"] - before["nv_inference_request_success"]
                if n > 0:
                    res["tokenize_compute_us_per_request"] = round((after["nv_inference_compute_infer_duration_us"]
                                                                    - before["nv_inference_compute_infer_duration_us"]) / n, 1)
                    res["tokenize_queue_us_per_request"] = round((after["nv_inference_queue_duration_us"]
                                                                  - before["nv_inference_queue_duration_us"]) / n, 1)
            out[name] = res
            if served == "rose":
                windows[name] = (t_run, time.perf_counter_ns())
            print(model, inline, name, json.dumps(res), flush=True)
    finally:
        out["server_exit_code"] = srv.stop()
    out["stages"] = {p.stem.rsplit("_", 1)[0] + f"[{i}]": json.loads(p.read_text())
                     for i, p in enumerate(sorted(stage_dir.glob("*.json")))}
    out["stages_by_run"] = stages_in_windows(stage_dir, "rose", windows)
    for run, stages in out["stages_by_run"].items():
        print(model, inline, run, "stages p50 us:", json.dumps(stages), flush=True)
    return out


def concurrent_server(folder: Path, model: str, work: Path, interval_ms: int, clients: int = 16) -> dict:
    """`embed` with 512-word texts from `clients` concurrent clients, a server of its own (no stage
    clock: its samples would mix with the single-client ones): p50, p99, requests per second."""
    repo = repository_copy(DEFAULT_REPOSITORY, work / f"repo-{model}-c{clients}", {})
    srv = TritonProcess(str(folder), repo, free_ports(), log_file=work / f"triton-{model}-c{clients}.log")
    srv.start()
    try:
        srv.wait_ready(timeout=420)
        vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
        res = run_perf_analyzer(srv.grpc_url, "embed", text_input(work / f"text_{model}_512.json", vocab, 512),
                                work / f"pa-{model}-c{clients}.csv", interval_ms, concurrency=clients)
        if res.get("p50_ms"):
            res["p99_over_p50"] = round(res["p99_ms"] / res["p50_ms"], 3)
        print(model, f"embed 512-word texts, {clients} clients", json.dumps(res), flush=True)
        return res
    finally:
        srv.stop()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/host_path")
    ap.add_argument("--models", default="bge-m3,pplx-embed")
    ap.add_argument("--inline", default="", help="per model: MODEL=true,false;MODEL2=true (default: true)")
    ap.add_argument("--interval-ms", type=int, default=3000)
    ap.add_argument("--lengths", default="128,512", help="token counts of the lone `rose` requests (floor: those <= 512)")
    ap.add_argument("--embed-words", default="128", help="words of the one-text `embed` runs, comma-separated")
    ap.add_argument("--clients", type=int, default=16, help="concurrent clients of the embed 512-word run (0: none)")
    ap.add_argument("--work", default="/tmp/rose-host-path")
    ap.add_argument("--git-commit", default=None, help="recorded in the JSON where .git is not available")
    ap.add_argument("--concurrency", default="1", help="perf_analyzer concurrencies of the `rose` id runs, comma-separated")
    ap.add_argument("--rose-param", action="append", default=[], metavar="KEY=VALUE",
                    help="a `rose` config.pbtxt parameter of every server started (repeatable)")
    args = ap.parse_args(argv)
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    modes = {m: v.split(",") for m, v in (kv.split("=", 1) for kv in filter(None, args.inline.split(";")))}
    cuda = cuda_available()
    result = {**run_record(args.git_commit, "cuda" if cuda else "cpu"), "runs": {}}
    for model in args.models.split(","):
        folder = make_folder(model, Path(args.work) / "folders" / model, device="cuda" if cuda else "cpu")
        for inline in modes.get(model, ["true"]):
            try:
                result["runs"][f"{model}/inline={inline}"] = one_server(folder, model, inline, work, args.interval_ms,
                                                                         tuple(int(n) for n in args.lengths.split(",")),
                                                                         tuple(int(w) for w in args.embed_words.split(",")),
                                                                         dict(kv.split("=", 1) for kv in args.rose_param),
                                                                         tuple(int(c) for c in args.concurrency.split(",")))
            except Exception as e:
                result["runs"][f"{model}/inline={inline}"] = {"error": f"{type(e).__name__}: {e}"}
            (out / "host_path.json").write_text(json.dumps(result, indent=1))
        if args.clients:
            try:
                result["runs"][f"{model}/embed 512-word texts, {args.clients} clients"] = concurrent_server(
                    folder, model, work, args.interval_ms, args.clients)
            except Exception as e:
                result["runs"][f"{model}/embed 512-word texts, {args.clients} clients"] = {"error": f"{type(e).__name__}: {e}"}
            (out / "host_path.json").write_text(json.dumps(result, indent=1))
    for key, run in result["runs"].items():
        print(key, json.dumps(run.get("stages", run))[:2000], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
