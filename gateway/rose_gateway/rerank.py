"""POST /v1/rerank in the Cohere / Jina / vLLM shape, against the `rerank` model's contract
(QUERY BYTES [1], DOCUMENTS BYTES [-1] -> SCORES FP32 [-1]).

    {"model": "...", "query": "what is rose?", "documents": ["...", {"text": "..."}],
     "top_n": 3, "return_documents": true, "lane": "interactive"}   <- lane: rose's extension
    -> {"id": "rerank-...", "model": "...", "results": [{"index": 2, "relevance_score": 0.91,
        "document": {"text": "..."}}, ...]}     (best first)

The call goes to the replicas in turn (one stream each, rose_client's StreamConnection): a replica
whose stream breaks is skipped for the next; a refused input answers 400 at once.
"""
from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass

import numpy as np

from rose_client import ServerError, StreamConnection
from rose_client.auth import grpc_api_key_headers
from rose_gateway.embeddings import lane_of, positive_int
from rose_gateway.errors import bad_request, from_triton, too_large


@dataclass(slots=True)
class RerankRequest:
    query: str
    documents: list[str]
    top_n: int | None
    return_documents: bool
    model: str | None
    lane: str | None = None


def parse_rerank_request(body: object, max_inputs: int) -> RerankRequest:
    if not isinstance(body, dict):
        raise bad_request("body", "the request body must be a JSON object")
    query = body.get("query")
    if not isinstance(query, str) or not query:
        raise bad_request("query", "'query' must be a non-empty string")
    docs = body.get("documents")
    if not isinstance(docs, list) or not docs:
        raise bad_request("documents", "'documents' must be a non-empty list of strings (or {\"text\": ...} objects)")
    if len(docs) > max_inputs:
        raise too_large("documents", f"'documents' has {len(docs)} items; this gateway takes at most {max_inputs}")
    texts = []
    for i, d in enumerate(docs):
        t = d.get("text") if isinstance(d, dict) else d
        if not isinstance(t, str) or not t:
            raise bad_request(f"documents[{i}]", f"documents[{i}] must be a non-empty string or {{\"text\": \"...\"}}")
        texts.append(t)
    top_n = positive_int(body.get("top_n", body.get("top_k")), "top_n")
    ret = body.get("return_documents", True)
    if not isinstance(ret, bool):
        raise bad_request("return_documents", "'return_documents' must be true or false")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("model", "'model' must be a string")
    return RerankRequest(query, texts, top_n, ret, model, lane_of(body))


class Reranker:
    def __init__(self, urls: list[str], timeout: float, retry_after: int, api_key: str | None = None):
        self.urls, self.timeout, self.retry_after = urls, timeout, retry_after
        self._headers = grpc_api_key_headers(api_key)
        self._conns: dict[str, StreamConnection] = {}
        self._next = 0

    async def scores(self, req: RerankRequest) -> np.ndarray:
        last: BaseException | None = None
        for k in range(len(self.urls)):
            url = self.urls[(self._next + k) % len(self.urls)]
            conn = self._conns.get(url)
            if conn is None or conn.broken is not None:
                conn = self._conns[url] = StreamConnection(url, headers=self._headers)
            fut = conn.infer("rerank", [("QUERY", [req.query]), ("DOCUMENTS", req.documents)],
                             parameters={"lane": req.lane} if req.lane else None)
            try:
                out = await asyncio.wait_for(asyncio.wrap_future(fut), self.timeout)
            except ServerError as e:
                if not e.retryable:
                    raise from_triton(e, self.urls, self.retry_after) from None
                if e.server_leaving:                       # let a stopping server exit
                    conn.close(wait=False)
                last = e
                continue
            except Exception as e:                          # broken stream, timeout: next replica
                last = e
                conn.close(wait=False)
                continue
            self._next = (self._next + k + 1) % len(self.urls)
            scores = out.get("SCORES")
            if scores is None or scores.reshape(-1).shape[0] != len(req.documents):
                raise from_triton(RuntimeError("the rerank model answered without one SCORES value per document"),
                                  self.urls)
            return scores.reshape(-1)
        raise from_triton(last or ConnectionError("no replica"), self.urls, self.retry_after)

    def close(self) -> None:
        for c in self._conns.values():
            c.close(wait=False)


def rerank_response(req: RerankRequest, scores: np.ndarray, model: str) -> dict:
    order = np.argsort(-scores, kind="stable")[: req.top_n or len(scores)]
    results = []
    for i in order.tolist():
        r = {"index": i, "relevance_score": float(scores[i])}
        if req.return_documents:
            r["document"] = {"text": req.documents[i]}
        results.append(r)
    return {"id": f"rerank-{uuid.uuid4().hex}", "object": "rerank", "model": model, "results": results}
