"""Time every attention backend per (attention shape, sequence-count bucket, token bucket) on the
GPU and write the table the engine chooses from (rose_backend/engine/attention_table.json).

Each cell: random lengths of S sequences summing to T tokens, laid out as the engine lays out a
graph configuration (S + 1 entries, the last a dummy holding padding); each backend is planned in
graph mode, 10 layer-calls are captured in one CUDA graph, and the replay is timed with events
(median of 5). Margin = second-best time / best time.

    python -m rose_bench attention-sweep [--out OUT.json]      # kept as benchmarks/results/attention-sweep/<shapes>-<gpu>.json
    python -m rose_bench attention-sweep --add-from RUN.json   # no GPU: RUN's backends into the table

--add-from copies the backends of another run's cells that the table's cells lack (a backend measured
on a host without the others, e.g. FlashAttention 4 where flashinfer was not installed) and shapes the
table lacks, then recomputes each cell's best and margin. The backends both hold (torch varlen) are
the check that the two runs agree: their median ratio per shape is printed and noted in the table.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from rose_backend.engine.backend_table import TABLE_PATH
from rose_backend.layers.attention import AttentionMetadata, AttentionShape, available_backends, make_backend
from rose_bench.engine_bench import events_ms

SHAPES = {  # name -> shape
    "bge-m3": AttentionShape(16, 16, 64, torch.bfloat16),
    "pplx-embed-0.6b": AttentionShape(16, 8, 128, torch.bfloat16),
    "qwen3-embedding-0.6b (causal)": AttentionShape(16, 8, 128, torch.bfloat16, causal=True),
    "all-MiniLM-L6-v2": AttentionShape(12, 12, 32, torch.bfloat16),
}
SEQS = (1, 4, 16, 64, 128)
TOKENS = (128, 512, 2048, 8192, 32768, 65536)


def cell_layout(rng, s: int, t: int) -> np.ndarray:
    w = rng.random(s) + 0.2
    lens = np.maximum(1, np.floor(w / w.sum() * t)).astype(np.int32)
    lens[-1] += t - lens.sum()
    if lens[-1] < 1:
        lens = np.full(s, t // s, np.int32)
        lens[-1] += t - lens.sum()
    cu = np.zeros(s + 2, np.int32)
    np.cumsum(lens, out=cu[1:s + 1])
    cu[s + 1] = cu[s]                  # the (here empty) dummy sequence slot
    return cu


def time_backend(be, shape, cu_np, t, reps=10):
    cu_host = torch.from_numpy(cu_np)
    cu = cu_host.cuda()
    q = torch.randn(t, shape.num_heads, shape.head_dim, device="cuda", dtype=shape.dtype)
    k = torch.randn(t, shape.num_kv_heads, shape.head_dim, device="cuda", dtype=shape.dtype)
    v = torch.randn_like(k)
    lens = np.diff(cu_np).tolist()
    be.plan(AttentionMetadata(cu, min(t, 8192), lens, shape.causal, graph_key=("sweep", len(lens), t),
                              cu_seqlens_host=cu_host))
    be.run(q, k, v)                    # warm (JIT, workspaces)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            be.run(q, k, v)
    us = events_ms(g.replay, 5) * 1000 / reps
    del g
    return us


def best_and_margin(us: dict[str, float]) -> tuple[str, float | None]:
    """The fastest backend of a cell and its margin (second-best time / best time; None alone)."""
    order = sorted(us, key=us.get)
    return order[0], (round(us[order[1]] / us[order[0]], 3) if len(order) > 1 else None)


def add_from(table: dict, run: dict) -> dict[str, float]:
    """Merge `run`'s backends into `table` (both attention-sweep JSON); returns, per shape the two
    share, the median ratio run / table of the backends both measured in the same cells."""
    ratios: dict[str, float] = {}
    for key, cells in run["shapes"].items():
        if key not in table["shapes"]:
            table["shapes"][key] = cells
            table["names"][key] = run["names"].get(key, key)
            continue
        mine = {(c["seqs"], c["tokens"]): c for c in table["shapes"][key]}
        both = []
        for c in cells:
            into = mine.get((c["seqs"], c["tokens"]))
            if into is None:
                continue
            for name, us in c["us"].items():
                if name in into["us"]:
                    both.append(us / into["us"][name])
                else:
                    into["us"][name] = us
            into["best"], into["margin"] = best_and_margin(into["us"])
        if both:
            ratios[key] = round(float(np.median(both)), 3)
    return ratios


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="benchmarks/results/attention_sweep.json")
    ap.add_argument("--table", default=str(TABLE_PATH))
    ap.add_argument("--shapes", default="", help="comma list of SHAPES names (default: all)")
    ap.add_argument("--add-from", default=None, metavar="RUN.json", help="merge that run's backends into --table "
                    "and stop (no GPU)")
    args = ap.parse_args(argv)
    if args.add_from:
        table, run = json.loads(Path(args.table).read_text()), json.loads(Path(args.add_from).read_text())
        ratios = add_from(table, run)
        table.setdefault("added", []).append({"from": args.add_from, "date": run.get("date"), "commit": run.get("commit"),
                                              "median_ratio_of_shared_backends": ratios})
        Path(args.table).write_text(json.dumps(table, indent=1))
        print("shared backends, median ratio", args.add_from, "/ table:", ratios)
        return 0
    rng = np.random.default_rng(0)
    table = {"device": torch.cuda.get_device_name(), "dtype": "bfloat16", "torch": torch.__version__,
             "date": time.strftime("%Y-%m-%d"), "shapes": {}, "names": {}, "errors": {}}
    for name, shape in SHAPES.items():
        if args.shapes and name not in args.shapes.split(","):
            continue
        backends = [n for n in available_backends(shape, "cuda") if n != "sdpa_loop"]
        table["names"][shape.key] = name
        objs = {}
        for n in backends:
            t0 = time.perf_counter()
            try:
                objs[n] = make_backend(n, shape, "cuda")
                time_backend(objs[n], shape, cell_layout(rng, 1, 128), 128)     # JIT compile here
            except Exception as e:  # a backend that cannot build this shape is left out, with why
                table["errors"][f"{shape.key}/{n}"] = f"{type(e).__name__}: {str(e)[:300]}"
                objs.pop(n, None)
            print(f"{shape.key} {n}: first use {time.perf_counter() - t0:.1f} s", flush=True)
        cells = []
        for s in SEQS:
            for t in TOKENS:
                if s > t // 16 and s > 1 or t / s > 8192 or (shape.causal and t > 8192) or (shape.head_dim == 32 and t > 8192):
                    continue
                cu = cell_layout(rng, s, t)
                us = {}
                for n, be in objs.items():
                    try:
                        us[n] = round(time_backend(be, shape, cu, t), 2)
                    except Exception as e:
                        table["errors"][f"{shape.key}/{n}/{s}x{t}"] = f"{type(e).__name__}: {str(e)[:200]}"
                if not us:
                    continue
                best, margin = best_and_margin(us)
                cells.append({"seqs": s, "tokens": t, "us": us, "best": best, "margin": margin})
                print(f"{shape.key:12s} {s:4d} x {t:6d}: " + "  ".join(f"{n} {u:9.1f}" for n, u in us.items())
                      + f"   -> {best} x{margin}", flush=True)
        table["shapes"][shape.key] = cells
        for p in (args.out, args.table):         # after every shape: a cut-off run still leaves a table
            Path(p).parent.mkdir(parents=True, exist_ok=True)
            Path(p).write_text(json.dumps(table, indent=1))
    print("errors:", json.dumps(table["errors"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
