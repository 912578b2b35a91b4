"""Engine measurements on the GPU, BGE-M3 shape by default (--shape pplx-embed; random weights, bf16):

  startup      seconds from Engine() to ready (weights, backends), and to the first result
  per config   first request (eager) and second (capture + replay) wall ms; device time per forward,
               eager vs graph replay (CUDA events, median); step+synchronize wall p50 in steady state
  kernels      per layer and per forward, counted from a torch.profiler trace of one eager forward
  memory       weights, then weights + every graph for token buckets up to 8192 (seq buckets 1/4/16/64)

    python -m rose_bench engine --out OUT.json      # kept as benchmarks/results/engine/<model>-<gpu>.json
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from rose_backend.config import ModelConfig
from rose_backend.engine.batch import PackedBatch
from rose_backend.engine.engine import Engine
from rose_backend.engine.graph_cache import token_buckets
from rose_backend.engine.options import EngineOptions
from rose_backend.layers import fused
from rose_testing.folders import make_folder

REF: list = []                 # an unpadded eager engine, for a correctness check per configuration
CONFIGS = [(1, 128), (1, 512), (1, 4096), (5, 512), (25, 512), (100, 512)]


def batch(rng, s, n, vocab):
    lens = np.full(s, n, np.int32)
    return PackedBatch(rng.integers(3, vocab, size=s * n).astype(np.int32), lens)


def events_ms(fn, reps):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(reps):
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return float(np.median(out))


def wall_ms(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def per_config(eng, rng, s, n):
    b = batch(rng, s, n, eng.cfg.vocab_size)
    first = wall_ms(lambda: eng.step(b).synchronize())
    second = wall_ms(lambda: eng.step(b).synchronize())
    key = eng.last_key
    assert eng.graphs.entries[key].state == "captured"
    v = eng.device_views(key[:2])
    graph_ms = events_ms(lambda: eng.graphs.replay(key), 20)
    with torch.inference_mode():
        eager_ms = events_ms(lambda: eng._forward(v), 10)
    steady = []
    for _ in range(30):
        t0 = time.perf_counter()
        eng.step(b).synchronize()
        steady.append((time.perf_counter() - t0) * 1e3)
    gap = None
    if REF:
        got, ref = eng.step(b).synchronize(), REF[0].step(b).synchronize()
        gap = float(1 - (got * ref).sum(1).min())            # both L2-normalized
    return {"config": f"{s}x{n}", "key": list(key), "backend": eng.backend_for(*key[:2]),
            "one_minus_cos_vs_unpadded_eager": gap,
            "first_request_eager_ms": round(first, 2), "second_request_capture_ms": round(second, 2),
            "device_ms_eager": round(eager_ms, 3), "device_ms_graph": round(graph_ms, 3),
            "step_sync_wall_p50_ms": round(float(np.median(steady)), 3)}


def count_kernels(eng, s, n):
    """Kernels of one eager forward (static buffers of the configuration), by name."""
    eng.step(batch(np.random.default_rng(1), s, n, eng.cfg.vocab_size)).synchronize()   # plan this layout
    key = eng.last_key
    v = eng.device_views(key[:2])
    from torch.profiler import ProfilerActivity, profile
    with torch.inference_mode():
        eng._forward(v)
        torch.cuda.synchronize()
        layer = None
        if eng.cfg.family in ("bert", "distilbert", "mpnet"):   # a BertLayer takes x alone; the other
                                                                 # families' layers positions and the residual too
            x = torch.randn(key[1], eng.cfg.hidden_size, device="cuda", dtype=eng.dtype)
            eng.model.layers[0](x)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                eng.model.layers[0](x)
                torch.cuda.synchronize()
            layer = [e.name for e in prof.events() if e.device_type.name == "CUDA" and not e.name.startswith("Mem")]
        with profile(activities=[ProfilerActivity.CUDA]) as prof2:
            eng._forward(v)
            torch.cuda.synchronize()
        total = [e.name for e in prof2.events() if e.device_type.name == "CUDA" and not e.name.startswith("Mem")]
    return {"per_layer": None if layer is None else len(layer),
            "per_layer_names": None if layer is None else [k[:90] for k in layer],
            "per_forward": len(total), "layers": eng.cfg.num_layers,
            "per_forward_names": Counter(k[:60] for k in total).most_common(20)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="benchmarks/results/engine_bench.json")
    ap.add_argument("--shape", default="bge-m3", help="the random-weight folder's shape: bge-m3 | pplx-embed")
    ap.add_argument("--model-dir", default=None, help="where that folder is written (default /tmp/rose-gpu/<shape>-random)")
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--attention", default=None, help="one attention backend for every configuration "
                    "(e.g. torch_varlen: nothing to JIT-compile); default: the engine's choice per configuration")
    ap.add_argument("--check", action="store_true", help="compare each configuration with unpadded eager")
    ap.add_argument("--unfused", action="store_true", help="also time the unfused add/LN/GELU variant")
    ap.add_argument("--fp8-min-tokens", type=int, default=0,
                    help="also time every configuration with FP8 projections from this many tokens (layers/fp8.py)")
    args = ap.parse_args(argv)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M"),
           "git": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()}
    res["shape"], res["attention"] = args.shape, args.attention or "auto"
    cfg = ModelConfig.from_folder(make_folder(args.shape, args.model_dir or f"/tmp/rose-gpu/{args.shape}-random",
                                              device="cuda"))
    free0 = torch.cuda.mem_get_info()[0]
    t0 = time.perf_counter()
    eng = Engine(cfg, "cuda", EngineOptions(attention=args.attention, max_tokens=65536, max_seqs=128))
    ready = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    first = wall_ms(lambda: eng.step(batch(rng, 1, 700, cfg.vocab_size)).synchronize())   # not a timed config
    res["startup"] = {"engine_ready_s": round(ready, 2), "first_result_s": round(ready + first / 1e3, 2),
                      "weights_bytes": torch.cuda.memory_allocated() - 0}
    if args.check:
        REF.append(Engine(cfg, "cuda", EngineOptions(graphs=False)))
    res["configs"] = [per_config(eng, rng, s, n) for s, n in CONFIGS]
    REF.clear()
    for r in res["configs"]:
        print(r, flush=True)
    res["kernels"] = count_kernels(eng, 1, 512)
    print("kernels per layer", res["kernels"]["per_layer"], res["kernels"]["per_layer_names"], flush=True)
    if args.unfused:
        fused.enabled = False
        eng2 = Engine(cfg, "cuda", EngineOptions(max_tokens=65536, max_seqs=128))
        res["unfused_configs"] = [per_config(eng2, rng, s, n) for s, n in CONFIGS[:2] + CONFIGS[-1:]]
        res["unfused_kernels"] = count_kernels(eng2, 1, 512)["per_layer"]
        fused.enabled = True
        del eng2
        print("unfused", res["unfused_configs"], flush=True)
    if args.fp8_min_tokens:
        eng_fp8 = Engine(cfg, "cuda", EngineOptions(attention=args.attention, max_tokens=65536, max_seqs=128,
                                                     fp8_min_tokens=args.fp8_min_tokens))
        res["fp8_min_tokens"] = args.fp8_min_tokens
        res["fp8_configs"] = [per_config(eng_fp8, rng, s, n) for s, n in CONFIGS]
        del eng_fp8
        print("fp8", res["fp8_configs"], flush=True)
    res["stats_after"] = str(eng.stats)
    del eng
    torch.cuda.empty_cache()
    if not args.skip_memory:
        torch.cuda.synchronize()
        free0 = torch.cuda.mem_get_info()[0]
        alloc0 = torch.cuda.memory_reserved()
        eng = Engine(cfg, "cuda", EngineOptions(max_tokens=8192, max_seqs=64))
        w_res = torch.cuda.memory_reserved() - alloc0
        w_used = free0 - torch.cuda.mem_get_info()[0]
        configs = [(s, t) for t in token_buckets(8192) for s in (1, 4, 16, 64) if s <= t // 8]
        t0 = time.perf_counter()
        eng.precapture(configs)
        secs = time.perf_counter() - t0
        torch.cuda.synchronize()
        res["memory"] = {"graphs": eng.graphs.num_captured, "configs": len(configs),
                         "weights_and_buffers_reserved_bytes": w_res,
                         "weights_and_buffers_device_used_bytes": w_used,
                         "total_reserved_bytes": torch.cuda.memory_reserved() - alloc0,
                         "total_device_used_bytes": free0 - torch.cuda.mem_get_info()[0],
                         "graph_pool_reserved_bytes": eng.stats.graph_memory_bytes,
                         "precapture_seconds": round(secs, 1), "stats": str(eng.stats)}
        print(res["memory"], flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
