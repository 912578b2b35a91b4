"""What each step of a request costs inside Triton's Python stub (part of the host path,
benchmarks/RESULTS-host-path.md): the
pb_utils calls `rose` makes, asking whether a request was cancelled, our validation and one tokenizer
call (each run twice in a row: cold, as a request pays it, then warm), building and sending the answer.
A tritonserver with benchmarks/repositories/stub_probe, one tritonclient gRPC stream sending requests
back to back (optionally with a pause between them), medians from the stub itself.

    python -m rose_bench stub-probe [--requests 1000] [--gap-ms 0] [--ask-cancelled] [--out DIR] [--git-commit C]

Prints a table and writes <out>/stub_probe.json (command, commit, machine, date).
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from rose_bench.record import command_line, git_commit, host_info, repo_root

REPOSITORY = repo_root() / "benchmarks" / "repositories" / "stub_probe"


def run(requests: int, gap_ms: float, work: Path, ask_cancelled: bool = False) -> dict:
    import queue

    import tritonclient.grpc as grpcclient

    from rose_backend.launch.deployment import free_ports
    from rose_backend.launch.tritonserver import ServerOptions, TritonProcess
    out = work / "probe.json"
    srv = TritonProcess(None, REPOSITORY, free_ports(), log_file=work / "triton.log", options=ServerOptions(exit_timeout=10),
                        env=dict(os.environ, ROSE_PROBE_OUT=str(out), ROSE_PROBE_ASK_CANCELLED=str(int(ask_cancelled))),
                        models=("stub_probe",))
    srv.start()
    lat = []
    try:
        srv.wait_ready(timeout=120)
        client = grpcclient.InferenceServerClient(srv.grpc_url)
        answers: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        ids, lens = grpcclient.InferInput("INPUT_IDS", [128], "INT32"), grpcclient.InferInput("SEQ_LENS", [1], "INT32")
        ids.set_data_from_numpy(np.arange(1000, 1128, dtype=np.int32))
        lens.set_data_from_numpy(np.array([128], np.int32))
        try:
            for _ in range(requests):
                t0 = time.perf_counter()
                client.async_stream_infer("stub_probe", [ids, lens])
                result, error = answers.get(timeout=120)
                if error is not None:
                    raise RuntimeError(f"stub_probe answered an error: {error}")
                got = result.as_numpy("EMBEDDINGS")
                if got is None or got.shape != (1, 1024):
                    raise RuntimeError(f"stub_probe's answer holds EMBEDDINGS {None if got is None else got.shape}, "
                                       "not [1, 1024]")
                lat.append(time.perf_counter() - t0)
                if gap_ms:
                    time.sleep(gap_ms / 1e3)
        finally:
            client.stop_stream()
            client.close()
    finally:
        srv.stop()
    a = np.asarray(lat[50:]) * 1e3
    return {"client_p50_ms": round(float(np.percentile(a, 50)), 3), "client_p99_ms": round(float(np.percentile(a, 99)), 3),
            "stages": json.loads(out.read_text())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--gap-ms", type=float, default=0.0, help="pause between requests")
    ap.add_argument("--ask-cancelled", action="store_true", help="also time request.is_cancelled() from execute() "
                    "(see the model's docstring)")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--git-commit", default=None, help="recorded in the JSON where .git is not available")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rose-probe-") as tmp:
        res = run(args.requests, args.gap_ms, Path(tmp), args.ask_cancelled)
    result = {"command": command_line(argv),
              "git": git_commit(args.git_commit), "machine": host_info("cpu"),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), **res}
    print(f"client p50 {res['client_p50_ms']} ms, p99 {res['client_p99_ms']} ms; in the stub, p50 / p99 us:")
    for name, s in res["stages"].items():
        print(f"  {name:44s} {s['p50_us']:8.1f} {s['p99_us']:8.1f}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "stub_probe.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {out / 'stub_probe.json'}")
    return 0
