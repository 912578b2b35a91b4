"""Device time per forward of the Qwen3 decoder, pplx-embed-v1-0.6b shape (28 layers, hidden 1024,
16 q / 8 kv heads x 128, FFN 3072, vocab 151669, bidirectional, mean pooling), random weights, bf16.

For each kernel set (torch: plain torch norms / RoPE / SiLU-and-mul; flashinfer: its fused kernels)
and each batch shape (1x128, 1x512, 100x512 tokens), it times the forward pass plus pooling eagerly
and as a CUDA-graph replay (CUDA events around back-to-back runs; the attention plan runs once,
before, as it runs on the host beside the previous batch in the server).
Results go to <out>/qwen3_bench_<kernels>.json after every measurement, so a run cut short keeps what it did.

    source .gpu/enter.sh && PYTHONPATH=. python3 benchmarks/qwen3_bench.py --out benchmarks/results
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rose_backend.layers.attention import AttentionShape, available_backends  # noqa: E402
from rose_backend.layers import fused  # noqa: E402
from rose_backend.models import qwen3  # noqa: E402
from tests.qwen3_folders import PackedForward, qwen3_model_config, random_qwen3  # noqa: E402

SHAPES = [(1, 128), (1, 512), (100, 512)]


def time_ms(fn, budget_s: float = 0.4, max_iters: int = 50) -> float:
    """Mean device milliseconds per call of fn over back-to-back calls (after one warm call)."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    iters = max(3, min(max_iters, int(budget_s * 1000 / max(start.elapsed_time(end), 1e-3))))
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--kernels", default="torch,flashinfer", help="comma list of: torch, flashinfer")
    ap.add_argument("--attention", default=None, help="attention backend (default: flashinfer, else torch_varlen)")
    ap.add_argument("--causal", action="store_true", help="Qwen3-Embedding mode (causal, last token)")
    args = ap.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    cfg = qwen3_model_config(causal=args.causal)
    shape = AttentionShape(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, torch.bfloat16, cfg.causal)
    have = available_backends(shape, "cuda")
    attention = args.attention or next(n for n in ("flashinfer", "torch_varlen", "sdpa_loop") if n in have)
    t0 = time.time()
    model = random_qwen3(cfg, "cuda", torch.bfloat16, seed=0)
    model.set_attention_backend(attention)
    report = {"model": "pplx-embed-v1-0.6b shape, random weights", "dtype": "bfloat16",
              "causal": cfg.causal, "pooling": cfg.pooling, "attention": attention,
              "device": torch.cuda.get_device_name(), "torch": torch.__version__, "results": []}
    print(f"model built in {time.time() - t0:.1f}s; attention {attention} (available: {have})", flush=True)

    for kernels in args.kernels.split(","):
        if kernels == "flashinfer" and qwen3.flashinfer is None:
            print("flashinfer not installed: skipping its kernels", flush=True)
            continue
        fused.enabled = kernels == "flashinfer"
        for n_seqs, seq_len in SHAPES:
            t0 = time.time()
            # as the engine does: flashinfer's workspace holds at most 8192 tokens, past that torch varlen
            batch_attention = attention
            if attention.startswith("flashinfer") and n_seqs * seq_len > 8192 and "torch_varlen" in have:
                batch_attention = "torch_varlen"
            model.set_attention_backend(batch_attention)
            run = PackedForward(model, [seq_len] * n_seqs, cfg.pooling, graph_key=("bench", kernels, n_seqs, seq_len))
            run.ids.copy_(torch.randint(0, cfg.vocab_size, run.ids.shape))
            eager_out = run.eager().clone()
            eager_ms = time_ms(lambda: run.eager(plan=False))
            run.capture()
            run.replay()
            graph_ms = time_ms(lambda: run.replay(plan=False))
            cos = torch.nn.functional.cosine_similarity(run.replay().float(), eager_out, dim=-1).min().item()
            row = {"kernels": kernels, "attention": batch_attention, "batch": f"{n_seqs}x{seq_len}", "tokens": n_seqs * seq_len,
                   "eager_ms": round(eager_ms, 3), "graph_replay_ms": round(graph_ms, 3),
                   "graph_vs_eager_min_cos": round(cos, 6), "wall_s": round(time.time() - t0, 1)}
            report["results"].append(row)
            print(json.dumps(row), flush=True)
            (out_dir / f"qwen3_bench_{args.kernels.replace(',', '+')}.json").write_text(json.dumps(report, indent=2))
            del run
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
