"""Reranking latency: one query with N documents of L tokens, rose's `rerank` vs a naive Triton model.

    python -m rose_bench rerank --shape bge-reranker-v2-m3            # on a GPU host
    python -m rose_bench rerank --shape qwen3-reranker-0.6b
    python -m rose_bench rerank --shape tiny-xlmr-ce --iters 5        # CPU smoke run

Each system is a real tritonserver started on a random-weight folder of the shape
(rose_testing/reranker_folders.py; --folder serves a real one instead): rose serves the
project's repository (`rerank` = tokenize -> rose), the baseline serves
benchmarks/repositories/rerank_baseline (`naive_rerank`: sentence-transformers' CrossEncoder.predict,
or the Qwen3-Reranker model card's code, per request, batch 32, bf16 on GPU). One request carries
the query and all N documents (gRPC stream, text in, scores out); after `--warmup` requests per N
(rose captures its CUDA graphs on the second sight of a configuration), `--iters` requests are timed
one after another: p50 and p99 in ms. The two systems' scores are compared too (max |diff|).
On a GPU host whose Python has numpy 2, set ROSE_STUB_SITE (a folder with numpy<2, see README's GPU
section) as for `make serve`: rose's stub gets it; the naive server does not (its texts come as UINT8
through DLPack, which numpy 2 reads correctly).
Prints a table and saves JSON (numbers, command, git commit, machine, date) to --out.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from rose_backend.launch.deployment import free_ports
from rose_backend.launch.tritonserver import TritonProcess
from rose_bench.record import command_line, git_commit, host_info, repo_root
from rose_client.transport import StreamConnection, serialize_bytes
from rose_testing.reranker_folders import SHAPES, write_reranker_folder

BASELINE_REPOSITORY = repo_root() / "benchmarks" / "repositories" / "rerank_baseline"
SYSTEMS = {"rose": (None, "rerank"), "naive": (BASELINE_REPOSITORY, "naive_rerank")}


def make_request(rng: np.random.Generator, vocab: int, n_docs: int, doc_tokens: int, query_tokens: int):
    """A query and n documents of words "w{i}" (one token each with the random folders' tokenizers)."""
    def text(n):
        return " ".join(f"w{i}" for i in rng.integers(8, vocab, size=n))
    return text(query_tokens), [text(doc_tokens) for _ in range(n_docs)]


def inputs_for(system: str, query: str, docs: list[str]) -> list:
    if system == "naive":   # through DLPack: the naive stub runs the host's numpy (2 on the GPU hosts)
        return [("TEXTS", np.frombuffer(serialize_bytes([query] + docs), dtype=np.uint8))]
    return [("QUERY", [query]), ("DOCUMENTS", docs)]


def time_system(system: str, folder: Path, args, requests: dict[int, tuple], log_dir: Path) -> dict:
    repository, model = SYSTEMS[system]
    kwargs = {"repository": repository, "models": (model,)} if repository else {}
    env = dict(os.environ)
    if system == "naive":   # $ROSE_STUB_SITE's numpy<2 is for rose's stub; torch & co. keep the host's
        env.pop("ROSE_STUB_SITE", None)
    srv = TritonProcess(str(folder), ports=free_ports(), log_file=log_dir / f"{system}.log", env=env, **kwargs)
    t0 = time.perf_counter()
    srv.start()
    out = {"log": str(log_dir / f"{system}.log")}
    try:
        srv.wait_ready(args.ready_timeout)
        out["ready_s"] = round(time.perf_counter() - t0, 1)
        conn = StreamConnection(srv.grpc_url)
        try:
            for n, (query, docs) in requests.items():
                inputs = inputs_for(system, query, docs)
                for _ in range(args.warmup):
                    scores = conn.infer(model, inputs).result(args.request_timeout)["SCORES"]
                times = []
                for _ in range(args.iters):
                    t = time.perf_counter()
                    conn.infer(model, inputs).result(args.request_timeout)
                    times.append((time.perf_counter() - t) * 1e3)
                out[str(n)] = {"p50_ms": float(np.percentile(times, 50)), "p99_ms": float(np.percentile(times, 99)),
                               "mean_ms": float(np.mean(times)), "iters": len(times), "scores": scores.tolist()}
                print(f"  {system:5s} {n:4d} docs  p50 {out[str(n)]['p50_ms']:8.2f} ms  "
                      f"p99 {out[str(n)]['p99_ms']:8.2f} ms", flush=True)
        finally:
            conn.close()
    finally:
        srv.stop()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="bge-reranker-v2-m3", choices=sorted(SHAPES))
    p.add_argument("--folder", default=None, help="a real reranker folder instead of a random-weight one")
    p.add_argument("--work-dir", default=str(Path(tempfile.gettempdir()) / "rose-rerank-bench"))
    p.add_argument("--docs", default="5,25,50,100")
    p.add_argument("--doc-tokens", type=int, default=256)
    p.add_argument("--query-tokens", type=int, default=16)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--systems", default="rose,naive")
    p.add_argument("--ready-timeout", type=float, default=900.0)
    p.add_argument("--request-timeout", type=float, default=600.0)
    p.add_argument("--out", default=None, help="JSON path (default benchmarks/results/rerank_bench_<shape>.json)")
    p.add_argument("--git-commit", default=None, help="recorded in the JSON where .git is not available")
    args = p.parse_args(argv)

    import torch
    device = "cuda" if torch.cuda.is_available() else "cpu"
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    folder = Path(args.folder) if args.folder else write_reranker_folder(args.shape, work / args.shape, device=device)
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    rng = np.random.default_rng(0)
    counts = [int(x) for x in args.docs.split(",") if x.strip()]
    requests = {n: make_request(rng, vocab, n, args.doc_tokens, args.query_tokens) for n in counts}
    result = {"command": command_line(argv), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "git": git_commit(args.git_commit), "host": host_info(device), "shape": args.shape,
              "folder": str(folder), "doc_tokens": args.doc_tokens, "query_tokens": args.query_tokens,
              "iters": args.iters, "warmup": args.warmup, "systems": {}}
    for system in [s.strip() for s in args.systems.split(",") if s.strip()]:
        print(f"{system}: starting tritonserver on {folder}", flush=True)
        result["systems"][system] = time_system(system, folder, args, requests, work)
    print(summary(result, counts))
    out = Path(args.out) if args.out else repo_root() / "benchmarks" / "results" / f"rerank_bench_{args.shape}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"saved {out}")
    return 0


def summary(result: dict, counts: list[int]) -> str:
    rows = [f"rerank {result['shape']} on {result['host'].get('gpu') or 'CPU'}: one query, N documents of "
            f"{result['doc_tokens']} tokens, {result['iters']} requests each (ms)",
            f"{'docs':>5} {'rose p50':>9} {'rose p99':>9} {'naive p50':>10} {'naive p99':>10} "
            f"{'p50 ratio':>10} {'max |diff|':>11}"]
    rose, naive = result["systems"].get("rose", {}), result["systems"].get("naive", {})
    for n in counts:
        r, b = rose.get(str(n)), naive.get(str(n))
        cell = lambda d, k: f"{d[k]:.2f}" if d else "-"                     # noqa: E731
        ratio = f"{r['p50_ms'] / b['p50_ms']:.3f}" if r and b else "-"
        diff = f"{np.abs(np.array(r['scores']) - np.array(b['scores'])).max():.2e}" if r and b else "-"
        rows.append(f"{n:>5} {cell(r, 'p50_ms'):>9} {cell(r, 'p99_ms'):>9} {cell(b, 'p50_ms'):>10} "
                    f"{cell(b, 'p99_ms'):>10} {ratio:>10} {diff:>11}")
    return "\n".join(rows)
