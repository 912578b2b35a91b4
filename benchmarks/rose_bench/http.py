"""The HTTP gateway beside gRPC, under NVIDIA's perf_analyzer, on one server.

    python -m rose_bench http --out $OUT                       # GPU: a random BGE-M3-shape folder
    python -m rose_bench http --model default --interval-ms 2000 --out /tmp/http   # CPU: the default model

Starts tritonserver through the project's launcher (TritonProcess) with its gateway (the launcher's
start_gateway; --workers sets GATEWAY_WORKERS, default: the gateway's own, the cores available)
and waits until every gateway worker serves. Per text length (--words, default 128 and 512 words;
16 different texts each) and concurrency (--concurrency, default 1, 16, 64), three paths:
- `gateway`: perf_analyzer's own OpenAI client against POST /v1/embeddings
  (`--service-kind openai --endpoint v1/embeddings -i http --async`), one text per request,
  `encoding_format: float`: the gateway parses, tokenizes and sends the ids to `rose`;
- `embed`: the `embed` ensemble over gRPC streaming, TEXT (Triton tokenizes);
- `rose`: the `rose` model over gRPC streaming, the same texts pre-tokenized (by the server's own
  `tokenize` model), so no tokenization is measured;
- `floor` (with --paths ...,floor): the OpenAI client against rose_bench.http_floor, the gateway's
  HTTP stack answering a prepared embedding: what the client and the HTTP layers cost alone.
--stages: the deployment runs with the stage clocks on ($ROSE_STAGE_TIMES: rose's and each gateway
worker's), and each cell gets the p50 us of every stage of the requests it sent (gateway cells: the
gateway's stages, rose's beside them; rose cells: rose's).
For a random folder the texts are words of its WordLevel vocabulary ("w123 w4567 ..."), one token
a word; for the default model (or --model FOLDER) English words.
--grpc-url and --gateway-url measure a deployment already running instead; --api-key-file for one
that requires a key (perf_analyzer then sends `-H "triton-grpc-protocol-api-key:KEY"` to gRPC and
`-H "Authorization:Bearer KEY"` to the gateway). The key is shown as KEY in the JSON.
Prints a table and writes <out>/http.json (command, git commit, machine, date, every cell with its
perf_analyzer command), rewritten after every cell.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from rose_bench.record import comma_list, cuda_available, log, run_record, save_json

PATHS = ("gateway", "embed", "rose")
OPENAI_PATHS = ("gateway", "floor")
ENGLISH = ("the embedding server answers every query with a vector while the gateway reads each request "
           "tokenizes its text and sends the ids to the model which runs on the device in batches of many "
           "sequences so that latency stays low and throughput high under a load of concurrent clients").split()


def texts_of(words: int, random_vocab: int | None, n: int = 16) -> list[str]:
    rng = np.random.default_rng(words)
    if random_vocab:
        from rose_testing.folders import FIRST_WORD_ID
        return [" ".join(f"w{i}" for i in rng.integers(FIRST_WORD_ID, random_vocab, size=words)) for _ in range(n)]
    return [f"{k} " + " ".join(rng.choice(ENGLISH, size=words - 1)) for k in range(n)]


def write_payloads(folder: Path, words: int, model_name: str, texts: list[str], tokens: list[np.ndarray]) -> dict:
    """perf_analyzer's input-data files of the three paths."""
    files = {p: folder / f"{p}_{words}.json" for p in PATHS}
    files["floor"] = files["gateway"]
    files["gateway"].write_text(json.dumps({"data": [{"payload": [{"model": model_name, "input": [t],
                                                                   "encoding_format": "float"}]} for t in texts]}))
    files["embed"].write_text(json.dumps({"data": [{"TEXT": {"content": [t], "shape": [1]}} for t in texts]}))
    files["rose"].write_text(json.dumps({"data": [{"INPUT_IDS": {"content": ids.tolist(), "shape": [len(ids)]},
                                                   "SEQ_LENS": {"content": [len(ids)], "shape": [1]}}
                                                  for ids in tokens]}))
    return files


def pre_tokenized(grpc_url: str, texts: list[str], headers: dict | None) -> list[np.ndarray]:
    """The server's own ids of each text (its `tokenize` model)."""
    from rose_client import StreamConnection
    conn = StreamConnection(grpc_url, headers=headers)
    try:
        return [conn.infer("tokenize", [("TEXT", [t])], ["INPUT_IDS"]).result(120)["INPUT_IDS"] for t in texts]
    finally:
        conn.close()


def perf_command(binary: str, path: str, args, urls: dict, model_name: str, input_file: Path, concurrency: int,
                 csv_file: Path, key: str | None) -> list[str]:
    common = ["--input-data", str(input_file), "--concurrency-range", str(concurrency),
              "--measurement-interval", str(args.interval_ms), "--stability-percentage", str(args.stability),
              "--max-trials", str(args.max_trials), "-f", str(csv_file)]
    if path in OPENAI_PATHS:
        cmd = [binary, "-m", model_name, "--service-kind", "openai", "--endpoint", "v1/embeddings", "-i", "http",
               "--async", "-u", urls[path]] + common
        return cmd + (["-H", f"Authorization:Bearer {key}"] if key else [])
    cmd = [binary, "-m", path, "-i", "grpc", "--streaming", "-u", urls["grpc"]] + common
    return cmd + (["-H", f"triton-grpc-protocol-api-key:{key}"] if key else [])


def run_cell(cmd: list[str], env: dict, csv_file: Path, key: str | None, timeout: float) -> dict:
    def hide(a: str) -> str:
        return a.replace(key, "KEY") if key else a
    shown = " ".join("perf_analyzer" if i == 0 else hide(a) for i, a in enumerate(cmd))
    from rose_bench.perf import csv_row
    row, error = csv_row(cmd, env, csv_file, shown, timeout, hide)
    if error:
        return error
    csv_file.unlink()

    def ms(k):
        return round(float(row[k]) / 1e3, 3) if row.get(k) not in (None, "") else None
    return {"command": shown, "p50_ms": ms("p50 latency"), "p90_ms": ms("p90 latency"), "p99_ms": ms("p99 latency"),
            "req_per_s": round(float(row["Inferences/Second"]), 1)}


@contextlib.contextmanager
def own_deployment(args, tmp: Path):
    """tritonserver and its gateway through the launcher, on a random BGE-M3-shape folder on the GPU
    or the model of --model; yields (urls, random vocabulary size or None)."""
    from rose_backend.launch.deployment import DEFAULT_REPOSITORY, free_ports
    from rose_backend.launch.serve import start_gateway
    from rose_backend.launch.tritonserver import TritonProcess
    vocab, model = None, None if args.model == "default" else args.model
    if args.model == "bge-m3":
        from rose_testing.folders import SHAPES, make_folder
        if not cuda_available():
            raise SystemExit("--model bge-m3 (the default) needs a GPU: pass --model default on the CPU")
        log("writing a random-weight BGE-M3-shape folder")
        model = str(make_folder("bge-m3", tmp / "bge-m3", device="cuda"))
        vocab = SHAPES["bge-m3"][0]["vocab_size"]
    if args.workers:
        os.environ["GATEWAY_WORKERS"] = str(args.workers)
    log_dir = Path(args.out)
    with TritonProcess(model, DEFAULT_REPOSITORY, ports=free_ports(), log_file=log_dir / "http_triton.log") as srv:
        gateway = start_gateway(free_ports().grpc, "127.0.0.1", model, srv.grpc_url)
        try:
            yield {"grpc": srv.grpc_url, "gateway": gateway.url.removeprefix("http://")}, vocab
        finally:
            gateway.stop()


@contextlib.contextmanager
def http_floor(log_dir: Path):
    """rose_bench.http_floor on a free port; yields its host:port."""
    import httpx

    from rose_backend.launch.deployment import free_ports
    port = free_ports().grpc
    with open(log_dir / "http_floor.log", "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "rose_bench.http_floor", "--port", str(port)],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(Exception):
                httpx.post(f"http://127.0.0.1:{port}/v1/embeddings", json={"input": "x"}, timeout=5).raise_for_status()
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the http floor did not serve (see {log_dir / 'http_floor.log'})")
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(30)


def stage_medians(stage_dir: Path, result: dict, windows: dict) -> None:
    """Each cell's stage p50s (us) from the stage clocks' marks of the requests inside its window."""
    from rose_bench.host_path import stages_in_windows
    for model in ("gateway", "rose"):
        for key, stages in stages_in_windows(stage_dir, model, windows).items():
            result["cells"][key][f"{model}_stages_p50_us"] = stages


def wait_for_workers(gateway: str, headers: dict, timeout: float = 120.0) -> dict:
    import httpx
    deadline, health = time.monotonic() + timeout, {}
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            health = httpx.get(f"http://{gateway}/health", headers=headers, timeout=10).json()
            w = health.get("workers") or {}
            if health.get("status") == "ready" and w.get("serving", 1) >= w.get("started", 1):
                if not health.get("tokenizes_texts"):
                    log("the gateway has not read the deployment's tokenize settings: "
                        "its texts go through embed")
                return {**w, "tokenizes_texts": health.get("tokenizes_texts")}
        time.sleep(0.5)
    raise SystemExit(f"the gateway's workers did not all serve within {timeout:.0f} s: {health}")


def warm_up(urls: dict, model_name: str, texts: list[str], tokens: list[np.ndarray], grpc_headers, http_headers,
            rounds: int = 32) -> None:
    """Every path's first requests (each gateway worker's, on new connections) before any is measured."""
    import httpx

    from rose_client import StreamConnection
    for i in range(rounds):
        with httpx.Client(headers=http_headers, timeout=120) as h:       # a new connection: any worker
            h.post(f"http://{urls['gateway']}/v1/embeddings",
                   json={"model": model_name, "input": [texts[i % len(texts)]]}).raise_for_status()
    conn = StreamConnection(urls["grpc"], headers=grpc_headers)
    try:
        for i in range(rounds // 4):
            ids = tokens[i % len(tokens)]
            conn.infer("embed", [("TEXT", [texts[i % len(texts)]])], ["EMBEDDINGS"]).result(120)
            conn.infer("rose", [("INPUT_IDS", ids), ("SEQ_LENS", np.array([len(ids)], np.int32))],
                       ["EMBEDDINGS"]).result(120)
    finally:
        conn.close()


def table(result: dict) -> str:
    lines = ["| words | concurrency | path | p50 ms | p99 ms | req/s | p99 / p50 | vs rose |",
             "|---:|---:|---|---:|---:|---:|---:|---:|"]
    for cell in result["cells"]:
        rose = next((c for c in result["cells"] if c["words"] == cell["words"] and c["path"] == "rose"
                     and c["concurrency"] == cell["concurrency"] and "error" not in c), None)
        if "error" in cell:
            lines.append(f"| {cell['words']} | {cell['concurrency']} | {cell['path']} | {cell['error'][:60]} ||||")
            continue
        ratio = f"{cell['req_per_s'] / rose['req_per_s']:.0%}" if rose and rose["req_per_s"] else ""
        lines.append(f"| {cell['words']} | {cell['concurrency']} | {cell['path']} | {cell['p50_ms']:.2f} | "
                     f"{cell['p99_ms']:.2f} | {cell['req_per_s']:.0f} | {cell['p99_ms'] / cell['p50_ms']:.2f} | "
                     f"{ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rose_bench http", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="bge-m3",
                   help="bge-m3 (a random-weight BGE-M3-shape folder, GPU), default (the default model) or a folder")
    p.add_argument("--words", default="128,512", help="words per text, comma-separated")
    p.add_argument("--concurrency", default="1,16,64")
    p.add_argument("--paths", default=",".join(PATHS), help="of gateway, embed, rose, floor")
    p.add_argument("--stages", action="store_true", help="stage clocks on: each cell's p50 per stage (own deployment)")
    p.add_argument("--interval-ms", type=int, default=5000, help="perf_analyzer's --measurement-interval")
    p.add_argument("--stability", type=int, default=10, help="perf_analyzer's --stability-percentage")
    p.add_argument("--max-trials", type=int, default=10)
    p.add_argument("--workers", type=int, default=None, help="gateway workers (GATEWAY_WORKERS; default: the gateway's)")
    p.add_argument("--grpc-url", help="a running deployment's gRPC host:port (with --gateway-url): start nothing")
    p.add_argument("--gateway-url", help="a running deployment's gateway host:port")
    p.add_argument("--api-key-file", help="a file holding the running deployment's API key")
    p.add_argument("--git-commit", default=None, help="the commit measured, where the tree has no .git")
    p.add_argument("--out", default="benchmarks/results/http")
    args = p.parse_args(argv)
    from rose_bench.perf import find_perf_analyzer
    found = find_perf_analyzer()
    if found is None:
        print("perf_analyzer not found, or its libraries do not load (install tritonclient==2.51.0)", file=sys.stderr)
        return 2
    binary, env = found
    key = Path(args.api_key_file).read_text().strip().splitlines()[0].strip() if args.api_key_file else None
    from rose_client.auth import grpc_api_key_headers
    grpc_headers = grpc_api_key_headers(key)
    http_headers = {"Authorization": f"Bearer {key}"} if key else {}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    result = {**run_record(args.git_commit, "cuda" if cuda_available() else "cpu"), "model": args.model, "cells": []}
    windows: dict[int, tuple[int, int]] = {}         # cell index -> its perf_counter_ns window
    with tempfile.TemporaryDirectory(prefix="rose-http-bench-") as tmp:
        stage_dir = Path(tmp) / "stages"
        if args.stages:
            os.environ["ROSE_STAGE_TIMES"] = str(stage_dir)          # the server and the gateway inherit it
        running = {"grpc": args.grpc_url, "gateway": (args.gateway_url or "").removeprefix("http://")}
        ctx = (contextlib.nullcontext((running, None)) if args.grpc_url and args.gateway_url
               else own_deployment(args, Path(tmp)))
        with ctx as (urls, vocab), (http_floor(out) if "floor" in comma_list(args.paths)
                                    else contextlib.nullcontext()) as floor_url:
            import httpx
            urls = {**urls, "floor": floor_url}
            result["gateway_workers"] = wait_for_workers(urls["gateway"], http_headers)
            model_name = httpx.get(f"http://{urls['gateway']}/v1/models", headers=http_headers,
                                   timeout=30).json()["data"][0]["id"]
            result["served_model"] = model_name
            for words in (int(w) for w in comma_list(args.words)):
                texts = texts_of(words, vocab)
                tokens = pre_tokenized(urls["grpc"], texts, grpc_headers)
                files = write_payloads(Path(tmp), words, model_name, texts, tokens)
                warm_up(urls, model_name, texts, tokens, grpc_headers, http_headers)
                for c in (int(x) for x in comma_list(args.concurrency)):
                    for path in comma_list(args.paths):
                        csv_file = Path(tmp) / f"{path}_{words}_{c}.csv"
                        t_cell = time.perf_counter_ns()
                        cmd = perf_command(binary, path, args, urls, model_name, files[path], c, csv_file, key)
                        cell = {"words": words, "tokens": int(np.mean([len(t) for t in tokens])), "concurrency": c,
                                "path": path, **run_cell(cmd, env, csv_file, key, 60 + 10 * args.interval_ms / 1000 * args.max_trials)}
                        log(f"{words} words c{c} {path}: " + (cell.get("error") or
                            f"p50 {cell['p50_ms']} ms p99 {cell['p99_ms']} ms {cell['req_per_s']} req/s"))
                        windows[len(result["cells"])] = (t_cell, time.perf_counter_ns())
                        result["cells"].append(cell)
                        save_json(out / "http.json", result, t0)
        if args.stages:                                  # the clocks are written as the processes stop
            stage_medians(stage_dir, result, windows)
            save_json(out / "http.json", result, t0)
    print(table(result))
    print(f"\nsaved {out / 'http.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
