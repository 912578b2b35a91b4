"""The lanes' load on a modelled device, for choosing their settings where no GPU is at hand.

    python -m rose_bench lanes --modelled-device [--device-ms "0.6+0.00122*tokens"] ...

The real EmbeddingService (scheduler, lanes, responders, inline launch) runs in this process on a
device that is a model, not a GPU: a batch of T tokens takes `a + b * T` milliseconds, batches run
one after another in launch order as on one CUDA stream, and a handle is ready once its batch's
time has passed. The defaults fit the H200's BGE-M3 graph replays (benchmarks/RESULTS-engine.md,
"graph ms" at 5x512, 25x512, 100x512). Clients are threads of this process; `--plan-ms`: host
time inside step() for a batch of more than 8 sequences, before its device time starts (flashinfer
fa3's plan; its measured range is in benchmarks/RESULTS-concurrency.md). `--bulk-clients` send
`--bulk-seqs` x `--bulk-len` without pause, one client sends 1 x `--query-len` at `--query-rate`. Latency is from submit() to the answer; the host work around the
device (forming, packing, answering) is this machine's. What it cannot show: Triton's and gRPC's
own time, and the real device's run-to-run spread. The phases and the table are those of `lanes`.
"""
from __future__ import annotations

import threading
import time

import numpy as np

from rose_backend.serving.scheduler import Request
from rose_backend.serving.service import EmbeddingService
from rose_backend.serving.service_settings import ServiceSettings
from rose_backend.triton.model_settings import RoseSettings
from rose_bench.record import latency_ms


class ModelledHandle:
    def __init__(self, rows: int, done_at: float):
        self.rows, self.done_at = rows, done_at

    def ready(self) -> bool:
        return time.perf_counter() >= self.done_at

    def synchronize(self) -> np.ndarray:
        time.sleep(max(0.0, self.done_at - time.perf_counter()))
        return np.zeros((self.rows, 8), np.float32)


class ModelledDevice:
    """step(batch) -> a handle ready `a + b * tokens` ms after the batches launched before it."""

    def __init__(self, a_ms: float, b_ms_per_token: float, plan_ms: float = 0.0):
        self.a, self.b, self.plan_s = a_ms / 1e3, b_ms_per_token / 1e3, plan_ms / 1e3
        self.free_at = 0.0
        self.busy_s = 0.0
        self.batches: list[tuple[int, int]] = []        # (sequences, tokens) of each batch launched

    def step(self, batch):
        tokens = int(batch.seq_lens.sum())
        if self.plan_s and len(batch.seq_lens) > 8:
            time.sleep(self.plan_s)
        run = self.a + self.b * tokens
        start = max(time.perf_counter(), self.free_at)
        self.free_at = start + run
        self.busy_s += run
        self.batches.append((len(batch.seq_lens), tokens))
        return ModelledHandle(len(batch.seq_lens), self.free_at)


def parse_device(text: str) -> tuple[float, float]:
    """"0.6+0.00122*tokens" -> (0.6, 0.00122)."""
    a, _, b = text.replace(" ", "").partition("+")
    return float(a), float(b.removesuffix("*tokens"))


def run_phase(svc: EmbeddingService, answered: dict, phase: str, args, seconds: float) -> dict:
    stop = time.perf_counter() + seconds
    lat: list[float] = []
    emb = [0]
    rng = np.random.default_rng(0)

    def query_client():
        ids = rng.integers(1000, 30000, size=args.query_len).astype(np.int32)
        i, t0 = 0, time.perf_counter()
        while (t := t0 + i / args.query_rate) < stop:
            time.sleep(max(0.0, t - time.perf_counter()))
            r = Request(ids, np.array([args.query_len], np.int32))
            answered[id(r)] = (time.perf_counter(), lat.append)
            svc.submit(r)
            i += 1

    def bulk_client():
        ids = rng.integers(1000, 30000, size=args.bulk_seqs * args.bulk_len).astype(np.int32)
        lens = np.full(args.bulk_seqs, args.bulk_len, np.int32)
        while time.perf_counter() < stop:
            done = threading.Event()
            r = Request(ids, lens, lane=None if args.bulk_lane == "none" else args.bulk_lane)
            answered[id(r)] = (time.perf_counter(), lambda s, done=done: done.set())
            svc.submit(r)
            done.wait(600)
            emb[0] += args.bulk_seqs

    threads = [] if phase == "bulk alone" else [threading.Thread(target=query_client)]
    if phase != "queries alone":
        threads += [threading.Thread(target=bulk_client) for _ in range(args.bulk_clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    res: dict = {"seconds": round(elapsed, 2)}
    if lat:
        res["query"] = latency_ms(np.array(lat) * 1e3)
    if phase != "queries alone":
        res["bulk"] = {"embeddings": emb[0], "emb_per_s": round(emb[0] / elapsed, 1)}
    return res


def one_variant(variant: str, args) -> dict:
    from rose_bench.tail import parse_variant
    name, params, _, _ = parse_variant(variant)
    rose = params.get("rose", {})
    settings = RoseSettings.from_values({k: v for k, v in rose.items()})
    device = ModelledDevice(*parse_device(args.device_ms), plan_ms=args.plan_ms)
    answered: dict[int, tuple] = {}

    def on_complete(r):
        sent, then = answered.pop(id(r))
        then(time.perf_counter() - sent)

    svc = EmbeddingService(device, on_complete, ServiceSettings.of(settings, inline=True))
    res: dict = {"variant": variant, "device_ms": args.device_ms, "plan_ms": args.plan_ms, "phases": {}}
    try:
        if args.warmup_s:
            run_phase(svc, answered, "both", args, args.warmup_s)
        for phase in args.phases:
            time.sleep(settings.interactive_recent_ms / 1e3 + 0.2)     # each phase starts with no recent query
            n0, busy0 = len(device.batches), device.busy_s
            res["phases"][phase] = run_phase(svc, answered, phase, args, args.seconds)
            sizes = [t for _, t in device.batches[n0:]]
            res["phases"][phase]["device"] = {"batches": len(sizes), "mean_tokens": round(float(np.mean(sizes)), 1)
                                              if sizes else 0, "busy_share": round((device.busy_s - busy0)
                                                                                   / res["phases"][phase]["seconds"], 4)}
    finally:
        svc.stop(30)
    alone = res["phases"].get("bulk alone", {}).get("bulk", {}).get("emb_per_s")
    both = res["phases"].get("both", {}).get("bulk", {}).get("emb_per_s")
    res["bulk_rate_beside_queries"] = round(both / alone, 4) if alone and both else None
    return res
