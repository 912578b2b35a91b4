"""Queries beside re-indexing: a query's latency under a bulk load, and the bulk rate beside queries.

    source benchmarks/gpu/enter_bench.sh && python3 -m rose_bench lanes --out $OUT --model bge-m3

Per variant (a server of its own each, started through the project's launcher), three phases of
`--seconds` each (`--phases`: some of them), after a warm-up (`--warmup-s`) that runs both loads:
- queries alone: one client sends 1 x `--query-len` token ids to `rose` at `--query-rate` per
  second (open loop: each at its time, whether or not the one before is answered; no lane named);
- bulk alone: `--bulk-clients` client processes, each sending `--bulk-seqs` x `--bulk-len` requests
  one after the other without pause (the lane `--bulk-lane`: bulk, or none, which is bulk by size);
- both at once (the queries from `--query-after-s` into the phase: 0, or after the bulk requests began).
`--path text` sends texts to `embed` instead (the text path: `tokenize_batched`, then `rose`): a query
is one text of `--query-len` words, a bulk request `--bulk-seqs` texts of `--bulk-chars` characters.
Each client is a process of its own with its own gRPC stream. Query latency is from its send to
its answer (p50, p90, p99, max, and each query's send time in the phase with its latency: where the
slow ones came); bulk throughput is embeddings per second over the phase. rose's per-lane metrics
(batches, waits) are read from the metrics port after each phase.

A variant is NAME:SETTING,... as in `rose_bench tail` (MODEL.PARAM=VALUE, MODEL.count=N, env.VAR=VALUE), e.g.
"lanes:;one-lane:rose.bulk_threshold_tokens=1048576" (the second puts every request in one lane,
one first-come-first-served queue, when --bulk-lane is none).
Results: <out>/lanes.json (command, git commit, machine, date), rewritten after every variant.
`--modelled-device`: the same phases in this process on a modelled device instead of a server
(lanes_model.py; <out>/lanes_modelled.json), for choosing the settings without a GPU.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

from rose_bench.record import comma_list, cuda_available, latency_ms, log, run_record

PHASES = ("queries alone", "bulk alone", "both")


# words of the text path's texts (common English words: the default model's tokenizer has each as one token)
WORDS = ("the of and to in is was for on that with as by at from his an were are which this be had not "
         "first one their its new after but who they has have her she two been other when there all year "
         "into more only time over most city some would where later also years up many may school then "
         "part between such during about him under both three state would known while used people world "
         "made team before house season since including second same number well being area through "
         "following early against government university film system national river music region").split()


def text_of(rng: np.random.Generator, chars: int) -> str:
    """A text of about `chars` characters of WORDS."""
    n = max(1, chars // 5)
    text = " ".join(WORDS[i] for i in rng.integers(0, len(WORDS), n))
    while len(text) < chars:
        text += " " + " ".join(WORDS[i] for i in rng.integers(0, len(WORDS), n))
    return text[:chars].rstrip()


def query_inputs(path: str, rng: np.random.Generator, vocab: int, length: int) -> tuple[str, list]:
    """(model, inputs) of one query: `length` token ids to `rose`, or a text of `length` words to `embed`."""
    from rose_testing.folders import random_ids
    if path == "text":
        return "embed", [("TEXT", [" ".join(WORDS[i] for i in rng.integers(0, len(WORDS), length))])]
    return "rose", [("INPUT_IDS", random_ids(rng, vocab, length)), ("SEQ_LENS", np.array([length], np.int32))]


def bulk_inputs(path: str, rng: np.random.Generator, vocab: int, seqs: int, length: int, chars: int) -> tuple[str, list]:
    """(model, inputs) of one bulk request: seqs x length token ids to `rose`, or seqs texts of
    `chars` characters to `embed`."""
    from rose_testing.folders import random_ids
    if path == "text":
        return "embed", [("TEXT", [text_of(rng, chars) for _ in range(seqs)])]
    return "rose", [("INPUT_IDS", np.concatenate([random_ids(rng, vocab, length) for _ in range(seqs)])),
                    ("SEQ_LENS", np.full(seqs, length, np.int32))]


def _query_client(url: str, path: str, length: int, vocab: int, rate: float, start: float, stop: float, out,
                  phase_start: float) -> None:
    """Open loop: request i is sent at start + i / rate; latency from its send to its answer."""
    from rose_client.transport import StreamConnection
    rng = np.random.default_rng(1)
    reqs = [query_inputs(path, rng, vocab, length) for _ in range(16)]
    conn = StreamConnection(url)
    lat, futures, errors = [], [], 0
    try:
        time.sleep(max(0.0, start - time.time()))
        i = 0
        while (t := start + i / rate) < stop:
            time.sleep(max(0.0, t - time.time()))
            sent, at = time.perf_counter(), time.time() - phase_start
            model, inputs = reqs[i % len(reqs)]
            f = conn.infer(model, inputs, outputs=["EMBEDDINGS"])
            f.add_done_callback(lambda f, sent=sent, at=at: lat.append((at, time.perf_counter() - sent)))
            futures.append(f)
            i += 1
        for f in futures:
            try:
                f.result(900)
            except Exception:
                errors += 1
    finally:
        conn.close()
    out.put({"kind": "query", "latencies": sorted(lat), "sent": len(futures), "errors": errors})


def _bulk_client(url: str, path: str, seqs: int, length: int, chars: int, vocab: int, lane: str, seed: int,
                 start: float, stop: float, out) -> None:
    """Closed loop without pause: the next request as soon as the last one is answered."""
    from rose_client.transport import StreamConnection
    rng = np.random.default_rng(seed)
    reqs = [bulk_inputs(path, rng, vocab, seqs, length, chars) for _ in range(2)]
    params = {"lane": lane} if lane != "none" else None
    conn = StreamConnection(url)
    done, i, t_end, calls = 0, 0, None, []
    try:
        time.sleep(max(0.0, start - time.time()))
        while time.time() < stop:
            model, inputs = reqs[i % 2]
            t0 = time.time()
            emb = conn.infer(model, inputs, outputs=["EMBEDDINGS"], parameters=params).result(3600)["EMBEDDINGS"]
            if emb.shape[0] != seqs:
                raise RuntimeError(f"expected {seqs} embeddings, got {emb.shape}")
            done, i, t_end = done + seqs, i + 1, time.time()
            calls.append((round(t0 - start, 3), round(t_end - t0, 3)))
    finally:
        conn.close()
    out.put({"kind": "bulk", "embeddings": done, "t_end": t_end, "calls": calls})


def run_phase(url: str, phase: str, args, vocab: int, seconds: float) -> dict:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    start = time.time() + 2.0 + 0.1 * args.bulk_clients           # every process up before it starts
    stop = start + seconds
    procs = []
    if phase != "bulk alone":
        q_start = start + (args.query_after_s if phase == "both" else 0.0)
        procs.append(ctx.Process(target=_query_client, args=(url, args.path, args.query_len, vocab, args.query_rate,
                                                              q_start, stop, out, start)))
    if phase != "queries alone":
        procs += [ctx.Process(target=_bulk_client, args=(url, args.path, args.bulk_seqs, args.bulk_len, args.bulk_chars,
                                                          vocab, args.bulk_lane, 7919 * (i + 1), start, stop, out))
                  for i in range(args.bulk_clients)]
    for p in procs:
        p.start()
    got = [out.get(timeout=seconds + 3600) for _ in procs]
    for p in procs:
        p.join(30)
    # the machine's 1-minute load average at the phase's end (the server and clients count in it: about
    # 2 here; more is other work sharing the cores)
    res: dict = {"seconds": seconds, "loadavg_1m": round(os.getloadavg()[0], 2)}
    queries = [g for g in got if g["kind"] == "query"]
    if queries:
        lat = queries[0]["latencies"]
        ms = np.array([s for _, s in lat]) * 1e3
        res["query"] = {"sent": queries[0]["sent"], "errors": queries[0]["errors"], "max_ms": None, **latency_ms(ms),
                        # [seconds into the phase it was sent, its latency in ms], in sending order
                        "timeline": [[round(at, 3), round(s * 1e3, 1)] for at, s in lat]}
    bulks = [g for g in got if g["kind"] == "bulk"]
    if bulks:
        # the bulk clients' last answers (a request in flight at `stop` still counts, to its end)
        t_end = max((g["t_end"] or stop) for g in bulks)
        total = sum(g["embeddings"] for g in bulks)
        res["bulk"] = {"embeddings": total, "emb_per_s": round(total / max(t_end - start, 1e-9), 1),
                       "clients": len(bulks),
                       # each call's [seconds into the phase it was sent, seconds it took]
                       "calls": [g["calls"] for g in bulks]}
    return res


def lane_metrics(metrics_port: int) -> dict:
    """rose's per-lane series from the metrics port: {series with labels: value}."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    out = {}
    for m in re.finditer(r'^(rose_lane_\w+|rose_batches_total)\{([^}]*)\} ([0-9.e+-]+)$', text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        if labels.get("model") != "rose":
            continue
        key = m.group(1) + "".join(f",{k}={v}" for k, v in labels.items() if k in ("lane", "le"))
        out[key] = float(m.group(3))
    return out


def delta(before: dict, after: dict) -> dict:
    return {k: round(after[k] - before.get(k, 0.0), 6) for k in after if after[k] != before.get(k, 0.0)}


def startup_lines(log_file: Path, offset: int) -> list[str]:
    """rose's start-up lines in a server log from byte `offset` on (a log may hold earlier runs):
    each engine's memory budget and what it warmed up in how long (the parts of READY that the query
    lane adds)."""
    try:
        with open(log_file, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    return re.findall(r'rose: (?:memory budget|warmed up)[^\n"]*', text)


def one_variant(folder: Path | None, variant: str, vocab: int, work: Path, args) -> dict:
    from rose_backend.launch.deployment import DEFAULT_REPOSITORY, free_ports, repository_copy
    from rose_backend.launch.tritonserver import TritonProcess
    from rose_bench.tail import parse_variant
    name, params, counts, env_extra = parse_variant(variant)
    repo = repository_copy(DEFAULT_REPOSITORY, work / f"repo-{name}", params, instances=counts) \
        if params or counts else DEFAULT_REPOSITORY
    srv = TritonProcess(str(folder) if folder else None, repo, free_ports(), log_file=work / f"triton-{name}.log",
                        env=dict(os.environ, **env_extra))
    # the server's thread settings as it got them (unset: torch's default, one thread per core)
    res: dict = {"variant": variant, "phases": {},
                 "server_threads_env": {k: srv.env[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS") if k in srv.env}}
    log_file = work / f"triton-{name}.log"
    offset = log_file.stat().st_size if log_file.exists() else 0
    t0 = time.monotonic()
    srv.start()
    try:
        srv.wait_ready(timeout=900)
        res["ready_s"] = round(time.monotonic() - t0, 1)
        if args.warmup_s:
            res["warmup"] = run_phase(srv.grpc_url, "both", args, vocab, args.warmup_s)
        for phase in args.phases:
            time.sleep(1.5)                                  # rose's metrics: each refreshed once a second
            before = lane_metrics(srv.ports.metrics)
            res["phases"][phase] = run_phase(srv.grpc_url, phase, args, vocab, args.seconds)
            time.sleep(1.5)
            res["phases"][phase]["rose"] = delta(before, lane_metrics(srv.ports.metrics))
            shown = {k: ({n: x for n, x in v.items() if n not in ("timeline", "calls")} if isinstance(v, dict) else v)
                     for k, v in res["phases"][phase].items() if k != "rose"}
            log(f"{name} / {phase}: {json.dumps(shown)}")
    finally:
        res["server_exit_code"] = srv.stop()
        res["startup_lines"] = startup_lines(log_file, offset)
    alone = res["phases"].get("bulk alone", {}).get("bulk", {}).get("emb_per_s")
    both = res["phases"].get("both", {}).get("bulk", {}).get("emb_per_s")
    if alone and both:
        res["bulk_rate_beside_queries"] = round(both / alone, 4)
    return res


def table(result: dict) -> str:
    lines = ["| variant | phase | query p50 ms | query p90 ms | query p99 ms | query max ms | bulk emb/s | bulk vs alone |",
             "|---|---|---|---|---|---|---|---|"]
    for name, res in result["variants"].items():
        if "error" in res:
            lines.append(f"| {name} | error: {res['error']} | | | | | | |")
            continue
        for phase, p in res["phases"].items():
            q, b = p.get("query", {}), p.get("bulk", {})
            ratio = (res.get("bulk_rate_beside_queries") or "") if phase == "both" else ""
            lines.append(f"| {name} | {phase} | {q.get('p50_ms', '')} | {q.get('p90_ms', '')} | {q.get('p99_ms', '')} "
                         f"| {q.get('max_ms', '')} | {b.get('emb_per_s', '')} | {ratio} |")
    return "\n".join(lines)


def modelled(args, out: Path) -> int:
    from rose_bench.lanes_model import one_variant as modelled_variant
    result = {**run_record(args.git_commit, "cpu"), "modelled_device": args.device_ms,
              "settings": {k: v for k, v in vars(args).items() if k not in ("out", "work", "git_commit")},
              "variants": {}}
    for variant in filter(None, args.variants.split(";")):
        result["variants"][variant.split(":")[0]] = res = modelled_variant(variant, args)
        log(f"{variant}: " + json.dumps({p: {k: v for k, v in r.items() if k in ("query", "bulk", "device")}
                                         for p, r in res["phases"].items()}))
        (out / "lanes_modelled.json").write_text(json.dumps(result, indent=1))
    print(table(result), flush=True)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/rose-lanes")
    ap.add_argument("--model", default="bge-m3", help="a rose_testing shape, or 'default' (the default model)")
    ap.add_argument("--variants", default="lanes:;one-lane:rose.bulk_threshold_tokens=1048576")
    ap.add_argument("--bulk-clients", type=int, default=4)
    ap.add_argument("--bulk-seqs", type=int, default=100)
    ap.add_argument("--bulk-len", type=int, default=512)
    ap.add_argument("--path", choices=("ids", "text"), default="ids",
                    help="ids: token ids to `rose`; text: texts to `embed` (tokenize_batched, then rose); a server's only")
    ap.add_argument("--bulk-chars", type=int, default=8000, help="--path text: characters of each bulk text")
    ap.add_argument("--bulk-lane", choices=("bulk", "none"), default="none",
                    help="the lane the bulk clients name (none: bulk by size, above bulk_threshold_tokens)")
    ap.add_argument("--query-len", type=int, default=128, help="tokens of a query (--path text: words)")
    ap.add_argument("--query-rate", type=float, default=50.0)
    ap.add_argument("--query-after-s", type=float, default=0.0,
                    help="in the phase with both, the first query this long after the bulk clients start (a server's only)")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--warmup-s", type=float, default=6.0)
    ap.add_argument("--modelled-device", action="store_true", help="no server: a modelled device (lanes_model.py)")
    ap.add_argument("--device-ms", default="0.6+0.00122*tokens", help="the modelled device's batch time")
    ap.add_argument("--plan-ms", type=float, default=0.0, help="modelled host time of a batch of > 8 sequences")
    ap.add_argument("--work", default="/tmp/rose-lanes-work")
    ap.add_argument("--git-commit", default=None, help="recorded in the JSON where .git is not available")
    ap.add_argument("--phases", type=comma_list, default=list(PHASES),
                    help=f"which phases to run, of {', '.join(PHASES)} (comma-separated)")
    args = ap.parse_args(argv)
    if not args.phases or set(args.phases) - set(PHASES):
        ap.error(f"--phases: one or more of {', '.join(PHASES)}")
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    if args.modelled_device:
        return modelled(args, out)
    cuda = cuda_available()
    if args.model == "default":
        from rose_backend.config import ModelConfig
        folder, vocab = None, ModelConfig.from_folder(None).vocab_size
    else:
        from rose_testing.folders import make_folder
        folder = make_folder(args.model, Path(args.work) / "folders" / args.model, device="cuda" if cuda else "cpu")
        vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    result = {**run_record(args.git_commit, "cuda" if cuda else "cpu"),
              "settings": {k: v for k, v in vars(args).items() if k not in ("out", "work", "git_commit")},
              "variants": {}}
    for variant in filter(None, args.variants.split(";")):
        name = variant.split(":")[0]
        try:
            result["variants"][name] = one_variant(folder, variant, vocab, work, args)
        except Exception as e:
            result["variants"][name] = {"variant": variant, "error": f"{type(e).__name__}: {e}"}
        (out / "lanes.json").write_text(json.dumps(result, indent=1))
    print(table(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
