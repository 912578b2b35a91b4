"""Device time per forward of the Qwen3 decoder through the real Engine, pplx-embed-v1-0.6b shape
(28 layers, hidden 1024, 16 q / 8 kv heads x 128, FFN 3072, vocab 151669, bidirectional, mean
pooling; --causal: Qwen3-Embedding's causal attention and last-token pooling), random weights, bf16.

For each kernel set (torch: plain torch norms / RoPE / SiLU-and-mul; flashinfer: its fused kernels)
and each batch shape (1x128, 1x512, 100x512 tokens) it measures, as `python -m rose_bench engine`
does per configuration: the forward pass plus pooling eagerly and as a CUDA-graph replay (CUDA
events, median), the first (eager) and second (capture) request, and step+synchronize wall p50.
Results go to <out>/qwen3_bench_<kernels>.json after every measurement, so a run cut short keeps
what it did.

    source benchmarks/gpu/enter_bench.sh && python -m rose_bench qwen3 --out OUT    # benchmarks/gpu/README.md
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from rose_backend.config import ModelConfig
from rose_backend.engine.engine import Engine
from rose_backend.engine.options import EngineOptions
from rose_backend.layers import fused
from rose_testing.folders import make_folder
from rose_bench.engine_bench import per_config
from rose_bench.record import git_commit

SHAPES = [(1, 128), (1, 512), (100, 512)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--model-dir", default=None, help="folder to write (or reuse) the random-weight model in")
    ap.add_argument("--kernels", default="torch,flashinfer", help="comma list of: torch, flashinfer")
    ap.add_argument("--attention", default=None,
                    help="attention backend for every batch (default: the engine's choice per configuration)")
    ap.add_argument("--causal", action="store_true", help="Qwen3-Embedding mode (causal, last token)")
    args = ap.parse_args(argv)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    t0 = time.time()
    folder = Path(args.model_dir or f"/tmp/rose-gpu/pplx-embed-{'causal' if args.causal else 'bidirectional'}")
    make_folder("pplx-embed", folder, device="cuda", pooling="lasttoken" if args.causal else "mean",
                normalize=args.causal, use_bidirectional_attention=not args.causal)
    cfg = ModelConfig.from_folder(folder)
    report = {"model": "pplx-embed-v1-0.6b shape, random weights", "dtype": "bfloat16",
              "causal": cfg.causal, "pooling": cfg.pooling, "attention": args.attention or "engine's choice",
              "command": "python -m rose_bench qwen3 " + " ".join(sys.argv[1:]), "git": git_commit(None),
              "date": time.strftime("%Y-%m-%d %H:%M"), "device": torch.cuda.get_device_name(),
              "torch": torch.__version__, "results": []}
    print(f"folder ready in {time.time() - t0:.1f}s", flush=True)
    rng = np.random.default_rng(0)
    for kernels in args.kernels.split(","):
        if kernels == "flashinfer" and fused.flashinfer is None:
            print("flashinfer not installed: skipping its kernels", flush=True)
            continue
        fused.enabled = kernels == "flashinfer"
        eng = Engine(cfg, "cuda", EngineOptions(attention=args.attention))
        for n_seqs, seq_len in SHAPES:
            t0 = time.time()
            r = per_config(eng, rng, n_seqs, seq_len)
            row = {"kernels": kernels, "attention": r["backend"], "batch": f"{n_seqs}x{seq_len}",
                   "tokens": n_seqs * seq_len, "eager_ms": r["device_ms_eager"], "graph_replay_ms": r["device_ms_graph"],
                   "first_request_eager_ms": r["first_request_eager_ms"],
                   "second_request_capture_ms": r["second_request_capture_ms"],
                   "step_sync_wall_p50_ms": r["step_sync_wall_p50_ms"], "key": r["key"],
                   "wall_s": round(time.time() - t0, 1)}
            report["results"].append(row)
            print(json.dumps(row), flush=True)
            (out_dir / f"qwen3_bench_{args.kernels.replace(',', '+')}.json").write_text(json.dumps(report, indent=2))
        del eng
        torch.cuda.empty_cache()
    fused.enabled = True
    return 0


if __name__ == "__main__":
    sys.exit(main())
