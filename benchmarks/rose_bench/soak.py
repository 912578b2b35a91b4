"""GPU soak (a benchmark, not a CI test): many clients, mixed traffic, faults, then SIGTERM.

    python -m rose_bench soak --shape pplx-embed --minutes 8 --clients 24     # on the H200
    python -m rose_bench soak --minutes 1 --clients 4 --max-len 64            # CPU smoke

One real tritonserver (the launcher's TritonProcess). Before the load, every sequence of a pool
(lengths 1..--max-len, log-uniform) is embedded alone, as token ids through `rose` and as text
through `embed`: these are the reference rows. Then --clients threads, each on its own gRPC stream,
send back to back for --minutes: 1..8 sequences a request, texts or ids at random; 5% of the
time a client opens a stream, sends a large request and closes the stream before the answer
(cancelled); 2% a malformed request (wrong dtype, 2-D ids, a missing or extra input, ids outside
the vocabulary, SEQ_LENS not matching) whose error must name the problem. Halfway, one burst of
1.5 x (max_queued_tokens + two batches) at once (some must be refused "overloaded"). Every good answer is checked
row by row against the reference (cosine distance <= --tol): wrong and unanswered must be 0.
Per minute: requests, p50 / p99 latency, errors by kind, the server's GPU memory (nvidia-smi
--query-compute-apps, summed over the server's processes) and host RSS (/proc). Then SIGTERM and
the time to exit. With --oom (GPU), a second server capped at its warm-up memory plus
--oom-headroom-mb (rose parameter gpu_memory_headroom_mb) gets batches that cannot fit: they must
be split and retried (rose_oom_splits_total > 0) and answered correctly. JSON to --out.
"""
from __future__ import annotations

import argparse
import re
import tempfile
import threading
import time
from collections import Counter, defaultdict
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from rose_backend.config import ModelConfig
from rose_backend.launch.deployment import DEFAULT_REPOSITORY, free_ports, repository_copy
from rose_backend.launch.tritonserver import TritonProcess
from rose_bench.record import command_line, git_commit, host_info, save_json
from rose_bench.soak_traffic import (BAD_KINDS, Pool, gpu_mib, ids_inputs, malformed, metric, rss_mib,
                                     server_processes)
from rose_client import ConnectionLost, ServerError, StreamConnection
from rose_testing.compare import cos_dist


class Soak:
    def __init__(self, args, url: str, pool: Pool, vocab: int):
        self.args, self.url, self.pool, self.vocab = args, url, pool, vocab
        self.lock = threading.Lock()
        self.lat = defaultdict(list)            # minute -> latencies (ms) of good answers
        self.errors = defaultdict(Counter)      # minute -> kind -> count
        self.counts = Counter()
        self.t0 = time.monotonic()
        self.stop = threading.Event()

    def minute(self) -> int:
        return int((time.monotonic() - self.t0) // 60)

    def note(self, kind: str, latency_ms: float | None = None) -> None:
        with self.lock:
            self.counts[kind] += 1
            if latency_ms is not None:
                self.lat[self.minute()].append(latency_ms)
            elif kind != "ok":
                self.errors[self.minute()][kind] += 1

    def client(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        conn = StreamConnection(self.url)
        try:
            while not self.stop.is_set():
                u = rng.random()
                if u < 0.05:
                    self.cancelled(rng)
                elif u < 0.07:
                    self.bad(conn, rng)
                else:
                    self.good(conn, rng)
        finally:
            conn.close()

    def good(self, conn, rng) -> None:
        picks = rng.integers(0, len(self.pool.ids), size=int(rng.integers(1, 9)))
        text = rng.random() < 0.5
        inputs = [("TEXT", [self.pool.texts[i] for i in picks])] if text else ids_inputs([self.pool.ids[i] for i in picks])
        t = time.perf_counter()
        try:
            emb = conn.infer("embed" if text else "rose", inputs).result(self.args.timeout)["EMBEDDINGS"]
        except TimeoutError:
            return self.note("unanswered")
        except ServerError as e:
            return self.note("overloaded" if "overloaded" in str(e) else f"error: {str(e)[:80]}")
        except Exception as e:
            return self.note(f"{type(e).__name__}: {str(e)[:80]}")
        ref = np.stack([(self.pool.ref_text if text else self.pool.ref_ids)[i] for i in picks])
        if emb.shape != ref.shape or cos_dist(emb, ref).max() > self.args.tol:
            return self.note("wrong")
        self.note("ok", (time.perf_counter() - t) * 1e3)

    def bad(self, conn, rng) -> None:
        kind = list(BAD_KINDS)[int(rng.integers(len(BAD_KINDS)))]
        try:
            conn.infer("rose", malformed(kind, self.vocab)).result(self.args.timeout)
            self.note("malformed accepted")
        except ServerError as e:
            clear = re.search(BAD_KINDS[kind], str(e))
            self.note("malformed (refused, expected)" if clear else f"malformed {kind}: unclear error {str(e)[:60]}")
        except Exception as e:
            self.note(f"malformed: {type(e).__name__}")

    def cancelled(self, rng) -> None:
        c = StreamConnection(self.url)
        big = [self.pool.ids[i] for i in rng.integers(0, len(self.pool.ids), size=64)]
        fut = c.infer("rose", ids_inputs(big))
        time.sleep(float(rng.uniform(0.001, 0.05)))
        c.close()
        try:
            fut.result(self.args.timeout)
            self.note("cancelled (answered first)")
        except ConnectionLost:
            self.note("cancelled (expected)")
        except ServerError as e:
            self.note("cancelled: overloaded" if "overloaded" in str(e) else f"cancelled: error: {str(e)[:60]}")
        except Exception as e:
            self.note(f"cancelled: {type(e).__name__}")

    def burst(self, max_queued: int) -> dict:
        """1.5 x (max_queued_tokens + what max_inflight batches take out of the pool) at once on
        one stream; refused ones are "overloaded"."""
        conn = StreamConnection(self.url)
        try:
            seqs = [s for s in self.pool.ids if len(s) >= 8] or self.pool.ids
            futs, tokens, i = [], 0, 0
            while tokens < 1.5 * (max_queued + 2 * 16384):   # default max_batch_tokens, max_inflight
                req = [seqs[(i + k) % len(seqs)] for k in range(8)]
                tokens += sum(len(s) for s in req)
                futs.append(conn.infer("rose", ids_inputs(req)))
                i += 8
            out = Counter()
            for f in futs:
                try:
                    f.result(self.args.timeout)
                    out["answered"] += 1
                except ServerError as e:
                    out["overloaded" if "overloaded" in str(e) else "other error"] += 1
                except Exception as e:
                    out[type(e).__name__] += 1
            return {"requests": len(futs), "tokens": tokens, **out}
        finally:
            conn.close()


def start(folder, repo, log_file) -> TritonProcess:
    srv = TritonProcess(str(folder) if folder else None, repo, free_ports(), log_file=log_file).start()
    srv.wait_ready(1800)
    return srv


def oom_phase(args, folder, work: Path, pool: Pool, params: dict) -> dict:
    """A server capped at warm-up memory + headroom; batches too big for it are split and retried."""
    p = {**params, "rose": {**params["rose"], "gpu_memory_headroom_mb": str(args.oom_headroom_mb),
                            "precapture": "none", "cuda_graphs": "off", "max_batch_tokens": str(args.oom_batch_tokens)}}
    srv = start(folder, repository_copy(DEFAULT_REPOSITORY, work / "repo-oom", p), work / "server-oom.log")
    try:
        conn = StreamConnection(srv.grpc_url)
        order = np.argsort([-len(s) for s in pool.ids])
        wrong = failed = 0
        errors = []
        for k in range(4):                                        # the longest sequences, many at once
            picks = order[(k * 64) % len(order):][:64]
            try:
                emb = conn.infer("rose", ids_inputs([pool.ids[i] for i in picks])).result(600)["EMBEDDINGS"]
                wrong += int(cos_dist(emb, np.stack([pool.ref_ids[i] for i in picks])).max() > args.tol)
            except Exception as e:
                failed += 1
                errors.append(f"{type(e).__name__}: {e}"[:400])
        after = conn.infer("rose", ids_inputs(pool.ids[:4])).result(600)["EMBEDDINGS"]    # still serving
        conn.close()
        time.sleep(1.5)
        return {"oom_splits": metric(srv, "rose_oom_splits_total"), "requests": 4, "wrong": wrong,
                "failed": failed, "errors": errors, "serving_after": bool(cos_dist(after, np.stack(pool.ref_ids[:4])).max() <= args.tol)}
    finally:
        srv.stop()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="Hugging Face model folder (default: the default model)")
    ap.add_argument("--shape", help="instead: a random-weight folder of this shape (bge-m3, pplx-embed)")
    ap.add_argument("--minutes", type=float, default=8.0)
    ap.add_argument("--clients", type=int, default=24)
    ap.add_argument("--max-len", type=int, default=4096, help="longest sequence (capped at the model's)")
    ap.add_argument("--pool", type=int, default=256, help="distinct sequences with reference rows")
    ap.add_argument("--max-queued-tokens", type=int, default=262144, help="rose max_queued_tokens (the burst exceeds it)")
    ap.add_argument("--tol", type=float, default=None, help="max cosine distance to the reference (default 2e-3 GPU, 1e-4 CPU)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds before a request counts as unanswered")
    ap.add_argument("--oom", action="store_true", help="also the forced out-of-memory phase (GPU only)")
    ap.add_argument("--oom-only", action="store_true", help="only the reference rows and the out-of-memory phase")
    ap.add_argument("--oom-headroom-mb", type=int, default=512)
    ap.add_argument("--oom-batch-tokens", type=int, default=65536)
    ap.add_argument("--rose-param", action="append", default=[], metavar="KEY=VALUE",
                    help="a rose config.pbtxt parameter for the soak's server (repeatable)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--out", default="benchmarks/results/soak_gpu.json")
    ap.add_argument("--git-commit", default=None, help="recorded in the JSON where .git is not available")
    args = ap.parse_args(argv)
    t_start = time.monotonic()
    import torch
    cuda = torch.cuda.is_available()
    args.tol = args.tol if args.tol is not None else (2e-3 if cuda else 1e-4)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="rose-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    folder = Path(args.model).resolve() if args.model else None
    if args.shape:
        from rose_testing.folders import make_folder
        folder = make_folder(args.shape, work / args.shape, device="cuda" if cuda else "cpu")
    cfg = ModelConfig.from_folder(folder)
    max_len = min(args.max_len, cfg.max_positions)
    params = {"rose": {"max_queued_tokens": str(args.max_queued_tokens),
                       **dict(kv.split("=", 1) for kv in args.rose_param)}}
    result = {"command": command_line(argv),
              "git": git_commit(args.git_commit), "machine": host_info("cuda" if cuda else "cpu"),
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "model": str(folder or "default"),
              "settings": {k: v for k, v in vars(args).items()}, "max_len": max_len}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    pool = Pool(rng, args.pool, max_len, cfg.vocab_size, random_folder=args.shape is not None)
    srv = start(folder, repository_copy(DEFAULT_REPOSITORY, work / "repo", params), work / "server.log")
    try:
        print(f"[soak] server ready; embedding {len(pool.ids)} reference sequences alone", flush=True)
        pool.fill(srv.grpc_url)
        if args.oom_only:
            srv.stop()
            result["oom"] = oom_phase(args, folder, work, pool, params)
            save_json(out, result, t_start)
            print(f"oom: {result['oom']}\nwrote {out}")
            return 0 if result["oom"]["oom_splits"] > 0 and not result["oom"]["wrong"] else 1
        soak = Soak(args, srv.grpc_url, pool, cfg.vocab_size)
        threads = [threading.Thread(target=soak.client, args=(i,), daemon=True) for i in range(args.clients)]
        for t in threads:
            t.start()
        minutes, burst, samples = [], None, []
        n_min = max(1, int(np.ceil(args.minutes)))
        burst_at = soak.t0 + args.minutes * 30                     # halfway
        for m in range(n_min):
            end = soak.t0 + min(args.minutes, m + 1) * 60
            while (now := time.monotonic()) < end:                  # memory every 10 s
                if burst is None and now >= burst_at:
                    burst = soak.burst(args.max_queued_tokens)
                pids = server_processes(srv)
                samples.append({"t_s": round(now - soak.t0, 1), "rss_mib": rss_mib(pids), "gpu_mib": gpu_mib(pids)})
                time.sleep(max(0.0, min(10.0, end - time.monotonic())))
            pids = server_processes(srv)
            lat = np.array(soak.lat.get(m, []) or [np.nan])
            row = {"minute": m + 1, "ok": int(np.isfinite(lat).sum()), "p50_ms": round(float(np.nanpercentile(lat, 50)), 1),
                   "p99_ms": round(float(np.nanpercentile(lat, 99)), 1), "errors": dict(soak.errors.get(m, {})),
                   "rss_mib": rss_mib(pids), "gpu_mib": gpu_mib(pids)}
            minutes.append(row)
            print(f"[soak] {row}", flush=True)
            result.update(minutes=minutes, counts=dict(soak.counts), samples=samples)
            save_json(out, result, t_start)                           # a run cut short keeps its minutes
        soak.stop.set()
        for t in threads:
            t.join(args.timeout + 5)
        t_term = time.monotonic()
        code = srv.stop()
        stop_s = round(time.monotonic() - t_term, 1)
        # growth after warm-up: from the first sample past a quarter of the run to the last
        after = [x for x in samples if x["t_s"] >= args.minutes * 15] or samples
        rss = [x["rss_mib"] for x in after] + [minutes[-1]["rss_mib"]]
        gpu = [x["gpu_mib"] for x in after if x["gpu_mib"] is not None]
        result.update(minutes=minutes, counts=dict(soak.counts), burst=burst, stop_s=stop_s, exit_code=code,
                      samples=samples, rss_growth_pct=round(100 * (rss[-1] - rss[0]) / rss[0], 1) if rss[0] else None,
                      gpu_mib_after_warmup=[min(gpu), max(gpu)] if gpu else None,
                      wrong=soak.counts["wrong"], unanswered=soak.counts["unanswered"])
        save_json(out, result, t_start)
        if args.oom and cuda:
            result["oom"] = oom_phase(args, folder, work, pool, params)
            save_json(out, result, t_start)
    finally:
        srv.stop()
    print(summary(result))
    print(f"wrote {out}")
    return 0 if result["wrong"] == 0 and result["unanswered"] == 0 else 1


def summary(r: dict) -> str:
    lines = [f"{'min':>3} {'ok':>6} {'p50 ms':>8} {'p99 ms':>8} {'RSS MiB':>8} {'GPU MiB':>8}  errors"]
    for m in r["minutes"]:
        lines.append(f"{m['minute']:>3} {m['ok']:>6} {m['p50_ms']:>8.1f} {m['p99_ms']:>8.1f} {m['rss_mib']:>8.0f} "
                     f"{m['gpu_mib'] if m['gpu_mib'] is not None else '-':>8}  {m['errors']}")
    lines.append(f"counts: {r['counts']}")
    lines.append(f"burst: {r['burst']}")
    lines.append(f"wrong {r['wrong']}, unanswered {r['unanswered']}, RSS growth after warm-up {r['rss_growth_pct']}%, "
                 f"GPU MiB after warm-up (min, max) {r['gpu_mib_after_warmup']}, "
                 f"SIGTERM -> exit {r['stop_s']} s (code {r['exit_code']})")
    if "oom" in r:
        lines.append(f"oom: {r['oom']}")
    return "\n".join(lines)
