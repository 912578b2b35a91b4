"""perf_analyzer for the online workload: input-data JSON files of token ids, the runs, their CSV.

    python -m rose_bench perf-inputs --vocab 250002 --lengths 128,512,4096 --out benchmarks/perf_analyzer
    perf_analyzer -m rose -i grpc --streaming -u 127.0.0.1:8001 \\
        --input-data benchmarks/perf_analyzer/online_4096.json --percentile=99

Each JSON file holds `variants` requests of one random sequence each (ids of ordinary words, no
special tokens) in perf_analyzer's input-data format, with explicit shapes, so no --shape is needed.
perf_analyzer measures decoupled models to the first response; `rose` and `naive` send exactly one.
"""
from __future__ import annotations

import argparse
import atexit
import csv
import functools
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


def write_input_data(path: str | Path, vocab: int, length: int, variants: int = 16, seed: int = 0) -> Path:
    from rose_testing.folders import random_ids
    rng = np.random.default_rng(seed + length)
    data = [{"INPUT_IDS": {"content": random_ids(rng, vocab, length).tolist(), "shape": [length]},
             "SEQ_LENS": {"content": [length], "shape": [1]}} for _ in range(variants)]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"data": data}, separators=(",", ":")))
    return path


@functools.cache
def find_perf_analyzer() -> tuple[str, dict] | None:
    """The perf_analyzer binary and an environment where its libraries load (libb64, libcudart:
    taken from the nvidia-pytriton wheel's bundled libraries when the system has none). Probed once
    a process; callers pass the environment on and do not change it."""
    binary = shutil.which("perf_analyzer") or (str(Path(sys.prefix) / "bin" / "perf_analyzer")
                                                if (Path(sys.prefix) / "bin" / "perf_analyzer").exists() else None)
    if not binary:
        return None
    env = dict(os.environ)
    probe = subprocess.run([binary, "--version"], capture_output=True, text=True, env=env)
    if "error while loading shared libraries" in probe.stderr:
        libdir = Path(tempfile.mkdtemp(prefix="rose-pa-lib-"))
        atexit.register(shutil.rmtree, libdir, ignore_errors=True)      # links only: gone with the process
        for pattern, name in (("libb64-*.so.0d", "libb64.so.0d"), ("libcudart-*.so.12*", "libcudart.so.12")):
            for site in sys.path:
                hits = glob.glob(str(Path(site) / "nvidia_pytriton.libs" / pattern))
                if hits:
                    (libdir / name).symlink_to(hits[0])
                    break
        env["LD_LIBRARY_PATH"] = f"{libdir}:{env.get('LD_LIBRARY_PATH', '')}".rstrip(":")
        probe = subprocess.run([binary, "--version"], capture_output=True, text=True, env=env)
        if "error while loading shared libraries" in probe.stderr:
            return None
    return binary, env


def key_headers(api_key: str | None = None) -> list[str]:
    """perf_analyzer's -H options for a deployment's API key (it reads the model's metadata and config,
    which Triton serves to whoever may infer); none without one."""
    from rose_client.auth import grpc_api_key_headers
    return [opt for k, v in (grpc_api_key_headers(api_key) or {}).items() for opt in ("-H", f"{k}:{v}")]


def csv_row(cmd: list[str], env: dict, csv_file: Path, shown: str, timeout: float, scrub=lambda text: text):
    """Run perf_analyzer `cmd` (shown as `shown`); (its CSV's first row, None), or (None, {"command",
    "error"}) when it failed or timed out (its output's tail passed through `scrub`)."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, {"command": shown, "error": f"timed out after {timeout:.0f} s"}
    if p.returncode != 0 or not csv_file.exists():
        return None, {"command": shown, "error": f"exit {p.returncode}: {scrub((p.stdout + p.stderr)[-600:].strip())}"}
    with open(csv_file) as f:
        return next(csv.DictReader(f)), None


def run_perf_analyzer(url: str, model: str, input_file: Path, csv_file: Path, interval_ms: int,
                      timeout: float = 120.0, concurrency: int = 1, extra: list[str] | None = None,
                      api_key: str | None = None) -> dict:
    """perf_analyzer over gRPC streaming: p50 / p90 / p99 / mean ms and inferences/s (or "error").
    api_key: the server's API key, sent as a header and never shown."""
    found = find_perf_analyzer()
    if found is None:
        return {"error": "perf_analyzer not found or its libraries do not load"}
    binary, env = found
    cmd = [binary, "-m", model, "-i", "grpc", "--streaming", "-u", url, "--input-data", str(input_file),
           "--measurement-interval", str(interval_ms), "--stability-percentage", "100",
           "--max-trials", "10", "--concurrency-range", str(concurrency), "-f", str(csv_file)] + (extra or [])
    shown = " ".join(["perf_analyzer"] + cmd[1:] + (["-H <key headers>"] if api_key else []))
    cmd += key_headers(api_key)
    row, error = csv_row(cmd, env, csv_file, shown, timeout)
    if error:
        return error
    us = lambda k: round(float(row[k]) / 1e3, 4) if row.get(k) not in (None, "") else None  # noqa: E731
    return {"command": shown, "p50_ms": us("p50 latency"), "p90_ms": us("p90 latency"),
            "p99_ms": us("p99 latency"), "mean_ms": us("Avg latency"),
            "infer_per_s": round(float(row["Inferences/Second"]), 2)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m rose_bench perf-inputs", description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab", type=int, required=True, help="vocabulary size of the served model")
    p.add_argument("--lengths", default="128,512,4096")
    p.add_argument("--variants", type=int, default=16)
    p.add_argument("--out", default="benchmarks/perf_analyzer")
    args = p.parse_args(argv)
    for n in (int(x) for x in args.lengths.split(",")):
        print(write_input_data(Path(args.out) / f"online_{n}.json", args.vocab, n, args.variants))
    return 0


if __name__ == "__main__":
    sys.exit(main())
