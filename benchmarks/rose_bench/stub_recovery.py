"""A Python stub (or tritonserver itself: kind `tritonserver`) killed (kill -9) under load, each kind in
turn, on a deployment started as `make serve` starts it (python -m rose_backend.launch with its
gateway): when the requests in flight got their error, when Triton's and the gateway's readiness
dropped and came back, when correct answers came again and when the launcher said the server serves
again (seconds after the kill); on a GPU also the device memory before the kill, at its lowest while
the server was out, and after, and the old and the new stub's own share where nvidia-smi lists processes.

    python -m rose_bench stub-recovery                                     # CPU, the default model, every kind
    python -m rose_bench stub-recovery --reranker-shape tiny-bert-ce       # ... and the reranker's stubs
    ROSE_CACHE_DIR=/var/cache/rose python -m rose_bench stub-recovery --model /models/bge-m3 --kinds rose \\
        --repeat 3 --gap 2e-3 --out benchmarks/results/stub-recovery/bge-m3-h200.json     # a precompiled GPU node

The launcher runs with --stub-death-window 0 (every death is restarted); each kill follows the last
recovery. The answers are checked as rose_testing/stub_kill.py does (sentence-transformers on the
folder, float32 on the CPU; CrossEncoder for the reranker): any wrong answer is listed. Prints a table
and writes JSON (command, commit, machine, date) to --out.
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from rose_bench.record import command_line, git_commit, host_info, save_json

STEADY_TEXTS = ["Paris is the capital of France.", "the rose is a flower", "search servers answer queries fast " * 30]
BIG_TEXTS = [f"document {i}: " + " ".join(f"word{(i * 7 + j) % 97} rose server" for j in range(120)) for i in range(32)]
QUERY, DOCS = "capital of france", ["paris is the capital of france", "a red rose in the garden", "blue"]
BIG_DOCS = [f"passage {i} " + "the river city of lights " * 30 for i in range(24)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Launch:
    """`python -m rose_backend.launch` in a child process on free ports, its output read as it comes."""

    def __init__(self, args: list[str], env: dict, log_file: Path):
        from rose_backend.launch.deployment import REPO_ROOT, free_ports
        self.ports, self.gateway_port = free_ports(), free_port()
        cmd = [sys.executable, "-m", "rose_backend.launch", "--grpc-port", str(self.ports.grpc),
               "--http-port", str(self.ports.http), "--metrics-port", str(self.ports.metrics),
               "--gateway-port", str(self.gateway_port), "--stub-death-window", "0", *args]
        self.log = open(log_file, "w")
        self.proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, text=True, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT)
        self.prefix = f"rose_{self.proc.pid}_"
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            self.log.write(line)
            self.log.flush()

    def wait_for(self, pattern: str, timeout: float, after: int = 0) -> re.Match | None:
        end = time.monotonic() + timeout
        while time.monotonic() < end and self.proc.poll() is None:
            found = next((m for m in map(re.compile(pattern).search, self.lines[after:]) if m), None)
            if found:
                return found
            time.sleep(0.05)
        return None

    def stubs(self) -> dict[str, int]:
        """{model: pid} of the deployment's Python stubs (the first of each model), and its
        tritonserver's pid as "tritonserver"."""
        from rose_backend.launch.supervision import processes_with
        out: dict[str, int] = {}
        for pid, cmd in sorted(processes_with([self.prefix]).items()):
            args = cmd.split()
            if args and args[0].endswith("triton_python_backend_stub"):
                out.setdefault(Path(args[1]).parent.parent.name, pid)
            elif args and args[0].endswith("/tritonserver"):
                out["tritonserver"] = pid
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def gpu_used_mib() -> float | None:
    """Device memory in use over every GPU (nvidia-smi), None without one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return sum(float(x) for x in out.stdout.split()) if out.returncode == 0 and out.stdout.strip() else None


def gpu_processes() -> dict[int, float]:
    """{pid: MiB} of the processes nvidia-smi lists (its pids: a container may show none of ours)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    rows = [line.split(",") for line in out.stdout.splitlines() if "," in line]
    return {int(p): float(m) for p, m in rows if p.strip().isdigit() and m.strip().replace(".", "").isdigit()}


class MemorySampler:
    def __init__(self, period: float = 0.2):
        self.period, self.samples, self._stop = period, [], threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            used = gpu_used_mib()
            if used is not None:
                self.samples.append(used)
            self._stop.wait(self.period)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self.thread.join(30)


def workload(folder, reranker, gap: float):
    from sentence_transformers import SentenceTransformer
    from rose_testing.stub_kill import Workload
    st = SentenceTransformer(str(folder), device="cpu")
    work = Workload(STEADY_TEXTS, st.encode(STEADY_TEXTS), BIG_TEXTS, st.encode(BIG_TEXTS), gap=gap)
    if reranker is not None:
        from rose_testing.reranker_folders import reference_scores
        work.query, work.documents, work.scores = QUERY, DOCS, reference_scores(reranker, QUERY, DOCS)
        work.big_documents, work.big_scores = BIG_DOCS, reference_scores(reranker, QUERY, BIG_DOCS)
    return work


def one_kill(launch: Launch, kind: str, work) -> dict:
    from rose_testing.stub_kill import Target, kill_under_load
    what = "tritonserver itself" if kind == "tritonserver" else f"the Python stub of model '{kind}'"
    pattern = rf"was restarted because {what} .* serves again ([0-9.]+) s after the death"
    after, pid = len(launch.lines), launch.stubs()[kind]
    before_mib, before_apps = gpu_used_mib(), gpu_processes()
    target = Target(f"127.0.0.1:{launch.ports.grpc}", f"http://127.0.0.1:{launch.ports.http}",
                    f"http://127.0.0.1:{launch.gateway_port}")
    with MemorySampler() as mem:
        seen = kill_under_load(target, pid, kind, work,
                               until=lambda: any(re.search(pattern, ln) for ln in launch.lines[after:]))
    line = launch.wait_for(pattern, 1.0, after)
    row = {**seen.summary(), "kind": kind, "serves_again_s": float(line.group(1)) if line else None}
    new_pid = launch.stubs().get(kind)
    after_apps = gpu_processes()
    row.update(gpu_mib_before=before_mib, gpu_mib_lowest=min(mem.samples, default=None), gpu_mib_after=gpu_used_mib(),
               old_stub_mib=before_apps.get(pid), old_stub_listed_after=pid in after_apps,
               new_stub_mib=after_apps.get(new_pid) if new_pid else None)
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="Hugging Face model folder (default: the default model)")
    p.add_argument("--shape", help="instead: a random-weight folder of this shape (rose_testing.folders)")
    p.add_argument("--reranker-shape",
                   help="serve a random-weight reranker of this shape beside it (e.g. tiny-bert-ce)")
    p.add_argument("--kinds", default="", help="stub models to kill, in order (default: every one served); "
                   "tritonserver: the server itself (a crash)")
    p.add_argument("--repeat", type=int, default=1, help="kills of each kind")
    p.add_argument("--gap", type=float, default=1e-4, help="largest 1 - cos accepted against sentence-transformers")
    p.add_argument("--workdir", default=None, help="folder for model folders and logs (default: a temp dir)")
    p.add_argument("--out", default="benchmarks/results/stub-recovery.json")
    p.add_argument("--git-commit", default=None, help="recorded in the JSON where .git is not available")
    args = p.parse_args(argv)

    t_start = time.monotonic()
    work_dir = Path(args.workdir or tempfile.mkdtemp(prefix="rose-stub-recovery-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    from rose_backend.config import resolve_model_dir
    if args.shape:
        from rose_testing.folders import make_folder
        folder = make_folder(args.shape, work_dir / args.shape, device="cpu")
    else:
        folder = resolve_model_dir(args.model)
    reranker = None
    launch_args = ["--model", str(folder)]
    if args.reranker_shape:
        from rose_testing.reranker_folders import write_reranker_folder
        reranker = write_reranker_folder(args.reranker_shape, work_dir / args.reranker_shape)
        launch_args += ["--reranker", str(reranker)]
    work = workload(folder, reranker, args.gap)
    device = "cuda" if gpu_used_mib() is not None else "cpu"
    result = {"command": command_line(argv), "git": git_commit(args.git_commit), "machine": host_info(device),
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "model": args.shape or (folder.name if args.model else "default (all-MiniLM-L6-v2)"),
              "reranker": args.reranker_shape, "runs": []}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    launch = Launch(launch_args, dict(os.environ), work_dir / "launch.log")
    try:
        if not launch.wait_for(r"rose: serving", 1800) or not launch.wait_for(r"HTTP \(OpenAI-compatible\)", 60):
            print("".join(launch.lines[-40:]), file=sys.stderr)
            return 1
        result["ready_s"] = round(time.monotonic() - t0, 1)
        kinds = [k.strip() for k in args.kinds.split(",") if k.strip()] or \
            sorted(k for k in launch.stubs() if k != "tritonserver")
        for _ in range(args.repeat):
            for kind in kinds:
                row = one_kill(launch, kind, work)
                result["runs"].append(row)
                save_json(out, result, t_start)
                print(table([row], header=len(result["runs"]) == 1), flush=True)
    finally:
        launch.stop()
    print(f"\nwrote {out} (launch log: {work_dir / 'launch.log'})")
    return 1 if any(r["wrong"] or r["serves_again_s"] is None for r in result["runs"]) else 0


def table(rows: list[dict], header: bool = True) -> str:
    def f(v, fmt="{:.2f}"):
        return "-" if v is None else fmt.format(v)
    cols = f"{'kind':<17} {'in flight':>9} {'errors by':>9} {'unready':>8} {'ready again':>11} {'correct':>8} " \
           f"{'line':>6} {'GPU MiB before/lowest/after':>28}  wrong"
    lines = [cols] if header else []
    for r in rows:
        mem = "/".join(f(r[k], "{:.0f}") for k in ("gpu_mib_before", "gpu_mib_lowest", "gpu_mib_after"))
        lines.append(f"{r['kind']:<17} {r['inflight_errors']:>4}/{r['inflight']:<4} {f(r['inflight_error_max_s']):>9} "
                     f"{f(r['triton_unready_s']):>8} {f(r['triton_ready_again_s']):>11} {f(r['first_correct_s']):>8} "
                     f"{f(r['serves_again_s'], '{:.1f}'):>6} {mem:>28}  {len(r['wrong'])}")
    return "\n".join(lines)
