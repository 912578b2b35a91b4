"""Several GPUs: one server per GPU, one server over all GPUs, and the one-GPU reference.

    python -m rose_bench multi-gpu --model bge-m3 --gpus 0,1 --out benchmarks/results

Layouts, each started in turn with this project's model repository on one random-weight model
folder (the shapes of rose_testing.folders):
- one-gpu: one tritonserver that sees only the first GPU (the reference);
- one-server: one tritonserver that sees every GPU: `rose` has one instance per GPU
  (instance_group without a kind) and Triton spreads requests over them;
- per-gpu-servers: one tritonserver per GPU, which clients reach either one stream each
  (client i on server i mod N) or through rose_client's EmbeddingClient, which cuts every request
  into chunks and sends each chunk to the server with the fewest tokens outstanding.

`--merge OUT.json RUN.json ...` joins runs (a later run's layout replaces a failed or missing one).

Workloads: the throughput workload of docs/DESIGN.md (batches of 100 sequences of 512 / 1024 / 4096
tokens from `--procs` client processes) and the concurrency workload (closed-loop clients of one
512-token text) at `--clients`. Writes multi_gpu_<model>.json (numbers, command, commit, GPUs, date,
and each GPU's memory in use while each layout ran, which shows which GPUs did the work).
`--cpu-smoke` runs the same layouts on the CPU with N servers (a self-test; numbers mean nothing).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from rose_testing import folders
from rose_testing.compare import cos_dist
from rose_bench import workloads
from rose_bench.modes import MODES, SMOKE_INSTANCES, SYSTEM_MODELS
from rose_bench.record import comma_list, counts_json, git_commit, host_info, log, save_json


def _counts(mode: str, **override) -> dict:
    """The throughput and concurrency counts of the end-to-end bench's `mode` (rose_bench.modes), with overrides."""
    m = MODES[mode]
    return {"throughput": m["throughput"], "tput_batch": m["tput_batch"], "tput_batches": m["tput_batches"],
            "conc_len": m["conc_len"], "conc_total": m["conc_total"], "warmup": m["tput_warmup"], **override}


COUNTS = {"full": _counts("full", conc_total=1024),
          "tiny": _counts("tiny", throughput=(16,), conc_len=16, conc_total=8)}


def gpu_memory() -> list[dict] | None:
    """Each GPU's memory in use now (nvidia-smi), or None without one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used,utilization.gpu",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    rows = []
    for line in out.stdout.strip().splitlines():
        idx, used, util = (x.strip() for x in line.split(","))
        rows.append({"gpu": int(idx), "memory_used_mib": int(used), "utilization_pct": util})
    return rows


class MultiGpuBench:
    def __init__(self, args):
        self.args = args
        self.m = COUNTS["tiny" if args.cpu_smoke else "full"]
        self.model = folders.shape_name(args.model)
        self.gpus = comma_list(args.gpus)
        self.out, self.work = Path(args.out), Path(args.workdir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work.mkdir(parents=True, exist_ok=True)
        self.json_path = self.out / f"multi_gpu_{self.model}.json"
        self.t_start = time.monotonic()
        self.deadline = self.t_start + args.budget_s if args.budget_s else None

    def save(self) -> None:
        save_json(self.json_path, self.result, self.t_start)

    def layouts(self) -> list[tuple[str, list[str | None]]]:
        """(name, one CUDA_VISIBLE_DEVICES value per server; None: leave the environment alone)."""
        if self.args.cpu_smoke:
            all_ = [("one-gpu", [None]), ("per-gpu-servers", [None] * len(self.gpus))]
        else:
            all_ = [("one-gpu", [self.gpus[0]]), ("one-server", [",".join(self.gpus)]),
                    ("per-gpu-servers", list(self.gpus))]
        chosen = comma_list(self.args.layouts)
        return [(n, v) for n, v in all_ if not chosen or n in chosen]

    def run(self) -> int:
        device = "cpu" if self.args.cpu_smoke else "cuda"
        config = folders.SHAPES[self.model][0]
        self.vocab = config["vocab_size"]
        self.result = {
            "schema": "rose-multi-gpu/1", "model": self.model, "gpus": self.gpus,
            "command": "python -m rose_bench multi-gpu " + " ".join(sys.argv[1:]),
            "git": git_commit(self.args.git_commit),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "host": host_info(device), "counts": counts_json(self.m),
            "procs": self.args.procs, "clients": self.args.clients,
            "client_kwargs": self.client_kwargs(), "layouts": {},
        }
        folder = Path(self.args.folder) if self.args.folder else self.work / self.model
        folders.make_folder(self.model, folder, device=device)
        self.folder = folder
        self.check_ids = [folders.random_ids(np.random.default_rng(5), self.vocab, n) for n in (64, 300, 17)]
        from rose_backend.launch.deployment import DEFAULT_REPOSITORY, repository_copy
        params = {"rose": {"max_queued_tokens": "0", **dict(kv.split("=", 1) for kv in self.args.rose_param)}}
        self.repo = repository_copy(DEFAULT_REPOSITORY, self.work / "repo-rose", params,      # one for every layout
                                    SMOKE_INSTANCES if self.args.cpu_smoke else None)
        self.save()
        ok = True
        size = max(max(self.args.clients), max(self.args.procs))
        with workloads.ClientPool(size) as pool:
            for name, visible in self.layouts():
                res = self.result["layouts"].setdefault(name, {"servers": len(visible), "visible_gpus": visible})
                try:
                    self.run_layout(name, visible, pool, res)
                except Exception as e:
                    ok = False
                    res["error"] = f"{type(e).__name__}: {e}"
                    log(f"{name}: FAILED: {e}")
                self.save()
        print(summary(self.result), flush=True)
        return 0 if ok else 1

    def client_kwargs(self) -> dict:
        return {"token_budget": self.args.token_budget, "max_inflight_tokens": self.args.max_inflight_tokens}

    def run_layout(self, name: str, visible: list[str | None], pool, res: dict) -> None:
        from rose_backend.launch.deployment import free_ports
        from rose_backend.launch.serve import stop_all
        from rose_backend.launch.tritonserver import TritonProcess
        servers = []
        try:
            t0 = time.monotonic()
            for i, vis in enumerate(visible):
                env = dict(os.environ)
                if vis is not None:
                    env["CUDA_VISIBLE_DEVICES"] = vis
                log_file = self.work / f"triton-{name}-{i}.log"
                log_file.unlink(missing_ok=True)
                servers.append(TritonProcess(str(self.folder), self.repo, free_ports(), log_file=log_file, env=env).start())
            for s in servers:
                s.wait_ready(timeout=self.args.ready_timeout, models=SYSTEM_MODELS["rose"])
            urls = [s.grpc_url for s in servers]
            res["ready_s"] = round(time.monotonic() - t0, 2)
            log(f"{name}: {len(servers)} server(s) ready in {res['ready_s']} s: {urls}")
            self.check(urls, res)
            self.cells(name, urls, pool, res)
        finally:
            stop_all(servers)
            for i in range(len(visible) if self.args.keep_logs else 0):
                f = self.work / f"triton-{name}-{i}.log"
                if f.exists():
                    shutil.copy(f, self.out / f"triton-{self.model}-{name}-{i}.log")

    def check(self, urls: list[str], res: dict) -> None:
        """Every server answers, and all give the same embeddings (one model, several GPUs)."""
        from rose_client.client import EmbeddingClient
        outs = []
        for u in urls:
            with EmbeddingClient(u) as c:
                outs.append(c.embed_tokens(self.check_ids))
        with EmbeddingClient(urls, token_budget=64) as c:       # one chunk per sequence, spread out
            outs.append(c.embed_tokens(self.check_ids))
            res["check_spread"] = {u: v["chunks"] for u, v in c.stats().items()}
        worst = max(float(cos_dist(o, outs[0]).max()) for o in outs)
        res["check_max_cos_dist"] = worst
        if not worst <= 1e-3:
            raise RuntimeError(f"servers disagree: max 1-cos {worst:.2e}")

    def cells(self, name: str, urls: list[str], pool, res: dict) -> None:
        m, kw = self.m, self.client_kwargs()
        cells = []
        for procs in self.args.procs:
            for n in m["throughput"]:
                for balanced in (False, True):
                    if balanced and self.args.no_balanced_throughput:
                        continue
                    key = f"throughput/{n}/procs{procs}/{'client' if balanced else 'stream'}"
                    cells.append((key, lambda n=n, procs=procs, balanced=balanced: workloads.throughput(
                        pool, urls, "rose", n, m["tput_batch"], procs, m["tput_batches"][n], m["warmup"],
                        self.vocab, balanced=balanced, client_kwargs=kw)))
        for c in self.args.clients:
            cells.append((f"concurrency/{c}/client", lambda c=c: workloads.concurrency(
                pool, urls, "embed", m["conc_len"], c, m["conc_total"], m["warmup"], self.vocab,
                balanced=True, client_kwargs=kw)))
        w = res.setdefault("cells", {})
        for key, fn in cells:
            if self.deadline is not None and time.monotonic() > self.deadline:
                w[key] = {"skipped": "time budget spent"}
                continue
            t = time.monotonic()
            try:
                w[key] = fn()
            except Exception as e:
                w[key] = {"error": f"{type(e).__name__}: {e}"}
                log(f"{name}: {key}: ERROR {e}")
                if isinstance(e, TimeoutError):
                    raise
            cell = w[key]
            shown = f"{cell['emb_per_s']} emb/s" if "emb_per_s" in cell else \
                f"p50 {cell.get('p50_ms')} p99 {cell.get('p99_ms')} ms, {cell.get('requests_per_s')} req/s"
            log(f"{name}: {key}: {shown} ({time.monotonic() - t:.1f} s)")
            self.save()
        res["gpu_memory_after"] = gpu_memory()


def _shown(cell: dict | None) -> str:
    if cell is None:
        return "-"
    if "emb_per_s" in cell:
        return f"{cell['emb_per_s']:.1f} emb/s"
    if "p50_ms" in cell:
        return f"{cell['p50_ms']:.1f}/{cell['p99_ms']:.1f} ms"
    return str(next(iter(cell.values()), "-"))[:20]


def summary(result: dict) -> str:
    """A plain-text table: one row per cell, one column per layout (emb/s, or p50/p99 latency)."""
    layouts = result.get("layouts", {})
    keys = list(dict.fromkeys(k for v in layouts.values() for k in v.get("cells", {})))
    rows = [f"{result['model']} on GPUs {','.join(result['gpus'])} ({(result.get('host') or {}).get('gpu') or 'CPU'})",
            f"{'cell':<34}" + "".join(f"{n:>22}" for n in layouts)]
    for k in keys:
        rows.append(f"{k:<34}" + "".join(f"{_shown(v.get('cells', {}).get(k)):>22}" for v in layouts.values()))
    for n, v in layouts.items():
        rows.append(f"{n}: servers {v.get('servers')} visible {v.get('visible_gpus')} check 1-cos "
                    f"{v.get('check_max_cos_dist')} spread {v.get('check_spread')} gpu memory {v.get('gpu_memory_after')}"
                    + (f" ERROR {v['error']}" if v.get("error") else ""))
    return "\n".join(rows)


def merge_runs(paths: list[Path]) -> dict:
    """One result from several runs of one model: a later run's layout replaces an earlier one's
    where that failed or is missing; every run's command, date and commit stay under "runs"."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    out = dict(runs[0], layouts={})
    out["runs"] = [{"command": r["command"], "date": r["date"], "git": r["git"], "layouts": sorted(r["layouts"])}
                   for r in runs]
    for r in runs:
        if r["model"] != out["model"]:
            raise SystemExit(f"cannot merge {r['model']} into {out['model']}")
        for name, layout in r["layouts"].items():
            if name not in out["layouts"] or out["layouts"][name].get("error"):
                out["layouts"][name] = layout
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--merge"]:
        if len(argv) < 4:
            raise SystemExit("usage: python -m rose_bench multi-gpu --merge OUT.json RUN.json RUN.json ...")
        result = merge_runs([Path(x) for x in argv[2:]])
        Path(argv[1]).write_text(json.dumps(result, indent=1))
        print(summary(result))
        return 0
    p = argparse.ArgumentParser(prog="python -m rose_bench multi-gpu", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ints = lambda s: [int(x) for x in s.split(",") if x.strip()]  # noqa: E731
    p.add_argument("--model", default="bge-m3")
    p.add_argument("--gpus", default="0,1", help="GPU ids; one server per GPU in per-gpu-servers")
    p.add_argument("--procs", type=ints, default=[4], help="throughput client processes (comma-separated)")
    p.add_argument("--clients", type=ints, default=[16, 32], help="concurrency clients (comma-separated)")
    p.add_argument("--layouts", default="", help="one-gpu,one-server,per-gpu-servers (default: all)")
    p.add_argument("--token-budget", type=int, default=8192, help="EmbeddingClient tokens per chunk")
    p.add_argument("--max-inflight-tokens", type=int, default=65536, help="EmbeddingClient tokens outstanding per server")
    p.add_argument("--no-balanced-throughput", action="store_true", help="throughput through raw streams only")
    p.add_argument("--rose-param", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--workdir", default="/tmp/rose-multi-gpu")
    p.add_argument("--folder", default=None)
    p.add_argument("--budget-s", type=float, default=None, help="cells past this wall-clock budget are skipped")
    p.add_argument("--ready-timeout", type=float, default=300.0)
    p.add_argument("--keep-logs", action="store_true", help="copy the server logs to --out")
    p.add_argument("--cpu-smoke", action="store_true", help="CPU self-test: tiny counts, servers without GPUs")
    p.add_argument("--git-commit", default=None)
    return MultiGpuBench(p.parse_args(argv)).run()


if __name__ == "__main__":
    sys.exit(main())
