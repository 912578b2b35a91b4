"""Each native family's bulk rate against sentence-transformers in-process on the same folder.

    python -m rose_bench families --out $OUT                       # GPU: one published-width shape per family
    python -m rose_bench families --shapes tiny-mpnet --batch 8 --length 64 --out /tmp/f   # CPU: the tool itself

Per shape (rose_testing/folders.py; random weights at the published model's width), one process:
a random-weight folder (made on the GPU), then the same `--batch` x `--length` texts of the folder's
WordLevel words (one token each) embedded `--reps` times, after a warm-up, by
- rose: the folder's tokenizer (the `tokenizers` library, as the gateway tokenizes) and the engine
  (bf16, CUDA graphs, two batches in flight), in this process;
- sentence-transformers: SentenceTransformer(folder).encode(texts, batch_size=--batch) in bf16.
Prints embeddings/s of each, their ratio and the largest 1 - cos between the two outputs (a check
that both run the same model), and writes <out>/families.json (command, git commit, machine, date).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from rose_bench.record import comma_list, cuda_available, log, run_record, save_json

# one published-width shape per native family file (models/<family>.py); qwen2 runs models/llama.py
DEFAULT_SHAPES = ("all-mpnet-base-v2", "distilbert-base", "gte-modernbert-base", "embeddinggemma-300m",
                  "gte-qwen2-1.5b", "llama-3.2-1b")


def texts_of(vocab: int, batch: int, length: int, seed: int = 0) -> list[str]:
    from rose_testing.folders import ids_to_text, random_ids
    rng = np.random.default_rng(seed)
    return [ids_to_text(random_ids(rng, vocab, length)) for _ in range(batch)]


def rose_rate(folder: Path, texts: list[str], reps: int, device: str) -> tuple[float, np.ndarray]:
    """Embeddings per second of tokenize + engine over `reps` batches (two in flight), and its output."""
    import torch
    from tokenizers import Tokenizer

    from rose_backend.config import ModelConfig
    from rose_backend.engine.batch import PackedBatch
    from rose_backend.engine.engine import Engine
    cfg = ModelConfig.from_folder(folder)
    engine = Engine(cfg, device)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(cfg.max_seq_length)

    def batch():
        return PackedBatch.of_lists([e.ids for e in tok.encode_batch(texts)])
    out = None
    for _ in range(3):                                   # eager, capture, replay
        out = engine.step(batch()).synchronize()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    inflight = []
    for _ in range(reps):
        inflight.append(engine.step(batch()))
        if len(inflight) == 2:
            out = inflight.pop(0).synchronize()
    for h in inflight:
        out = h.synchronize()
    return len(texts) * reps / (time.perf_counter() - t0), out


def st_rate(folder: Path, texts: list[str], reps: int, device: str) -> tuple[float, np.ndarray]:
    import torch
    from sentence_transformers import SentenceTransformer
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = SentenceTransformer(str(folder), device=device, model_kwargs={"torch_dtype": dtype})
    out = model.encode(texts, batch_size=len(texts), convert_to_numpy=True)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        out = model.encode(texts, batch_size=len(texts), convert_to_numpy=True)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return len(texts) * reps / (time.perf_counter() - t0), np.asarray(out, dtype=np.float32)


def one_shape(shape: str, args, work: Path, device: str) -> dict:
    from rose_testing.compare import cos_dist
    from rose_testing.folders import SHAPES, make_folder
    folder = make_folder(shape, work / shape, device=device)
    texts = texts_of(SHAPES[shape][0]["vocab_size"], args.batch, args.length)
    rose, rose_out = rose_rate(folder, texts, args.reps, device)
    st, st_out = st_rate(folder, texts, args.reps, device)
    return {"model_type": SHAPES[shape][0]["model_type"], "rose_emb_per_s": round(rose, 1),
            "sentence_transformers_emb_per_s": round(st, 1), "ratio": round(rose / st, 3),
            "max_cos_dist": float(cos_dist(rose_out, st_out).max())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rose_bench families", description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=",".join(DEFAULT_SHAPES))
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="/tmp/rose-families")
    ap.add_argument("--workdir", default="/tmp/rose-families-work")
    ap.add_argument("--git-commit")
    args = ap.parse_args(argv)
    device = "cuda" if cuda_available() else "cpu"
    out, work = Path(args.out), Path(args.workdir)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    path = out / "families.json"
    result = {**run_record(args.git_commit, device), "batch": args.batch, "length": args.length, "reps": args.reps,
              "shapes": {}}
    t_start = time.monotonic()
    for shape in comma_list(args.shapes):
        try:
            result["shapes"][shape] = one_shape(shape, args, work, device)
        except Exception as e:                       # recorded: the other shapes still run
            result["shapes"][shape] = {"error": f"{type(e).__name__}: {e}"}
        log(f"{shape}: {json.dumps(result['shapes'][shape])}")
        save_json(path, result, t_start)
    print("| shape | model_type | rose emb/s | sentence-transformers emb/s | rose / ST | max 1 - cos |")
    print("|---|---|---|---|---|---|")
    for shape, r in result["shapes"].items():
        if "error" in r:
            print(f"| {shape} | - | error: {r['error'][:80]} | | | |")
        else:
            print(f"| {shape} | {r['model_type']} | {r['rose_emb_per_s']} | {r['sentence_transformers_emb_per_s']} | "
                  f"{r['ratio']} | {r['max_cos_dist']:.1e} |")
    return 0
