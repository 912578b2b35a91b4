"""Should rose swap Hugging Face `tokenizers` for a faster tokenizer.json reader? Parity and speed.

    python -m rose_bench tokenizers                       # full study, writes results/tokenizers/cpu.json
    python -m rose_bench tokenizers --quick               # small corpus, few rounds (a smoke run)

Three tokenizers: (1) WordPiece, the default model's own tokenizer.json (all-MiniLM-L6-v2:
BertNormalizer, BertPreTokenizer, [CLS] $A [SEP]); (2) byte-level BPE shaped like Qwen3's (NFC,
Qwen's split regex then ByteLevel, `$A <|endoftext|>`), and (3) Unigram shaped like XLM-R / BGE-M3's
(NFKC and runs of spaces folded, Metaspace, `<s> $A </s>`), both trained here with `tokenizers`' own
trainers on a seeded generated corpus; and (4, where sentencepiece and transformers are installed)
`unigram-spm`: a SentencePiece Unigram model converted by transformers' XLMRobertaConverter, the way
XLM-R's and BGE-M3's tokenizer.json were made (Precompiled charsmap normalizer). Every tokenizer.json is loaded without padding or truncation
(rose calls no_padding() and sets its own truncation).

The corpus (seeded): texts of 9, 128, 512 and 4,096 words drawn from text Python ships
(pydoc_data's topic help, the `this` module) and generated words: accented and decomposed Latin,
CJK, kana, Hangul, other scripts, emoji (ZWJ sequences, skin tones, flags), control and format
characters, special-token look-alikes, numbers; words joined by mixed whitespace; plus empty and
whitespace-only texts.

Parity: every candidate's ids against `tokenizers`' encode_batch(add_special_tokens=True), on every
text, untruncated and truncated at 512 tokens (where the candidate can truncate), batch and one text
at a time; mismatch counts and the first mismatch.
Speed (each in a child process, candidates interleaved in a shuffled order per round, each round's
time divided by the reference's in the same round; median and min-max over the rounds):
batch throughput per text length, single-threaded (RAYON_NUM_THREADS=1, TOKENIZERS_PARALLELISM=false)
and with the library's own parallelism (all cores); and one-text latency (a 9-word and a 128-word
text, microseconds per call). A candidate that is not installed, or cannot load a tokenizer, is
skipped with the reason in the table.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent.parent
if str(BENCH_DIR) not in sys.path:        # the speed worker runs this file as a script
    sys.path.insert(0, str(BENCH_DIR))

from rose_bench.record import log, run_record, save_json  # noqa: E402
from rose_bench.tokenizer_adapters import ADAPTERS, REFERENCE, Unsupported  # noqa: E402
from rose_bench.tokenizer_corpus import (  # noqa: E402
    CORPUS_COUNTS, LENGTHS, build_tokenizers, make_corpus, without_padding_or_truncation)
from rose_bench.tokenizer_parity import TRUNCATE, identical, parity  # noqa: E402

# texts per length in one timed batch call
BATCH_SIZES = {9: 1000, 128: 200, 512: 50, 4096: 12}


# ----------------------------------------------------------------------------------------------
# speed (a child process per thread setting)
# ----------------------------------------------------------------------------------------------

def _timed(fn, arg, inner: int) -> tuple[float, float]:
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(inner):
        fn(arg)
    wall = time.perf_counter() - t0
    return wall, (time.process_time() - c0) / wall if wall else 0.0


def interleaved(cands: dict, arg, inner: int, rounds: int, rng: random.Random) -> dict:
    """{name: {"s": [seconds per round], "cpu_per_wall": [...]}}: every round times each candidate
    `inner` times over `arg`, in a shuffled order."""
    times = {n: {"s": [], "cpu_per_wall": []} for n in cands}
    names = list(cands)
    for _ in range(rounds):
        rng.shuffle(names)
        for n in names:
            wall, cpu = _timed(cands[n], arg, inner)
            times[n]["s"].append(wall)
            times[n]["cpu_per_wall"].append(round(cpu, 2))
    return times


def ratio_stats(mine: list[float], ref: list[float]) -> dict:
    """Speed-up against the reference, per round (reference time / candidate time)."""
    r = sorted(b / a for a, b in zip(mine, ref))
    return {"median": round(statistics.median(r), 3), "min": round(r[0], 3), "max": round(r[-1], 3)}


def speed_worker(spec: dict) -> dict:
    """Runs in a child process under the thread setting chosen by its environment."""
    if spec.get("cpus"):            # before any library starts its threads: they see these cores only
        os.sched_setaffinity(0, spec["cpus"])
    corpus = json.loads(Path(spec["corpus"]).read_text(encoding="utf-8"))
    rng = random.Random(spec["seed"])
    target_s, rounds = spec["target_s"], spec["rounds"]
    out = {"env": {k: os.environ.get(k) for k in ("RAYON_NUM_THREADS", "TOKENIZERS_PARALLELISM")},
           "cpus": sorted(os.sched_getaffinity(0)), "loadavg_before": os.getloadavg(), "tokenizers": {}}
    for tname, path in spec["paths"].items():
        adapters = {}
        for a in ADAPTERS:
            try:
                adapters[a.name] = a(Path(path), None)
            except Unsupported:
                pass
        res = out["tokenizers"][tname] = {"batch": {}, "one": {}}
        for words in LENGTHS:
            texts = [c["text"] for c in corpus if c["words"] == words][:spec["batch_sizes"][str(words)]]
            if not texts:
                continue
            tokens = {n: sum(map(len, a.batch(texts))) for n, a in adapters.items()}     # also the warm-up
            wall, _ = _timed(adapters["tokenizers"].batch, texts, 1)
            inner = max(1, round(target_s / max(wall, 1e-6)))
            times = interleaved({n: a.batch for n, a in adapters.items()}, texts, inner, rounds, rng)
            cell = res["batch"][str(words)] = {"texts": len(texts), "inner": inner}
            for n, t in times.items():
                med = statistics.median(t["s"]) / inner
                cell[n] = {"texts_per_s": round(len(texts) / med, 1), "tokens_per_s": round(tokens[n] / med),
                           "vs_tokenizers": ratio_stats(t["s"], times["tokenizers"]["s"]),
                           "vs_tokenizers_fast": ratio_stats(t["s"], times["tokenizers-fast"]["s"]),
                           "cpu_per_wall": statistics.median(t["cpu_per_wall"]), "round_s": [round(x, 4) for x in t["s"]]}
            log(f"[{out['env']['RAYON_NUM_THREADS'] or 'all'} threads] {tname} {words} words: " + ", ".join(
                f"{n} x{c['vs_tokenizers']['median']}" for n, c in cell.items() if isinstance(c, dict)))
        for words in (9, 128):
            text = next(c["text"] for c in corpus if c["words"] == words)
            for a in adapters.values():
                a.one(text)
            wall, _ = _timed(adapters["tokenizers"].one, text, 20)
            inner = max(20, round(target_s / 2 / max(wall / 20, 1e-7)))
            times = interleaved({n: a.one for n, a in adapters.items()}, text, inner, rounds, rng)
            cell = res["one"][str(words)] = {"inner": inner}
            for n, t in times.items():
                cell[n] = {"us_per_call": round(statistics.median(t["s"]) / inner * 1e6, 2),
                           "vs_tokenizers": ratio_stats(t["s"], times["tokenizers"]["s"]),
                           "vs_tokenizers_fast": ratio_stats(t["s"], times["tokenizers-fast"]["s"])}
    out["loadavg_after"] = os.getloadavg()
    return out


def run_speed(work: Path, paths: dict[str, Path], corpus: list[dict], threads: int | None, args) -> dict:
    """speed_worker in a child process: threads=1 pins the process to one core (CPU affinity: some
    libraries start threads of their own whatever RAYON_NUM_THREADS says) and sets rayon's and
    tokenizers' switches; None leaves each library its own parallelism on all cores."""
    corpus_path = work / "corpus.json"
    if not corpus_path.exists():
        corpus_path.write_text(json.dumps(corpus, ensure_ascii=False), encoding="utf-8")
    spec = {"corpus": str(corpus_path), "paths": {k: str(v) for k, v in paths.items()}, "seed": args.seed,
            "rounds": args.rounds, "target_s": args.target_ms / 1e3,
            "batch_sizes": {str(k): max(1, v // (4 if args.quick else 1)) for k, v in BATCH_SIZES.items()},
            "cpus": sorted(os.sched_getaffinity(0))[:threads] if threads else None}
    spec_path = work / f"speed_{threads or 'all'}.json"
    spec_path.write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if k not in ("RAYON_NUM_THREADS", "TOKENIZERS_PARALLELISM")}
    if threads:
        env.update(RAYON_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")
    else:
        env["TOKENIZERS_PARALLELISM"] = "true"
    result_path = work / f"speed_{threads or 'all'}_result.json"
    subprocess.run([sys.executable, __file__, "--speed-worker", str(spec_path), str(result_path)], env=env, check=True)
    return json.loads(result_path.read_text())


# ----------------------------------------------------------------------------------------------
# report
# ----------------------------------------------------------------------------------------------

def decide(result: dict) -> dict:
    """Per tokenizer, the candidates that pass the rule: identical ids on every text (batch and one
    at a time, untruncated and truncated) AND at least 2x tokenizers' encode_batch (the median of
    every text length's cell, single-threaded and parallel)."""
    verdict = {}
    for tname, cands in result["parity"].items():
        verdict[tname] = {}
        for cname, entry in cands.items():
            if cname.startswith("_") or cname.startswith("tokenizers"):
                continue
            same = identical(entry)
            if same is None:
                verdict[tname][cname] = {"passes_rule": False, "why": "skipped: " + entry["skipped"]}
                continue
            speeds = [run["tokenizers"][tname]["batch"][w][cname]["vs_tokenizers"]["median"]
                      for run in result["speed"].values() for w in run["tokenizers"][tname]["batch"]
                      if cname in run["tokenizers"][tname]["batch"][w]]
            lowest = min(speeds) if speeds else None
            why = []
            if not same:
                worst = max((entry[m][k]["mismatches"], m, k) for m in ("plain", "truncated") if m in entry
                            for k in ("batch", "one"))
                why.append(f"ids differ on {worst[0]} of {entry['plain']['batch']['texts']} texts "
                           f"({'untruncated' if worst[1] == 'plain' else 'truncated'}, {worst[2]})")
            if lowest is None or lowest < 2:
                why.append(f"slowest batch cell {lowest}x tokenizers (< 2x)")
            verdict[tname][cname] = {"passes_rule": not why, "min_batch_speedup": lowest,
                                     "why": "; ".join(why) or f"identical ids; slowest batch cell {lowest}x"}
    return verdict


def fmt_parity(entry: dict) -> str:
    if "skipped" in entry:
        return "skip"
    cells = []
    for m in ("plain", "truncated"):
        if m in entry:
            cells.append(f"{entry[m]['batch']['mismatches']}/{entry[m]['one']['mismatches']}")
    return " ".join(cells)


def table(result: dict) -> str:
    lines = []
    names = [a.name for a in ADAPTERS if a is not REFERENCE]
    n_texts = result["corpus"]["texts"]
    lines.append(f"Parity: mismatching texts of {n_texts}, 'batch/one' untruncated then truncated at {TRUNCATE}")
    lines.append("")
    lines.append("| tokenizer | " + " | ".join(names) + " |")
    lines.append("|---|" + "---|" * len(names))
    for tname, cands in result["parity"].items():
        lines.append(f"| {tname} | " + " | ".join(fmt_parity(cands.get(n, {"skipped": "-"})) for n in names) + " |")
    lines.append("")
    skipped = {}
    for tname, c in result["parity"].items():
        for n, e in c.items():
            if not n.startswith("_") and "skipped" in e:
                skipped.setdefault((n, e["skipped"]), []).append(tname)
    for (n, why), tnames in sorted(skipped.items()):
        lines.append(f"  skip {n} ({', '.join(tnames)}): {why}")
    for label, run in result.get("speed", {}).items():
        lines.append("")
        load = [f"{x[0]:.1f}" if x else "?" for x in (run.get("loadavg_before"), run.get("loadavg_after"))]
        lines.append(f"Batch speed-up vs tokenizers encode_batch ({label}; cores {run.get('cpus')}, load average "
                     f"{load[0]} -> {load[1]}): median [min-max] over rounds; last column: tokenizers' tokens/s")
        lines.append("")
        lines.append("| tokenizer | words | " + " | ".join(names) + " | tokenizers tok/s |")
        lines.append("|---|---|" + "---|" * (len(names) + 1))
        for tname, res in run["tokenizers"].items():
            for w, cell in res["batch"].items():
                row = []
                for n in names:
                    c = cell.get(n)
                    row.append(f"{c['vs_tokenizers']['median']:.2f} [{c['vs_tokenizers']['min']:.2f}-"
                               f"{c['vs_tokenizers']['max']:.2f}]" if c else "skip")
                lines.append(f"| {tname} | {w} | " + " | ".join(row) + f" | {cell['tokenizers']['tokens_per_s']:,} |")
        lines.append("")
        lines.append(f"One text ({label}): us per call (speed-up vs tokenizers encode)")
        lines.append("")
        lines.append("| tokenizer | words | tokenizers | " + " | ".join(names) + " |")
        lines.append("|---|---|---|" + "---|" * len(names))
        for tname, res in run["tokenizers"].items():
            for w, cell in res["one"].items():
                row = [f"{cell[n]['us_per_call']:.1f} (x{cell[n]['vs_tokenizers']['median']:.2f})" if n in cell else "skip"
                       for n in names]
                lines.append(f"| {tname} | {w} | {cell['tokenizers']['us_per_call']:.1f} | " + " | ".join(row) + " |")
    if "decision" in result:
        lines.append("")
        lines.append("The rule (identical ids on every text, batch and one at a time, untruncated and truncated, AND "
                     ">= 2x tokenizers encode_batch, median, in every batch cell of both thread settings):")
        for tname, v in result["decision"].items():
            for cname, d in v.items():
                lines.append(f"  {tname:11s} {cname:14s} {'PASSES' if d['passes_rule'] else 'fails'}: {d['why']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rose_bench tokenizers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=BENCH_DIR / "results" / "tokenizers" / "cpu.json")
    p.add_argument("--seed", type=int, default=20261201)
    p.add_argument("--quick", action="store_true", help="a tenth of the corpus, 3 rounds, smaller tokenizers")
    p.add_argument("--rounds", type=int, default=None, help="timed rounds per cell (default 9; 3 with --quick)")
    p.add_argument("--target-ms", type=float, default=None, help="time per candidate per round (default 60)")
    p.add_argument("--no-speed", action="store_true", help="parity only")
    p.add_argument("--tokenizer", action="append", default=[], metavar="NAME=PATH",
                   help="also test this tokenizer.json (e.g. a real model's), under NAME; repeatable")
    p.add_argument("--git-commit", default=None)
    p.add_argument("--speed-worker", nargs=2, metavar=("SPEC", "RESULT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.speed_worker:
        spec, out = args.speed_worker
        Path(out).write_text(json.dumps(speed_worker(json.loads(Path(spec).read_text()))))
        return 0
    args.rounds = args.rounds or (3 if args.quick else 9)
    args.target_ms = args.target_ms or (20 if args.quick else 60)
    t_start = time.monotonic()
    counts = {w: max(2, n // 10) if args.quick else n for w, n in CORPUS_COUNTS.items()}
    result = run_record(args.git_commit, "cpu")
    result["versions"] = {a.module: a.version() for a in ADAPTERS}
    with tempfile.TemporaryDirectory(prefix="rose_tokenizers_bench_") as tmp:
        work = Path(tmp)
        corpus = make_corpus(args.seed, counts)
        result["corpus"] = {"seed": args.seed, "texts": len(corpus), "per_length": {str(k): v for k, v in counts.items()},
                            "empty_or_whitespace": sum(c["words"] == 0 for c in corpus),
                            "chars": sum(len(c["text"]) for c in corpus),
                            "sha256": hashlib.sha256(json.dumps(corpus, ensure_ascii=False).encode()).hexdigest()}
        log(f"corpus: {len(corpus)} texts, {result['corpus']['chars']:,} characters")
        paths = build_tokenizers(work, args.seed, 300 if args.quick else 3000,
                                 4000 if args.quick else 16000, 2000 if args.quick else 8000)
        for spec in args.tokenizer:
            name, _, path = spec.partition("=")
            paths[name] = without_padding_or_truncation(Path(path), work / f"{name}.json")
        result["tokenizer_files"] = {k: {"sha256": hashlib.sha256(v.read_bytes()).hexdigest(),
                                         "model": json.loads(v.read_text())["model"]["type"]} for k, v in paths.items()}
        result["parity"] = parity(paths, corpus)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        save_json(args.out, result, t_start)
        if not args.no_speed:
            result["speed"] = {}
            for label, threads in (("single-threaded", 1), ("library's own parallelism", None)):
                result["speed"][label] = run_speed(work, paths, corpus, threads, args)
                save_json(args.out, result, t_start)
            result["decision"] = decide(result)
    save_json(args.out, result, t_start)
    print(table(result))
    log(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
