"""Arrow tables of encode() results, for rose-embed's parquet output (needs pyarrow: the cli extra).

Columns: `row` int64; `embedding` fixed-size list of float32 (when dense); `sparse_ids` list of
int32 and `sparse_weights` list of float32 (when sparse: the input's token ids and their weights);
`colbert` list of fixed-size lists of float32 (when colbert: one vector per token but the first).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from rose_client.encoded import Encoded


def encoded_table(res: Encoded, first_row: int):
    import pyarrow as pa

    n = next(len(x) for x in (res.dense, res.sparse, res.colbert) if x is not None)
    cols = {"row": pa.array(np.arange(first_row, first_row + n, dtype=np.int64))}
    if res.dense is not None:
        dense = np.ascontiguousarray(res.dense, dtype=np.float32)
        cols["embedding"] = pa.FixedSizeListArray.from_arrays(pa.array(dense.reshape(-1)), dense.shape[1])
    if res.sparse is not None:
        cols["sparse_ids"] = pa.array([np.fromiter(d.keys(), np.int32, len(d)) for d in res.sparse],
                                      type=pa.list_(pa.int32()))
        cols["sparse_weights"] = pa.array([np.fromiter(d.values(), np.float32, len(d)) for d in res.sparse],
                                          type=pa.list_(pa.float32()))
    if res.colbert is not None:
        dc = res.colbert[0].shape[1]
        offsets = np.concatenate([[0], np.cumsum([len(c) for c in res.colbert])]).astype(np.int32)
        flat = np.ascontiguousarray(np.concatenate(res.colbert), dtype=np.float32).reshape(-1)
        cols["colbert"] = pa.ListArray.from_arrays(pa.array(offsets),
                                                   pa.FixedSizeListArray.from_arrays(pa.array(flat), dc))
    return pa.table(cols)


def write_part(path: Path, res: Encoded, first_row: int) -> int:
    """One block's table to `path` (written aside, then renamed); returns its rows."""
    import pyarrow.parquet as pq

    table = encoded_table(res, first_row)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)
    return table.num_rows


def join_parquet(parts, out: Path) -> int:
    """Concatenate parquet parts (same schema) into `out` (written aside, then renamed); returns the rows."""
    import pyarrow.parquet as pq

    rows, tmp = 0, out.with_name(out.name + ".tmp")
    with pq.ParquetWriter(tmp, pq.read_schema(parts[0])) as w:
        for p in parts:
            t = pq.read_table(p)
            w.write_table(t)
            rows += t.num_rows
    os.replace(tmp, out)
    return rows
