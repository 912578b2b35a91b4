"""The FFN block at small token counts (bf16, GPU): today's kernels against the persistent kernel of
rose_backend/layers/persistent_ffn.py. Per shape (BGE-M3: H 1024, I 4096, biases, GELU, LayerNorm;
pplx-embed: I 3072, SwiGLU, RMSNorm) and token count, a chain of --blocks FFN blocks with distinct
weights (8 blocks of 16 / 18 MB, more than the H200's 50 MB L2: each block's weights come from HBM)
captured in one CUDA graph; median of --reps replays (CUDA events), us per block:

    today       as the models run it (models/bert.py, models/qwen3.py): project() (cuBLASLt with the
                GELU epilogue; the small-GEMM kernel with SwiGLU up to 128 tokens, else cuBLAS + SiLU-
                and-mul), project_for_norm() (split-K partials), AddLayerNorm / AddRMSNorm (sum + bias
                + residual + norm; AddRMSNorm keeps the sum in the residual, and so does the kernel here)
    persistent  persistent_ffn: one launch, grid barriers, its default tiles
    phased      persistent_ffn(phased=True): the same kernel as three launches

all with the project's PDL switch as it stands ($ROSE_TRITON_PDL; default up to 128 tokens). One
block's output is checked against today's (max abs diff; today's GELU is the cuBLASLt epilogue's
tanh form, the kernel's the exact erf). Then a sweep over the persistent kernel's tiles at
--sweep-tokens, one setting at a time from the default. JSON: command, commit, machine, rows, sweep.

    python -m rose_bench ffn-bench --out OUT        # writes OUT/ffn_bench.json
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

from rose_bench.record import comma_list, log, run_record, save_json

HIDDEN = 1024
SHAPES = {"bge-m3": dict(inter=4096, act="gelu", norm="layer", bias=True, eps=1e-5),
          "pplx-embed": dict(inter=3072, act="swiglu", norm="rms", bias=False, eps=1e-6)}
# one setting at a time from the default: phase-1 tiles, phase-2 tiles and splits, warps, stages,
# L2 prefetch (0 none, 1 up, 3 up + down), a cooperative launch, half the grid
SWEEP = ([dict(bm1=b, bn1=n) for b, n in ((64, 64), (128, 32), (128, 64), (64, 32), (32, 128), (64, 128))]
         + [dict(bm2=b, bn2=n, splits=s) for b, n, s in ((64, 128, 8), (128, 64, 8), (64, 64, 16), (64, 128, 4),
                                                          (128, 64, 4), (64, 64, 8), (128, 128, 8))]
         + [dict(warps=8), dict(stages=2), dict(stages=4), dict(prefetch=0), dict(prefetch=1), dict(coop=True),
            dict(grid=66)])


class Block:
    """One FFN block's modules as the models hold them (random weights, bf16, CUDA)."""

    def __init__(self, shape: str):
        import torch
        from torch import nn

        from rose_backend.layers.norm import AddLayerNorm, AddRMSNorm
        f = SHAPES[shape]
        self.shape, self.act, self.norm_kind, self.inter = shape, f["act"], f["norm"], f["inter"]
        gates = 2 if self.act == "swiglu" else 1
        kw = dict(device="cuda", dtype=torch.bfloat16)
        self.up = nn.Linear(HIDDEN, gates * self.inter, bias=f["bias"], **kw)
        self.down = nn.Linear(self.inter, HIDDEN, bias=f["bias"], **kw)
        norm = AddRMSNorm(HIDDEN, eps=f["eps"]) if self.norm_kind == "rms" else AddLayerNorm(HIDDEN, eps=f["eps"])
        self.norm = norm.to(**kw).requires_grad_(False)
        with torch.no_grad():
            self.norm.weight.copy_(1 + 0.1 * torch.randn(HIDDEN, device="cuda"))
            if self.norm_kind == "layer":
                self.norm.bias.copy_(0.1 * torch.randn(HIDDEN, device="cuda"))
        for p in (*self.up.parameters(), *self.down.parameters()):
            p.requires_grad_(False)

    def today(self, x, r):
        """(y, residual): the models' own calls."""
        from rose_backend.layers.projection import project, project_for_norm
        parts = project_for_norm(project(x, self.up, self.act), self.down)
        if self.norm_kind == "rms":
            return self.norm(parts, r)
        return self.norm(parts, x), None

    def persistent(self, x, r, ws, phased=False, config=None):
        from rose_backend.layers.persistent_ffn import persistent_ffn
        rms = self.norm_kind == "rms"
        y = persistent_ffn(x, self.up.weight, self.up.bias, self.down.weight, self.down.bias, r if rms else x,
                           self.norm.weight, None if rms else self.norm.bias, self.norm.eps, self.act, self.norm_kind,
                           phased=phased, workspace=ws, config=config, residual_out=r if rms else None)
        return y, r


def today_path(block: Block, m: int) -> str:
    """Which kernels today's path launches for this block at m tokens (layers/projection.py's rules)."""
    from rose_backend.layers import fused, projection
    half = fused.flashinfer is not None and fused.enabled
    if block.act == "swiglu":
        up = "small-GEMM + SwiGLU" if m <= projection.gemm_max_tokens and half else "cuBLAS, SiLU-and-mul"
    else:
        up = "cuBLASLt + GELU epilogue"
    s = projection.splits_for(m, block.inter)
    down = f"split-K x{s}, partials norm" if m <= projection.max_tokens and half else "cuBLAS, add + norm"
    return f"{up} | {down}"


def chain(blocks, kind, x0, r0, ws, config=None):
    x, r = x0, r0
    for b in blocks:
        if kind == "today":
            x, r = b.today(x, r)
        else:
            x, r = b.persistent(x, r, ws, phased=kind == "phased", config=config)
    return x


def wait_or_exit(seconds: float = 120.0) -> None:
    """Wait for the stream; a grid barrier that never opens cannot be interrupted (a synchronize would
    wait forever too): end the process, the JSON keeps the rows measured so far."""
    from rose_backend.layers.persistent_ffn import finished_within
    if not finished_within(seconds):
        print(f"a launch did not finish in {seconds:.0f} s: a grid barrier waits forever (programs not all "
              "resident?)", file=sys.stderr, flush=True)
        os._exit(3)


def graph_us(fn, n_blocks: int, reps: int) -> float:
    """us per block: fn (a chain of n_blocks) captured in one CUDA graph, median of reps replays."""
    import torch

    from rose_bench.engine_bench import events_ms
    fn()                                                # compile, warm
    wait_or_exit()
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    us = events_ms(g.replay, reps) * 1e3 / n_blocks
    del g
    return us


def inputs(m: int, shape: str):
    import torch
    x = torch.randn(m, HIDDEN, device="cuda").bfloat16()
    r = torch.randn(m, HIDDEN, device="cuda").bfloat16() if SHAPES[shape]["norm"] == "rms" else None
    return x, r


def one_block_diffs(block: Block, m: int, ws) -> dict:
    """Max abs diff of one block's output (and, RMSNorm, of the residual sum) against today's path."""
    x, r = inputs(m, block.shape)
    want, want_r = block.today(x.clone(), None if r is None else r.clone())
    out = {}
    for kind in ("persistent", "phased"):
        got, got_r = block.persistent(x.clone(), None if r is None else r.clone(), ws, phased=kind == "phased")
        wait_or_exit()
        out[kind] = round(float((got.float() - want.float()).abs().max()), 4)
        if r is not None:
            out[kind + "_residual"] = round(float((got_r.float() - want_r.float()).abs().max()), 4)
    return out


def measure(shape: str, blocks, m: int, reps: int, ws) -> dict:
    from rose_backend.layers import persistent_ffn, small_gemm
    x0, r0 = inputs(m, shape)
    row = {"shape": shape, "tokens": m, "blocks": len(blocks), "today_path": today_path(blocks[0], m),
           "pdl": small_gemm.use_pdl(x0, m),
           "config": persistent_ffn.default_config(m, HIDDEN, blocks[0].inter, blocks[0].act, persistent_ffn.num_sms(x0.device))}
    row["max_abs_diff_vs_today"] = one_block_diffs(blocks[0], m, ws)
    ends = {k: chain(blocks, k, x0.clone(), None if r0 is None else r0.clone(), ws) for k in ("today", "persistent", "phased")}
    row["chain_max_abs_diff_vs_today"] = {k: round(float((ends[k].float() - ends["today"].float()).abs().max()), 4)
                                          for k in ("persistent", "phased")}
    row["us_per_block"] = {k: round(graph_us(lambda: chain(blocks, k, x0, r0, ws), len(blocks), reps), 2)
                           for k in ("today", "persistent", "phased")}
    return row


def sweep(shape: str, blocks, m: int, reps: int, ws) -> list[dict]:
    from rose_backend.layers import persistent_ffn
    x, r = inputs(m, shape)                             # kept as they are for the checks
    x0, r0 = x.clone(), None if r is None else r.clone()   # the timed chains' (RMSNorm: the residual drifts)
    base = persistent_ffn.default_config(m, HIDDEN, blocks[0].inter, blocks[0].act, persistent_ffn.num_sms(x0.device))
    want, _ = blocks[0].persistent(x.clone(), None if r is None else r.clone(), ws)
    rows = []
    for change in [{}] + SWEEP:
        if change and all(base.get(k) == v for k, v in change.items()):
            continue
        cfg = {**base, **change}
        row = {"shape": shape, "tokens": m, "change": change, "config": cfg}
        try:
            got, _ = blocks[0].persistent(x.clone(), None if r is None else r.clone(), ws, config=cfg)
            wait_or_exit()
            row["max_abs_diff_vs_default"] = round(float((got.float() - want.float()).abs().max()), 4)
            row["us_per_block"] = round(graph_us(lambda: chain(blocks, "persistent", x0, r0, ws, cfg), len(blocks), reps), 2)
        except Exception as e:                          # a tile the shape or the compiler refuses
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        rows.append(row)
        log(f"sweep {shape:<10} {m:>4} {str(change or 'default'):<40} "
            + (f"{row['us_per_block']:7.2f} us  diff {row['max_abs_diff_vs_default']}" if "us_per_block" in row else row["error"]))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rose_bench ffn-bench", description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--tokens", default="32,128,256")
    ap.add_argument("--blocks", type=int, default=8, help="FFN blocks with distinct weights in one graph")
    ap.add_argument("--reps", type=int, default=20, help="graph replays per measurement (median)")
    ap.add_argument("--sweep-tokens", default="128", help="token counts of the tile sweep ('' for none)")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--git-commit", default=None, help="recorded in the JSON where .git is not available")
    args = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("ffn-bench needs a CUDA GPU", file=sys.stderr)
        return 2
    from rose_backend.layers.persistent_ffn import FfnWorkspace
    path = Path(args.out) / "ffn_bench.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    result = {**run_record(args.git_commit, "cuda"), "blocks": args.blocks, "reps": args.reps, "rows": [], "sweep": []}
    ws = FfnWorkspace(256, HIDDEN, max(s["inter"] for s in SHAPES.values()), 16, torch.bfloat16, "cuda")
    print(f"{'shape':<11} {'tokens':>6} {'today':>8} {'persist':>8} {'phased':>8}  us per block;  "
          "max abs diff vs today (persistent, phased); today's kernels")
    torch.set_grad_enabled(False)
    for shape in comma_list(args.shapes):
        torch.manual_seed(0)
        blocks = [Block(shape) for _ in range(args.blocks)]
        for m in (int(t) for t in comma_list(args.tokens)):
            try:
                row = measure(shape, blocks, m, args.reps, ws)
            except Exception as e:
                traceback.print_exc()
                row = {"shape": shape, "tokens": m, "error": f"{type(e).__name__}: {str(e)[:300]}"}
            result["rows"].append(row)
            save_json(path, result, t0)
            if "error" in row:
                continue
            us, d = row["us_per_block"], row["max_abs_diff_vs_today"]
            print(f"{shape:<11} {m:>6} {us['today']:>8.2f} {us['persistent']:>8.2f} {us['phased']:>8.2f}  "
                  f"diff {d['persistent']:.3g}, {d['phased']:.3g}; {row['today_path']}", flush=True)
        for m in (int(t) for t in comma_list(args.sweep_tokens)):
            result["sweep"] += sweep(shape, blocks, m, args.reps, ws)
            save_json(path, result, t0)
        del blocks
        torch.cuda.empty_cache()
    print(f"saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
