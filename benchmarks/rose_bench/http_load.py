"""Closed-loop HTTP/1.1 clients on raw keep-alive connections, spread over processes: a load that
costs the client side little, so that the server is what is measured.

    result = http_load("127.0.0.1:8080", "/v1/embeddings", bodies, clients=64, seconds=3.0)
    result["req_per_s"], result["latency"]["p50_ms"]

Each client is one connection sending the next body (in turn from `bodies`) as soon as the last
answer has come; answers are read by Content-Length. Clients are spread over up to `processes`
spawned processes (asyncio in each), all starting at one wall-clock instant; a non-200 answer is
counted as an error and its first one kept.
"""
from __future__ import annotations

import asyncio
import multiprocessing as mp
import time

from rose_bench.record import latency_ms


def request_bytes(host: str, path: str, body: bytes, headers: dict | None = None) -> bytes:
    head = {"Host": host, "Content-Type": "application/json", "Content-Length": str(len(body)), **(headers or {})}
    return (f"POST {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in head.items()) + "\r\n").encode() + body


async def _answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    body = await reader.readexactly(length) if length else b""
    return int(lines[0].split()[1]), body


async def _client(host: str, port: int, requests: list[bytes], offset: int, start_at: float, stop_at: float,
                  lat: list, errors: list) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        await asyncio.sleep(max(0.0, start_at - time.time()))
        i = offset
        while time.time() < stop_at:
            sent = time.perf_counter()
            writer.write(requests[i % len(requests)])
            status, body = await _answer(reader)
            lat.append(time.perf_counter() - sent)
            if status != 200:
                errors.append(f"HTTP {status}: {body[:300]!r}")
            i += 1
    finally:
        writer.close()


def _process(address: str, requests: list[bytes], clients: int, first: int, start_at: float, stop_at: float, out) -> None:
    host, port = address.rsplit(":", 1)
    lat: list[float] = []
    errors: list[str] = []

    async def run():
        await asyncio.gather(*(_client(host, int(port), requests, first + c, start_at, stop_at, lat, errors)
                               for c in range(clients)))
    try:
        asyncio.run(run())
        out.put({"latencies": lat, "errors": errors})
    except BaseException as e:   # reported to the parent
        out.put({"latencies": lat, "errors": errors, "failed": f"{type(e).__name__}: {e}"})


def http_load(address: str, path: str, bodies: list[bytes], clients: int, seconds: float,
              headers: dict | None = None, processes: int = 4) -> dict:
    """`clients` closed-loop connections to `address` (host:port) posting `bodies` to `path` for
    `seconds`: requests per second, latency summary, errors."""
    requests = [request_bytes(address, path, b, headers) for b in bodies]
    procs_n = max(1, min(processes, clients))
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    start_at = time.time() + 0.6 + 0.1 * procs_n                  # every process up before it starts
    stop_at = start_at + seconds
    share = [clients // procs_n + (1 if i < clients % procs_n else 0) for i in range(procs_n)]
    procs = [ctx.Process(target=_process, args=(address, requests, n, sum(share[:i]), start_at, stop_at, out))
             for i, n in enumerate(share)]
    for p in procs:
        p.start()
    got = [out.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join(30)
    failed = [g["failed"] for g in got if "failed" in g]
    if failed:
        raise RuntimeError(f"an HTTP client failed: {failed[0]}")
    lat = [x for g in got for x in g["latencies"]]
    errors = [e for g in got for e in g["errors"]]
    res = {"req_per_s": round(len(lat) / seconds, 1), "latency": latency_ms([x * 1e3 for x in lat]),
           "errors": len(errors), "clients": clients}
    if errors:
        res["first_error"] = errors[0]
    return res
