"""The cells guard: every workload cell of one model shape against one deployment, measured twice,
compared with a committed baseline.

    python -m rose_bench cells --model bge-m3 --out $OUT                     # run: $OUT/cells_bge-m3.json
    python -m rose_bench cells --model bge-m3 --out $OUT --baseline benchmarks/results/cells/bge-m3-h200.json
    python -m rose_bench cells --compare $OUT/cells_bge-m3.json --baseline benchmarks/results/cells/bge-m3-h200.json

One deployment (tritonserver with the repository's models, and the gateway) serves a random-weight
folder of the shape (rose_testing/folders.py; made on the GPU where there is one). The cells, per
shape (`SCALES`: the benchmark shapes' cells, or small ones for the tiny CPU shapes):
- online-L: one client, 1 x L token ids to `rose`, one after the other (p50 ms);
- scoring-N: one client, N x 512 token ids (p50 ms);
- bulk-L: 4 clients of 100 x L token ids without pause (embeddings/s);
- embed-W-cC: C clients of one W-word text each through `embed` (p50 ms; C > 1: requests/s too);
- openai-W-cC: C clients of one W-word text each through the gateway's POST /v1/embeddings
  (requests/s; C = 1: p50 ms too); tei-W-cC: the same through TEI's POST /embed (requests/s);
- beside-bulk: 1 x 128 queries at 50/s to `rose` while the bulk-512 load runs (query p99 ms, and the
  bulk rate beside the queries as a share of bulk-512's rate in the same pass).
A warm-up pass runs every cell briefly first (captures, compiles, connections); then `--reps`
passes (rep 1 of every cell, then rep 2). A cell's value is the mean of its reps and its noise
their spread (max - min) / mean. Against a baseline, a value is worse when it is worse than the
baseline's by more than max(noise now, the baseline's noise, --min-noise); the table shows every
cell's ratio (now / baseline) and the exit code is 1 when any is worse. `--variant NAME:SETTINGS`
runs the deployment with other parameters (`rose_bench tail`'s syntax: rose.PARAM=VALUE,
env.VAR=VALUE), `--cells` a subset (names or prefixes): an A/B of the request path's settings on the
cells that moved. Writes <out>/cells_<label>.json (command, git commit, machine, date), rewritten
after every cell, and prints the table.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from rose_bench.record import comma_list, cuda_available, log, run_record, save_json

LOWER, HIGHER = "lower", "higher"
BETTER = {"p50_ms": LOWER, "p99_ms": LOWER, "req_per_s": HIGHER, "emb_per_s": HIGHER, "bulk_share": HIGHER}


@dataclass(frozen=True)
class Cell:
    name: str
    kind: str                       # online | scoring | bulk | embed | openai | beside-bulk
    length: int                     # tokens (ids) or words (texts)
    batch: int = 1
    clients: int = 1
    metrics: tuple[str, ...] = ("p50_ms",)
    seconds: float = 3.0


def _cells(online, scoring, bulk, bulk_batch, bulk_clients, embed_c1, embed_cc, openai_words, openai_clients,
           query_len, seconds) -> list[Cell]:
    s = seconds
    return ([Cell(f"online-{n}", "online", n, seconds=s) for n in online]
            + [Cell(f"scoring-{b}", "scoring", scoring[1], batch=b, seconds=s) for b in scoring[0]]
            + [Cell(f"bulk-{n}", "bulk", n, batch=bulk_batch, clients=bulk_clients, metrics=("emb_per_s",),
                    seconds=2 * s) for n in bulk]
            + [Cell(f"embed-{w}-c1", "embed", w, seconds=s) for w in embed_c1]
            + [Cell(f"embed-{embed_cc[0]}-c{c}", "embed", embed_cc[0], clients=c, metrics=("p50_ms", "req_per_s"),
                    seconds=s) for c in embed_cc[1]]
            + [Cell(f"openai-{openai_words}-c{c}", "openai", openai_words, clients=c,
                    metrics=("p50_ms", "req_per_s") if c == 1 else ("req_per_s",), seconds=s) for c in openai_clients]
            + [Cell(f"tei-{openai_words}-c{openai_clients[1]}", "tei", openai_words, clients=openai_clients[1],
                    metrics=("req_per_s",), seconds=s)]
            + [Cell("beside-bulk", "beside-bulk", query_len, batch=bulk_batch, clients=bulk_clients,
                    metrics=("p99_ms", "bulk_share"), seconds=2 * s)])


# The benchmark shapes' cells (BENCHMARKS.md), and small ones for the tiny CPU shapes (tests, tools).
SCALES = {
    "gpu": dict(online=(128, 512, 4096), scoring=((5, 25, 50), 512), bulk=(512, 1024, 4096), bulk_batch=100,
                bulk_clients=4, embed_c1=(128, 512), embed_cc=(512, (8, 16)), openai_words=128,
                openai_clients=(1, 16, 64), query_len=128, seconds=3.0),
    "cpu": dict(online=(16, 64), scoring=((2, 4), 64), bulk=(64,), bulk_batch=8, bulk_clients=2,
                embed_c1=(16,), embed_cc=(32, (4,)), openai_words=16, openai_clients=(1, 4), query_len=16,
                seconds=1.0),
}
QUERY_RATE = {"gpu": 50.0, "cpu": 10.0}


def cells_of(scale: str, max_len: int, only: list[str] | None = None) -> list[Cell]:
    """The scale's cells (lengths past the model's positions dropped), or those named in `only`
    (a name or a prefix of names, e.g. "openai")."""
    cells = [c for c in _cells(**SCALES[scale]) if c.length <= max_len]
    if only:
        unknown = [o for o in only if not any(c.name.startswith(o) for c in cells)]
        if unknown:
            raise SystemExit(f"--cells: no cell named {', '.join(unknown)}; the cells: {', '.join(c.name for c in cells)}")
        cells = [c for c in cells if any(c.name.startswith(o) for o in only)]
    return cells


# ------------------------------------------------------------------------------------ measuring
@dataclass
class Deployment:
    grpc: str                       # host:port
    gateway: str                    # host:port
    metrics_port: int
    model_name: str                 # the gateway's model id
    vocab: int


def measure(cell: Cell, dep: Deployment, pool, seconds: float, scale: str, bulk_rate: float | None) -> dict:
    """One measurement of `cell` lasting about `seconds`: {metric: value} (and what else it saw)."""
    from rose_bench import workloads
    from rose_bench.workloads import Spec
    if cell.kind in ("online", "scoring"):
        (r,) = pool.run([Spec(dep.grpc, "rose", cell.length, cell.batch, dep.vocab, 1, 2, seed=cell.length + cell.batch,
                              seconds=seconds)], seconds + 600)
        return workloads.latency_stats(r["latencies_s"]) | {"requests": len(r["latencies_s"])}
    if cell.kind == "bulk":
        specs = [Spec(dep.grpc, "rose", cell.length, cell.batch, dep.vocab, 1, 0, seed=7919 * (i + 1) + cell.length,
                      variants=2, seconds=seconds) for i in range(cell.clients)]
        rs = workloads._synced(pool, specs, seconds + 900)
        t0, t1 = min(r["t0"] for r in rs), max(r["t1"] for r in rs)
        return {"emb_per_s": round(sum(r["embeddings"] for r in rs) / (t1 - t0), 2), "seconds": round(t1 - t0, 2)}
    if cell.kind == "embed":
        specs = [Spec(dep.grpc, "embed", cell.length, 1, dep.vocab, 1, 1, text=True, seed=104729 * (i + 1) + cell.clients,
                      variants=16, seconds=seconds) for i in range(cell.clients)]
        rs = workloads._synced(pool, specs, seconds + 600)
        t0, t1 = min(r["t0"] for r in rs), max(r["t1"] for r in rs)
        stats = workloads.latency_stats([x for r in rs for x in r["latencies_s"]])
        return stats | {"req_per_s": round(sum(len(r["latencies_s"]) for r in rs) / (t1 - t0), 2)}
    if cell.kind in ("openai", "tei"):
        from rose_bench.http_load import http_load
        from rose_testing.folders import ids_to_text, random_ids
        rng = np.random.default_rng(cell.length)
        texts = [ids_to_text(random_ids(rng, dep.vocab, cell.length)) for _ in range(16)]
        if cell.kind == "openai":
            path, bodies = "/v1/embeddings", [{"model": dep.model_name, "input": [t], "encoding_format": "float"}
                                              for t in texts]
        else:
            path, bodies = "/embed", [{"inputs": [t]} for t in texts]
        r = http_load(dep.gateway, path, [json.dumps(b).encode() for b in bodies], cell.clients, seconds,
                      processes=min(8, cell.clients))
        if r["errors"]:
            raise RuntimeError(f"{r['errors']} answers were not 200: {r.get('first_error')}")
        return {"req_per_s": r["req_per_s"], "p50_ms": r["latency"].get("p50_ms"), "p99_ms": r["latency"].get("p99_ms")}
    if cell.kind == "beside-bulk":
        from rose_bench.lanes import run_phase
        args = SimpleNamespace(path="ids", query_len=cell.length, query_rate=QUERY_RATE[scale], query_after_s=0.0,
                               bulk_clients=cell.clients, bulk_seqs=cell.batch, bulk_len=512 if scale == "gpu" else 64,
                               bulk_chars=0, bulk_lane="none")
        r = run_phase(dep.grpc, "both", args, dep.vocab, seconds)
        q, b = r["query"], r["bulk"]
        if q["errors"]:
            raise RuntimeError(f"{q['errors']} queries failed")
        out = {"p99_ms": q["p99_ms"], "p50_ms": q["p50_ms"], "bulk_emb_per_s": b["emb_per_s"]}
        if bulk_rate:
            out["bulk_share"] = round(b["emb_per_s"] / bulk_rate, 4)
        return out
    raise ValueError(f"unknown cell kind {cell.kind!r}")


@contextlib.contextmanager
def deployment(args, work: Path):
    """tritonserver (the repository's models, `--variant`'s parameters) and the gateway on a random
    folder of the shape; yields a Deployment."""
    import httpx

    from rose_backend.launch.deployment import DEFAULT_REPOSITORY, free_ports, repository_copy
    from rose_backend.launch.serve import start_gateway
    from rose_backend.launch.tritonserver import TritonProcess
    from rose_bench.tail import parse_variant
    from rose_testing.folders import SHAPES, make_folder, shape_name
    shape = shape_name(args.model)
    log(f"writing a random-weight {shape} folder")
    folder = make_folder(shape, work / shape, device="cuda" if cuda_available() else "cpu")
    name, params, counts, env = parse_variant(args.variant or "defaults:")
    repo = repository_copy(DEFAULT_REPOSITORY, work / "repository", params, instances=counts) \
        if params or counts else DEFAULT_REPOSITORY
    with TritonProcess(str(folder), repo, ports=free_ports(), log_file=work / "triton.log",
                       env={**os.environ, **env}) as srv:
        gateway = start_gateway(free_ports().grpc, "127.0.0.1", str(folder), srv.grpc_url)
        try:
            address = gateway.url.removeprefix("http://")
            models = httpx.get(f"http://{address}/v1/models", timeout=60).json()["data"]
            yield Deployment(srv.grpc_url, address, srv.ports.metrics, models[0]["id"], SHAPES[shape][0]["vocab_size"])
        finally:
            gateway.stop()


def run(args, out: Path) -> dict:
    from rose_bench.workloads import ClientPool
    from rose_testing.folders import SHAPES, max_seq_len, shape_name
    shape = shape_name(args.model)
    scale = args.scale or ("gpu" if shape in ("bge-m3", "pplx-embed") else "cpu")
    cells = cells_of(scale, max_seq_len(SHAPES[shape][0]), comma_list(args.cells) if args.cells else None)
    label = args.label or shape
    path = out / f"cells_{label}.json"
    device = "cuda" if cuda_available() else "cpu"
    result = {**run_record(args.git_commit, device), "model": shape, "label": label, "scale": scale,
              "variant": args.variant or "defaults:", "reps": args.reps, "cells": {}}
    t_start = time.monotonic()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    grpc_clients = [c.clients for c in cells if c.kind not in ("openai", "tei")]
    with deployment(args, work) as dep, ClientPool(max(grpc_clients, default=1)) as pool:
        result["server"] = {"grpc": dep.grpc, "gateway": dep.gateway}
        passes = [("warm-up", args.warmup_s)] + [(f"rep {i + 1}", None) for i in range(args.reps)]
        for label_pass, seconds in passes:
            bulk_rate = None
            for cell in cells:
                t = time.monotonic()
                got = measure(cell, dep, pool, seconds or cell.seconds * args.time_scale, scale, bulk_rate)
                if cell.name == "bulk-512" or (cell.kind == "bulk" and bulk_rate is None):
                    bulk_rate = got["emb_per_s"]
                log(f"{label_pass} {cell.name}: " + json.dumps({k: got.get(k) for k in cell.metrics})
                    + f" ({time.monotonic() - t:.1f} s)")
                if seconds is not None:
                    continue
                entry = result["cells"].setdefault(cell.name, {"metrics": {m: [] for m in cell.metrics}, "runs": []})
                for m in cell.metrics:
                    entry["metrics"][m].append(got.get(m))
                entry["runs"].append(got)
                save_json(path, result, t_start)
    summarize(result)
    save_json(path, result, t_start)
    log(f"wrote {path}")
    return result


# ------------------------------------------------------------------------------------ comparing
def summarize(result: dict) -> None:
    """Each cell metric's value (mean of its reps) and noise ((max - min) / mean), in place."""
    for entry in result["cells"].values():
        entry["value"], entry["noise"] = {}, {}
        for m, reps in entry["metrics"].items():
            vals = [v for v in reps if v is not None]
            if not vals:
                continue
            mean = float(np.mean(vals))
            entry["value"][m] = round(mean, 4)
            entry["noise"][m] = round((max(vals) - min(vals)) / mean, 4) if mean else 0.0


def compare(now: dict, base: dict, min_noise: float) -> tuple[list[dict], bool]:
    """Rows (cell, metric, baseline, now, ratio, tolerance, verdict) and whether any cell is worse."""
    rows, worse = [], False
    for name, entry in now["cells"].items():
        b = base["cells"].get(name)
        for m, value in entry.get("value", {}).items():
            row = {"cell": name, "metric": m, "now": value, "baseline": None, "ratio": None, "tolerance": None,
                   "verdict": "new"}
            if b and m in b.get("value", {}):
                bv = b["value"][m]
                tol = max(entry["noise"].get(m, 0.0), b.get("noise", {}).get(m, 0.0), min_noise)
                ratio = value / bv if bv else float("inf")
                bad = ratio > 1 + tol if BETTER[m] == LOWER else ratio < 1 - tol
                good = ratio < 1 - tol if BETTER[m] == LOWER else ratio > 1 + tol
                row.update(baseline=bv, ratio=round(ratio, 4), tolerance=round(tol, 4),
                           verdict="WORSE" if bad else "better" if good else "same")
                worse |= bad
            rows.append(row)
    for name in base["cells"]:
        if name not in now["cells"]:
            rows.append({"cell": name, "metric": "-", "now": None, "baseline": None, "ratio": None,
                         "tolerance": None, "verdict": "not run"})
    return rows, worse


def table(rows: list[dict]) -> str:
    def f(v, fmt="{:.4g}"):
        return "-" if v is None else fmt.format(v)
    lines = ["| cell | metric | baseline | now | now / baseline | tolerance | verdict |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['cell']} | {r['metric']} ({BETTER.get(r['metric'], '-')} is better) | {f(r['baseline'])} | "
                     f"{f(r['now'])} | {f(r['ratio'], '{:.3f}')} | {f(r['tolerance'], '{:.1%}')} | {r['verdict']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rose_bench cells", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="bge-m3", help="a shape of rose_testing/folders.py (bge-m3, pplx-embed, tiny-bert, ...)")
    ap.add_argument("--out", default="benchmarks/results/cells")
    ap.add_argument("--baseline", help="a cells JSON to compare with (exit 1 when a cell is worse beyond its noise)")
    ap.add_argument("--compare", help="compare this cells JSON with --baseline without running anything")
    ap.add_argument("--cells", help="comma list of cell names or prefixes (default: every cell of the scale)")
    ap.add_argument("--scale", choices=tuple(SCALES), help="the cells' sizes (default: gpu for the benchmark "
                    "shapes, cpu for the tiny ones)")
    ap.add_argument("--variant", help="NAME:MODEL.PARAM=VALUE,...,env.VAR=VALUE: the deployment's settings")
    ap.add_argument("--label", help="the JSON's name (default: the shape)")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--warmup-s", type=float, default=1.0, help="seconds per cell of the warm-up pass")
    ap.add_argument("--time-scale", type=float, default=1.0, help="every cell's seconds times this")
    ap.add_argument("--min-noise", type=float, default=0.03, help="the least tolerance of a comparison")
    ap.add_argument("--workdir", default="/tmp/rose-cells")
    ap.add_argument("--git-commit")
    args = ap.parse_args(argv)
    if args.compare:
        if not args.baseline:
            ap.error("--compare needs --baseline")
        now = json.loads(Path(args.compare).read_text())
    else:
        if args.reps < 1:
            ap.error("--reps must be at least 1")
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        now = run(args, out)
    if not args.baseline:
        rows, worse = compare(now, {"cells": {}}, args.min_noise)
        print(table(rows))
        return 0
    base = json.loads(Path(args.baseline).read_text())
    if base.get("model") != now.get("model") or base.get("scale") != now.get("scale"):
        print(f"the baseline is {base.get('model')} at scale {base.get('scale')}, this run {now.get('model')} "
              f"at scale {now.get('scale')}: not comparable", file=sys.stderr)
        return 2
    rows, worse = compare(now, base, args.min_noise)
    print(f"now: {now.get('git', {}).get('commit')} ({now.get('date')}); baseline: "
          f"{base.get('git', {}).get('commit')} ({base.get('date')})")
    print(table(rows))
    if worse:
        print("cells worse than the baseline beyond their noise: "
              + ", ".join(sorted({r['cell'] for r in rows if r['verdict'] == 'WORSE'})), file=sys.stderr)
    return 1 if worse else 0
