"""Ready means ready: launch -> READY, then each configuration's first request vs its steady p50.

    python -m rose_bench readiness                                   # CPU, the default model
    python -m rose_bench readiness --shape pplx-embed --device cuda  # random-weight folder
    python -m rose_bench readiness --model /models/bge-m3 --variants default,none

For every precapture variant (`default`: the server's default warm-up list; `none`: no warm-up; or
an explicit "seqs:tokens,..." list) and every launch (`cold`: an empty compile-cache folder, so
flashinfer / Triton kernels compile; `warm`: the same folder again, as a restart on the same machine)
it starts a real tritonserver through the launcher's TritonProcess, measures launch -> READY, then
for each request shape (SEQSxTOKENS, token ids straight to `rose` over a gRPC stream) the latency
of the first request after READY and the steady p50 of `--steady` more, and the ratio (goal:
first <= 3x steady p50), and finally the SIGTERM -> exit time. Prints a table and writes JSON
(command, git commit, machine, date) to --out.

`--cache-dir DIR` serves every launch from DIR (ROSE_CACHE_DIR), which is never emptied: a folder
filled by `python -m rose_backend.launch.precompile` (its precompile.json marks it precompiled). There
`cold` is a launch on a machine whose own caches ($XDG_CACHE_HOME or ~/.cache; the caller empties
them) are empty, recorded as cache "empty" with the file count found there.
Each run records model, cache ("empty" | "warm"), precompiled, ready_s, first_request_ms and
steady_p50_ms ({shape: ms}); with one run its fields are also the file's top level, with commit and
date.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from rose_backend.launch.deployment import DEFAULT_REPOSITORY, free_ports, repository_copy
from rose_backend.launch.tritonserver import TritonProcess
from rose_bench.record import command_line, git_commit, host_info, save_json
from rose_client import StreamConnection


def parse_shapes(value: str) -> list[tuple[int, int]]:
    out = []
    for item in filter(None, (v.strip() for v in value.split(","))):
        seqs, tokens = item.lower().split("x")
        out.append((int(seqs), int(tokens)))
    return out


def model_folder(args, work: Path) -> Path | None:
    if args.model:
        return Path(args.model).expanduser().resolve()
    if args.shape:
        from rose_testing.folders import make_folder
        return make_folder(args.shape, work / args.shape, device="cuda" if args.device == "cuda" else "cpu")
    return None                                                   # the default model


def vocab_size(folder: Path | None) -> int:
    from rose_backend.config import ModelConfig
    return ModelConfig.from_folder(folder).vocab_size


def request(rng, seqs: int, tokens: int, vocab: int):
    lens = np.full(seqs, tokens // seqs, np.int32)
    lens[: tokens % seqs] += 1
    ids = rng.integers(100, vocab - 1, size=int(lens.sum()), dtype=np.int32)
    return [("INPUT_IDS", ids), ("SEQ_LENS", lens)]


CACHE_VARS = ("FLASHINFER_WORKSPACE_BASE", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "CUDA_CACHE_PATH")


def home_cache() -> Path:
    import os
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()


def count_files(folder: Path) -> int:
    return sum(1 for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0


def one_launch(folder, repo: Path, cache: Path, shapes, steady: int, vocab: int, log_file: Path) -> dict:
    import os
    # the server's caches all follow ROSE_CACHE_DIR (supervision.cache_env), whatever the caller set
    env = {**{k: v for k, v in os.environ.items() if k not in CACHE_VARS}, "ROSE_CACHE_DIR": str(cache)}
    srv = TritonProcess(str(folder) if folder else None, repo, free_ports(), log_file=log_file, env=env)
    t0 = time.monotonic()
    srv.start()
    rows = []
    try:
        srv.wait_ready(1800)
        ready_s = time.monotonic() - t0
        rng = np.random.default_rng(0)
        conn = StreamConnection(srv.grpc_url)
        try:
            for seqs, tokens in shapes:
                times = []
                for _ in range(steady + 1):
                    inputs = request(rng, seqs, tokens, vocab)
                    t = time.perf_counter()
                    conn.infer("rose", inputs).result(600)
                    times.append((time.perf_counter() - t) * 1e3)
                p50 = float(np.median(times[1:]))
                rows.append({"shape": f"{seqs}x{tokens}", "first_ms": round(times[0], 2), "steady_p50_ms": round(p50, 2),
                             "ratio": round(times[0] / p50, 2)})
        finally:
            conn.close()
    finally:
        t_stop = time.monotonic()
        code = srv.stop()
        stop_s = time.monotonic() - t_stop
    return {"ready_s": round(ready_s, 2), "stop_s": round(stop_s, 2), "exit_code": code, "shapes": rows,
            "first_request_ms": {r["shape"]: r["first_ms"] for r in rows},
            "steady_p50_ms": {r["shape"]: r["steady_p50_ms"] for r in rows}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="Hugging Face model folder (default: the default model)")
    p.add_argument("--shape", help="instead: a random-weight folder of this shape (bge-m3, pplx-embed, tiny-bert)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where --shape folders are made")
    p.add_argument("--shapes", default="1x16,1x64,1x512,8x512,32x4096", help="request shapes SEQSxTOKENS")
    p.add_argument("--steady", type=int, default=20, help="requests per shape after the first")
    p.add_argument("--variants", default="default", help="precapture variants: default, none, or seqs:tokens lists (;-separated)")
    p.add_argument("--launches", default="cold,warm", help="cold (empty compile cache) and/or warm (the same cache again)")
    p.add_argument("--workdir", default=None, help="folder for model folders, caches and logs (default: a temp dir)")
    p.add_argument("--cache-dir", default=None, help="serve every launch from this compile-cache folder, never "
                   "emptied (e.g. one filled by python -m rose_backend.launch.precompile)")
    p.add_argument("--out", default="benchmarks/results/readiness.json")
    p.add_argument("--git-commit", default=None, help="recorded in the JSON where .git is not available")
    args = p.parse_args(argv)

    t_start = time.monotonic()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="rose-readiness-"))
    work.mkdir(parents=True, exist_ok=True)
    folder = model_folder(args, work)
    vocab = vocab_size(folder)
    shapes = parse_shapes(args.shapes)
    result = {"command": command_line(argv),
              "git": git_commit(args.git_commit), "machine": host_info(args.device),
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "model": args.shape or (folder.name if folder else "default"), "folder": str(folder or "default"),
              "runs": []}
    result.update(commit=result["git"].get("commit"))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    variants = [v.strip() for v in (args.variants.split(";") if ";" in args.variants else args.variants.split(",")) if v.strip()]
    for variant in variants:
        params = {} if variant == "default" else {"rose": {"precapture": variant}}
        repo = repository_copy(DEFAULT_REPOSITORY, work / f"repo-{len(result['runs'])}", params)
        cache = Path(args.cache_dir).resolve() if args.cache_dir else work / f"cache-{len(result['runs'])}"
        for launch in [x.strip() for x in args.launches.split(",") if x.strip()]:
            if launch == "cold" and not args.cache_dir:
                import shutil
                shutil.rmtree(cache, ignore_errors=True)
            found = {"precompiled": (cache / "precompile.json").is_file(), "home_cache_files": count_files(home_cache())}
            run = one_launch(folder, repo, cache, shapes, args.steady, vocab,
                             work / f"server-{len(result['runs'])}-{launch}.log")
            run.update(model=result["model"], variant=variant, launch=launch,
                       cache="empty" if launch == "cold" else "warm", cache_dir=str(cache), **found)
            result["runs"].append(run)
            if len(result["runs"]) == 1:
                result.update(run)
            else:                                       # several runs: the top level is no one run's
                for key in run:
                    if key not in ("model",):
                        result.pop(key, None)
            save_json(out, result, t_start)
            print(table([run]), flush=True)
    print("\n" + table(result["runs"]))
    print(f"\nwrote {out}")
    return 0


def table(runs: list[dict]) -> str:
    lines = [f"{'variant':<10} {'launch':<6} {'ready s':>8} {'stop s':>7} {'shape':>9} {'first ms':>9} {'p50 ms':>8} {'first/p50':>9}"]
    for r in runs:
        for i, s in enumerate(r["shapes"]):
            head = (f"{r['variant'][:10]:<10} {r['launch']:<6} {r['ready_s']:>8.1f} {r['stop_s']:>7.1f}" if i == 0
                    else " " * 33)
            lines.append(f"{head} {s['shape']:>9} {s['first_ms']:>9.1f} {s['steady_p50_ms']:>8.1f} {s['ratio']:>9.2f}")
    return "\n".join(lines)
