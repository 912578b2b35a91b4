"""End-to-end benchmark: this project's Triton deployment against a naive Triton deployment.

    python -m rose_bench e2e --model bge-m3 --quick --out benchmarks/results
    python -m rose_bench e2e --model pplx-embed            # full mode: more requests per cell

For one model shape it writes a random-weight Hugging Face folder (config.json, bf16 safetensors,
a WordLevel tokenizer.json; weights made on the GPU), computes the float32 Hugging Face reference
of a set of gate sequences, then starts tritonserver twice in turn, once with this project's
model repository (`rose`, `embed`) and once with the naive baseline repository
(benchmarks/repositories/baseline: `naive`, Hugging Face transformers on a padded batch in a Python
model). Against each it runs the correctness gate (1 - cos <= 1e-3 against the reference, token
ids and texts), the four workloads of docs/DESIGN.md with the same client, and perf_analyzer on the online
workload. It writes bench_<model>.json (numbers, command, git commit, GPU, date, mode) and one
PNG per workload. Needs tritonserver (see rose_backend.launch), torch and transformers (folder
and reference), matplotlib (charts); perf_analyzer is used when found.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from rose_testing import folders
from rose_testing.compare import cos_dist
from rose_testing.reference import Reference
from rose_bench import published, workloads
from rose_bench.modes import (FP8_GATE_MAX_COS_DIST, GATE_MAX_COS_DIST, MODES, NAIVE_TEXT_SKIPPED, SMOKE_INSTANCES, SYSTEM_MODELS,
                              TEXT_MODEL, TOKEN_MODEL)
from rose_bench.record import comma_list, counts_json, git_commit, host_info, log, repo_root, save_json, tail


class Bench:
    def __init__(self, args):
        self.args = args
        self.mode = args.mode
        self.m = MODES[args.mode]
        self.model = folders.shape_name(args.model)
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(args.workdir)
        self.work.mkdir(parents=True, exist_ok=True)
        self.t_start = time.monotonic()
        self.deadline = self.t_start + args.budget_s if args.budget_s else None
        self.label = args.label or self.model          # the JSON's `model` (e.g. bge-m3-fp8 under dtype=fp8)
        self.json_path = self.out / f"bench_{self.label}.json"
        fp8 = any(kv.replace(" ", "") == "dtype=fp8" for kv in args.rose_param)
        self.gate_limit = FP8_GATE_MAX_COS_DIST if fp8 else GATE_MAX_COS_DIST
        self.result: dict = {}

    # -- bookkeeping -------------------------------------------------------------------------------
    def save(self) -> None:
        save_json(self.json_path, self.result, self.t_start)

    def time_left(self, deadline) -> float:
        return float("inf") if deadline is None else deadline - time.monotonic()

    # -- phases ----------------------------------------------------------------------------------
    def run(self) -> int:
        import torch
        device = self.args.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        config, pooling, normalize, _ = folders.SHAPES[self.model]
        self.vocab = config["vocab_size"]
        self.result = {
            "schema": "rose-bench/1", "model": self.label, "shape_name": self.model,
            "model_title": published.MODEL_TITLES.get(self.model, self.model),
            "mode": self.mode, "counts": counts_json(self.m),
            "command": "python -m rose_bench e2e " + " ".join(sys.argv[1:]),
            "git": git_commit(self.args.git_commit),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "host": host_info(device),
            "shape": {**config, "pooling": pooling, "normalize": normalize},
            "weights": "random (seed 0), rounded to bf16; servers run bf16 on GPU, float32 on CPU",
            "gate": {"max_cos_dist": self.gate_limit, "reference": "HF transformers AutoModel, float32, "
                     "eager attention, one sequence at a time, unpadded"},
            "published": published.as_json(self.model),
            "systems": {},
        }
        self.save()

        t = time.monotonic()
        folder = Path(self.args.folder) if self.args.folder else self.work / self.model
        log(f"model folder {folder} ({self.model}) on {device}")
        folders.make_folder(self.model, folder, device=device)
        self.result["folder_s"] = round(time.monotonic() - t, 1)
        self.folder = folder

        t = time.monotonic()
        rng = np.random.default_rng(12345)
        limit = folders.max_seq_len(config)
        self.gate_seqs = [folders.random_ids(rng, self.vocab, min(n, limit)) for n in self.m["gate_lengths"]]
        self.gate_texts = [folders.random_ids(rng, self.vocab, n) for n in (self.m["conc_len"], 9)]
        ref = Reference(folder, device=device)
        self.ref = ref.embed(self.gate_seqs)
        self.ref_text = ref.embed(self.gate_texts)
        ref.close()
        del ref
        self.result["gate"]["lengths"] = [len(s) for s in self.gate_seqs]
        self.result["reference_s"] = round(time.monotonic() - t, 1)
        log(f"folder {self.result['folder_s']} s, reference {self.result['reference_s']} s")
        self.save()

        pool_size = max(max(self.m["concurrency"]), self.m["tput_procs"])
        systems = comma_list(self.args.systems)
        with workloads.ClientPool(pool_size) as pool:
            for i, system in enumerate(systems):
                left = self.time_left(self.deadline)
                deadline = None if self.deadline is None else time.monotonic() + left / (len(systems) - i)
                try:
                    self.run_system(system, pool, deadline)
                except Exception as e:
                    log(f"{system}: FAILED: {e}")
                    traceback.print_exc()
                    self.result["systems"].setdefault(system, {})["error"] = f"{type(e).__name__}: {e}"
                self.save()

        if not self.args.no_charts:
            try:
                from rose_bench.charts import charts
                self.result["charts"] = [p.name for p in charts(self.result, self.out)]
            except Exception as e:
                log(f"charts failed: {e}")
                self.result["charts_error"] = str(e)
        self.save()
        print(summary(self.result), flush=True)
        gate_ok = all((s.get("gate") or {}).get("passed") for s in self.result["systems"].values())
        return 0 if gate_ok and all("error" not in s for s in self.result["systems"].values()) else 1

    def run_system(self, system: str, pool, deadline) -> None:
        from rose_backend.launch.deployment import DEFAULT_REPOSITORY, free_ports, repository_copy
        from rose_backend.launch.tritonserver import TritonProcess

        res = self.result["systems"].setdefault(system, {})
        if system == "rose":
            params = {"rose": {"max_queued_tokens": "0", **dict(kv.split("=", 1) for kv in self.args.rose_param)}}
            instances = SMOKE_INSTANCES if self.mode == "tiny" else None
            repo = repository_copy(DEFAULT_REPOSITORY, self.work / "repo-rose", params, instances)
            res["repository"] = "model_repository (max_queued_tokens=0 so 4 x 100 x 4096 tokens may queue)"
            res["params"] = params["rose"]
            if instances:
                res["instances"] = instances
        elif system == "naive":
            src = Path(self.args.baseline_repository) if self.args.baseline_repository else \
                repo_root() / "benchmarks" / "repositories" / "baseline"
            repo = repository_copy(src, self.work / "repo-naive", {})
            res["repository"] = "benchmarks/repositories/baseline (naive: HF AutoModel, bf16, sdpa, padded batch)"
        else:
            raise ValueError(f"unknown system {system!r} (rose, naive)")
        log_file = self.work / f"triton-{system}.log"
        log_file.unlink(missing_ok=True)
        env = dict(os.environ)
        if system == "naive":
            # The naive model reads and writes numbers through DLPack, so it runs on the stub's own
            # numpy; a numpy<2 stub site (see launcher.stub_site) breaks transformers' imports there.
            env.pop("ROSE_STUB_SITE", None)
        srv = TritonProcess(str(self.folder), repo, free_ports(), log_file=log_file, env=env)
        t0 = time.monotonic()
        log(f"{system}: starting tritonserver ({repo})")
        srv.start()
        try:
            try:
                srv.wait_ready(timeout=self.args.ready_timeout, models=SYSTEM_MODELS[system])
            except Exception:
                print(tail(log_file), flush=True)
                raise
            res["startup"] = {"ready_s": round(time.monotonic() - t0, 2)}
            log(f"{system}: ready in {res['startup']['ready_s']} s on {srv.grpc_url}")
            self.gate(system, srv.grpc_url, res, t0)
            self.save()
            self.workloads(system, srv.grpc_url, pool, res, deadline)
        finally:
            code = srv.stop()
            res["server_exit_code"] = code
            shutil.copy(log_file, self.work / f"triton-{system}.last.log") if log_file.exists() else None
            if res.get("error") or not (res.get("gate") or {}).get("passed", True):
                print(tail(log_file, 40), flush=True)

    def gate(self, system: str, url: str, res: dict, t_launch: float) -> None:
        from rose_client.transport import StreamConnection
        conn = StreamConnection(url)
        try:
            t = time.monotonic()
            ids = np.concatenate(self.gate_seqs)
            lens = np.array([len(s) for s in self.gate_seqs], dtype=np.int32)
            together = conn.infer(TOKEN_MODEL[system], [("INPUT_IDS", ids), ("SEQ_LENS", lens)]).result(
                self.args.first_request_timeout)["EMBEDDINGS"]
            res["startup"]["first_response_s"] = round(time.monotonic() - t_launch, 2)
            res["startup"]["first_request_ms"] = round((time.monotonic() - t) * 1e3, 1)
            alone = np.concatenate([conn.infer(TOKEN_MODEL[system], [
                ("INPUT_IDS", s), ("SEQ_LENS", np.array([len(s)], dtype=np.int32))]).result(600)["EMBEDDINGS"]
                for s in self.gate_seqs])
            texts = [folders.ids_to_text(s) for s in self.gate_texts]
            text_out = None if self.text_model(system) is None else \
                conn.infer(self.text_model(system), [("TEXT", texts)]).result(600)["EMBEDDINGS"]
        finally:
            conn.close()
        d_together = cos_dist(together, self.ref)
        d_alone = cos_dist(alone, self.ref)
        d_text = np.zeros(0) if text_out is None else cos_dist(text_out, self.ref_text)
        if text_out is None:
            res["text_skipped"] = NAIVE_TEXT_SKIPPED
        worst = float(max(d_together.max(), d_alone.max(), d_text.max(initial=0.0)))
        res["gate"] = {"passed": bool(worst <= self.gate_limit and np.isfinite(worst)),
                       "max_cos_dist": worst,
                       "one_request": [float(x) for x in d_together], "one_per_request": [float(x) for x in d_alone],
                       "texts": [float(x) for x in d_text]}
        log(f"{system}: gate {'PASSED' if res['gate']['passed'] else 'FAILED'}: max 1-cos {worst:.2e} "
            f"(limit {self.gate_limit:g}); first response {res['startup']['first_response_s']} s after launch")

    @staticmethod
    def text_model(system: str) -> str | None:
        """The model that takes TEXT, or None where it cannot run (see NAIVE_TEXT_SKIPPED)."""
        if system == "naive" and np.lib.NumpyVersion(np.__version__) >= "2.0.0":
            return None
        return TEXT_MODEL[system]

    def workloads(self, system: str, url: str, pool, res: dict, deadline) -> None:
        m, vocab = self.m, self.vocab
        w = res.setdefault("workloads", {"online": {}, "scoring": {}, "throughput": {}, "concurrency": {}})
        tm, xm = TOKEN_MODEL[system], self.text_model(system)
        cells = []
        for n in m["online"]:
            cells.append(("online", n, lambda n=n: workloads.sequential(
                pool, url, tm, n, 1, m["online_n"], m["online_warmup"], vocab)))
        for b in m["scoring"]:
            cells.append(("scoring", b, lambda b=b: workloads.sequential(
                pool, url, tm, m["scoring_len"], b, m["scoring_n"], m["scoring_warmup"], vocab)))
        for n in m["throughput"]:
            cells.append(("throughput", n, lambda n=n: workloads.throughput(
                pool, url, tm, n, m["tput_batch"], m["tput_procs"], m["tput_batches"][n], m["tput_warmup"], vocab)))
        for c in m["concurrency"]:
            # Where the model cannot read TEXT (NAIVE_TEXT_SKIPPED), its clients send token ids: the
            # cell then leaves tokenization out and says so ("input").
            cells.append(("concurrency", c, lambda c=c: {**workloads.concurrency(
                pool, url, xm or tm, m["conc_len"], c, m["conc_total"], m["conc_warmup"], vocab, text=xm is not None),
                "input": "texts" if xm is not None else "token ids (TEXT unreadable, see text_skipped)"}))
        chosen = comma_list(self.args.workloads)
        for workload, x, fn in cells:
            if workload not in chosen:
                continue
            if self.time_left(deadline) < 0:
                w[workload][str(x)] = {"skipped": "time budget spent"}
                log(f"{system}: {workload} {x}: skipped (time budget)")
                continue
            t = time.monotonic()
            try:
                w[workload][str(x)] = fn()
            except Exception as e:
                w[workload][str(x)] = {"error": f"{type(e).__name__}: {e}"}
                log(f"{system}: {workload} {x}: ERROR {e}")
                if isinstance(e, TimeoutError):
                    raise
            cell = w[workload][str(x)]
            shown = (f"{cell['emb_per_s']} emb/s" if "emb_per_s" in cell else
                     f"p50 {cell.get('p50_ms')} ms p99 {cell.get('p99_ms')} ms" if "p50_ms" in cell else "")
            log(f"{system}: {workload} {x}: {shown} ({time.monotonic() - t:.1f} s)")
            self.save()
        if not self.args.no_perf_analyzer and "online" in chosen:
            from rose_bench.perf import run_perf_analyzer, write_input_data
            pa = res.setdefault("perf_analyzer", {"online": {}})
            for n in m["online"]:
                if self.time_left(deadline) < 0:
                    pa["online"][str(n)] = {"skipped": "time budget spent"}
                    continue
                f = write_input_data(self.work / "perf_analyzer" / f"{self.model}_online_{n}.json", vocab, n)
                r = run_perf_analyzer(url, tm, f, self.work / f"pa_{system}_{n}.csv", m["pa_interval_ms"])
                pa["online"][str(n)] = r
                log(f"{system}: perf_analyzer online {n}: "
                    + (f"p50 {r['p50_ms']} ms p99 {r['p99_ms']} ms" if "p50_ms" in r else r.get("error", "")[-300:]))
                self.save()


def summary(result: dict) -> str:
    """A plain-text table of one result: ours / naive / published / goal per cell."""
    rows = [f"{result.get('model_title')} ({result.get('mode')} mode, {(result.get('host') or {}).get('gpu') or 'CPU'})",
            f"{'workload':<12}{'x':>6} {'rose p50/p99':>18} {'naive p50/p99':>18} {'vLLM':>8} {'Tulip':>8} {'goal':>8}"]
    pub = result.get("published", {})
    sysw = {s: (v.get("workloads") or {}) for s, v in result.get("systems", {}).items()}
    for workload in ("online", "scoring", "throughput", "concurrency"):
        xs = sorted({int(x) for w in sysw.values() for x in (w.get(workload) or {})})
        for x in xs:
            cells = []
            for s in ("rose", "naive"):
                c = (sysw.get(s, {}).get(workload) or {}).get(str(x)) or {}
                if "emb_per_s" in c:
                    cells.append(f"{c['emb_per_s']:.1f}/s")
                elif "p50_ms" in c:
                    cells.append(f"{c['p50_ms']:.2f}/{c['p99_ms']:.2f}")
                else:
                    cells.append(next(iter(c.values()), "-")[:18] if c else "-")
            row = (pub.get(workload) or {}).get(str(x)) or {}
            f = lambda v: "-" if v is None else (f"{v:.1f}" if isinstance(v, (int, float)) else  # noqa: E731
                                                 ("-" if v[0] is None else f"{v[0]:.2f}"))
            rows.append(f"{workload:<12}{x:>6} {cells[0]:>18} {cells[1]:>18} {f(row.get('vllm')):>8} "
                        f"{f(row.get('tulip')):>8} {f(row.get('goal')):>8}")
    for s, v in result.get("systems", {}).items():
        g = v.get("gate") or {}
        rows.append(f"{s}: gate {'passed' if g.get('passed') else 'FAILED'} (max 1-cos {g.get('max_cos_dist')}), "
                    f"startup {v.get('startup')}" + (f", error {v['error']}" if v.get("error") else ""))
    return "\n".join(rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m rose_bench e2e", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--model", default="bge-m3", help="bge-m3 | pplx-embed | tiny-bert | tiny-qwen3")
    p.add_argument("--mode", choices=sorted(MODES), default="full")
    p.add_argument("--quick", dest="mode", action="store_const", const="quick",
                   help="fewer requests per cell: one model in a few minutes on an H200")
    p.add_argument("--tiny", dest="mode", action="store_const", const="tiny", help="smoke test of the tool")
    p.add_argument("--out", default="benchmarks/results", help="folder for bench_<model>.json and the PNGs")
    p.add_argument("--workdir", default="/tmp/rose-bench", help="model folder, repositories, server logs")
    p.add_argument("--folder", default=None, help="use this model folder instead of writing one")
    p.add_argument("--systems", default="rose,naive")
    p.add_argument("--label", default=None, help="the JSON's model name and file (default: the shape's; "
                   "e.g. bge-m3-fp8 with --rose-param dtype=fp8, whose gate is the fp8 one)")
    p.add_argument("--device", default="auto", help="where the folder's weights and the reference are made")
    p.add_argument("--baseline-repository", default=None)
    p.add_argument("--workloads", default="online,scoring,throughput,concurrency",
                   help="which of the four workloads to run (comma-separated)")
    p.add_argument("--rose-param", action="append", default=[], metavar="KEY=VALUE",
                   help="extra `rose` config.pbtxt parameter (repeatable)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="wall-clock budget: cells past it are skipped (shared evenly by the systems)")
    p.add_argument("--ready-timeout", type=float, default=300.0)
    p.add_argument("--first-request-timeout", type=float, default=600.0)
    p.add_argument("--no-perf-analyzer", action="store_true")
    p.add_argument("--no-charts", action="store_true")
    p.add_argument("--git-commit", default=None, help="recorded in the JSON where .git is not available")
    args = p.parse_args(argv)
    return Bench(args).run()


if __name__ == "__main__":
    sys.exit(main())
