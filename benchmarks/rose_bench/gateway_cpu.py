"""The gateway's own CPU per request: CPU seconds of the gateway process over the requests it
served under a steady load, against a real tritonserver, for this tree's gateway and (--baseline)
an older commit's, measured side by side (benchmarks/RESULTS-http.md).

    python -m rose_bench gateway-cpu --baseline 1c5c85a --out benchmarks/results/gateway/cpu.json

One tritonserver (the default model unless --model), one gateway process per variant (--workers 1,
so one process holds all of it; the baseline's rose_gateway is `git archive`d from the commit and
put first on that gateway's PYTHONPATH, everything else is this tree's). --clients threads each
keep one http.client connection and post one --words-word text per request (16 different texts,
`encoding_format: float`), as fast as answers come. Per round and variant: warm-up, then a window
of --seconds in which the gateway's CPU time (user + system, psutil) and its requests are counted;
variants alternate round by round so drift hits both. Also reported: the gateway's CPU per second
while idle (its timers, gRPC's threads), subtracted in `cpu_ms_per_request_net`.
--profile: each variant again under cProfile with a CPU clock (time.thread_time, the event-loop
thread only), and its self time grouped by where it is spent (GROUPS). Writes JSON (command,
commit, machine, date) to --out and prints a table.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from rose_bench.http import texts_of
from rose_bench.record import log, repo_root, run_record, save_json

# self time of the event-loop thread by where it is spent: the first group whose pattern is in the
# function's file (or a builtin's name) takes it
GROUPS = (
    ("event loop", ("asyncio/", "uvloop", "selectors.py", "epoll", "contextvars", "_asyncio")),
    ("HTTP: uvicorn, Starlette, the connection", ("uvicorn/", "starlette/", "anyio/", "httptools", "h11",
                                                  "rose_gateway/protocol.py", "rose_gateway/direct.py")),
    ("the call to rose: rose_client, tritonclient, gRPC", ("rose_client/", "tritonclient/", "grpc", "queue.py",
                                                           "threading.py", "rose_gateway/calls.py")),
    ("tokenization", ("rose_ensemble/", "tokenizers", "rose_gateway/tokens.py")),
    ("JSON in and out", ("orjson", "json/", "base64")),
    ("metrics", ("prometheus_client/",)),
    ("the handler (parsing, checks)", ("rose_gateway/",)),
    ("numpy", ("numpy",)),
)
# the gateway under cProfile on the event-loop thread's CPU clock: SIGUSR1 starts a fresh profile
# (start-up left out), SIGUSR2 writes it to the file named first
PROFILE_RUNNER = (
    "import cProfile, os, runpy, signal, sys, time\n"
    "out = sys.argv.pop(1)\n"
    "sys.argv[0] = 'rose_gateway'\n"
    "p = cProfile.Profile(time.thread_time)\n"
    "def start(*_):\n"
    "    p.disable(); p.clear(); p.enable()\n"
    "def dump(*_):\n"
    "    p.disable(); p.dump_stats(out + '.tmp'); os.replace(out + '.tmp', out)\n"
    "signal.signal(signal.SIGUSR1, start)\n"
    "signal.signal(signal.SIGUSR2, dump)\n"
    "runpy.run_module('rose_gateway', run_name='__main__', alter_sys=True)\n")


def baseline_tree(rev: str, into: Path) -> Path:
    """rose_gateway as commit `rev` has it, under into/ (a folder for PYTHONPATH)."""
    root = repo_root()
    archive = subprocess.run(["git", "archive", rev, "gateway/rose_gateway"], cwd=root, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "gateway"


class Gateway:
    """One gateway process (--workers 1) with rose_gateway from `src`; `profile_to`: under cProfile."""

    def __init__(self, grpc_url: str, port: int, src: Path, log_file: Path,
                 profile_to: Path | None = None, model: str | None = None):
        root = repo_root()
        env = {k: v for k, v in os.environ.items() if k not in ("API_KEY", "ADMIN_KEY", "GATEWAY_WORKERS")}
        env["PYTHONPATH"] = ":".join([str(src), str(root / "client"), str(root)] +
                                     ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        args = ["--triton-urls", grpc_url, "--port", str(port), "--workers", "1", "--owner", f"rose_{os.getpid()}_"]
        args += ["--model", model] if model else []
        head = [sys.executable, "-c", PROFILE_RUNNER, str(profile_to)] if profile_to else \
            [sys.executable, "-m", "rose_gateway"]
        self.url = ("127.0.0.1", port)
        self.log = open(log_file, "w")
        self.proc = subprocess.Popen(head + args, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.ps = psutil.Process(self.proc.pid)

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Until /health says the gateway tokenizes texts itself (it has the deployment's settings)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the gateway exited with {self.proc.returncode}; see {self.log.name}")
            try:
                c = http.client.HTTPConnection(*self.url, timeout=5)
                c.request("GET", "/health")
                r = c.getresponse()
                body = r.read()
                c.close()
                if r.status == 200 and json.loads(body).get("tokenizes_texts"):
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.3)
        raise TimeoutError(f"the gateway did not get ready in {timeout:.0f} s; see {self.log.name}")

    def cpu_s(self) -> float:
        t = self.ps.cpu_times()
        return t.user + t.system

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def load(url: tuple[str, int], bodies: list[bytes], clients: int, seconds: float) -> dict:
    """`clients` threads posting bodies in turn for `seconds`; requests answered and their latencies."""
    stop_at = time.monotonic() + seconds
    lat: list[float] = []
    errors: list[str] = []

    def client(k: int) -> None:
        conn = http.client.HTTPConnection(*url, timeout=120)
        i = k
        while time.monotonic() < stop_at and not errors:
            t0 = time.perf_counter()
            conn.request("POST", "/v1/embeddings", bodies[i % len(bodies)], {"Content-Type": "application/json"})
            r = conn.getresponse()
            body = r.read()
            if r.status != 200:
                errors.append(f"{r.status}: {body[:300]!r}")
            lat.append(time.perf_counter() - t0)
            i += 1
        conn.close()

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"the gateway answered {errors[0]}")
    lat.sort()
    return {"requests": len(lat), "wall_s": time.monotonic() - t0,
            "p50_ms": 1e3 * lat[len(lat) // 2] if lat else None}


def window(gw: Gateway, bodies: list[bytes], clients: int, seconds: float, idle_cpu_per_s: float) -> dict:
    load(gw.url, bodies, clients, 2.0)                        # warm-up: connections, graphs, caches
    c0 = gw.cpu_s()
    res = load(gw.url, bodies, clients, seconds)
    cpu = gw.cpu_s() - c0
    n = res["requests"]
    res.update(cpu_s=cpu, cpu_ms_per_request=1e3 * cpu / n,
               cpu_ms_per_request_net=1e3 * (cpu - idle_cpu_per_s * res["wall_s"]) / n, req_s=n / res["wall_s"])
    return res


def idle_rate(gw: Gateway, seconds: float = 5.0) -> float:
    c0, t0 = gw.cpu_s(), time.monotonic()
    time.sleep(seconds)
    return (gw.cpu_s() - c0) / (time.monotonic() - t0)


def group_profile(path: Path, requests: int) -> dict:
    stats = pstats.Stats(str(path)).stats
    groups = {name: 0.0 for name, _ in GROUPS}
    groups["other"] = 0.0
    for (file, _line, func), (_cc, _nc, tottime, _ct, _callers) in stats.items():
        where = f"{file} {func}" if file == "~" else file
        for name, patterns in GROUPS:
            if any(p in where for p in patterns):
                groups[name] += tottime
                break
        else:
            groups["other"] += tottime
    total = sum(groups.values())
    return {"thread_cpu_s": total, "requests": requests, "us_per_request": 1e6 * total / max(requests, 1),
            "shares": {k: v / total for k, v in sorted(groups.items(), key=lambda kv: -kv[1])}}


def table(res: dict) -> str:
    lines = [f"gateway CPU per request, {res['clients']} clients, one {res['words']}-word text per request, "
             f"{res['seconds']:g} s windows x {res['rounds']} rounds:", "",
             "| gateway | req/s | p50 ms | CPU ms / request | net of idle | idle CPU ms/s |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, v in res["variants"].items():
        w = v["windows"]
        lines.append(f"| {name} | {sum(x['req_s'] for x in w) / len(w):.1f} | "
                     f"{sorted(x['p50_ms'] for x in w)[len(w) // 2]:.1f} | "
                     + ", ".join(f"{x['cpu_ms_per_request']:.2f}" for x in w) + " | "
                     + ", ".join(f"{x['cpu_ms_per_request_net']:.2f}" for x in w) + f" | {1e3 * v['idle_cpu_s_per_s']:.1f} |")
    for name, v in res["variants"].items():
        prof = v.get("profile")
        if prof:
            lines += ["", f"{name}, cProfile (event-loop thread CPU, {prof['us_per_request']:.0f} us per request "
                          f"under the profiler):"]
            lines += [f"  {share:6.1%}  {group}" for group, share in prof["shares"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rose_bench gateway-cpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", default=None, metavar="REV", help="also measure rose_gateway as commit REV has it")
    p.add_argument("--model", default=None, help="model folder (default: the default model)")
    p.add_argument("--words", type=int, default=128)
    p.add_argument("--clients", type=int, default=4, help="concurrent connections (default 4)")
    p.add_argument("--seconds", type=float, default=20.0, help="length of each measured window")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--profile", action="store_true", help="also a cProfile pass per variant")
    p.add_argument("--git-commit", default=None, help="the commit measured, where the tree has no .git")
    p.add_argument("--out", default=str(repo_root() / "benchmarks" / "results" / "gateway" / "cpu.json"))
    args = p.parse_args(argv)
    from rose_backend.launch.deployment import free_ports
    from rose_backend.launch.tritonserver import TritonProcess
    t_start = time.monotonic()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    logs = repo_root() / "tests" / ".logs"
    logs.mkdir(parents=True, exist_ok=True)
    texts = texts_of(args.words, None)
    res = {**run_record(args.git_commit, "cpu"), "words": args.words, "clients": args.clients,
           "seconds": args.seconds, "rounds": args.rounds, "baseline": args.baseline, "variants": {}}
    with tempfile.TemporaryDirectory(prefix="rose-gw-cpu-") as tmp:
        sources = {"this tree": repo_root() / "gateway"}
        if args.baseline:
            sources = {f"baseline {args.baseline}": baseline_tree(args.baseline, Path(tmp)), **sources}
        with TritonProcess(args.model, ports=free_ports(), log_file=logs / "gateway_cpu_triton.log") as srv:
            gws: dict[str, Gateway] = {}
            try:
                for k, (name, src) in enumerate(sources.items()):
                    gws[name] = Gateway(srv.grpc_url, free_ports().grpc, src,
                                        logs / f"gateway_cpu_{k}.log", model=args.model)
                for gw in gws.values():
                    gw.wait_ready()
                model = json.loads(_get(next(iter(gws.values())).url, "/v1/models"))["data"][0]["id"]
                bodies = [json.dumps({"input": [t], "model": model, "encoding_format": "float"}).encode()
                          for t in texts]
                for name, gw in gws.items():
                    load(gw.url, bodies, args.clients, 3.0)
                    res["variants"][name] = {"idle_cpu_s_per_s": idle_rate(gw), "windows": []}
                for r in range(args.rounds):
                    for name, gw in (gws.items() if r % 2 == 0 else reversed(gws.items())):
                        v = res["variants"][name]
                        v["windows"].append(window(gw, bodies, args.clients, args.seconds, v["idle_cpu_s_per_s"]))
                        log(f"{name}: round {r}: {v['windows'][-1]}")
                        save_json(out, res, t_start)
            finally:
                for gw in gws.values():
                    gw.stop()
            if args.profile:
                for k, (name, src) in enumerate(sources.items()):
                    prof = Path(tmp) / f"profile_{k}.prof"
                    gw = Gateway(srv.grpc_url, free_ports().grpc, src,
                                 logs / f"gateway_cpu_profile_{k}.log", profile_to=prof, model=args.model)
                    try:
                        gw.wait_ready()
                        load(gw.url, bodies, args.clients, 3.0)
                        gw.proc.send_signal(signal.SIGUSR1)
                        time.sleep(0.5)
                        n = load(gw.url, bodies, args.clients, args.seconds)["requests"]
                        gw.proc.send_signal(signal.SIGUSR2)
                        for _ in range(100):
                            if prof.exists():
                                break
                            time.sleep(0.1)
                    finally:
                        gw.stop()
                    res["variants"][name]["profile"] = group_profile(prof, n)
                    save_json(out, res, t_start)
    print(table(res))
    save_json(out, res, t_start)
    print(f"\nsaved {out}")
    return 0


def _get(url: tuple[str, int], path: str) -> bytes:
    c = http.client.HTTPConnection(*url, timeout=30)
    try:
        c.request("GET", path)
        return c.getresponse().read()
    finally:
        c.close()
