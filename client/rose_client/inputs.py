"""rose-embed's input side: the texts of a .txt, .jsonl or .parquet file, counted and read in order
(from a starting row, for --resume), cut into blocks."""
from __future__ import annotations

import json
from pathlib import Path

INPUTS = (".txt", ".jsonl", ".parquet")


class CliError(Exception):
    pass



def count_rows(path: Path, field: str) -> int:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq
        f = pq.ParquetFile(path)
        if field not in f.schema_arrow.names:
            raise CliError(f"{path} has no column {field!r} (columns: {f.schema_arrow.names}); use --field")
        return f.metadata.num_rows
    with open(path, "rb") as f:
        if path.suffix == ".txt":
            return sum(1 for _ in f)
        return sum(1 for line in f if line.strip())


def iter_texts(path: Path, field: str, start: int):
    """Texts from row `start` on, with clear errors naming the line / row."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq
        row = 0
        for batch in pq.ParquetFile(path).iter_batches(columns=[field], batch_size=8192):
            values = batch.column(0).to_pylist()
            for i in range(max(0, start - row), len(values)):
                yield _check(values[i], path, f"row {row + i}")
            row += len(values)
        return
    row = 0
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if path.suffix == ".txt":
                text = line.rstrip("\n").rstrip("\r")
                if row >= start and not text:
                    raise CliError(f"{path}:{lineno} is an empty line; every line of a .txt input is a text")
            else:
                if not line.strip():
                    continue
                if row >= start:
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise CliError(f"{path}:{lineno}: not valid JSON ({e})") from None
                    if not isinstance(obj, dict) or field not in obj:
                        raise CliError(f"{path}:{lineno}: no field {field!r}; use --field")
                    text = obj[field]
            if row >= start:
                yield _check(text, path, f"line {lineno}")
            row += 1


def _check(text, path, where):
    if not isinstance(text, str) or not text:
        raise CliError(f"{path} {where}: expected a non-empty string, got {text!r}")
    return text


def blocks(it, size: int):
    block = []
    for t in it:
        block.append(t)
        if len(block) == size:
            yield block
            block = []
    if block:
        yield block


# ------------------------------------------------------------------------------------ output
