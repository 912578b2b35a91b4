"""BGE-M3's three outputs vs dense only, through Triton: what sparse + ColBERT cost per request.

Starts one tritonserver on a BGE-M3-style folder (a real one with --model; else --shape bge-m3: the
benchmarks' random BGE-M3 folder, rose_testing.folders, plus random heads; --shape tiny: a
small XLM-R from rose_testing.m3_folders, for a CPU smoke run) and sends pre-tokenized requests
(random ids) straight to `rose` over a gRPC stream, one at a time, alternating between
    dense   outputs [EMBEDDINGS]
    all     outputs [EMBEDDINGS, SPARSE_*, COLBERT, COLBERT_LENS], parameter outputs=sparse,colbert
at 1 x 128 and 100 x 512 tokens. Per cell: median / p90 milliseconds from send to the decoded
answer (the client's clock: Triton, the forward pass, the heads, the transfer), and the bytes of
the answer (ColBERT's share at 100 x 512 = the size of that one response). Warm-up requests
first (graph captures). Prints a table and saves JSON (command, git commit, machine, date).

    H200:  python3 -m rose_bench retrieval --shape bge-m3 --out benchmarks/results
    CPU smoke: .venv/bin/python -m rose_bench retrieval --shape tiny --iters 5 --warmup 2
    Where the time goes: --stage-times (the server's per-stage medians, ROSE_STAGE_TIMES, dense vs
    all; run one cell at a time with --cells 100x512 so the stages are that cell's); --colbert-dim
    1024 gives the tiny folder BGE-M3's ColBERT width (the answer's real size on a CPU).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from rose_backend.launch.deployment import DEFAULT_REPOSITORY, free_ports, repository_copy
from rose_backend.launch.tritonserver import ServerOptions, TritonProcess
from rose_bench.record import command_line, git_commit, host_info
from rose_client.transport import StreamConnection

SHAPES = ("bge-m3", "tiny")
CELLS = [(1, 128), (100, 512)]
ALL = ["EMBEDDINGS", "SPARSE_IDS", "SPARSE_WEIGHTS", "SPARSE_LENS", "COLBERT", "COLBERT_LENS"]


def request(conn, seqs: int, tokens: int, outputs, rng, vocab: int):
    ids = rng.integers(4, vocab - 1, size=seqs * tokens, dtype=np.int32)
    ids[::tokens], ids[tokens - 1::tokens] = 0, 2                   # <s> ... </s>
    lens = np.full(seqs, tokens, dtype=np.int32)
    t0 = time.perf_counter()
    # naming every output is "no choice" to rose (serving/outputs.py): the parameter says what to compute
    params = {"outputs": "sparse,colbert"} if len(outputs) > 1 else None
    out = conn.infer("rose", [("INPUT_IDS", ids), ("SEQ_LENS", lens)], outputs=outputs, parameters=params).result(600)
    ms = (time.perf_counter() - t0) * 1e3
    if set(out) != set(outputs):
        raise RuntimeError(f"asked for {outputs}, got {sorted(out)}")
    sizes = {k: v.nbytes for k, v in out.items()}
    if "SPARSE_LENS" in out:     # how many (id, weight) pairs each input got: 0 everywhere is a defect
        sizes["sparse_pairs_per_input"] = float(out["SPARSE_LENS"].mean())
    return ms, sizes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a BGE-M3 folder (with sparse_linear.pt, colbert_linear.pt)")
    ap.add_argument("--shape", default="bge-m3", choices=SHAPES, help="random folder shape without --model")
    ap.add_argument("--iters", type=int, default=30, help="measured requests per cell and mode")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--git-commit", default=None, help="recorded in the JSON where .git is not available")
    ap.add_argument("--cells", default=",".join(f"{s}x{t}" for s, t in CELLS),
                    help="sequences x tokens, comma-separated (default: %(default)s)")
    ap.add_argument("--colbert-dim", type=int, default=None, help="--shape tiny: ColBERT width (default: hidden, 64)")
    ap.add_argument("--stage-times", action="store_true", help="print the server's per-stage medians, dense vs all")
    ap.add_argument("--server-arg", action="append", default=[],
                    help="extra tritonserver argument, e.g. --server-arg=--backend-config=python,shm-growth-byte-size=268435456")
    args = ap.parse_args(argv)
    args.cells = [tuple(int(x) for x in c.split("x")) for c in args.cells.split(",")]

    with tempfile.TemporaryDirectory(prefix="rose-retrieval-") as tmp:
        folder = args.model
        if folder is None:
            folder = str(random_folder(args.shape, Path(tmp) / "m3", args.colbert_dim))
        vocab = json.loads((Path(folder) / "config.json").read_text())["vocab_size"]
        repo = repository_copy(DEFAULT_REPOSITORY, Path(tmp) / "repo", {})
        log = Path(tmp) / "server.log"
        stage_dir = Path(tmp) / "stages"
        env = dict(os.environ, ROSE_STAGE_TIMES=str(stage_dir)) if args.stage_times else None
        srv = TritonProcess(folder, repo, free_ports(), log_file=log, env=env,
                            options=ServerOptions(extra_args=tuple(args.server_arg)))
        srv.start()
        try:
            srv.wait_ready(900)
            rows = run(srv.grpc_url, args, vocab)
        except BaseException:
            print(log.read_text()[-3000:], file=sys.stderr)
            raise
        finally:
            srv.stop()
        stages = {p.name: json.loads(p.read_text()) for p in sorted(stage_dir.glob("*.json"))}
    report = {"command": command_line(argv), "git": git_commit(args.git_commit),
              "host": host_info("cuda" if torch.cuda.is_available() else "cpu"),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "model": args.model or f"random {args.shape}", "colbert_dim": args.colbert_dim, "rows": rows}
    if args.stage_times:
        report["stages"] = stages
        print_stages(stages)
    print(f"{'cell':>9} {'mode':>6} {'median ms':>10} {'p90 ms':>8} {'answer MB':>10} {'extra':>9} {'sparse pairs/input':>19}")
    for r in rows:
        print(f"{r['cell']:>9} {r['mode']:>6} {r['median_ms']:10.2f} {r['p90_ms']:8.2f} "
              f"{r['bytes'] / 1e6:10.2f} {r.get('extra', ''):>9} "
              f"{r['bytes_by_output'].get('sparse_pairs_per_input', ''):>19}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"retrieval_bench_{args.shape if args.model is None else Path(args.model).name}.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"saved {path}")
    return 0


def print_stages(stages: dict) -> None:
    """Per stage of rose's host path: p50 microseconds, dense-only requests vs all three outputs."""
    for name, summary in stages.items():
        print(f"stages ({name}, p50 us; warm-up requests included)")
        print(f"{'stage':>16} {'dense':>10} {'all':>10}")
        for stage, v in summary.items():
            if ":" in stage:
                continue
            other = summary.get(f"colbert+sparse:{stage}", {}).get("p50_us", "")
            print(f"{stage:>16} {v['p50_us']:>10} {other:>10}")


def random_folder(shape: str, path: Path, colbert_dim: int | None = None) -> Path:
    from rose_testing.m3_folders import center_sparse_bias, make_m3_folder, write_heads
    if shape == "tiny":
        return make_m3_folder(path, hidden=64, layers=2, heads=4, max_positions=512, max_seq_length=512,
                              colbert_dim=colbert_dim)
    from rose_testing.folders import make_folder
    device = "cuda" if torch.cuda.is_available() else "cpu"
    make_folder("bge-m3", path, device=device)
    write_heads(path, 1024, 1024)
    center_sparse_bias(path, device)            # else a deep random encoder gives every token one sign
    return path


def run(url: str, args, vocab: int) -> list[dict]:
    rng = np.random.default_rng(0)
    conn = StreamConnection(url)
    rows = []
    try:
        for seqs, tokens in args.cells:
            modes = {"dense": ["EMBEDDINGS"], "all": ALL}
            for _ in range(args.warmup):
                for outs in modes.values():
                    request(conn, seqs, tokens, outs, rng, vocab)
            times = {m: [] for m in modes}
            sizes = {}
            for _ in range(args.iters):                           # alternate: both see the same drift
                for m, outs in modes.items():
                    ms, sizes[m] = request(conn, seqs, tokens, outs, rng, vocab)
                    times[m].append(ms)
            med = {m: float(np.median(t)) for m, t in times.items()}
            for m in modes:
                row = {"cell": f"{seqs}x{tokens}", "mode": m, "median_ms": med[m],
                       "p90_ms": float(np.percentile(times[m], 90)), "bytes": int(sum(v for k, v in sizes[m].items() if k.isupper())),
                       "bytes_by_output": sizes[m], "times_ms": times[m]}
                if m == "all":
                    row["extra"] = f"{(med['all'] / med['dense'] - 1) * 100:+.1f}%"
                    row["extra_ms"] = med["all"] - med["dense"]
                rows.append(row)
    finally:
        conn.close()
    return rows
