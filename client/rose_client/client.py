"""EmbeddingClient: texts or token ids in, a float32 [n, D] array out, in input order.

One call is cut into chunks on a token budget (chunking.py); each chunk goes to the replica with
the fewest outstanding tokens, never past `max_inflight_tokens` per replica (a chunk waits at the
client instead, and goes to whichever replica frees up first); results are put back by position.

Failures, and why nothing is lost or duplicated: every chunk is one attempt at a time on one
replica, and its rows are written once, by the first attempt that succeeds.
- The stream to a replica breaks (server killed, network) or a chunk times out (no answer from its
  replica for chunk_timeout seconds, counted from when it was sent or from the replica's last
  answer, whichever is later: a long queue that moves is no timeout): the replica is marked down
  for a backoff (0.1 s doubling up to 5 s; its channel is closed so late answers cannot arrive) and
  the chunk goes to another replica. A down replica is tried again after its backoff.
- The server says it is overloaded ("... retry later"): the chunk is retried after a backoff.
- The server says it is shutting down (the model "has no available versions"): as a broken stream,
  so the replica's stream is closed (tritonserver waits for open streams before it exits).
- The server rejects the input (bad text, bad token id): the call raises ServerError at once,
  naming the input positions of the chunk.
- Every replica has failed `retries` times in a row: the call raises AllReplicasDown naming each
  replica and its last error.
- The server refuses the API key: the call raises AccessDenied at once.

Each call has streams of its own (replica.py). A call that ends before all of its chunks are
answered (an error, a timeout, KeyboardInterrupt, or the asyncio task cancelled) sends nothing
more and cancels its streams: the server cancels the requests still pending on them (`rose`
drops their sequences not yet computed; Triton 2.51 passes a cancellation on through the `embed`
ensemble only before the request's `rose` step has started).

    >>> client = EmbeddingClient("127.0.0.1:8001,127.0.0.1:8011", tokenizer="path/to/model")
    >>> client.embed(["what is rose?"], task="query").shape      # (1, 384)
    >>> r = client.encode(texts, sparse=True, colbert=True)       # BGE-M3: r.dense, r.sparse, r.colbert
"""
from __future__ import annotations

import threading

import numpy as np

from rose_client.auth import grpc_api_key_headers
from rose_client.chunking import TextTokenCounter, chunk_ranges, estimate_text_tokens
from rose_client.dispatch import AllReplicasDown, Chunk, Job  # noqa: F401 (AllReplicasDown: raised from here)
from rose_client.encoded import Ask, Encoded
from rose_client.late_chunks import Counted, CountedAsk, LateChunksAsk, document_chunks
from rose_client.replica import ReplicaSet
from rose_client.rerank import SCORES, pair_chunks, ranked
from rose_client.token_requests import ragged_chunks, token_chunk_request


def parse_urls(urls: str | list[str]) -> list[str]:
    if isinstance(urls, str):
        urls = urls.split(",")
    urls = [u.strip() for u in urls if u and u.strip()]
    if not urls:
        raise ValueError("give at least one server url, e.g. '127.0.0.1:8001'")
    if len(set(urls)) != len(urls):
        raise ValueError(f"a url is given twice: {urls}")
    return urls


class EmbeddingClient:
    """Client of the `embed` ensemble (texts), the `encode` model (texts, when outputs beyond
    EMBEDDINGS are asked for: sparse, ColBERT, token counts), the `rose` model (token ids) and, for a
    reranker deployment, the `rerank` ensemble (query + documents -> scores) over gRPC streams.

    urls: "host:port,host:port" or a list (one per replica). token_budget: tokens per chunk
    (default 2048). max_chunk_seqs: sequences per chunk. max_inflight_tokens: tokens outstanding per
    replica, over all calls of this client. tokenizer: a tokenizer.json or model folder for exact
    text token counts (else bytes/4 + 2, capped at max_text_tokens). timeout: seconds per call
    (None: no bound); progress_timeout: seconds a call may go without any of its chunks answered
    (None: no bound); chunk_timeout: seconds a chunk may wait for its replica's next answer.
    retries: consecutive failures of every replica before a call gives up. api_key: sent on every
    request (gRPC metadata, rose_client.auth.grpc_api_key_headers) to a deployment that requires
    one; never logged nor put in an error. Thread-safe: any number of threads may call one client.
    channel_type: what the replicas' connections are (None: transport.Channel, threaded streams;
    aio_transport.AioChannel: grpc.aio streams of one event loop, what AsyncEmbeddingClient's
    asyncio_streams=True passes). on_rows(n): called, from the calling thread, each time a chunk of
    n inputs is answered.
    """

    def __init__(self, urls: str | list[str], model: str = "embed", token_model: str = "rose",
                 rerank_model: str = "rerank", outputs_model: str = "encode", timeout: float = 300.0, token_budget: int = 2048, max_chunk_seqs: int = 512,
                 max_inflight_tokens: int = 32768, tokenizer: str | None = None,
                 max_text_tokens: int = 512, chunk_timeout: float = 120.0, retries: int = 4,
                 backoff: float = 0.1, max_backoff: float = 5.0, max_chunk_bytes: int = 16 << 20,
                 api_key: str | None = None, progress_timeout: float | None = None, channel_type: type | None = None,
                 on_rows=None):
        self.urls = parse_urls(urls)
        self.on_rows = on_rows              # on_rows(n): a chunk of n inputs was answered (a progress bar)
        self.model, self.token_model, self.outputs_model = model, token_model, outputs_model
        self.timeout, self.progress_timeout = timeout, progress_timeout
        self.rerank_model = rerank_model
        self.token_budget, self.max_chunk_seqs = token_budget, max_chunk_seqs
        self.max_inflight_tokens, self.max_chunk_bytes = max_inflight_tokens, max_chunk_bytes
        self.chunk_timeout, self.retries = chunk_timeout, max(1, retries)
        self.backoff, self.max_backoff = backoff, max_backoff
        self.max_text_tokens = max_text_tokens
        self.counter = TextTokenCounter(tokenizer, None) if tokenizer else None
        self.pool = ReplicaSet(self.urls, grpc_api_key_headers(api_key), channel_type, max_inflight_tokens,
                               backoff, max_backoff)

    # ----------------------------------------------------------------------------- public API
    def embed(self, texts: list[str], task: str | None = None, dimensions: int | None = None,
              encoding: str = "float32", lane: str | None = None) -> np.ndarray:
        """Embed texts; returns [len(texts), D] in input order: float32, or what `encoding` says
        (float16, int8, uint8; binary / ubinary: int8 / uint8 [n, D / 8]). `dimensions`: keep the
        first d dimensions (Matryoshka; normalized again if the model normalizes). `lane`:
        "interactive" (scheduled before bulk work) or "bulk"; None: the server decides by size."""
        ask = Ask(dimensions=dimensions, encoding=encoding)
        return self._run_sync(self.model, self.text_chunks(texts, task, ask), len(texts), ask, lane).dense

    def encode(self, texts: list[str], dense: bool = True, sparse: bool = False, colbert: bool = False,
               dimensions: int | None = None, encoding: str = "float32", task: str | None = None,
               lane: str | None = None) -> Encoded:
        """Dense, sparse and / or ColBERT outputs of texts from one forward pass (BGE-M3's heads):
        .dense [n, D] (as embed), .sparse a {token id: weight} dict per input, .colbert a float32
        [tokens - 1, Dc] array per input. Chunked and balanced like embed."""
        ask = Ask(dense, sparse, colbert, dimensions, encoding)
        return self._run_sync(self.text_model(ask), self.text_chunks(texts, task, ask), len(texts), ask, lane)

    def embed_tokens(self, token_lists: list[list[int]], dimensions: int | None = None, encoding: str = "float32",
                     lane: str | None = None) -> np.ndarray:
        """Embed pre-tokenized sequences (with the model's special tokens); [n, D] as embed."""
        ask = Ask(dimensions=dimensions, encoding=encoding)
        return self._run_sync(self.token_model, self.token_chunks(token_lists, ask), len(token_lists), ask,
                              lane).dense

    def embed_ragged(self, input_ids: np.ndarray, seq_lens: np.ndarray, dimensions: int | None = None,
                     encoding: str = "float32", lane: str | None = None) -> np.ndarray:
        """embed_tokens for sequences already end to end: input_ids int32 [sum(seq_lens)], seq_lens [n]."""
        ask = Ask(dimensions=dimensions, encoding=encoding)
        return self._run_sync(self.token_model, ragged_chunks(self, input_ids, seq_lens, ask), len(seq_lens), ask,
                              lane).dense

    def embed_token_chunks(self, input_ids: np.ndarray, seq_lens: np.ndarray, token_chunks: np.ndarray,
                           dimensions: int | None = None, encoding: str = "float32",
                           lane: str | None = None) -> np.ndarray:
        """Late chunking of pre-tokenized documents in one `rose` request: token_chunks int32 [T]
        gives each token's chunk row (0..n-1) or -1 (rose_ensemble.late_chunks' plan); [n, D], one
        vector per chunk row."""
        ask = Ask(dimensions=dimensions, encoding=encoding)
        chunks = token_chunk_request(input_ids, seq_lens, token_chunks, ask)
        return self._run_sync(self.token_model, chunks, chunks[0].end, ask, lane).dense

    def embed_late_chunks(self, documents: list[list[str]], task: str | None = None, counts: bool = False,
                          lane: str | None = None) -> list[np.ndarray] | Counted:
        """Late chunking: each document given as its consecutive chunks (a list of strings, joined as
        given) runs through the model once; per document a float32 [n_chunks, D] array, each chunk's
        vector pooled over its own tokens in the whole document's forward pass (docs/API.md,
        "Late chunking"). counts=True: a Counted with each chunk's own token counts as well. Documents are
        never split over requests; several go in one while they fit the token budget."""
        ask = LateChunksAsk(documents, counts)
        return self._run_sync(self.text_model(ask), document_chunks(self, documents, task, Chunk), ask.n_chunks, ask,
                              lane)

    def embed_counted(self, texts: list[str], task: str | None = None, lane: str | None = None) -> Counted:
        """embed() with each text's tokens before truncation (prompt and special tokens included) and
        whether it was cut: Counted(vectors [n, D], token_counts int32 [n], truncated bool [n])."""
        ask = CountedAsk()
        return self._run_sync(self.text_model(ask), self.text_chunks(texts, task, Ask()), len(texts), ask, lane)

    def rerank(self, query: str, documents: list[str], top_k: int | None = None,
               return_documents: bool = False, instruction: str | None = None, lane: str | None = None):
        """Score each document against the query with a reranker deployment (`rerank`): float32
        [len(documents)] scores in document order, or with top_k (or return_documents) a list of
        (index, score) -- (index, score, document) with return_documents -- best first, top_k long
        (all documents when top_k is None). Large lists are chunked and spread over the replicas like
        embed(). instruction: the task instruction of models that take one (Qwen3-Reranker)."""
        chunks = pair_chunks(self, query, documents, instruction, Chunk)
        scores = self._run_sync(self.rerank_model, chunks, len(documents), SCORES, lane) if chunks \
            else np.zeros(0, np.float32)
        return ranked(scores, list(documents), top_k, return_documents)

    def count_tokens(self, texts: list[str]) -> list[int]:
        """Token counts used for chunking: exact with a tokenizer, else the bytes/4 + 2 estimate."""
        if self.counter is not None:
            return self.counter(texts)
        return [estimate_text_tokens(len(t.encode("utf-8")) if isinstance(t, str) else len(t),
                                     self.max_text_tokens) for t in texts]

    def stats(self) -> dict[str, dict[str, int]]:
        """Per replica: tokens and chunks answered, failures, tokens in flight now."""
        return self.pool.stats()

    def close(self) -> list:
        """Close every replica's connection; returns the channels closed."""
        channels = self.pool.close()
        for ch in channels:
            ch.close()
        return channels

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ----------------------------------------------------------------------------- chunking
    def text_model(self, ask) -> str:
        """The model for texts: `embed` (self.model) for EMBEDDINGS alone, else `encode`
        (self.outputs_model), where named outputs are sent: the `embed` ensemble sends EMBEDDINGS only."""
        return self.model if list(ask.outputs()) == ["EMBEDDINGS"] else self.outputs_model

    def text_chunks(self, texts, task, ask: Ask = Ask()) -> list[Chunk]:
        """A call's texts as chunks (the asyncio twin sends the same)."""
        if isinstance(texts, (str, bytes)):
            raise TypeError("embed() takes a list of texts; wrap a single text in a list")
        texts = list(texts)
        sizes = [len(t.encode("utf-8")) if isinstance(t, str) else len(t) for t in texts]
        costs = self.count_tokens(texts)
        extra = ([("TASK", [task])] if task else []) + ask.inputs()
        ranges = chunk_ranges(costs, self.token_budget, self.max_chunk_seqs, sizes, self.max_chunk_bytes) or [(0, 0)]
        return [Chunk(s, e, sum(costs[s:e]), [("TEXT", texts[s:e])] + extra) for s, e in ranges]

    def token_chunks(self, token_lists, ask: Ask = Ask()) -> list[Chunk]:
        """A call's token lists as chunks."""
        arrays = [np.asarray(t, dtype=np.int32).reshape(-1) for t in token_lists]
        lens = np.array([len(a) for a in arrays], dtype=np.int32)
        flat = np.concatenate(arrays) if arrays else np.zeros(0, np.int32)
        return ragged_chunks(self, flat, lens, ask)

    # ----------------------------------------------------------------------------- driving a call
    def _run_sync(self, model: str, chunks: list[Chunk], n: int, ask: Ask, lane: str | None = None) -> Encoded:
        event = threading.Event()
        job = Job(self, model, chunks, n, event.set, ask, lane)
        try:
            while True:
                event.clear()
                wait = job.step()
                if wait is None:
                    return job.output()
                event.wait(wait)
        finally:
            job.finish()
