"""The reranking side of the client: a query and its documents cut into chunks, scores ranked.

    chunks = pair_chunks(client, "what is rose?", documents)    # DOCUMENTS cut on the token budget
    ranked(scores, documents, top_k=3)                          # [(index, score), ...] best first

Each chunk is one `rerank` request: the query (and instruction) with a run of consecutive
documents; its cost is the query's tokens plus the document's, per document, so the chunks
balance over replicas like `embed`'s. The scores come back in document order.
"""
from __future__ import annotations

import numpy as np

from rose_client.chunking import chunk_ranges
from rose_client.transport import ServerError


class ScoresAsk:
    """What a `rerank` call asks for (dispatch.Job's `ask`): SCORES, one per document of a chunk."""

    def inputs(self) -> list:
        return []

    def outputs(self) -> list[str]:
        return ["SCORES"]

    def parameters(self) -> None:
        return None

    def check(self, result: dict[str, np.ndarray], rows: int, where: str) -> None:
        if "SCORES" not in result:
            raise ServerError(f"{where}: the answer lacks SCORES (is this server serving a reranker?)")
        if result["SCORES"].shape != (rows,):
            raise ServerError(f"{where}: answered {result['SCORES'].shape} scores for a chunk of {rows} documents")

    def assemble(self, parts: list[dict[str, np.ndarray]], urls) -> np.ndarray:
        """float32 [n] scores in document order."""
        return np.ascontiguousarray(np.concatenate([p["SCORES"] for p in parts]), dtype=np.float32)


SCORES = ScoresAsk()


def pair_chunks(client, query: str, documents: list[str], instruction: str | None, chunk_cls) -> list:
    if isinstance(documents, (str, bytes)):
        raise TypeError("rerank() takes a list of documents; wrap a single document in a list")
    if not isinstance(query, (str, bytes)):
        raise TypeError(f"rerank() takes one query string, got {type(query).__name__}")
    documents = list(documents)
    q_cost = client.count_tokens([query])[0]
    sizes = [len(d.encode("utf-8")) if isinstance(d, str) else len(d) for d in documents]
    costs = [q_cost + c for c in client.count_tokens(documents)] if documents else []
    extra = [("INSTRUCTION", [instruction])] if instruction else []
    ranges = chunk_ranges(costs, client.token_budget, client.max_chunk_seqs, sizes, client.max_chunk_bytes)
    return [chunk_cls(s, e, sum(costs[s:e]), [("QUERY", [query]), ("DOCUMENTS", documents[s:e])] + extra)
            for s, e in ranges]


def ranked(scores: np.ndarray, documents: list[str], top_k: int | None, return_documents: bool):
    """scores [n] in document order -> the form rerank() returns (see EmbeddingClient.rerank)."""
    scores = np.asarray(scores, dtype=np.float32).reshape(-1)
    if top_k is None and not return_documents:
        return scores
    if top_k is not None and top_k < 0:
        raise ValueError(f"top_k must be >= 0, got {top_k}")
    order = np.argsort(-scores, kind="stable")[: len(scores) if top_k is None else top_k]
    if return_documents:
        return [(int(i), float(scores[i]), documents[i]) for i in order]
    return [(int(i), float(scores[i])) for i in order]
