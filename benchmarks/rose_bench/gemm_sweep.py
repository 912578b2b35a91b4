"""The projections of both model shapes as bare GEMMs (bf16, GPU): which call form is fastest at each
token count. The forward-pass profiles show it GEMM-bound at small batches (benchmarks/RESULTS-engine.md),
so this times, per (tokens, N, K):

    linear      F.linear(x, W), W [N, K] (what the models call today)
    matmul_t    x @ Wt, Wt = W.t().contiguous() [K, N] (the other cuBLAS layout)
    cublaslt    F.linear with torch.backends.cuda.preferred_blas_library("cublaslt")
    cublas      F.linear with preferred_blas_library("cublas")

Each form runs 50 times inside one CUDA graph (no launch gaps), median of 10 replays per call; the
table gives us per call and the weight bandwidth it reaches (GB/s). JSON: command, commit, machine.

    python -m rose_bench gemm-sweep --out OUT --git-commit <c>
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rose_bench.engine_bench import events_ms
from rose_bench.record import run_record

# (name, N, K) of each projection: BGE-M3 (XLM-R large) and pplx-embed (Qwen3 0.6B)
SHAPES = [("bge qkv", 3072, 1024), ("bge o", 1024, 1024), ("bge up", 4096, 1024), ("bge down", 1024, 4096),
          ("pplx qkv", 4096, 1024), ("pplx o", 1024, 2048), ("pplx gate_up", 6144, 1024), ("pplx down", 1024, 3072)]
FORMS = ("linear", "matmul_t", "cublaslt", "cublas")
DEFAULT_TOKENS = "128,512,4096,16384"


def time_form(form: str, x, w, wt, reps: int = 50) -> float:
    import torch
    import torch.nn.functional as F
    lib = {"cublaslt": "cublaslt", "cublas": "cublas"}.get(form)
    prev = torch.backends.cuda.preferred_blas_library()
    if lib:
        torch.backends.cuda.preferred_blas_library(lib)
    try:
        return time_fn((lambda: x @ wt) if form == "matmul_t" else (lambda: F.linear(x, w)), reps)
    finally:
        torch.backends.cuda.preferred_blas_library(prev)


def splitk_sweep(tokens: list[int]) -> list[dict]:
    """Small token counts: cuBLAS (F.linear with bias, as the models call it; and W @ x.T) against
    the split-K kernel of rose_backend/layers/small_gemm.py over its configurations (kernel
    alone: its consumer sums the partials). Each row: us per call and the best configuration."""
    import itertools

    import torch
    import torch.nn.functional as F

    from rose_backend.layers.small_gemm import splitk_matmul
    rows = []
    configs = [dict(splits=s, bm=bm, bn=bn, bk=bk, stages=st) for s, bm, bn, bk, st in
               itertools.product((2, 4, 8), (64, 128), (32, 64, 128), (64, 128), (3, 4))]
    for name, n, k in SHAPES:
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        for m in tokens:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = F.linear(x.float(), w.float())
            us = {"linear_bias": round(time_fn(lambda: F.linear(x, w, b)), 2),
                  "w_xt": round(time_fn(lambda: w @ x.t()), 2)}
            best, best_us, err = None, float("inf"), None
            for c in configs:
                if k % (c["splits"] * c["bk"]) or (c["bm"] > 64 and m < 128):
                    continue
                try:
                    out = torch.empty((c["splits"], m, n), dtype=torch.float32, device="cuda")
                    t = time_fn(lambda: splitk_matmul(x, w, out=out, **c))
                except Exception as e:      # a configuration the compiler refuses (shared memory)
                    print(f"  {name} {m} {c}: {type(e).__name__}", flush=True)
                    continue
                if t < best_us:
                    best, best_us = c, t
                    err = float(((out.sum(0) - ref).abs().max() / ref.abs().max()).item())
            us["splitk"] = round(best_us, 2)
            rows.append({"shape": name, "n": n, "k": k, "tokens": m, "us": us, "splitk_config": best,
                         "splitk_rel_err": err})
            print(f"{name:<13} {m:>5} " + " ".join(f"{f} {v:7.2f}" for f, v in us.items()) + f"  {best} err {err:.1e}",
                  flush=True)
    return rows


def small_gemm_sweep(tokens: list[int]) -> list[dict]:
    """Small token counts, the projections that end in an epilogue (QKV, up + GELU, gate/up + SwiGLU):
    cuBLAS as the models call it (GELU in the cuBLASLt epilogue; SwiGLU as GEMM + flashinfer's kernel
    where installed) against the small-GEMM kernel of rose_backend/layers/small_gemm.py over its
    configurations (BM, BN, BK, warps, stages). Each row: us per call and the best configuration."""
    import itertools

    import torch
    import torch.nn.functional as F

    from rose_backend.layers import small_gemm
    from rose_backend.layers.activation import silu_and_mul
    rows = []
    configs = list(itertools.product((64, 128), (32, 64, 128), (64, 128), (4,), (3, 5, 7)))
    for name, n, k, act in (("bge qkv", 3072, 1024, "none"), ("bge up", 4096, 1024, "gelu"),
                            ("pplx qkv", 4096, 1024, "none"), ("pplx gate_up", 6144, 1024, "swiglu")):
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16) if act != "swiglu" else None
        cublas = {"none": lambda: F.linear(x, w, b), "gelu": lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True),
                  "swiglu": lambda: silu_and_mul(F.linear(x, w))}[act]
        for m in tokens:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            us = {"cublas": round(time_fn(cublas), 2)}
            best, best_us = None, float("inf")
            for bm, bn, bk, warps, stages in configs:
                if bm > 64 and m <= 64:
                    continue
                try:
                    t = time_fn(lambda: small_gemm.gemm_act(x, w, b, act, config=(bm, bn, bk, warps), stages=stages))
                except Exception as e:      # a configuration the compiler refuses (shared memory)
                    print(f"  {name} {m} {(bm, bn, bk, warps, stages)}: {type(e).__name__}", flush=True)
                    continue
                if t < best_us:
                    best, best_us = dict(bm=bm, bn=bn, bk=bk, warps=warps, stages=stages), t
            us["small_gemm"] = round(best_us, 2)
            rows.append({"shape": name, "n": n, "k": k, "act": act, "tokens": m, "us": us, "small_gemm_config": best})
            print(f"{name:<13} {m:>5} " + " ".join(f"{f} {v:7.2f}" for f, v in us.items()) + f"  {best}", flush=True)
    return rows


def time_fn(fn, reps: int = 50) -> float:
    """us per call of fn, `reps` calls captured in one CUDA graph, median of 10 replays."""
    import torch
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    return events_ms(g.replay, 10) * 1e3 / reps


def main(argv=None) -> int:
    import torch
    ap = argparse.ArgumentParser(prog="python -m rose_bench gemm-sweep", description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default=DEFAULT_TOKENS)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--git-commit", default=None, help="recorded in the JSON where .git is not available")
    ap.add_argument("--splitk", action="store_true", help="small token counts: cuBLAS vs the split-K kernel "
                    "(--tokens default 128,256,512); writes gemm_splitk.json")
    ap.add_argument("--small-gemm", action="store_true", help="small token counts: cuBLAS vs the small-GEMM "
                    "kernel with its epilogue (--tokens default 128,256); writes gemm_small.json")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gemm-sweep needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.small_gemm:
        tokens = [int(t) for t in (args.tokens if args.tokens != DEFAULT_TOKENS else "128,256").split(",")]
        return save(small_gemm_sweep(tokens), Path(args.out) / "gemm_small.json", args.git_commit)
    if args.splitk:
        tokens = [int(t) for t in (args.tokens if args.tokens != DEFAULT_TOKENS else "128,256,512").split(",")]
        return save(splitk_sweep(tokens), Path(args.out) / "gemm_splitk.json", args.git_commit)
    rows = []
    print(f"{'shape':<13} {'tokens':>6} " + " ".join(f"{f + ' us':>12}" for f in FORMS) + "  best   GB/s(best)")
    for name, n, k in SHAPES:
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
        wt = w.t().contiguous()
        for m in (int(t) for t in args.tokens.split(",")):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            us = {f: round(time_form(f, x, w, wt), 2) for f in FORMS}
            best = min(us, key=us.get)
            gbs = (n * k + m * k + m * n) * 2 / (us[best] * 1e-6) / 1e9
            rows.append({"shape": name, "n": n, "k": k, "tokens": m, "us": us, "best": best,
                         "tflops_best": round(2 * m * n * k / (us[best] * 1e-6) / 1e12, 1), "gbs_best": round(gbs)})
            print(f"{name:<13} {m:>6} " + " ".join(f"{us[f]:>12.2f}" for f in FORMS) + f"  {best:<9} {gbs:>7.0f}", flush=True)
    return save(rows, Path(args.out) / "gemm_sweep.json", args.git_commit)


def save(rows: list[dict], path: Path, commit: str | None) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    result = {**run_record(commit, "cuda"), "rows": rows}
    path.write_text(json.dumps(result, indent=1))
    print(f"saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
