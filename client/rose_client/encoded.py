"""What one call asks the server for (outputs, DIMENSIONS, ENCODING), and putting the answers of
its chunks back together.

    >>> r = client.encode(texts, sparse=True, colbert=True)
    >>> r.dense            # np.ndarray [n, D] (dtype per `encoding`)
    >>> r.sparse[0]        # {token id: weight} of the first input
    >>> r.colbert[0]       # np.ndarray [tokens - 1, Dc] float32 of the first input
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rose_client.transport import ServerError

ENCODINGS = ("float32", "float16", "int8", "uint8", "binary", "ubinary")
SPARSE = ("SPARSE_IDS", "SPARSE_WEIGHTS", "SPARSE_LENS")
COLBERT = ("COLBERT", "COLBERT_LENS")


@dataclass
class Encoded:
    """The result of EmbeddingClient.encode, in input order; what was not asked for is None."""
    dense: np.ndarray | None = None
    sparse: list[dict[int, float]] | None = None
    colbert: list[np.ndarray] | None = None


@dataclass(frozen=True)
class Ask:
    """One call's choice of outputs and options: the request's extra inputs and output names (the
    outputs beyond EMBEDDINGS go to the `encode` model, which sends what a request names: the
    `embed` ensemble sends EMBEDDINGS only; EmbeddingClient.text_model)."""
    dense: bool = True
    sparse: bool = False
    colbert: bool = False
    dimensions: int | None = None
    encoding: str = "float32"

    def __post_init__(self):
        if not (self.dense or self.sparse or self.colbert):
            raise ValueError("ask for at least one of dense, sparse and colbert")
        if self.encoding not in ENCODINGS:
            raise ValueError(f"encoding must be one of {', '.join(ENCODINGS)}, got {self.encoding!r}")
        if self.dimensions is not None and (not isinstance(self.dimensions, (int, np.integer)) or self.dimensions < 1):
            raise ValueError(f"dimensions must be a positive integer, got {self.dimensions!r}")

    @property
    def plain(self) -> bool:
        """Dense only with the defaults: the request an older server understands too."""
        return self.dense and not (self.sparse or self.colbert) and self.dimensions is None and self.encoding == "float32"

    def inputs(self) -> list[tuple[str, object]]:
        out = []
        if self.dimensions is not None:
            out.append(("DIMENSIONS", np.array([self.dimensions], dtype=np.int32)))
        if self.encoding != "float32":
            out.append(("ENCODING", [self.encoding]))
        return out

    def outputs(self) -> list[str]:
        return ((["EMBEDDINGS"] if self.dense else []) + (list(SPARSE) if self.sparse else [])
                + (list(COLBERT) if self.colbert else []))

    def parameters(self) -> dict[str, str] | None:
        return None                                  # the output names say it all

    def check(self, result: dict[str, np.ndarray], rows: int, where: str) -> None:
        """A chunk's answer holds what was asked for, one row / length per input."""
        missing = [n for n in self.outputs() if n not in result]
        if missing:
            raise ServerError(f"{where}: the answer lacks {', '.join(missing)} (does this server serve them?)")
        if self.dense and (result["EMBEDDINGS"].ndim != 2 or result["EMBEDDINGS"].shape[0] != rows):
            raise ServerError(f"{where}: answered {result['EMBEDDINGS'].shape} for a chunk of {rows} inputs")
        for lens in [n for n in ("SPARSE_LENS", "COLBERT_LENS") if n in result]:
            if result[lens].shape != (rows,):
                raise ServerError(f"{where}: {lens} has shape {result[lens].shape} for a chunk of {rows} inputs")

    def assemble(self, parts: list[dict[str, np.ndarray]], urls) -> Encoded:
        out = Encoded()
        if self.dense:
            out.dense = concat_dense([p["EMBEDDINGS"] for p in parts], urls)
        if self.sparse:
            out.sparse = []
            for p in parts:
                ends = np.cumsum(p["SPARSE_LENS"])
                for ids, w in zip(np.split(p["SPARSE_IDS"], ends[:-1]), np.split(p["SPARSE_WEIGHTS"], ends[:-1])):
                    out.sparse.append(dict(zip(ids.tolist(), w.tolist())))
        if self.colbert:
            out.colbert = []
            for p in parts:
                out.colbert += np.split(p["COLBERT"], np.cumsum(p["COLBERT_LENS"])[:-1])
        return out


def concat_dense(parts: list[np.ndarray], urls) -> np.ndarray:
    dims = {p.shape[1] for p in parts}
    if len(dims) > 1:
        raise ServerError(f"replicas answered with different embedding sizes {sorted(dims)}: "
                          f"are they serving the same model? ({', '.join(urls)})")
    out = np.concatenate(parts) if len(parts) > 1 else parts[0]
    return np.ascontiguousarray(out)
