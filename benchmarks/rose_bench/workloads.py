"""The four workloads of docs/DESIGN.md (Benchmarks), driven by client processes over gRPC streams (one stream each).

Every client is a closed loop: send one request, wait for its one FINAL response, send the next.
Clients live in worker processes (spawned once per benchmark run and reused), so that concurrent
clients never share a GIL with each other or with the benchmark's own bookkeeping.

    with ClientPool(16) as pool:
        online(pool, url, "rose", length=128, n=300, warmup=20, vocab=250002)     # latencies
        throughput(pool, url, "rose", length=512, batch=100, procs=4, batches=5, ...)

Requests are random token ids (never special tokens) or texts of "w<id>" words that a
WordLevel tokenizer maps one to one onto ids, so a 512-word text is 512 tokens.
"""
from __future__ import annotations

import multiprocessing as mp
import queue
import time
from dataclasses import dataclass

import numpy as np


@dataclass
class Spec:
    """One client's work: `n` timed requests of `batch` sequences of `length` tokens, after `warmup`."""
    url: str
    model: str
    length: int
    batch: int
    vocab: int
    n: int
    warmup: int = 0
    text: bool = False          # TEXT (through tokenization) instead of INPUT_IDS + SEQ_LENS
    seed: int = 0
    variants: int = 8           # distinct requests cycled through
    start_at: float = 0.0       # wall clock (time.time) to start timing at; 0: at once
    timeout: float = 600.0
    # Through rose_client's EmbeddingClient over these servers (chunked and balanced) instead of one
    # gRPC stream to `url`; `model` is then the text model (text=True) or the token model.
    balanced_urls: tuple = ()
    client_kwargs: dict | None = None
    seconds: float = 0.0        # > 0: timed requests for this long (at least one) instead of `n`
    parameters: dict | None = None   # request parameters (e.g. {"lane": "bulk"}) of a raw stream's requests


def _requests(spec: Spec):
    from rose_testing.folders import ids_to_text, random_ids
    rng = np.random.default_rng(spec.seed)
    out = []
    for _ in range(max(1, spec.variants)):
        seqs = [random_ids(rng, spec.vocab, spec.length) for _ in range(spec.batch)]
        if spec.balanced_urls:
            out.append([ids_to_text(s) for s in seqs] if spec.text else seqs)
        elif spec.text:
            out.append([("TEXT", [ids_to_text(s) for s in seqs])])
        else:
            out.append([("INPUT_IDS", np.concatenate(seqs)),
                        ("SEQ_LENS", np.full(spec.batch, spec.length, dtype=np.int32))])
    return out


def _connect(spec: Spec):
    """(call(request) -> embeddings, close) for one client: a raw stream or the balancing client."""
    if spec.balanced_urls:
        from rose_client.client import EmbeddingClient
        client = EmbeddingClient(list(spec.balanced_urls), model=spec.model, token_model=spec.model,
                                 timeout=spec.timeout, **(spec.client_kwargs or {}))
        return (client.embed if spec.text else client.embed_tokens), client.close
    from rose_client.transport import StreamConnection
    conn = StreamConnection(spec.url)
    return (lambda req: conn.infer(spec.model, req, parameters=spec.parameters).result(spec.timeout)["EMBEDDINGS"]), \
        conn.close


def run_client(spec: Spec) -> dict:
    """One closed-loop client (runs in a worker process, or inline)."""
    reqs = _requests(spec)
    call, close = _connect(spec)
    try:
        emb = None
        for i in range(spec.warmup):
            emb = call(reqs[i % len(reqs)])
        if spec.start_at:
            time.sleep(max(0.0, spec.start_at - time.time()))
        lat = []
        t0 = time.time()
        end = t0 + spec.seconds
        while (len(lat) < spec.n) if not spec.seconds else (not lat or time.time() < end):
            s = time.perf_counter()
            emb = call(reqs[len(lat) % len(reqs)])
            lat.append(time.perf_counter() - s)
        t1 = time.time()
        if emb is not None and emb.shape[0] != spec.batch:
            raise RuntimeError(f"expected {spec.batch} embeddings, got {emb.shape}")
        return {"latencies_s": lat, "t0": t0, "t1": t1, "embeddings": len(lat) * spec.batch}
    finally:
        close()


def _worker(tasks, results):
    while True:
        item = tasks.get()
        if item is None:
            return
        key, spec = item
        try:
            results.put((key, run_client(spec), None))
        except BaseException as e:  # reported to the parent
            results.put((key, None, f"{type(e).__name__}: {e}"))


class ClientPool:
    """`size` spawned worker processes, each running one client at a time."""

    def __init__(self, size: int):
        ctx = mp.get_context("spawn")
        self.results = ctx.Queue()
        self.tasks = [ctx.Queue() for _ in range(size)]
        self.procs = [ctx.Process(target=_worker, args=(q, self.results), daemon=True) for q in self.tasks]
        for p in self.procs:
            p.start()
        self._key = 0

    def run(self, specs: list[Spec], timeout: float) -> list[dict]:
        """Run one spec per worker (len(specs) <= size) at once; their results in order."""
        if len(specs) > len(self.tasks):
            raise ValueError(f"{len(specs)} clients but only {len(self.tasks)} workers")
        keys = []
        for q, spec in zip(self.tasks, specs):
            self._key += 1
            keys.append(self._key)
            q.put((self._key, spec))
        got, end = {}, time.monotonic() + timeout
        while len(got) < len(keys):
            try:
                key, result, error = self.results.get(timeout=max(0.1, end - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"clients did not finish within {timeout:.0f} s") from None
            if key not in keys:
                continue                        # a late answer of an earlier, abandoned run
            if error:
                raise RuntimeError(f"client failed: {error}")
            got[key] = result
        return [got[k] for k in keys]

    def close(self):
        for q in self.tasks:
            q.put(None)
        for p in self.procs:
            p.join(5)
            if p.is_alive():
                p.terminate()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def latency_stats(lat_s) -> dict:
    ms = np.asarray(lat_s, dtype=np.float64) * 1e3
    if ms.size == 0:
        return {"n": 0}
    p = np.percentile(ms, [50, 90, 99])
    return {"n": int(ms.size), "p50_ms": round(float(p[0]), 4), "p90_ms": round(float(p[1]), 4),
            "p99_ms": round(float(p[2]), 4), "mean_ms": round(float(ms.mean()), 4),
            "min_ms": round(float(ms.min()), 4), "max_ms": round(float(ms.max()), 4)}


def sequential(pool: ClientPool, url: str, model: str, length: int, batch: int, n: int, warmup: int,
               vocab: int, timeout: float = 600.0) -> dict:
    """Workloads 1 and 2: one client, `batch` sequences of `length` per request, sequential."""
    (r,) = pool.run([Spec(url, model, length, batch, vocab, n, warmup, seed=length * 1000 + batch,
                          variants=16 if batch * length <= 8192 else 4)], timeout)
    stats = latency_stats(r["latencies_s"])
    stats["requests_per_s"] = round(n / max(r["t1"] - r["t0"], 1e-9), 2)
    return stats


def throughput(pool: ClientPool, url: str | list[str], model: str, length: int, batch: int, procs: int,
               batches: int, warmup: int, vocab: int, timeout: float = 600.0, balanced: bool = False,
               client_kwargs: dict | None = None) -> dict:
    """Workload 3: `procs` client processes, each sending `batches` requests of `batch` x `length`.
    url: one server, or a list: client i streams to url[i % len] (balanced=False), or every client
    spreads its chunks over all of them through EmbeddingClient (balanced=True)."""
    specs = [Spec(_url(url, i), model, length, batch, vocab, batches, warmup, seed=7919 * (i + 1) + length,
                  variants=2, **_balancing(url, balanced, client_kwargs)) for i in range(procs)]
    rs = _synced(pool, specs, timeout)
    t0, t1 = min(r["t0"] for r in rs), max(r["t1"] for r in rs)
    total = sum(r["embeddings"] for r in rs)
    lat = [x for r in rs for x in r["latencies_s"]]
    return {"emb_per_s": round(total / (t1 - t0), 2), "tokens_per_s": round(total * length / (t1 - t0), 1),
            "embeddings": total, "seconds": round(t1 - t0, 3), "procs": procs, "batch": batch,
            "batch_latency": latency_stats(lat)}


def _url(url: str | list[str], i: int) -> str:
    return url if isinstance(url, str) else url[i % len(url)]


def _balancing(url: str | list[str], balanced: bool, client_kwargs: dict | None) -> dict:
    if not balanced:
        return {}
    return {"balanced_urls": (url,) if isinstance(url, str) else tuple(url), "client_kwargs": client_kwargs}


def _synced(pool: ClientPool, specs: list[Spec], timeout: float) -> list[dict]:
    """Warm every client up together (so lazy capture sees the mixes concurrent clients make),
    then start the timed loops of all clients at one wall-clock instant."""
    if any(s.warmup for s in specs):
        pool.run([Spec(**{**s.__dict__, "n": 0}) for s in specs], timeout)
    start_at = time.time() + 0.3 + 0.02 * len(specs)
    return pool.run([Spec(**{**s.__dict__, "warmup": 0, "start_at": start_at}) for s in specs], timeout)


def concurrency(pool: ClientPool, url: str | list[str], model: str, length: int, clients: int, total: int,
                warmup: int, vocab: int, text: bool = True, timeout: float = 600.0, balanced: bool = False,
                client_kwargs: dict | None = None) -> dict:
    """Workload 4: `clients` closed-loop clients of one sequence each (texts through tokenization).
    url: as for throughput()."""
    per = max(8, -(-total // clients))
    specs = [Spec(_url(url, i), model, length, 1, vocab, per, warmup, text=text, seed=104729 * (i + 1) + clients,
                  variants=16, **_balancing(url, balanced, client_kwargs)) for i in range(clients)]
    rs = _synced(pool, specs, timeout)
    t0, t1 = min(r["t0"] for r in rs), max(r["t1"] for r in rs)
    stats = latency_stats([x for r in rs for x in r["latencies_s"]])
    stats["requests_per_s"] = round(per * clients / (t1 - t0), 2)
    stats["clients"] = clients
    return stats
