"""Queries beside re-indexing: a query's latency under a bulk load, and the bulk rate beside queries.

    source benchmarks/gpu/enter_bench.sh && python3 -m rose_bench lanes --out $OUT --model bge-m3

Per variant (a server of its own each, started through the project's launcher), three phases of
`--seconds` each, after a warm-up (`--warmup-s`) that runs both loads:
- queries alone: one client sends 1 x `--query-len` token ids to `rose` at `--query-rate` per
  second (open loop: each at its time, whether or not the one before is answered; no lane named);
- bulk alone: `--bulk-clients` client processes, each sending `--bulk-seqs` x `--bulk-len` requests
  one after the other without pause (the lane `--bulk-lane`: bulk, or none, which is bulk by size);
- both at once.
Each client is a process of its own with its own gRPC stream. Query latency is from its send to
its answer (p50, p99, max); bulk throughput is embeddings per second over the phase. rose's
per-lane metrics (batches, waits) are read from the metrics port after each phase.

A variant is NAME:SETTING,... as in `rose_bench tail` (MODEL.PARAM=VALUE, env.VAR=VALUE), e.g.
"lanes:;one-lane:rose.bulk_threshold_tokens=1048576" (the second puts every request in one lane,
one first-come-first-served queue, when --bulk-lane is none).
Results: <out>/lanes.json (command, git commit, machine, date), rewritten after every variant.
`--modelled-device`: the same phases in this process on a modelled device instead of a server
(lanes_model.py; <out>/lanes_modelled.json), for choosing the settings without a GPU.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

from rose_bench.record import cuda_available, log, run_record

PHASES = ("queries alone", "bulk alone", "both")


def _query_client(url: str, length: int, vocab: int, rate: float, start: float, stop: float, out) -> None:
    """Open loop: request i is sent at start + i / rate; latency from its send to its answer."""
    from rose_testing.folders import random_ids
    from rose_client.transport import StreamConnection
    rng = np.random.default_rng(1)
    reqs = [[("INPUT_IDS", random_ids(rng, vocab, length)), ("SEQ_LENS", np.array([length], np.int32))]
            for _ in range(16)]
    conn = StreamConnection(url)
    lat, futures, errors = [], [], 0
    try:
        time.sleep(max(0.0, start - time.time()))
        i = 0
        while (t := start + i / rate) < stop:
            time.sleep(max(0.0, t - time.time()))
            sent = time.perf_counter()
            f = conn.infer("rose", reqs[i % len(reqs)], outputs=["EMBEDDINGS"])
            f.add_done_callback(lambda f, sent=sent: lat.append(time.perf_counter() - sent))
            futures.append(f)
            i += 1
        for f in futures:
            try:
                f.result(120)
            except Exception:
                errors += 1
    finally:
        conn.close()
    out.put({"kind": "query", "latencies_s": lat, "sent": len(futures), "errors": errors})


def _bulk_client(url: str, seqs: int, length: int, vocab: int, lane: str, seed: int, start: float, stop: float,
                 out) -> None:
    """Closed loop without pause: the next request as soon as the last one is answered."""
    from rose_testing.folders import random_ids
    from rose_client.transport import StreamConnection
    rng = np.random.default_rng(seed)
    reqs = [[("INPUT_IDS", np.concatenate([random_ids(rng, vocab, length) for _ in range(seqs)])),
             ("SEQ_LENS", np.full(seqs, length, np.int32))] for _ in range(2)]
    params = {"lane": lane} if lane != "none" else None
    conn = StreamConnection(url)
    done, i, t_end = 0, 0, None
    try:
        time.sleep(max(0.0, start - time.time()))
        while time.time() < stop:
            emb = conn.infer("rose", reqs[i % 2], outputs=["EMBEDDINGS"], parameters=params).result(600)["EMBEDDINGS"]
            if emb.shape[0] != seqs:
                raise RuntimeError(f"expected {seqs} embeddings, got {emb.shape}")
            done, i, t_end = done + seqs, i + 1, time.time()
    finally:
        conn.close()
    out.put({"kind": "bulk", "embeddings": done, "t_end": t_end})


def run_phase(url: str, phase: str, args, vocab: int, seconds: float) -> dict:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    start = time.time() + 2.0 + 0.1 * args.bulk_clients           # every process up before it starts
    stop = start + seconds
    procs = []
    if phase != "bulk alone":
        procs.append(ctx.Process(target=_query_client, args=(url, args.query_len, vocab, args.query_rate,
                                                              start, stop, out)))
    if phase != "queries alone":
        procs += [ctx.Process(target=_bulk_client, args=(url, args.bulk_seqs, args.bulk_len, vocab, args.bulk_lane,
                                                          7919 * (i + 1), start, stop, out))
                  for i in range(args.bulk_clients)]
    for p in procs:
        p.start()
    got = [out.get(timeout=seconds + 900) for _ in procs]
    for p in procs:
        p.join(30)
    res: dict = {"seconds": seconds}
    queries = [g for g in got if g["kind"] == "query"]
    if queries:
        ms = np.array(queries[0]["latencies_s"]) * 1e3
        res["query"] = {"n": int(ms.size), "sent": queries[0]["sent"], "errors": queries[0]["errors"],
                        **({f"p{q}_ms": round(float(np.percentile(ms, q)), 3) for q in (50, 90, 99)} if ms.size else {}),
                        "max_ms": round(float(ms.max()), 3) if ms.size else None}
    bulks = [g for g in got if g["kind"] == "bulk"]
    if bulks:
        # the bulk clients' last answers (a request in flight at `stop` still counts, to its end)
        t_end = max((g["t_end"] or stop) for g in bulks)
        total = sum(g["embeddings"] for g in bulks)
        res["bulk"] = {"embeddings": total, "emb_per_s": round(total / max(t_end - start, 1e-9), 1),
                       "clients": len(bulks)}
    return res


def lane_metrics(metrics_port: int) -> dict:
    """rose's per-lane series from the metrics port: {series with labels: value}."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    out = {}
    for m in re.finditer(r'^(rose_lane_\w+|rose_batches_total)\{([^}]*)\} ([0-9.e+-]+)$', text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        if labels.get("model") != "rose":
            continue
        key = m.group(1) + "".join(f",{k}={v}" for k, v in labels.items() if k in ("lane", "le"))
        out[key] = float(m.group(3))
    return out


def delta(before: dict, after: dict) -> dict:
    return {k: round(after[k] - before.get(k, 0.0), 6) for k in after if after[k] != before.get(k, 0.0)}


def one_variant(folder: Path | None, variant: str, vocab: int, work: Path, args) -> dict:
    from rose_backend.launch.deployment import DEFAULT_REPOSITORY, free_ports, repository_copy
    from rose_backend.launch.tritonserver import TritonProcess
    from rose_bench.tail import parse_variant
    name, params, _, env_extra = parse_variant(variant)
    repo = repository_copy(DEFAULT_REPOSITORY, work / f"repo-{name}", params) if params else DEFAULT_REPOSITORY
    srv = TritonProcess(str(folder) if folder else None, repo, free_ports(), log_file=work / f"triton-{name}.log",
                        env=dict(os.environ, **env_extra))
    res: dict = {"variant": variant, "phases": {}}
    t0 = time.monotonic()
    srv.start()
    try:
        srv.wait_ready(timeout=900)
        res["ready_s"] = round(time.monotonic() - t0, 1)
        if args.warmup_s:
            res["warmup"] = run_phase(srv.grpc_url, "both", args, vocab, args.warmup_s)
        for phase in PHASES:
            time.sleep(1.5)                                  # rose's metrics: each refreshed once a second
            before = lane_metrics(srv.ports.metrics)
            res["phases"][phase] = run_phase(srv.grpc_url, phase, args, vocab, args.seconds)
            time.sleep(1.5)
            res["phases"][phase]["rose"] = delta(before, lane_metrics(srv.ports.metrics))
            log(f"{name} / {phase}: {json.dumps({k: v for k, v in res['phases'][phase].items() if k != 'rose'})}")
    finally:
        res["server_exit_code"] = srv.stop()
    alone = res["phases"].get("bulk alone", {}).get("bulk", {}).get("emb_per_s")
    both = res["phases"].get("both", {}).get("bulk", {}).get("emb_per_s")
    if alone and both:
        res["bulk_rate_beside_queries"] = round(both / alone, 4)
    return res


def table(result: dict) -> str:
    lines = ["| variant | phase | query p50 ms | query p99 ms | query max ms | bulk emb/s | bulk vs alone |",
             "|---|---|---|---|---|---|---|"]
    for name, res in result["variants"].items():
        if "error" in res:
            lines.append(f"| {name} | error: {res['error']} | | | | | |")
            continue
        for phase, p in res["phases"].items():
            q, b = p.get("query", {}), p.get("bulk", {})
            ratio = res.get("bulk_rate_beside_queries", "") if phase == "both" else ""
            lines.append(f"| {name} | {phase} | {q.get('p50_ms', '')} | {q.get('p99_ms', '')} | {q.get('max_ms', '')} "
                         f"| {b.get('emb_per_s', '')} | {ratio} |")
    return "\n".join(lines)


def modelled(args, out: Path) -> int:
    from rose_bench.lanes_model import one_variant as modelled_variant
    result = {**run_record(args.git_commit, "cpu"), "modelled_device": args.device_ms,
              "settings": {k: v for k, v in vars(args).items() if k not in ("out", "work", "git_commit")},
              "variants": {}}
    for variant in filter(None, args.variants.split(";")):
        result["variants"][variant.split(":")[0]] = res = modelled_variant(variant, args)
        log(f"{variant}: " + json.dumps({p: {k: v for k, v in r.items() if k in ("query", "bulk", "device")}
                                         for p, r in res["phases"].items()}))
        (out / "lanes_modelled.json").write_text(json.dumps(result, indent=1))
    print(table(result), flush=True)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/rose-lanes")
    ap.add_argument("--model", default="bge-m3", help="a rose_testing shape, or 'default' (the default model)")
    ap.add_argument("--variants", default="lanes:;one-lane:rose.bulk_threshold_tokens=1048576")
    ap.add_argument("--bulk-clients", type=int, default=4)
    ap.add_argument("--bulk-seqs", type=int, default=100)
    ap.add_argument("--bulk-len", type=int, default=512)
    ap.add_argument("--bulk-lane", choices=("bulk", "none"), default="none",
                    help="the lane the bulk clients name (none: bulk by size, above bulk_threshold_tokens)")
    ap.add_argument("--query-len", type=int, default=128)
    ap.add_argument("--query-rate", type=float, default=50.0)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--warmup-s", type=float, default=6.0)
    ap.add_argument("--modelled-device", action="store_true", help="no server: a modelled device (lanes_model.py)")
    ap.add_argument("--device-ms", default="0.6+0.00122*tokens", help="the modelled device's batch time")
    ap.add_argument("--plan-ms", type=float, default=0.0, help="modelled host time of a batch of > 8 sequences")
    ap.add_argument("--work", default="/tmp/rose-lanes-work")
    ap.add_argument("--git-commit", default=None, help="recorded in the JSON where .git is not available")
    args = ap.parse_args(argv)
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    if args.modelled_device:
        return modelled(args, out)
    cuda = cuda_available()
    if args.model == "default":
        from rose_backend.config import ModelConfig
        folder, vocab = None, ModelConfig.from_folder(None).vocab_size
    else:
        from rose_testing.folders import make_folder
        folder = make_folder(args.model, Path(args.work) / "folders" / args.model, device="cuda" if cuda else "cpu")
        vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    result = {**run_record(args.git_commit, "cuda" if cuda else "cpu"),
              "settings": {k: v for k, v in vars(args).items() if k not in ("out", "work", "git_commit")},
              "variants": {}}
    for variant in filter(None, args.variants.split(";")):
        name = variant.split(":")[0]
        try:
            result["variants"][name] = one_variant(folder, variant, vocab, work, args)
        except Exception as e:
            result["variants"][name] = {"variant": variant, "error": f"{type(e).__name__}: {e}"}
        (out / "lanes.json").write_text(json.dumps(result, indent=1))
    print(table(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
