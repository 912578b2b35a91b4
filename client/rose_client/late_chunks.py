"""Late chunking and token counts on the client side: requests of the `embed` ensemble (vectors
only) or of the `encode` model (with TOKEN_COUNTS and TRUNCATED, which it sends by name) and their answers.

    vectors = embed_late_chunks(conn, [["Paris is the capital. ", "It lies on the Seine."], ["One chunk."]])
    # one float32 [n_chunks, D] array per document, its chunks' vectors in order
    r = embed_late_chunks(conn, documents, task="passage", counts=True)
    # r.vectors as above; r.token_counts / r.truncated: one int32 / bool array per document

`conn` is anything with StreamConnection's infer(model, inputs, outputs, parameters) -> Future of
{name: array}. A document is its chunks joined exactly as given (no separator): the server embeds
it in one forward pass (windows of the model's maximum length for a long one) and pools each
chunk's own tokens, so every vector sees the whole document. A chunk with no token of its own
(an empty or blank one) is refused with an error naming it.

For an EmbeddingClient (balanced over replicas, retried), the Ask objects here plug into its Job
machinery as rerank.py's do: LateChunksAsk with document_chunks (whole documents per request,
never split), CountedAsk for plain texts with their TOKEN_COUNTS and TRUNCATED.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rose_client.chunking import chunk_ranges
from rose_client.transport import ServerError

COUNTS = ("TOKEN_COUNTS", "TRUNCATED")


@dataclass
class Counted:
    """Vectors with each input's tokens before truncation and whether it was cut. For late chunks:
    lists per document (a chunk's own tokens; never cut); for texts: arrays [n] in input order."""
    vectors: list | np.ndarray
    token_counts: list | np.ndarray
    truncated: list | np.ndarray


def _check(result: dict, rows: int, where: str, counts: bool) -> None:
    emb = result.get("EMBEDDINGS")
    if emb is None or emb.ndim != 2 or emb.shape[0] != rows:
        raise ServerError(f"{where}: answered {None if emb is None else emb.shape} embeddings for {rows} inputs")
    for name in COUNTS if counts else ():
        if name not in result:
            raise ServerError(f"{where}: the answer lacks {name} (does this server give token counts?)")
        if result[name].shape != (rows,):
            raise ServerError(f"{where}: {name} has shape {result[name].shape} for {rows} inputs")


class CountedAsk:
    """Plain texts' EMBEDDINGS with TOKEN_COUNTS and TRUNCATED (dispatch.Job's `ask`)."""

    def inputs(self) -> list:
        return []

    def outputs(self) -> list[str]:
        return ["EMBEDDINGS", *COUNTS]

    def parameters(self) -> None:
        return None                                  # the output names say it all (`encode`)

    def check(self, result: dict, rows: int, where: str) -> None:
        _check(result, rows, where, True)

    def assemble(self, parts: list[dict], urls) -> Counted:
        return Counted(*(np.concatenate([p[n] for p in parts]) for n in ("EMBEDDINGS", *COUNTS)))


class LateChunksAsk:
    """Documents' chunk vectors (and counts): parts come per request of whole documents, in order."""

    def __init__(self, documents: list[list[str]], counts: bool = False):
        self.doc_chunks = [len(d) for d in documents]
        self.counts = counts

    @property
    def n_chunks(self) -> int:
        return sum(self.doc_chunks)

    def inputs(self) -> list:
        return []

    def outputs(self) -> list[str]:
        return ["EMBEDDINGS", *(COUNTS if self.counts else ())]

    def parameters(self) -> None:
        return None                                  # the output names say it all (`encode` with counts)

    def check(self, result: dict, rows: int, where: str) -> None:
        _check(result, rows, where, self.counts)

    def assemble(self, parts: list[dict], urls) -> list[np.ndarray] | Counted:
        ends = np.cumsum(self.doc_chunks)[:-1]
        split = {n: np.split(np.concatenate([p[n] for p in parts]), ends) for n in self.outputs()}
        if not self.counts:
            return split["EMBEDDINGS"]
        return Counted(split["EMBEDDINGS"], split["TOKEN_COUNTS"], split["TRUNCATED"])


def check_documents(documents) -> list[list[str]]:
    if isinstance(documents, (str, bytes)) or any(isinstance(d, (str, bytes)) for d in documents):
        raise TypeError("late chunking takes a list of documents, each a list of its chunks")
    documents = [list(d) for d in documents]
    empty = [i for i, d in enumerate(documents) if not d]
    if empty:
        raise ValueError(f"document {empty[0]} has no chunks")
    return documents


def document_inputs(documents: list[list[str]], task: str | None = None) -> list[tuple[str, object]]:
    """The `embed` inputs of late-chunked documents: TEXT (every chunk, end to end), DOC_CHUNKS, TASK."""
    inputs = [("TEXT", [c for d in documents for c in d]),
              ("DOC_CHUNKS", np.array([len(d) for d in documents], dtype=np.int32))]
    return inputs + ([("TASK", [task])] if task else [])


def document_chunks(client, documents: list[list[str]], task: str | None, chunk_cls) -> list:
    """Requests of whole documents on the client's token budget (chunk positions count text chunks;
    a document is one forward pass, so it is never split over requests)."""
    documents = check_documents(documents)
    sizes = [sum(len(c.encode("utf-8")) for c in d) for d in documents]
    costs = [n // 4 + 2 for n in sizes]        # the bytes/4 + 2 estimate, uncapped: nothing is truncated
    ranges = chunk_ranges(costs, client.token_budget, client.max_chunk_seqs, sizes, client.max_chunk_bytes)
    first = np.concatenate([[0], np.cumsum([len(d) for d in documents])]).astype(int).tolist()
    return [chunk_cls(first[s], first[e], sum(costs[s:e]), document_inputs(documents[s:e], task)) for s, e in ranges]


def embed_late_chunks(conn, documents, task: str | None = None, counts: bool = False, model: str | None = None,
                      timeout: float | None = 300.0) -> list[np.ndarray] | Counted:
    """One request over `conn` (see the module docstring): per document its chunks' vectors, and
    with counts=True each chunk's own tokens and TRUNCATED (false: long documents run in windows).
    model None: `encode` with counts, else `embed`."""
    documents = check_documents(documents)
    ask = LateChunksAsk(documents, counts)
    model = model or ("encode" if counts else "embed")
    result = conn.infer(model, document_inputs(documents, task), ask.outputs(), ask.parameters()).result(timeout)
    ask.check(result, ask.n_chunks, model)
    return ask.assemble([result], None)


def embed_counted(conn, texts: list[str], task: str | None = None, model: str = "encode",
                  timeout: float | None = 300.0) -> Counted:
    """One request over `conn`: EMBEDDINGS [n, D] with each text's tokens before truncation
    (prompt and special tokens included) and whether it was cut."""
    texts = list(texts)
    ask = CountedAsk()
    inputs = [("TEXT", texts)] + ([("TASK", [task])] if task else [])
    result = conn.infer(model, inputs, ask.outputs(), ask.parameters()).result(timeout)
    ask.check(result, len(texts), model)
    return ask.assemble([result], None)
