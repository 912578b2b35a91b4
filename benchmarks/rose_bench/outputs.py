"""Where BGE-M3's sparse + ColBERT outputs cost time on the host, in-process (no Triton): per stage.

Runs rose's own serving path without a server: EmbeddingService + Engine on a small random XLM-R
folder with BGE-M3's heads (ColBERT width --colbert-dim, default 1024 as BGE-M3's), and builds each
answer's arrays with serving/outputs.py's build_outputs (what `rose` hands to pb_utils.Tensor).
Per cell (sequences x tokens) and mode (dense only / dense + sparse + ColBERT): the median of each
stage of the host path (serving/stage_clock.py names: scheduled ... result_on_host, sliced,
outputs_built), then the outputs functions alone on the same shapes (sparse_outputs,
colbert_outputs over the batches' pieces). What Triton adds (pb_utils.Tensor into shared memory,
the gRPC response) is `rose_bench retrieval --stage-times`'s job.

    python -m rose_bench outputs [--iters 20] [--cells 1x128,100x512] [--out DIR]
"""
from __future__ import annotations

import argparse
import functools
import json
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from rose_backend.config import ModelConfig
from rose_backend.engine.engine import Engine
from rose_backend.serving.outputs import (OutputOptions, build_outputs, colbert_outputs, collect_piece, sparse_outputs,
                                          special_token_ids)
from rose_backend.serving.scheduler import Request
from rose_backend.serving.service import EmbeddingService
from rose_backend.serving.service_settings import ServiceSettings
from rose_backend.serving.stage_clock import StageClock
from rose_bench.record import command_line
from rose_testing.m3_folders import make_m3_folder

MODES = {"dense": OutputOptions(frozenset({"EMBEDDINGS"}), frozenset()),
         "all": OutputOptions(frozenset({"EMBEDDINGS", "SPARSE_IDS", "SPARSE_WEIGHTS", "SPARSE_LENS", "COLBERT",
                                         "COLBERT_LENS"}), frozenset({"sparse", "colbert"}))}


def served(engine, folder, cells, iters: int, warmup: int) -> dict:
    """{cell: {mode: {stage: p50 us}}} through EmbeddingService, answers built as `rose` builds them."""
    skip = special_token_ids(folder)
    rng = np.random.default_rng(0)
    out = {}
    for seqs, tokens in cells:
        cell = out[f"{seqs}x{tokens}"] = {}
        for mode, opts in MODES.items():
            clock = StageClock()
            done = threading.Event()

            def answer(r, opts=opts, clock=clock, done=done):
                build_outputs(r, opts, True, None)
                clock.mark(r, "outputs_built")
                done.set()

            svc = EmbeddingService(engine, answer, ServiceSettings(inline=False), clock=clock,
                                   on_piece=functools.partial(collect_piece, skip_ids=skip))
            try:
                for i in range(warmup + iters):
                    ids = rng.integers(4, engine.cfg.vocab_size - 1, size=seqs * tokens, dtype=np.int32)
                    ids[::tokens], ids[tokens - 1::tokens] = 0, 2
                    r = Request(ids, np.full(seqs, tokens, np.int32), token_outputs=opts.token_outputs, options=opts)
                    done.clear()
                    clock.mark(r, "received")
                    svc.submit(r)
                    done.wait(600)
                    if i < warmup:
                        clock.finish(r)         # the last request's marks are finished by the service
                        clock.samples.clear()
                        clock.order.clear()
            finally:
                svc.stop(10)
            # the service files requests with token outputs under "colbert+sparse:<stage>"
            cell[mode] = {k.split(":")[-1]: v["p50_us"] for k, v in clock.summary().items()}
    return out


def functions(cells, colbert_dim: int, iters: int, batch_tokens: int = 16384) -> dict:
    """{cell: {function: p50 us}}: sparse_outputs and colbert_outputs alone, on pieces of at most
    batch_tokens tokens (as the scheduler's batches deliver them)."""
    rng = np.random.default_rng(1)
    out = {}
    for seqs, tokens in cells:
        t = seqs * tokens
        ids = rng.integers(0, 250_000, size=t, dtype=np.int32)
        lens = np.full(seqs, tokens, np.int32)
        weights = np.maximum(rng.normal(size=t).astype(np.float32), 0)
        vecs = rng.normal(size=(t, colbert_dim)).astype(np.float32)
        step = max(tokens, batch_tokens // tokens * tokens)
        pieces = [(i, vecs[i:i + step]) for i in range(0, t, step)]
        skip = np.array([0, 1, 2, 3], np.int32)
        times = {"sparse_outputs": [], "colbert_outputs": []}
        for _ in range(iters):
            t0 = time.perf_counter_ns()
            sparse_outputs(ids, lens, weights, skip)
            t1 = time.perf_counter_ns()
            colbert_outputs(pieces, lens)
            t2 = time.perf_counter_ns()
            times["sparse_outputs"].append(t1 - t0)
            times["colbert_outputs"].append(t2 - t1)
        out[f"{seqs}x{tokens}"] = {k: round(float(np.median(v)) / 1e3, 1) for k, v in times.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", default="1x128,100x512")
    ap.add_argument("--colbert-dim", type=int, default=1024)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", default=None, help="folder for outputs_bench.json")
    args = ap.parse_args(argv)
    cells = [tuple(int(x) for x in c.split("x")) for c in args.cells.split(",")]
    with tempfile.TemporaryDirectory(prefix="rose-outputs-") as tmp:
        folder = make_m3_folder(Path(tmp) / "m3", hidden=64, layers=2, heads=4, colbert_dim=args.colbert_dim,
                                max_positions=512, max_seq_length=512)
        engine = Engine(ModelConfig.from_folder(folder))
        engine.mark_stages = True
        stages = served(engine, folder, cells, args.iters, args.warmup)
    funcs = functions(cells, args.colbert_dim, args.iters)
    for cell, modes in stages.items():
        print(f"{cell}, ColBERT width {args.colbert_dim}: p50 us per stage (batch stages: per batch)")
        print(f"{'stage':>16} {'dense':>10} {'all':>10} {'extra':>10}")
        for stage, dense in modes["dense"].items():
            a = modes["all"].get(stage, float("nan"))
            print(f"{stage:>16} {dense:>10.1f} {a:>10.1f} {a - dense:>+10.1f}")
        for name, us in funcs[cell].items():
            print(f"{name:>16} {'':>10} {us:>10.1f}   (alone)")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "outputs_bench.json").write_text(json.dumps(
            {"command": command_line(argv), "stages": stages, "functions": funcs}, indent=1))
    return 0
