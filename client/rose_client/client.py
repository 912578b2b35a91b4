"""EmbeddingClient: texts or token ids in, a float32 [n, D] array out, in input order."""
from __future__ import annotations

import numpy as np

from rose_client.transport import StreamConnection


def parse_urls(urls: str | list[str]) -> list[str]:
    if isinstance(urls, str):
        urls = urls.split(",")
    urls = [u.strip() for u in urls if u and u.strip()]
    if not urls:
        raise ValueError("give at least one server url, e.g. '127.0.0.1:8001'")
    return urls


class EmbeddingClient:
    """Client of the `embed` ensemble (texts) and the `rose` model (token ids) over gRPC streams.

    >>> client = EmbeddingClient("127.0.0.1:8001")
    >>> client.embed(["what is rose?"], task="query").shape      # (1, 384)
    """

    def __init__(self, urls: str | list[str], model: str = "embed", token_model: str = "rose",
                 timeout: float = 300.0):
        self.urls = parse_urls(urls)
        self.model, self.token_model, self.timeout = model, token_model, timeout
        self._conns = [StreamConnection(u) for u in self.urls]

    def _least_loaded(self) -> StreamConnection:
        live = [c for c in self._conns if c.broken is None] or self._conns
        return min(live, key=lambda c: c.outstanding)

    def embed(self, texts: list[str], task: str | None = None) -> np.ndarray:
        if isinstance(texts, str):
            raise TypeError("embed() takes a list of texts; wrap a single text in a list")
        inputs = [("TEXT", list(texts))]
        if task:
            inputs.append(("TASK", [task]))
        return self._least_loaded().infer(self.model, inputs).result(self.timeout)["EMBEDDINGS"]

    def embed_tokens(self, token_lists: list[list[int]]) -> np.ndarray:
        lens = np.array([len(t) for t in token_lists], dtype=np.int32)
        ids = np.concatenate([np.asarray(t, dtype=np.int32) for t in token_lists]) if len(lens) else np.zeros(0, np.int32)
        fut = self._least_loaded().infer(self.token_model, [("INPUT_IDS", ids), ("SEQ_LENS", lens)])
        return fut.result(self.timeout)["EMBEDDINGS"]

    def close(self):
        for c in self._conns:
            c.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
