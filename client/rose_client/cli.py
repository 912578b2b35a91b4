"""rose-embed: embed a file of texts in bulk through rose servers, resumably.

    rose-embed texts.txt out.npy --url 127.0.0.1:8001,127.0.0.1:8011
    rose-embed docs.jsonl out.parquet --field body --task passage
    rose-embed docs.parquet out.npy --field text --resume        # continue an interrupted run
    rose-embed docs.jsonl m3.parquet --sparse --colbert          # BGE-M3: + lexical weights, ColBERT

Input: .txt (one text a line, every line), .jsonl (one JSON object a line, the text in --field;
blank lines skipped), .parquet (column --field). Output: .npy (float32 [n, D]) or .parquet
(columns `row` int64 and `embedding` fixed-size list of float32), rows in input order.
--sparse / --colbert (BGE-M3's heads; .parquet output only) add the columns `sparse_ids`,
`sparse_weights` and `colbert` (rose_client/tables.py); --dense-off leaves the embedding out.

The work is cut into blocks of --block rows. Each finished block is written to
OUTPUT.partial/part-NNNNNN.npy (atomically: written aside, then renamed) beside a manifest; at the
end the parts are joined into OUTPUT and the .partial folder is removed. After an interruption
(Ctrl-C, a crash, a killed job), `--resume` checks the manifest against the input and options and
embeds only the blocks not yet written.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from collections import deque
import threading
from concurrent.futures import Future
from pathlib import Path

import numpy as np

from rose_client.auth import read_key_file, refuse_keys_on_the_command_line
from rose_client.client import EmbeddingClient
from rose_client.contract import BULK, LANES
from rose_client.env_vars import API_KEY, ROSE_URL
from rose_client.inputs import INPUTS, CliError, blocks, count_rows, iter_texts
from rose_client.tables import join_parquet, write_part

OUTPUTS = (".npy", ".parquet")


def in_background(fn, *args, **kwargs) -> Future:
    """fn(*args, **kwargs) on a daemon thread: an interrupted run exits at once instead of waiting
    (as a ThreadPoolExecutor's workers make the interpreter wait) for blocks whose rows it drops."""
    fut: Future = Future()

    def work():
        try:
            fut.set_result(fn(*args, **kwargs))
        except BaseException as e:          # noqa: BLE001 - handed to the waiting caller
            fut.set_exception(e)
    threading.Thread(target=work, name="rose-embed-block", daemon=True).start()
    return fut


def write_atomic(path: Path, data: bytes | np.ndarray) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        if isinstance(data, np.ndarray):
            np.save(f, data)
        else:
            f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def assemble(parts: list[Path], out: Path, n: int) -> int:
    first = np.load(parts[0], mmap_mode="r")
    dim = first.shape[1]
    tmp = out.with_name(out.name + ".tmp")
    if out.suffix == ".npy":
        dest = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(n, dim))
        row = 0
        for p in parts:
            a = np.load(p, mmap_mode="r")
            dest[row:row + len(a)] = a
            row += len(a)
        dest.flush()
        del dest
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq
        schema = pa.schema([("row", pa.int64()), ("embedding", pa.list_(pa.float32(), dim))])
        row = 0
        with pq.ParquetWriter(tmp, schema) as w:
            for p in parts:
                a = np.ascontiguousarray(np.load(p), dtype=np.float32)
                emb = pa.FixedSizeListArray.from_arrays(pa.array(a.reshape(-1)), dim)
                w.write_table(pa.table({"row": pa.array(np.arange(row, row + len(a), dtype=np.int64)),
                                        "embedding": emb}, schema=schema))
                row += len(a)
    if row != n:
        raise CliError(f"internal error: parts hold {row} rows, the input {n}")
    os.replace(tmp, out)
    return dim


# ------------------------------------------------------------------------------------ the run
def run(args) -> int:
    src, out = Path(args.input), Path(args.output)
    if src.suffix not in INPUTS:
        raise CliError(f"input must be one of {', '.join(INPUTS)}, got {src.name}")
    if out.suffix not in OUTPUTS:
        raise CliError(f"output must be one of {', '.join(OUTPUTS)}, got {out.name}")
    if not src.exists():
        raise CliError(f"{src} does not exist")
    if ".parquet" in (src.suffix, out.suffix):
        _require_pyarrow()                      # before any work, not after embedding everything
    rich, ext = _outputs(args)
    if rich and out.suffix != ".parquet":
        raise CliError("--sparse / --colbert / --dense-off write a .parquet output")
    if args.dense_off and not (args.sparse or args.colbert):
        raise CliError("--dense-off needs --sparse or --colbert")
    partial = out.with_name(out.name + ".partial")
    st = src.stat()
    manifest = {"input": str(src.resolve()), "input_bytes": st.st_size, "input_mtime_ns": st.st_mtime_ns,
                "field": args.field, "task": args.task, "model": args.model, "block": args.block,
                "dimensions": args.dimensions, "sparse": args.sparse, "colbert": args.colbert,
                "dense": not args.dense_off}
    if args.overwrite:
        shutil.rmtree(partial, ignore_errors=True)
        out.unlink(missing_ok=True)
    if out.exists():
        if args.resume and not partial.exists():
            print(f"rose-embed: {out} is already complete; nothing to do", file=sys.stderr)
            return 0
        raise CliError(f"{out} exists; pass --overwrite to replace it")

    done_blocks = 0
    if partial.exists():
        if not args.resume:
            raise CliError(f"an interrupted run left {partial}; pass --resume to continue it "
                           "or --overwrite to start over")
        old = json.loads((partial / "manifest.json").read_text())
        diff = {k: (old.get(k), v) for k, v in manifest.items() if k != "rows" and old.get(k) != v}
        if diff:
            raise CliError(f"cannot resume: the input or options changed since {partial} was written "
                           f"({', '.join(f'{k}: {a!r} -> {b!r}' for k, (a, b) in diff.items())}); "
                           "pass --overwrite to start over")
        while (partial / f"part-{done_blocks:06d}{ext}").exists():
            done_blocks += 1
    else:
        if args.resume:
            print(f"rose-embed: nothing to resume at {partial}; starting from the beginning", file=sys.stderr)
        partial.mkdir(parents=True)
    created = done_blocks == 0
    try:
        code = _embed_all(args, src, out, partial, manifest, done_blocks)
    except BaseException:
        _drop_if_empty(partial, created)
        raise
    if code:
        _drop_if_empty(partial, created)
    return code


def _api_key(args) -> str | None:
    """The deployment's key: --api-key-file, else $API_KEY (never a command-line value: `ps` shows those)."""
    if args.api_key_file:
        try:
            return read_key_file(args.api_key_file)
        except ValueError as e:
            raise CliError(str(e)) from None
    return API_KEY.get().strip() or None


def _require_pyarrow() -> None:
    try:
        import pyarrow  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise CliError("reading or writing .parquet needs pyarrow: pip install \"pyarrow>=14,<22\" "
                       "(or pip install \"<rose checkout>/client[cli]\")") from None


def _drop_if_empty(partial: Path, created: bool) -> None:
    """A run that made `partial` and finished no block leaves nothing behind (no --resume needed)."""
    if created and partial.exists() and not any(partial.glob("part-*.npy")):
        shutil.rmtree(partial, ignore_errors=True)


def _outputs(args) -> tuple[bool, str]:
    """(BGE-M3 outputs asked for, the parts' file suffix)."""
    rich = bool(args.sparse or args.colbert or args.dense_off)
    return rich, ".parquet" if rich else ".npy"


def _embed_all(args, src: Path, out: Path, partial: Path, manifest: dict, done_blocks: int) -> int:
    """Embed the blocks from `done_blocks` on into `partial`, then join them into `out`."""
    rich, ext = _outputs(args)
    n = count_rows(src, args.field)
    if n == 0:
        raise CliError(f"{src} holds no texts")
    manifest["rows"] = n
    write_atomic(partial / "manifest.json", json.dumps(manifest, indent=1).encode())
    start = min(done_blocks * args.block, n)
    if start:
        print(f"rose-embed: resuming at row {start} of {n}: {done_blocks} blocks already written "
              f"are not recomputed", file=sys.stderr)

    bar = _progress(n, start, args.quiet)            # moved by every chunk answered, not every block saved
    client = EmbeddingClient(args.url, model=args.model, tokenizer=args.tokenizer, timeout=args.timeout,
                             token_budget=args.token_budget, api_key=_api_key(args), on_rows=bar.update)
    t0, embedded = time.monotonic(), 0
    inflight: deque = deque()
    k = done_blocks

    def write_one(emb) -> None:
        nonlocal k, embedded
        if rich:
            done = write_part(partial / f"part-{k:06d}.parquet", emb, k * args.block)
        else:
            write_atomic(partial / f"part-{k:06d}.npy", emb.astype(np.float32, copy=False))
            done = len(emb)
        k += 1
        embedded += done

    try:
        for block in blocks(iter_texts(src, args.field, start), args.block):
            if rich:
                inflight.append(in_background(client.encode, block, dense=not args.dense_off, sparse=args.sparse,
                                            colbert=args.colbert, dimensions=args.dimensions, task=args.task,
                                               lane=args.lane))
            else:
                inflight.append(in_background(client.embed, block, args.task, dimensions=args.dimensions,
                                              lane=args.lane))
            if len(inflight) >= args.concurrency:
                write_one(inflight.popleft().result())
        while inflight:
            write_one(inflight.popleft().result())
    except KeyboardInterrupt:
        # keep every block already finished (in order: --resume counts parts from the first), drop the
        # rest without waiting for it: the client is closed, which ends its streams
        while inflight and inflight[0].done() and inflight[0].exception() is None:
            write_one(inflight.popleft().result())
        bar.close()
        if embedded + start:
            print(f"\nrose-embed: interrupted; {embedded + start} of {n} rows are saved in {partial}. "
                  f"Run the same command with --resume to continue.", file=sys.stderr)
        else:
            print("\nrose-embed: interrupted before any block was finished; nothing was saved.", file=sys.stderr)
        return 130
    except BaseException as e:
        if embedded + start and not isinstance(e, CliError):
            e.rows_saved = embedded + start          # main() says what is kept
        raise
    finally:
        client.close()
    bar.close()
    parts = sorted(partial.glob(f"part-*{ext}"))
    if rich:
        if join_parquet(parts, out) != n:
            raise CliError(f"internal error: parts do not hold the input's {n} rows")
        dim = "+".join(k for k, on in (("dense", not args.dense_off), ("sparse", args.sparse),
                                       ("colbert", args.colbert)) if on)
    else:
        dim = assemble(parts, out, n)
    shutil.rmtree(partial)
    dt = time.monotonic() - t0
    print(f"rose-embed: {n} embeddings ({dim}-dim) in {out}; {embedded} embedded in this run in {dt:.1f} s "
          f"({embedded / max(dt, 1e-9):.0f} embeddings/s)", file=sys.stderr)
    return 0


def _progress(total: int, initial: int, quiet: bool):
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is in the [cli] extra
        class _NoBar:
            def update(self, n):
                pass

            def close(self):
                pass
        return _NoBar()
    return tqdm(total=total, initial=initial, unit="emb", unit_scale=True, desc="rose-embed",
                disable=quiet, smoothing=0.1, dynamic_ncols=True)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rose-embed", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 2)[2], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", help="texts: .txt (a line each), .jsonl (--field) or .parquet (--field)")
    p.add_argument("output", help="embeddings: .npy or .parquet")
    p.add_argument("--url", default=ROSE_URL.get(),
                   help="comma-separated gRPC urls of the replicas (default $ROSE_URL or 127.0.0.1:8001)")
    p.add_argument("--field", default="text", help="JSON field / parquet column holding the text (default text)")
    p.add_argument("--task", default=None, help="task / prompt name, e.g. query or passage")
    p.add_argument("--model", default="embed", help="Triton model taking TEXT (default embed)")
    p.add_argument("--lane", choices=LANES, default=BULK,
                   help="scheduling lane (default bulk: queries sent beside this run are served first)")
    p.add_argument("--api-key-file", default=None,
                   help="file holding the deployment's API key (default: $API_KEY, if set)")
    refuse_keys_on_the_command_line(p, "set $API_KEY or pass --api-key-file PATH")
    p.add_argument("--tokenizer", default=None, help="tokenizer.json or model folder for exact token counts")
    p.add_argument("--block", type=int, default=2048, help="rows per saved block, the unit of resuming (default 2048)")
    p.add_argument("--concurrency", type=int, default=4, help="blocks in flight at once (default 4)")
    p.add_argument("--token-budget", type=int, default=2048, help="tokens per chunk sent to a replica (default 2048)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per block (default 600)")
    p.add_argument("--dimensions", type=int, default=None, help="keep the first d dimensions (Matryoshka)")
    p.add_argument("--sparse", action="store_true", help="also write BGE-M3's lexical weights (.parquet)")
    p.add_argument("--colbert", action="store_true", help="also write BGE-M3's ColBERT vectors (.parquet)")
    p.add_argument("--dense-off", action="store_true", help="leave the dense embedding out (with --sparse/--colbert)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run from OUTPUT.partial")
    p.add_argument("--overwrite", action="store_true", help="replace OUTPUT and any partial run")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    # Ctrl-C (SIGINT) stops a run keeping its finished blocks, also where the process was started with
    # SIGINT ignored (a shell's background job), which Python would otherwise keep ignoring
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    args = parser().parse_args(argv)
    if args.block < 1 or args.concurrency < 1:
        print("rose-embed: --block and --concurrency must be >= 1", file=sys.stderr)
        return 2
    try:
        return run(args)
    except CliError as e:
        print(f"rose-embed: {e}", file=sys.stderr)
        return 2
    except (ConnectionError, TimeoutError, RuntimeError) as e:
        saved = getattr(e, "rows_saved", 0)
        print(f"rose-embed: {type(e).__name__}: {e}\n" + (
            f"{saved} rows are saved in {args.output}.partial; run again with --resume to continue."
            if saved else "Nothing was saved."), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
