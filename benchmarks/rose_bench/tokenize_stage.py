"""`tokenize` cost per request: in-process stages, and through a real tritonserver (no GPU needed).

    python -m rose_bench tokenize --out OUT            # CPU, the default model (kept as benchmarks/results/tokenize/minilm-cpu.json)
    source benchmarks/gpu/enter_bench.sh && python3 -m rose_bench tokenize --out OUT --shape bge-m3   # on a GPU host

1. In process (no server): the stages `tokenize` runs per request, on one 128-word and one 512-word
   text as Triton hands them over (a numpy object array of bytes): `decode` (BYTES -> str, checks),
   `encode` (Rust, tokenizers' encode_batch_fast), `arrays` (flat INT32 INPUT_IDS + SEQ_LENS);
   p50 / p99 us over --repeat runs; plus 16 waiting one-text requests encoded one call each vs in one
   batched call (what the batching `tokenize` does).
2. Through tritonserver (the project's repository as it is, the default model unless --model; the
   `rose` device is the repository's `auto`): `tokenize`, `tokenize_batched` (the decoupled,
   batching twin `embed` uses) and `embed`, one 128-word text per request, each at concurrency 1
   and 16 (one gRPC stream per client thread), p50 / p99 ms; Triton's compute / queue time per
   request of the tokenizer models, how many requests each Rust call of `tokenize_batched` held (its
   counters), and the servers' own per-stage times (ROSE_STAGE_TIMES).
Prints a table; writes <out>/tokenize_bench.json (command, git commit, machine, date).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import tempfile
import threading
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from rose_bench.record import command_line, git_commit, host_info, save_json


def words_text(tokenizer, words: int, seed: int) -> str:
    """`words` random whole-word vocabulary entries (no special tokens, no word pieces), spaced."""
    vocab = [w for w in tokenizer.get_vocab() if w.isalnum() and w.isascii() and len(w) > 2]   # "w123" too
    vocab.sort()
    rng = np.random.default_rng(seed)
    return " ".join(vocab[i] for i in rng.integers(0, len(vocab), size=words))


def percentiles(samples_ns: list[int]) -> dict:
    a = np.asarray(samples_ns, dtype=np.float64) / 1e3
    return {"p50_us": round(float(np.percentile(a, 50)), 1), "p99_us": round(float(np.percentile(a, 99)), 1)}


def in_process(model_dir: str | None, repeat: int) -> dict:
    from rose_ensemble.tokenization import TextTokenizer
    tok = TextTokenizer.from_folder(model_dir)
    out = {}
    for words in (128, 512):
        raw = np.array([words_text(tok.tokenizer, words, words).encode()], dtype=np.object_)
        stages = {"decode": [], "encode": [], "arrays": [], "total": []}
        for _ in range(repeat):
            t0 = time.perf_counter_ns()
            texts = tok.decode_texts(raw)
            t1 = time.perf_counter_ns()
            encodings = tok.encode_batch(texts, add_special_tokens=True)
            t2 = time.perf_counter_ns()
            tok.encode(texts)                 # encode + arrays, as execute() calls it
            t3 = time.perf_counter_ns()
            stages["decode"].append(t1 - t0)
            stages["encode"].append(t2 - t1)
            stages["arrays"].append(max(0, (t3 - t2) - (t2 - t1)))
            stages["total"].append((t1 - t0) + (t3 - t2))
        out[f"one {words}-word text"] = {k: percentiles(v) for k, v in stages.items()} | {
            "tokens": len(encodings[0].ids)}
    # 16 one-text requests waiting: one Rust call each vs one call for all (the batching model's way)
    texts = [[words_text(tok.tokenizer, 128, 1000 + i)] for i in range(16)]
    each, together = [], []
    for _ in range(max(10, repeat // 10)):
        t0 = time.perf_counter_ns()
        for t in texts:
            tok.encode(t)
        t1 = time.perf_counter_ns()
        if hasattr(tok, "encode_requests"):
            tok.encode_requests(texts)
        t2 = time.perf_counter_ns()
        each.append(t1 - t0)
        together.append(t2 - t1)
    out["16 waiting 128-word requests"] = {"one call each": percentiles(each)}
    if hasattr(tok, "encode_requests"):
        out["16 waiting 128-word requests"]["one call for all"] = percentiles(together)
    return out


# ---- through tritonserver ----------------------------------------------------------------------

def metric(url: str, name: str, model: str) -> float:
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    m = re.search(rf'^{name}{{model="{model}",version="1"}} ([0-9.e+]+)$', text, re.M)
    return float(m.group(1)) if m else float("nan")


def load(grpc_url: str, model: str, texts: list[str], clients: int, per_client: int) -> dict:
    """`clients` threads, each with its own gRPC stream, sending one-text requests back to back."""
    from rose_client import StreamConnection
    lat: list[float] = []
    lock = threading.Lock()
    errors: list[str] = []

    def run(c: int) -> None:
        conn = StreamConnection(grpc_url)
        mine = []
        try:
            for i in range(per_client + 5):
                t0 = time.perf_counter()
                try:
                    conn.infer(model, [("TEXT", [texts[(c * 7 + i) % len(texts)]])]).result(60)
                except Exception as e:
                    errors.append(str(e))
                    return
                if i >= 5:                                         # the first few warm up
                    mine.append(time.perf_counter() - t0)
        finally:
            conn.close()
            with lock:
                lat.extend(mine)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=run, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    a = np.asarray(lat) * 1e3
    res = {"requests": int(a.size), "errors": len(errors), "req_per_s": round(a.size / wall, 1)}
    if a.size:
        res.update(p50_ms=round(float(np.percentile(a, 50)), 3), p99_ms=round(float(np.percentile(a, 99)), 3))
    if errors:
        res["first_error"] = errors[0][:300]
    return res


def _plain_embed(message) -> None:
    """`embed` with the non-decoupled `tokenize` as its first step, rose's options straight
    from the ensemble's inputs (the A/B for the lone-request latency and the 16-client load)."""
    first, rose = message.ensemble_scheduling.step
    if first.model_name != "tokenize_batched" or rose.model_name != "rose":
        raise RuntimeError(f"embed's steps have changed: {first.model_name}, {rose.model_name}")
    first.model_name = "tokenize"
    for name in ("DIMENSIONS", "ENCODING"):
        del first.input_map[name]
        del first.output_map[name]
        rose.input_map[name] = name


def plain_embed_repository(dest: Path) -> Path:
    from rose_backend.launch.deployment import DEFAULT_REPOSITORY, repository_copy
    from rose_backend.triton.model_settings import edit_model_config
    repo = repository_copy(DEFAULT_REPOSITORY, dest, {})
    edit_model_config(repo / "embed" / "config.pbtxt", change=_plain_embed)
    shutil.rmtree(repo / "tokenize_batched")
    return repo


def through_server(model_dir: str | None, per_client: int, work: Path, repo: Path, served_models: tuple) -> dict:
    from rose_backend.launch.deployment import free_ports, served_models as models_of
    from rose_backend.launch.tritonserver import ServerOptions, TritonProcess
    from rose_ensemble.tokenization import TextTokenizer
    tok = TextTokenizer.from_folder(model_dir)
    texts = [words_text(tok.tokenizer, 128, 2000 + i) for i in range(32)]
    work.mkdir(parents=True, exist_ok=True)
    stage_dir = work / "stages"
    shutil.rmtree(stage_dir, ignore_errors=True)
    ports = free_ports()
    srv = TritonProcess(model_dir, repo, ports, log_file=work / "triton.log",
                        env=dict(os.environ, ROSE_STAGE_TIMES=str(stage_dir)), options=ServerOptions(exit_timeout=10),
                        models=tuple(m for m in models_of(model_dir) if (repo / m).exists()))   # the plain repo has no twin
    metrics = f"http://127.0.0.1:{ports.metrics}/metrics"
    steps = [m for m in ("tokenize", "tokenize_batched") if (repo / m).exists()]
    out: dict = {"runs": {}}
    srv.start()
    try:
        srv.wait_ready(timeout=300)
        for served in served_models:
            for clients in (1, 16):
                names = ("nv_inference_request_success", "nv_inference_compute_infer_duration_us",
                         "nv_inference_queue_duration_us", "rose_tokenize_encode_calls_total",
                         "rose_tokenize_encoded_requests_total")
                time.sleep(1.2)                           # the batching model's counters refresh each second
                before = {(m, k): metric(metrics, k, m) for m in steps for k in names}
                res = load(srv.grpc_url, served, texts, clients, per_client if clients == 1 else per_client // 4)
                time.sleep(1.2)
                after = {(m, k): metric(metrics, k, m) for m in steps for k in names}
                for m in steps:
                    n = after[(m, names[0])] - before[(m, names[0])]
                    if n > 0:
                        res[f"{m} compute_us_per_request (Triton metric)"] = round(
                            (after[(m, names[1])] - before[(m, names[1])]) / n, 1)
                        res[f"{m} queue_us_per_request (Triton metric)"] = round(
                            (after[(m, names[2])] - before[(m, names[2])]) / n, 1)
                    calls = after[(m, names[3])] - before[(m, names[3])]
                    if calls > 0:
                        res[f"{m} requests per Rust call"] = round((after[(m, names[4])] - before[(m, names[4])]) / calls, 2)
                key = f"{served}, one 128-word text, {clients} client{'s' if clients > 1 else ''}"
                out["runs"][key] = res
                print(f"  {key}: {json.dumps(res)}", flush=True)
    finally:
        out["server_exit_code"] = srv.stop()
    out["stages"] = {p.stem: json.loads(p.read_text()) for p in sorted(stage_dir.glob("*.json"))}
    return out


def print_table(result: dict) -> None:
    print("\nin process (us, p50 / p99)")
    for name, stages in result.get("in_process", {}).items():
        cells = "  ".join(f"{k} {v['p50_us']:.1f} / {v['p99_us']:.1f}" for k, v in stages.items() if isinstance(v, dict))
        print(f"  {name:32s} {cells}")
    for label, key in (("", "server"), (", embed through `tokenize`", "server_embed_via_tokenize")):
        srv = result.get(key)
        if srv:
            _print_server(srv, label)


def _print_server(srv: dict, label: str) -> None:
    print(f"\nthrough tritonserver{label} (ms)")
    for name, r in srv["runs"].items():
        extra = {k: v for k, v in r.items() if "metric" in k or "Rust" in k}
        print(f"  {name:44s} p50 {r.get('p50_ms', float('nan')):7.3f}  p99 {r.get('p99_ms', float('nan')):7.3f}  "
              f"{r['req_per_s']:7.1f} req/s  errors {r['errors']}  {extra}")
    print("\nserver stages (us, p50 / p99)")
    for name, stages in srv["stages"].items():
        print(f"  {name}: " + "  ".join(f"{k} {v['p50_us']:.0f} / {v['p99_us']:.0f}" for k, v in stages.items()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/tokenize", help="folder for tokenize_bench.json")
    ap.add_argument("--model", default=None, help="Hugging Face folder (default: the default model)")
    ap.add_argument("--shape", default=None, help="a random-weight folder of this shape instead (bge-m3, "
                    "pplx-embed, tiny-bert, ...: rose_testing/folders.py; the bench's WordLevel tokenizer)")
    ap.add_argument("--repeat", type=int, default=2000, help="in-process runs per text")
    ap.add_argument("--requests", type=int, default=400, help="requests per client at concurrency 1 (16: a quarter)")
    ap.add_argument("--skip-server", action="store_true", help="in-process stages only")
    ap.add_argument("--skip-plain", action="store_true", help="no second server with embed through `tokenize`")
    ap.add_argument("--git-commit", default=None, help="the commit to record (a device copy has no git history)")
    args = ap.parse_args(argv)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    result = {"command": command_line(argv),
              "git": git_commit(args.git_commit), "host": host_info("cpu"),
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    path = out_dir / "tokenize_bench.json"
    if args.shape and not args.model:
        import torch
        from rose_testing.folders import make_folder
        args.model = str(make_folder(args.shape, Path(tempfile.gettempdir()) / "rose-tokbench-folders" / args.shape,
                                     device="cuda" if torch.cuda.is_available() else "cpu"))
        result["shape"] = args.shape
    result["in_process"] = in_process(args.model, args.repeat)
    save_json(path, result, t_start)
    if not args.skip_server:
        from rose_backend.launch.deployment import DEFAULT_REPOSITORY
        with tempfile.TemporaryDirectory(prefix="rose-tokbench-") as tmp:
            print("the repository as it is (embed through tokenize_batched):", flush=True)
            result["server"] = through_server(args.model, args.requests, Path(tmp) / "a", DEFAULT_REPOSITORY,
                                              ("tokenize", "tokenize_batched", "embed"))
            save_json(path, result, t_start)
            if not args.skip_plain:
                print("embed through the non-decoupled tokenize:", flush=True)
                plain = plain_embed_repository(Path(tmp) / "plain")
                result["server_embed_via_tokenize"] = through_server(args.model, args.requests, Path(tmp) / "b",
                                                                     plain, ("embed",))
        save_json(path, result, t_start)
    print_table(result)
    print(f"\nwrote {path}")
    return 0
