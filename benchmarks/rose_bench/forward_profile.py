"""Where the forward pass spends its device time: per model shape, batch configuration and attention
backend, the CUDA-graph replay time, the kernels of one replay (torch.profiler, grouped by name) and
the gap to an unpadded eager reference. Random weights at the real shapes, bf16.

    source benchmarks/gpu/enter_bench.sh && python3 -m rose_bench forward-profile --out OUT    # benchmarks/gpu/README.md

Results: <out>/forward_profile.json (written after every cell, so a run cut short keeps what it did).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from rose_backend.config import ModelConfig
from rose_backend.engine.batch import PackedBatch
from rose_backend.engine.engine import Engine
from rose_backend.engine.options import EngineOptions
from rose_testing.folders import make_folder as _make_folder
from rose_bench.engine_bench import events_ms
from rose_bench.record import run_record

CONFIGS = [(1, 128), (1, 512), (1, 4096), (100, 512)]


def make_folder(name: str, root: Path) -> Path:
    return _make_folder(name, root / name, device="cuda")


def kernel_table(fn, reps: int = 3) -> dict:
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    by_name: dict[str, list[float]] = defaultdict(list)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset")):
            by_name[e.name].append(e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total)
    rows = sorted(((n, len(v) / reps, sum(v) / reps) for n, v in by_name.items()), key=lambda r: -r[2])
    return {"kernels_per_forward": sum(r[1] for r in rows),
            "device_us_per_forward": round(sum(r[2] for r in rows), 1),
            "top": [{"name": n[:120], "count": c, "us": round(us, 1)} for n, c, us in rows[:14]]}


def cell(eng: Engine, ref: Engine, s: int, n: int, rng, profile: bool) -> dict:
    lens = np.full(s, n, np.int32)
    b = PackedBatch(rng.integers(5, eng.cfg.vocab_size - 1, size=s * n).astype(np.int32), lens)
    eng.step(b).synchronize()                 # eager (warm-up, JIT)
    got = eng.step(b).synchronize()           # capture + replay
    key = eng.last_key
    if eng.graphs.entries[key].state != "captured":
        raise RuntimeError(f"{key} was not captured")
    graph = lambda: eng.graphs.replay(key)    # noqa: E731
    out = {"key": list(key), "backend": eng.backend_for(*key[:2]), "graph_ms": round(events_ms(graph, 20), 4)}
    if profile:     # the same forward launched eagerly on the same buffers (host launch gaps included)
        views = eng.device_views(tuple(key[:2]))
        with torch.inference_mode():
            out["eager_ms"] = round(events_ms(lambda: eng._forward(views), 5), 4)
        out["graph_pool_bytes"] = eng.stats.graph_memory_bytes        # all graphs captured so far
    want = ref.step(b).synchronize()
    a = got / np.linalg.norm(got, axis=1, keepdims=True)
    w = want / np.linalg.norm(want, axis=1, keepdims=True)
    out["one_minus_cos_vs_unpadded_eager"] = float(1 - (a * w).sum(1).min())
    if profile:
        out["profile"] = kernel_table(graph)
        out["profile"]["kernels_per_layer"] = round(out["profile"]["kernels_per_forward"] / eng.cfg.num_layers, 2)
    return out


def run_one(model: str, backend: str, configs, folders: Path, warm_only: bool) -> dict:
    """One (model, backend) in this process: a fault in one backend cannot take the others down."""
    cells = {}
    cfg = ModelConfig.from_folder(make_folder(model, folders))
    t0 = time.perf_counter()
    eng = Engine(cfg, "cuda", EngineOptions(attention=backend, max_tokens=65536, max_seqs=128))
    if warm_only:                             # compile the kernels (flashinfer JIT) and leave
        for s, n in configs:
            lens = np.full(s, n, np.int32)
            eng.step(PackedBatch(np.full(s * n, 5, np.int32), lens)).synchronize()
        return {"warm_seconds": round(time.perf_counter() - t0, 1)}
    ref = Engine(cfg, "cuda", EngineOptions(attention="torch_varlen", graphs=False))
    for s, n in configs:
        try:
            cells[f"{s}x{n}"] = cell(eng, ref, s, n, np.random.default_rng(0), profile=True)
        except Exception as e:
            cells[f"{s}x{n}"] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-800:]}
            break                             # the CUDA context may be gone
    cells["weights_bytes"] = sum(p.numel() * p.element_size() for p in eng.model.parameters())
    # the split-K projections (layers/projection.py) against cuBLAS, where they apply
    from rose_backend.layers import projection
    small = [(s, n) for s, n in configs if s * n <= projection.max_tokens and "error" not in cells.get(f"{s}x{n}", {})]
    if small:
        del ref
        limit, projection.max_tokens = projection.max_tokens, 0
        try:
            off = Engine(cfg, "cuda", EngineOptions(attention=backend, max_tokens=65536, max_seqs=128))
            for s, n in small:
                cells[f"{s}x{n}"]["graph_ms_splitk_off"] = cell(off, off, s, n, np.random.default_rng(0), False)["graph_ms"]
        finally:
            projection.max_tokens = limit
    cells["seconds"] = round(time.perf_counter() - t0, 1)
    return cells


# The kernel variants of the small-batch forward: (split-K `o` / `down`, gate/up + SwiGLU as the
# small-GEMM kernel, programmatic dependent launch between our kernels). "splitk" is cuBLAS for the others.
VARIANTS = {"cublas": (False, False, False), "splitk": (True, False, False), "splitk+pdl": (True, False, True),
            "gemm": (True, True, False), "gemm+pdl": (True, True, True)}


def kernel_ab(models: list[str], folders: Path, variants: list[str], backend: str = "torch_varlen",
              configs=((1, 128), (1, 256), (1, 512), (2, 100)), rounds: int = 7) -> dict:
    """Graph replay per kernel variant (VARIANTS), each captured on its own engine under its settings,
    the engines' replays alternated (round by round, 20 replays each) so that clocks and heat weigh on
    all alike; median of rounds, and each variant's output against the first one's (1 - cos)."""
    from rose_backend.layers import projection, small_gemm
    saved = (projection.max_tokens, projection.gemm_max_tokens, small_gemm.pdl)

    def apply(name):
        split, gemm, pdl = VARIANTS[name]
        projection.max_tokens = saved[0] if split else 0
        projection.gemm_max_tokens = max(saved[1], 256) if gemm else 0
        small_gemm.pdl = max(saved[2], 128) if pdl else 0
    out = {}
    for model in models:
        cfg = ModelConfig.from_folder(make_folder(model, folders))
        engines, firsts = {}, {}
        try:
            for name in variants:
                apply(name)
                eng = engines[name] = Engine(cfg, "cuda", EngineOptions(attention=backend, max_tokens=4096, max_seqs=8))
                for s, n in configs:
                    b = PackedBatch(np.full(s * n, 7, np.int32), np.full(s, n, np.int32))
                    for _ in range(2):
                        got = eng.step(b).synchronize()
                    firsts.setdefault((s, n), got)
                    got = got / np.linalg.norm(got, axis=1, keepdims=True)
                    want = firsts[(s, n)] / np.linalg.norm(firsts[(s, n)], axis=1, keepdims=True)
                    out.setdefault(f"{model} {s}x{n}", {}).setdefault("one_minus_cos", {})[name] = float(1 - (got * want).sum(1).min())
        finally:
            projection.max_tokens, projection.gemm_max_tokens, small_gemm.pdl = saved
        for s, n in configs:
            b = PackedBatch(np.full(s * n, 7, np.int32), np.full(s, n, np.int32))
            key = engines[variants[0]].graphs.key_for(s, s * n)
            keys = {k: next(x for x in e.graphs.entries if x[:2] == key) for k, e in engines.items()}
            times = {k: [] for k in engines}
            for _ in range(rounds):
                for k, e in engines.items():
                    e.step(b).synchronize()     # stage this configuration's layout into the static buffer
                    times[k].append(events_ms(lambda: e.graphs.replay(keys[k]), 20))
            cell = out[f"{model} {s}x{n}"]
            cell["graph_ms"] = {k: round(float(np.median(v)), 4) for k, v in times.items()}
            print(model, f"{s}x{n}", json.dumps(cell), flush=True)
        del engines
        torch.cuda.empty_cache()
    return out


def layer_scaling(models: list[str], folders: Path, layer_counts: list[int], backend: str = "torch_varlen",
                  configs=((1, 128), (1, 512))) -> dict:
    """Graph replay of each model shape cut to N layers: with one layer (25-30 MB) the weights stay in
    the 50 MB L2 from replay to replay, with all of them every layer reads its weights from HBM. The
    difference per layer is what reading the weights from memory costs beyond the kernels' own time,
    the most a prefetch into L2 could win. The kernels of one replay per cell (kernel_table)."""
    out = {}
    for model in models:
        for layers in layer_counts:
            cfg = ModelConfig.from_folder(_make_folder(model, folders / f"{model}-{layers}l", device="cuda",
                                                       num_hidden_layers=layers))
            eng = Engine(cfg, "cuda", EngineOptions(attention=backend, max_tokens=4096, max_seqs=8))
            for s, n in configs:
                b = PackedBatch(np.full(s * n, 7, np.int32), np.full(s, n, np.int32))
                for _ in range(2):
                    eng.step(b).synchronize()
                key = eng.last_key
                graph = lambda e=eng, k=key: e.graphs.replay(k)    # noqa: E731
                ms = float(np.median([events_ms(graph, 20) for _ in range(5)]))
                cell = {"graph_ms": round(ms, 4), "per_layer_us": round(1e3 * ms / layers, 2),
                        "kernels": kernel_table(graph)}
                out.setdefault(f"{model} {s}x{n}", {})[f"{layers} layers"] = cell
                print(model, f"{s}x{n}", layers, "layers", json.dumps({k: v for k, v in cell.items() if k != "kernels"}),
                      json.dumps(cell["kernels"]["top"][:8]), flush=True)
            del eng
            torch.cuda.empty_cache()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/forward_profile")
    ap.add_argument("--models", default="bge-m3,pplx-embed")
    ap.add_argument("--backends", default="torch_varlen,flashinfer,flashinfer_fa3")
    ap.add_argument("--configs", default=",".join(f"{s}x{n}" for s, n in CONFIGS))
    ap.add_argument("--folders", default="/tmp/rose-folders")
    ap.add_argument("--one", nargs=2, metavar=("MODEL", "BACKEND"), help=argparse.SUPPRESS)
    ap.add_argument("--warm-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--timeout", type=float, default=240, help="seconds per (model, backend) process")
    ap.add_argument("--git-commit", default=None, help="recorded in the JSON where .git is not available")
    ap.add_argument("--flashinfer-pdl", choices=("default", "on", "off"), default="default",
                    help="enable_pdl for flashinfer's norms and SiLU-and-mul (layers/fused.py's flashinfer_pdl; "
                         "default: flashinfer's own choice)")
    ap.add_argument("--kernel-ab", default=None, metavar="V1,V2,...", help="only: graph replay of the kernel "
                    f"variants named ({', '.join(VARIANTS)}), alternated, at 1x128, 1x256, 1x512 and 2x100, on "
                    "--backends' first backend; writes kernel_ab.json")
    ap.add_argument("--layer-counts", default=None, metavar="N1,N2", help="only: graph replay of the model shapes "
                    "cut to these layer counts (layer_scaling), on --backends' first backend; writes layer_scaling.json")
    args = ap.parse_args(argv)
    from rose_backend.layers import fused
    fused.flashinfer_pdl = {"default": None, "on": True, "off": False}[args.flashinfer_pdl]
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.layer_counts:
        cells = layer_scaling(args.models.split(","), Path(args.folders), [int(n) for n in args.layer_counts.split(",")],
                              args.backends.split(",")[0])
        (out_dir / "layer_scaling.json").write_text(json.dumps({**run_record(args.git_commit, "cuda"), "cells": cells}, indent=1))
        return 0
    if args.kernel_ab:
        cells = kernel_ab(args.models.split(","), Path(args.folders), args.kernel_ab.split(","), args.backends.split(",")[0])
        res = {**run_record(args.git_commit, "cuda"), "cells": cells}
        (out_dir / "kernel_ab.json").write_text(json.dumps(res, indent=1))
        return 0
    configs = [tuple(int(x) for x in c.split("x")) for c in args.configs.split(",")]
    if args.one:
        print("RESULT " + json.dumps(run_one(*args.one, configs, Path(args.folders), args.warm_only)), flush=True)
        return
    result = {**run_record(args.git_commit, "cuda"),
              "env": {k: v for k, v in os.environ.items() if k.startswith("ROSE_")},
              "flashinfer_pdl": args.flashinfer_pdl, "warm": {}, "cells": {}}
    path = out_dir / "forward_profile.json"
    pairs = [(m, b) for m in args.models.split(",") for b in args.backends.split(",")]
    for m in args.models.split(","):          # folders first (one writer each)
        make_folder(m, Path(args.folders))
    base = [sys.executable, "-m", "rose_bench", "forward-profile", "--configs", args.configs, "--folders", args.folders,
            "--out", args.out, "--flashinfer-pdl", args.flashinfer_pdl]

    def collect(proc, label):
        try:
            text, _ = proc.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            text, _ = proc.communicate()
            return {"error": f"timed out after {args.timeout} s", "log": text[-1500:]}
        for line in text.splitlines():
            if line.startswith("RESULT "):
                return json.loads(line[7:])
        return {"error": f"exit {proc.returncode}", "log": text[-1500:]}

    # Phase 1, in parallel: compile every backend's kernels. Phase 2, one at a time: measure.
    procs = {(m, b): subprocess.Popen(base + ["--one", m, b, "--warm-only"], stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True) for m, b in pairs}
    for (m, b), p in procs.items():
        result["warm"][f"{m}/{b}"] = collect(p, "warm")
        print("warm", m, b, json.dumps(result["warm"][f"{m}/{b}"])[:300], flush=True)
    path.write_text(json.dumps(result, indent=1))
    for m, b in pairs:
        p = subprocess.Popen(base + ["--one", m, b], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        cells = collect(p, "measure")
        result["cells"][f"{m}/{b}"] = cells
        for k, v in cells.items():
            if isinstance(v, dict):
                print(m, b, k, json.dumps({x: y for x, y in v.items() if x != "profile"})[:300], flush=True)
            else:
                print(m, b, k, v, flush=True)
        path.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
