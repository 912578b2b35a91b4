"""EmbeddingClient: texts or token ids in, a float32 [n, D] array out, in input order.

One call is cut into chunks on a token budget (chunking.py); each chunk goes to the replica with
the fewest outstanding tokens, never past `max_inflight_tokens` per replica (a chunk waits at the
client instead, and goes to whichever replica frees up first); results are put back by position.

Failures, and why nothing is lost or duplicated: every chunk is one attempt at a time on one
replica, and its rows are written once, by the first attempt that succeeds.
- The stream to a replica breaks (server killed, network) or a chunk times out: the replica is
  marked down for a backoff (0.1 s doubling up to 5 s; its stream is closed so late answers cannot
  arrive) and the chunk goes to another replica. A down replica is tried again after its backoff.
- The server says it is overloaded ("... retry later"): the chunk is retried after a backoff.
- The server rejects the input (bad text, bad token id): the call raises ServerError at once,
  naming the input positions of the chunk.
- Every replica has failed `retries` times in a row: the call raises AllReplicasDown naming each
  replica and its last error.

    >>> client = EmbeddingClient("127.0.0.1:8001,127.0.0.1:8011", tokenizer="path/to/model")
    >>> client.embed(["what is rose?"], task="query").shape      # (1, 384)
"""
from __future__ import annotations

import asyncio
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from rose_client.chunking import TextTokenCounter, chunk_ranges, estimate_text_tokens
from rose_client.rerank import pair_chunks, ranked
from rose_client.transport import ServerError, StreamConnection


class AllReplicasDown(ConnectionError):
    """Every replica failed `retries` times in a row while a call still had chunks to place."""


def parse_urls(urls: str | list[str]) -> list[str]:
    if isinstance(urls, str):
        urls = urls.split(",")
    urls = [u.strip() for u in urls if u and u.strip()]
    if not urls:
        raise ValueError("give at least one server url, e.g. '127.0.0.1:8001'")
    if len(set(urls)) != len(urls):
        raise ValueError(f"a url is given twice: {urls}")
    return urls


@dataclass
class _Replica:
    url: str
    conn: StreamConnection | None = None
    inflight_tokens: int = 0          # tokens sent and not yet answered (all calls of this client)
    failures: int = 0                 # consecutive failures; 0 after any success
    down_until: float = 0.0
    last_error: str = ""
    tokens_done: int = 0              # stats: tokens / chunks answered successfully
    chunks_done: int = 0
    failures_total: int = 0

    def connection(self) -> StreamConnection:
        if self.conn is None or self.conn.broken is not None:
            self.conn = StreamConnection(self.url)
        return self.conn


@dataclass
class _Chunk:
    start: int                        # input positions [start, end)
    end: int
    tokens: int
    inputs: list
    attempts: int = 0
    not_before: float = 0.0
    result: np.ndarray | None = None
    failed_on: set = field(default_factory=set)


@dataclass(eq=False)
class _Attempt:
    chunk: _Chunk
    replica: _Replica
    conn: StreamConnection
    deadline: float
    released: bool = False            # its tokens no longer count against the replica
    abandoned: bool = False           # timed out: a late answer is ignored
    fut: Future | None = None


class EmbeddingClient:
    """Client of the `embed` ensemble (texts), the `rose` model (token ids) and, for a reranker
    deployment, the `rerank` ensemble (query + documents -> scores) over gRPC streams.

    urls: "host:port,host:port" or a list (one per replica). token_budget: tokens per chunk
    (default 2048). max_chunk_seqs: sequences per chunk. max_inflight_tokens: tokens outstanding per
    replica, over all calls of this client. tokenizer: a tokenizer.json or model folder for exact
    text token counts (else bytes/4 + 2, capped at max_text_tokens). timeout: seconds per call;
    chunk_timeout: seconds per chunk attempt. retries: consecutive failures of every replica before
    a call gives up. Thread-safe: any number of threads may call one client.
    """

    def __init__(self, urls: str | list[str], model: str = "embed", token_model: str = "rose",
                 rerank_model: str = "rerank", timeout: float = 300.0, token_budget: int = 2048, max_chunk_seqs: int = 512,
                 max_inflight_tokens: int = 32768, tokenizer: str | None = None,
                 max_text_tokens: int = 512, chunk_timeout: float = 120.0, retries: int = 4,
                 backoff: float = 0.1, max_backoff: float = 5.0, max_chunk_bytes: int = 16 << 20):
        self.urls = parse_urls(urls)
        self.model, self.token_model, self.timeout = model, token_model, timeout
        self.rerank_model = rerank_model
        self.token_budget, self.max_chunk_seqs = token_budget, max_chunk_seqs
        self.max_inflight_tokens, self.max_chunk_bytes = max_inflight_tokens, max_chunk_bytes
        self.chunk_timeout, self.retries = chunk_timeout, max(1, retries)
        self.backoff, self.max_backoff = backoff, max_backoff
        self.max_text_tokens = max_text_tokens
        self.counter = TextTokenCounter(tokenizer, None) if tokenizer else None
        self._replicas = [_Replica(u) for u in self.urls]
        self._lock = threading.Lock()
        self._waiters: set = set()
        self._closed = False
        for r in self._replicas:
            r.connection()

    # ----------------------------------------------------------------------------- public API
    def embed(self, texts: list[str], task: str | None = None) -> np.ndarray:
        """Embed texts; returns float32 [len(texts), D] in input order."""
        return self._run_sync(self.model, self._text_chunks(texts, task), len(texts))

    def embed_tokens(self, token_lists: list[list[int]]) -> np.ndarray:
        """Embed pre-tokenized sequences (with the model's special tokens); float32 [n, D]."""
        return self._run_sync(self.token_model, self._token_chunks(token_lists), len(token_lists))

    def rerank(self, query: str, documents: list[str], top_k: int | None = None,
               return_documents: bool = False, instruction: str | None = None):
        """Score each document against the query with a reranker deployment (`rerank`).

        Returns float32 [len(documents)] scores in document order; with top_k (or
        return_documents), a list of (index, score) -- (index, score, document) with
        return_documents -- best first, top_k long (all documents when top_k is None).
        Large lists are chunked and spread over the replicas like embed(). instruction: the task
        instruction of models that take one (Qwen3-Reranker)."""
        chunks = pair_chunks(self, query, documents, instruction, _Chunk)
        scores = self._run_sync(self.rerank_model, chunks, len(documents), "SCORES")[:, 0] if chunks \
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
        with self._lock:
            return {r.url: {"tokens": r.tokens_done, "chunks": r.chunks_done, "failures": r.failures_total,
                            "inflight_tokens": r.inflight_tokens, "down": r.down_until > time.monotonic()}
                    for r in self._replicas}

    def close(self):
        with self._lock:
            self._closed = True
            conns = [r.conn for r in self._replicas if r.conn is not None]
            for r in self._replicas:
                r.conn = None
        for c in conns:
            c.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ----------------------------------------------------------------------------- chunking
    def _text_chunks(self, texts, task) -> list[_Chunk]:
        if isinstance(texts, (str, bytes)):
            raise TypeError("embed() takes a list of texts; wrap a single text in a list")
        texts = list(texts)
        sizes = [len(t.encode("utf-8")) if isinstance(t, str) else len(t) for t in texts]
        costs = self.count_tokens(texts)
        extra = [("TASK", [task])] if task else []
        ranges = chunk_ranges(costs, self.token_budget, self.max_chunk_seqs, sizes, self.max_chunk_bytes) or [(0, 0)]
        return [_Chunk(s, e, sum(costs[s:e]), [("TEXT", texts[s:e])] + extra) for s, e in ranges]

    def _token_chunks(self, token_lists) -> list[_Chunk]:
        arrays = [np.asarray(t, dtype=np.int32).reshape(-1) for t in token_lists]
        lens = np.array([len(a) for a in arrays], dtype=np.int32)
        flat = np.concatenate(arrays) if arrays else np.zeros(0, np.int32)
        offs = np.concatenate([[0], np.cumsum(lens, dtype=np.int64)])
        ranges = chunk_ranges(lens.tolist(), self.token_budget, self.max_chunk_seqs) or [(0, 0)]
        return [_Chunk(s, e, int(offs[e] - offs[s]),
                       [("INPUT_IDS", flat[offs[s]:offs[e]]), ("SEQ_LENS", lens[s:e])]) for s, e in ranges]

    # ----------------------------------------------------------------------------- driving a call
    def _run_sync(self, model: str, chunks: list[_Chunk], n: int, output: str = "EMBEDDINGS") -> np.ndarray:
        event = threading.Event()
        job = _Job(self, model, chunks, n, event.set, output)
        try:
            while True:
                event.clear()
                wait = job.step()
                if wait is None:
                    return job.output()
                event.wait(wait)
        finally:
            job.finish()

    def _pick(self, chunk: _Chunk, now: float) -> _Replica | None:
        """The live replica with the fewest outstanding tokens that can take the chunk (caller holds the lock)."""
        live = [r for r in self._replicas if r.down_until <= now and (
            r.inflight_tokens == 0 or r.inflight_tokens + chunk.tokens <= self.max_inflight_tokens)]
        fresh = [r for r in live if r.url not in chunk.failed_on] or live
        if not fresh:
            return None
        return min(fresh, key=lambda r: (r.inflight_tokens, r.tokens_done))

    def _on_done(self, att: _Attempt, job: "_Job", _fut) -> None:
        with self._lock:
            if not att.released:
                att.released = True
                att.replica.inflight_tokens -= att.chunk.tokens
            waiters = list(self._waiters)
        job.done.put(att)
        for wake in waiters:              # capacity freed: every waiting call may place a chunk now
            wake()

    def _replica_failed(self, r: _Replica, conn: StreamConnection, error: str) -> StreamConnection | None:
        """Caller holds the lock. Counts one failure per broken connection, not per chunk on it, and
        returns the connection for the caller to close once it has let go of the lock (closing fails
        the chunks still pending on it, whose callbacks take the lock)."""
        if r.conn is not conn:
            return None                   # this connection was already counted and dropped
        r.failures += 1
        r.failures_total += 1
        r.last_error = error
        r.down_until = time.monotonic() + min(self.backoff * 2 ** (r.failures - 1), self.max_backoff)
        r.conn = None
        return conn


class _Job:
    """One call's chunks in flight. `step()` does all the work and returns how long to wait for the
    next event (None: finished); the sync and the asyncio client only differ in how they wait."""

    def __init__(self, client: EmbeddingClient, model: str, chunks: list[_Chunk], n: int, wake,
                 output: str = "EMBEDDINGS"):
        self.client, self.model, self.n, self.wake = client, model, n, wake
        self.output_name = output                        # EMBEDDINGS [n, D], or SCORES [n] (kept as [n, 1])
        self.todo: list[_Chunk] = list(chunks)           # waiting to be sent, in input order
        self.chunks = chunks
        self.inflight: set[_Attempt] = set()
        self.done: queue.SimpleQueue = queue.SimpleQueue()
        self.remaining = len(chunks)
        self.deadline = time.monotonic() + client.timeout
        with client._lock:
            if client._closed:
                raise RuntimeError("the client is closed")
            client._waiters.add(wake)

    def step(self) -> float | None:
        c = self.client
        while True:                                      # 1. answers that came in
            try:
                att = self.done.get_nowait()
            except queue.Empty:
                break
            self._handle(att)
        if self.remaining == 0:
            return None
        now = time.monotonic()
        if now > self.deadline:
            raise TimeoutError(f"embedding call timed out after {c.timeout:.0f} s with {self.remaining} of "
                               f"{len(self.chunks)} chunks unanswered ({self._replica_summary()})")
        to_close = []
        with c._lock:                                    # 2. attempts past their deadline
            for att in [a for a in self.inflight if now > a.deadline]:
                to_close.append(self._abandon(att, f"chunk timed out after {c.chunk_timeout:g} s"))
            sent = []
            for chunk in list(self.todo):                # 3. place what can go, in input order
                if chunk.not_before > now:
                    continue
                r = c._pick(chunk, now)
                if r is None:
                    break
                conn = r.connection()
                att = _Attempt(chunk, r, conn, now + c.chunk_timeout)
                r.inflight_tokens += chunk.tokens
                chunk.attempts += 1
                self.todo.remove(chunk)
                self.inflight.add(att)
                sent.append(att)
            if self.todo and all(r.failures >= c.retries for r in c._replicas):
                raise AllReplicasDown(f"all {len(c._replicas)} replicas are down: {self._replica_summary()}")
            wakes = [a.deadline for a in self.inflight] + [ch.not_before for ch in self.todo if ch.not_before > now]
            if self.todo:
                wakes += [r.down_until for r in c._replicas if r.down_until > now]
        for conn in to_close:                            # outside the lock: pending chunks fail over
            if conn is not None:
                conn.close(wait=False)
        for att in sent:                                 # outside the lock: callbacks may run inline
            att.fut = att.conn.infer(self.model, att.chunk.inputs)
            att.fut.add_done_callback(lambda f, a=att: c._on_done(a, self, f))
        if sent:
            return 0.0                                   # look at the queue again right away
        return max(0.0, min(wakes + [self.deadline]) - time.monotonic()) + 1e-3

    def _handle(self, att: _Attempt) -> None:
        c = self.client
        self.inflight.discard(att)
        if att.abandoned or att.chunk.result is not None:
            return                                        # a late answer of an abandoned attempt
        chunk, r = att.chunk, att.replica
        exc = att.fut.exception()
        if exc is None:
            out = att.fut.result()[self.output_name]
            if self.output_name == "SCORES" and out.ndim == 1:
                out = out[:, None]
            rows = chunk.end - chunk.start
            if out.ndim != 2 or out.shape[0] != rows:
                raise ServerError(f"{r.url}: answered {out.shape} for a chunk of {rows} inputs")
            chunk.result = out
            self.remaining -= 1
            with c._lock:
                r.failures = 0
                r.tokens_done += chunk.tokens
                r.chunks_done += 1
            return
        if isinstance(exc, ServerError) and not exc.retryable:
            raise ServerError(f"{exc} (inputs {chunk.start}..{chunk.end - 1} of this call)") from exc
        broken = None
        with c._lock:
            if isinstance(exc, ServerError):              # overloaded: back off, try again (anywhere)
                r.last_error = str(exc)
                chunk.not_before = time.monotonic() + min(c.backoff * 2 ** min(chunk.attempts, 10), c.max_backoff)
            else:                                         # ConnectionLost and anything else: replica failed
                broken = c._replica_failed(r, att.conn, str(exc))
                chunk.failed_on.add(r.url)
            self._requeue(chunk)
        if broken is not None:
            broken.close(wait=False)

    def _abandon(self, att: _Attempt, why: str) -> StreamConnection | None:
        """Caller holds the lock. Give up on an attempt; its chunk goes back to the queue.
        Returns the replica's connection to close (see _replica_failed)."""
        c = self.client
        att.abandoned = True
        self.inflight.discard(att)
        if not att.released:
            att.released = True
            att.replica.inflight_tokens -= att.chunk.tokens
        att.chunk.failed_on.add(att.replica.url)
        self._requeue(att.chunk)
        return c._replica_failed(att.replica, att.conn, f"{att.replica.url}: {why}")

    def _requeue(self, chunk: _Chunk) -> None:
        self.todo.append(chunk)
        self.todo.sort(key=lambda ch: ch.start)

    def _replica_summary(self) -> str:
        now = time.monotonic()
        return "; ".join(f"{r.url} ({'down: ' + r.last_error if r.down_until > now or r.failures else 'up'})"
                         for r in self.client._replicas)

    def output(self) -> np.ndarray:
        parts = [ch.result for ch in self.chunks]
        dims = {p.shape[1] for p in parts}
        if len(dims) > 1:
            raise ServerError(f"replicas answered with different embedding sizes {sorted(dims)}: "
                              f"are they serving the same model? ({', '.join(self.client.urls)})")
        out = np.concatenate(parts) if len(parts) > 1 else parts[0]
        return np.ascontiguousarray(out, dtype=np.float32)

    def finish(self) -> None:
        with self.client._lock:
            self.client._waiters.discard(self.wake)


class AsyncEmbeddingClient:
    """The asyncio twin of EmbeddingClient (same arguments, same chunking, balancing and failover).

    >>> async with AsyncEmbeddingClient("127.0.0.1:8001") as client:
    ...     emb = await client.embed(["hello"])
    """

    def __init__(self, urls: str | list[str], **kwargs):
        self.sync = EmbeddingClient(urls, **kwargs)
        self.urls = self.sync.urls

    async def embed(self, texts: list[str], task: str | None = None) -> np.ndarray:
        return await self._run(self.sync.model, self.sync._text_chunks(texts, task), len(texts))

    async def embed_tokens(self, token_lists: list[list[int]]) -> np.ndarray:
        return await self._run(self.sync.token_model, self.sync._token_chunks(token_lists), len(token_lists))

    async def rerank(self, query: str, documents: list[str], top_k: int | None = None,
                     return_documents: bool = False, instruction: str | None = None):
        """See EmbeddingClient.rerank."""
        chunks = pair_chunks(self.sync, query, documents, instruction, _Chunk)
        scores = (await self._run(self.sync.rerank_model, chunks, len(documents), "SCORES"))[:, 0] if chunks \
            else np.zeros(0, np.float32)
        return ranked(scores, list(documents), top_k, return_documents)

    def stats(self):
        return self.sync.stats()

    async def _run(self, model, chunks, n, output: str = "EMBEDDINGS") -> np.ndarray:
        loop = asyncio.get_running_loop()
        event = asyncio.Event()

        def wake():
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:          # the loop is closed: nobody is waiting any more
                pass

        job = _Job(self.sync, model, chunks, n, wake, output)
        try:
            while True:
                event.clear()
                wait = job.step()
                if wait is None:
                    return job.output()
                try:
                    await asyncio.wait_for(event.wait(), wait)
                except asyncio.TimeoutError:
                    pass
        finally:
            job.finish()

    async def close(self):
        await asyncio.get_running_loop().run_in_executor(None, self.sync.close)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()
