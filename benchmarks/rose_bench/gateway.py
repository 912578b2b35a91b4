"""What the HTTP gateway costs over calling Triton directly with rose_client
(benchmarks/RESULTS-http.md).

    python -m rose_bench gateway                             # starts tritonserver + gateway itself
    python -m rose_bench gateway --triton-urls 127.0.0.1:8001 --gateway-url http://127.0.0.1:8080

1. Latency, one 128-token text per request, one request at a time (the paths alternated, so drift
   hits all): p50 / p99 of direct gRPC (EmbeddingClient.embed, the `embed` ensemble) and of the
   gateway (POST /v1/embeddings over a kept-alive connection, float JSON answer) through http.client
   and through httpx; the p50 difference to direct is the gateway's overhead.
2. Throughput, 64 concurrent clients with one text each, for --seconds: asyncio coroutines over
   AsyncEmbeddingClient (direct) and over one httpx.AsyncClient (HTTP), req/s and p50 / p99.
Prints a table and writes JSON (command, git commit, machine, date) to --out.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import http.client
import json
import os
import platform
import subprocess
import time
from pathlib import Path

import httpx
import numpy as np

from rose_bench.record import command_line, repo_root
from rose_client import AsyncEmbeddingClient, EmbeddingClient


def text_of_tokens(n: int) -> str:
    """all-MiniLM's tokenizer: 'word' is one token, plus [CLS] and [SEP]."""
    return " ".join(["word"] * (n - 2))


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q)) if xs else float("nan")


def latency(urls: str, gw: str, text: str, n: int) -> dict:
    """Three paths, alternated: direct gRPC; the gateway through http.client (stdlib, kept alive: the
    least client-side cost, so the difference to direct is the gateway's own); the gateway through
    httpx (the HTTP client of the openai SDK)."""
    body = json.dumps({"input": [text], "model": "embed", "encoding_format": "float"}).encode()
    headers = {"Content-Type": "application/json"}
    host, port = gw.split("//", 1)[1].rsplit(":", 1)
    with EmbeddingClient(urls) as c, httpx.Client(base_url=gw, timeout=60) as h:
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        reconnects: list[int] = []

        def stdlib():
            for attempt in (0, 1):                 # the server may have closed an idle connection
                try:
                    conn.request("POST", "/v1/embeddings", body, headers)
                    r = conn.getresponse()
                    r.read()
                    break
                except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
                    conn.close()
                    reconnects.append(attempt)
            if r.status != 200:
                raise RuntimeError(f"the gateway answered {r.status}")

        paths = {"direct": lambda: c.embed([text]), "gateway": stdlib,
                 "gateway_httpx": lambda: check(h.post("/v1/embeddings", content=body, headers=headers))}
        times: dict[str, list[float]] = {k: [] for k in paths}
        for i in range(20 + n):                                  # 20 warm-up rounds: graphs, connections
            for k, fn in paths.items():
                t0 = time.perf_counter()
                fn()
                if i >= 20:
                    times[k].append((time.perf_counter() - t0) * 1e3)
        conn.close()
    out = {"n": n, "stdlib_reconnects": len(reconnects)}
    for k, v in times.items():
        out[f"{k}_p50_ms"], out[f"{k}_p99_ms"] = pct(v, 50), pct(v, 99)
    out["overhead_p50_ms"] = out["gateway_p50_ms"] - out["direct_p50_ms"]
    out["overhead_httpx_p50_ms"] = out["gateway_httpx_p50_ms"] - out["direct_p50_ms"]
    return out


def check(r: httpx.Response) -> None:
    if r.status_code != 200:
        raise RuntimeError(f"the gateway answered {r.status_code}: {r.text[:500]}")


async def _closed_loop(call, clients: int, seconds: float) -> dict:
    lat: list[float] = []
    end = time.perf_counter() + seconds

    async def one():
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            await call()
            lat.append((time.perf_counter() - t0) * 1e3)

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(clients)))
    wall = time.perf_counter() - t0
    return {"requests": len(lat), "req_s": len(lat) / wall, "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99)}


async def throughput(urls: str, gw: str, text: str, clients: int, seconds: float) -> dict:
    async with AsyncEmbeddingClient(urls) as c:
        await asyncio.gather(*(c.embed([text]) for _ in range(clients)))        # warm-up
        direct = await _closed_loop(lambda: c.embed([text]), clients, seconds)
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    body = {"input": [text], "model": "embed", "encoding_format": "float"}
    async with httpx.AsyncClient(base_url=gw, timeout=120, limits=limits) as h:
        async def post():
            check(await h.post("/v1/embeddings", json=body))
        await asyncio.gather(*(post() for _ in range(clients)))
        http = await _closed_loop(post, clients, seconds)
    return {"clients": clients, "seconds": seconds, "direct": direct, "gateway": http}


@contextlib.contextmanager
def own_servers(model: str | None, log_dir: Path, params: list[str]):
    """tritonserver (the project's repository, `params` such as rose.inline_execute=false applied to
    a copy of it) and the gateway in front of it."""
    import tempfile
    from rose_backend.launch.deployment import DEFAULT_REPOSITORY, free_ports, repository_copy
    from rose_backend.launch.tritonserver import TritonProcess
    from rose_backend.launch.gateway import GatewayProcess
    log_dir.mkdir(parents=True, exist_ok=True)
    changes: dict[str, dict[str, str]] = {}
    for p in params:
        key, _, value = p.partition("=")
        model_name, _, name = key.partition(".")
        changes.setdefault(model_name, {})[name] = value
    with tempfile.TemporaryDirectory(prefix="rose-gw-bench-") as tmp:
        repo = repository_copy(DEFAULT_REPOSITORY, Path(tmp) / "model_repository", changes) if changes else DEFAULT_REPOSITORY
        with TritonProcess(model, repo, ports=free_ports(), log_file=log_dir / "gateway_bench_triton.log") as srv, \
                GatewayProcess(srv.grpc_url, free_ports().grpc, model_dir=model,
                               log_file=log_dir / "gateway_bench_gateway.log") as gw:
            yield srv.grpc_url, gw.url


def machine(commit: str | None) -> dict:
    info = {"hostname": platform.node(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "processor": platform.processor() or platform.machine()}
    with contextlib.suppress(Exception):
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
        if out.returncode == 0:
            info["gpu"] = out.stdout.strip()
    info["git_commit"] = commit
    with contextlib.suppress(Exception):
        info["git_commit"] = commit or subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo_root(),
                                                      capture_output=True, text=True, timeout=10).stdout.strip()
    return info


def table(res: dict) -> str:
    lat, thr = res["latency"], res["throughput"]
    server = f" (server parameters: {', '.join(res['server_params'])})" if res.get("server_params") else ""
    lines = [f"one {res['tokens']}-token text, one request at a time (n={lat['n']}){server}:",
             "| path | p50 ms | p99 ms |", "| --- | ---: | ---: |",
             f"| direct gRPC (rose_client) | {lat['direct_p50_ms']:.2f} | {lat['direct_p99_ms']:.2f} |",
             f"| HTTP gateway (http.client) | {lat['gateway_p50_ms']:.2f} | {lat['gateway_p99_ms']:.2f} |",
             f"| HTTP gateway (httpx, as the openai SDK) | {lat['gateway_httpx_p50_ms']:.2f} | "
             f"{lat['gateway_httpx_p99_ms']:.2f} |",
             f"| gateway overhead, p50 (http.client; httpx) | {lat['overhead_p50_ms']:.2f}; "
             f"{lat['overhead_httpx_p50_ms']:.2f} | |", "",
             f"{thr['clients']} concurrent clients, one text each, {thr['seconds']:g} s each:",
             "| path | req/s | p50 ms | p99 ms |", "| --- | ---: | ---: | ---: |"]
    for name, key in (("direct gRPC (AsyncEmbeddingClient)", "direct"), ("HTTP gateway (httpx)", "gateway")):
        r = thr[key]
        lines.append(f"| {name} | {r['req_s']:.1f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--triton-urls", help="measure running servers (else start tritonserver + gateway here)")
    p.add_argument("--gateway-url", help="with --triton-urls: the gateway in front of them")
    p.add_argument("--model", default=None, help="model folder when starting servers (default model: all-MiniLM)")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--n", type=int, default=300, help="requests per path for the latency table")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--param", action="append", default=[],
                   help="MODEL.KEY=VALUE config.pbtxt parameter of the started server, e.g. rose.inline_execute=false")
    p.add_argument("--git-commit", default=None, help="the commit measured, where the tree has no .git")
    p.add_argument("--out", default=str(repo_root() / "benchmarks" / "results" / "gateway_bench.json"))
    args = p.parse_args(argv)
    text = text_of_tokens(args.tokens)
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    ctx = (contextlib.nullcontext((args.triton_urls, args.gateway_url)) if args.triton_urls
           else own_servers(args.model, repo_root() / "tests" / ".logs", args.param))
    with ctx as (urls, gw):
        res = {"tokens": args.tokens, "server_params": args.param, "latency": latency(urls, gw, text, args.n)}
        res["throughput"] = asyncio.run(throughput(urls, gw, text, args.clients, args.seconds))
    res.update(command=command_line(argv), date=started, machine=machine(args.git_commit))
    print(table(res))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2))
    print(f"\nsaved {args.out}")
    return 0
