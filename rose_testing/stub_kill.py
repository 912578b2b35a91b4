"""A Python stub killed (kill -9) under a steady load on a running deployment, and what its clients
saw: shared by tests/launch/test_stub_recovery.py (which asserts on it) and `rose_bench
stub-recovery` (which records it, on the CPU and on a GPU).

    work = Workload(texts, embeddings, big_texts, big_embeddings)          # references: sentence-transformers
    seen = kill_under_load(Target(grpc_url, http_url, gateway_url), pid, "rose", work, until=recovered)
    seen.inflight, seen.triton_unready_s, seen.first_correct_s, seen.wrong

While the stub is killed: a gRPC client (rose_client: `embed`, and `rerank` when the workload has a
reranker) and an HTTP client of the gateway call in a loop, and a probe reads Triton's
/v2/health/ready and the gateway's /health every 0.1 s. Just before the kill a burst of heavy requests,
some to the victim's own model, is sent, so that the stub dies with requests in flight. The victim
may also be the server itself ("tritonserver": its crash, which the launcher restarts the same way).
Every answer is checked against the references as it comes; times are seconds after the kill.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from rose_testing.compare import cos_dist

EMBED_GAP = 1e-4          # 1 - cos against sentence-transformers
SCORE_ATOL = 1e-4         # rerank scores against CrossEncoder


@dataclass
class Target:
    grpc_url: str
    triton_http: str                      # http://host:port of Triton's HTTP port
    gateway_url: str | None = None


@dataclass
class Workload:
    """The steady requests and the burst's, with their reference answers."""
    texts: list[str]
    embeddings: np.ndarray
    big_texts: list[str]
    big_embeddings: np.ndarray
    query: str | None = None              # a reranker is served: `rerank` too
    documents: list[str] | None = None
    scores: np.ndarray | None = None
    big_documents: list[str] | None = None
    big_scores: np.ndarray | None = None
    gap: float = EMBED_GAP                # largest 1 - cos accepted (a GPU's bf16 needs more than the CPU's float32)


@dataclass
class Answer:
    channel: str                          # "grpc embed", "grpc rerank", "http embeddings", "burst <model>"
    sent: float
    done: float
    error: str | None = None              # the failure, as the client saw it
    wrong: str | None = None              # an answer that is not the reference's, or an error that blames the caller


@dataclass
class Seen:
    """What the clients saw; times in seconds after the kill."""
    victim: str
    pid: int
    inflight: list[Answer] = field(default_factory=list)          # the burst
    answers: list[Answer] = field(default_factory=list)           # the steady clients
    probes: list[tuple[float, int, int]] = field(default_factory=list)   # (t, Triton ready, gateway /health)
    until_s: float | None = None                                  # when `until` held
    killed_at: float = 0.0                                        # time.monotonic() of the kill

    @property
    def wrong(self) -> list[str]:
        return [f"{a.channel} at {a.done:.2f} s: {a.wrong}" for a in self.inflight + self.answers if a.wrong]

    @property
    def inflight_errors(self) -> list[Answer]:
        return [a for a in self.inflight if a.error]

    def _first(self, col: int, ok: bool, after: float = 0.0) -> float | None:
        return next((p[0] for p in self.probes if p[0] >= after and (p[col] == 200) == ok), None)

    @property
    def triton_unready_s(self) -> float | None:
        return self._first(1, False)

    @property
    def gateway_unready_s(self) -> float | None:
        return self._first(2, False)

    @property
    def triton_ready_again_s(self) -> float | None:
        down = self.triton_unready_s
        return None if down is None else self._first(1, True, down)

    @property
    def gateway_ready_again_s(self) -> float | None:
        down = self.gateway_unready_s
        return None if down is None else self._first(2, True, down)

    @property
    def first_correct_s(self) -> float | None:
        """When the first correct answer came to a steady request sent once Triton was not ready."""
        down = self.triton_unready_s
        if down is None:
            return None
        return min((a.done for a in self.answers if a.sent >= down and not a.error and not a.wrong), default=None)

    def back(self, gateway: bool) -> bool:
        """Whether the clients have seen the deployment serve again: a correct answer and Triton (and
        the gateway) ready after being not ready."""
        return self.first_correct_s is not None and self.triton_ready_again_s is not None and \
            (not gateway or self.gateway_ready_again_s is not None)

    def outage(self) -> dict[str, int]:
        """How the steady clients' failures read: {"grpc embed: AllReplicasDown": n, "http embeddings: 503": n}."""
        return dict(Counter(f"{a.channel}: {a.error.split(':')[0]}" for a in self.answers if a.error))

    def summary(self) -> dict:
        errors = [a.done for a in self.inflight_errors]
        return {"victim": self.victim, "inflight": len(self.inflight), "inflight_errors": len(errors),
                "inflight_error_max_s": max(errors, default=None),
                "triton_unready_s": self.triton_unready_s, "gateway_unready_s": self.gateway_unready_s,
                "triton_ready_again_s": self.triton_ready_again_s, "gateway_ready_again_s": self.gateway_ready_again_s,
                "first_correct_s": self.first_correct_s, "launcher_line_s": self.until_s,
                "wrong": self.wrong, "outage": self.outage()}


def _check_embeddings(got: np.ndarray, ref: np.ndarray, limit: float = EMBED_GAP) -> str | None:
    if got.shape != ref.shape:
        return f"shape {got.shape}, expected {ref.shape}"
    gap = float(cos_dist(got, ref).max())
    return None if gap <= limit else f"1 - cos {gap:.2e} against sentence-transformers"


def _check_scores(got: np.ndarray, ref: np.ndarray) -> str | None:
    got = np.asarray(got, np.float32).reshape(-1)
    if got.shape != ref.shape:
        return f"{got.shape[0]} scores, expected {ref.shape[0]}"
    diff = float(np.abs(got - ref).max())
    return None if diff <= SCORE_ATOL else f"scores off by {diff:.2e} from CrossEncoder"


def _client_error(e: BaseException) -> tuple[str, str | None]:
    """(the error as the client saw it, what is wrong with it): a refusal that blames the caller is wrong."""
    from rose_client import ServerError
    text = f"{type(e).__name__}: {str(e)[:300]}"
    if isinstance(e, ServerError) and not e.retryable:
        return text, "the server's fault reported as bad input (not retryable)"
    return text, None


class _Steady:
    """The steady clients and the readiness probe, each in a thread, until stop()."""

    def __init__(self, target: Target, work: Workload, t0: Callable[[], float]):
        self.target, self.work, self.t0 = target, work, t0
        self.answers: list[Answer] = []
        self.probes: list[tuple[float, int, int]] = []
        self._stop = threading.Event()
        loops = [self._grpc, self._probe] + ([self._http] if target.gateway_url else [])
        self.threads = [threading.Thread(target=f, daemon=True, name=f"steady-{f.__name__}") for f in loops]

    def start(self) -> "_Steady":
        for t in self.threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self.threads:
            t.join(60)

    def _now(self) -> float:
        return time.monotonic() - self.t0()

    def _grpc(self) -> None:
        from rose_client import EmbeddingClient
        w = self.work
        calls = [("grpc embed", lambda c: _check_embeddings(c.embed(w.texts), w.embeddings, w.gap))]
        if w.query is not None:
            calls.append(("grpc rerank", lambda c: _check_scores(c.rerank(w.query, w.documents), w.scores)))
        with EmbeddingClient(self.target.grpc_url, retries=2, backoff=0.05, max_backoff=0.5, timeout=30,
                             chunk_timeout=10) as client:
            i = 0
            while not self._stop.is_set():
                name, call = calls[i % len(calls)]
                sent = self._now()
                try:
                    wrong, error = call(client), None
                except Exception as e:
                    error, wrong = _client_error(e)
                self.answers.append(Answer(name, sent, self._now(), error, wrong))
                i += 1
                self._stop.wait(0.05)

    def _http(self) -> None:
        import httpx
        url = self.target.gateway_url + "/v1/embeddings"
        with httpx.Client(timeout=30) as http:
            while not self._stop.is_set():
                sent = self._now()
                error = wrong = None
                try:
                    r = http.post(url, json={"input": self.work.texts})
                    if r.status_code == 200:
                        got = np.array([d["embedding"] for d in r.json()["data"]], np.float32)
                        wrong = _check_embeddings(got, self.work.embeddings, self.work.gap)
                    else:
                        error = f"{r.status_code}: {r.text[:200]}"
                        if r.status_code != 503 or not r.headers.get("Retry-After"):
                            wrong = f"HTTP {r.status_code} (Retry-After {r.headers.get('Retry-After')})"
                except httpx.HTTPError as e:
                    error, wrong = f"{type(e).__name__}: {e}", "the gateway did not answer"
                self.answers.append(Answer("http embeddings", sent, self._now(), error, wrong))
                self._stop.wait(0.05)

    def _probe(self) -> None:
        from rose_backend.launch.child import http_status
        while not self._stop.is_set():
            triton = http_status(self.target.triton_http + "/v2/health/ready", 1.0)
            gateway = http_status(self.target.gateway_url + "/health", 3.0) if self.target.gateway_url else 0
            self.probes.append((self._now(), triton, gateway))
            self._stop.wait(0.1)


def _burst(conn, victim: str, work: Workload, ids: dict) -> list[tuple[str, Future, Callable]]:
    """Heavy requests on one connection: `embed` ones (long in `rose`), and some to the victim's model
    (`tokenize`'s on the connection's second stream: StreamConnection's split_unary)."""
    def check(o):
        return _check_embeddings(o["EMBEDDINGS"], work.big_embeddings, work.gap)
    embed = ("embed", [("TEXT", work.big_texts)], None, check)
    own = {
        "rose": ("rose", [("INPUT_IDS", ids["INPUT_IDS"]), ("SEQ_LENS", ids["SEQ_LENS"])], ["EMBEDDINGS"], check),
        "tokenize": ("tokenize", [("TEXT", work.big_texts * 16)], None,
                     lambda o: None if np.array_equal(o["INPUT_IDS"], np.tile(ids["INPUT_IDS"], 16))
                     else "other token ids than before the kill"),
        "encode": ("encode", [("TEXT", work.big_texts)], ["EMBEDDINGS"], check),
    }
    if work.query is not None:
        rerank = ("rerank", [("QUERY", [work.query]), ("DOCUMENTS", work.big_documents)], None,
                  lambda o: _check_scores(o["SCORES"], work.big_scores))
        own["rerank_rose"] = own["rerank_tokenize"] = rerank
    requests = [embed] * 4 + [own.get(victim, embed)] * 4
    return [(f"burst {m}", conn.infer(m, inputs, outputs), check) for m, inputs, outputs, check in requests]


def kill_under_load(target: Target, pid: int, victim: str, work: Workload, until: Callable[[], bool],
                    timeout: float = 120.0, settle_s: float = 1.5, load_s: float = 1.0) -> Seen:
    """Run the steady load for load_s, send the burst, kill -9 `pid` (the stub of model `victim`, or
    the server itself where victim is "tritonserver"), keep the load on until `until()` holds (the
    deployment says it serves again) or timeout, then until the clients have seen it serve again
    (Seen.back), settle_s at most; what the clients saw."""
    from rose_client import ConnectionLost, ServerError, StreamConnection
    killed_at = [time.monotonic() + 3600.0]
    seen = Seen(victim, pid)
    conn = StreamConnection(target.grpc_url)
    try:
        tokens = conn.infer("tokenize", [("TEXT", work.big_texts)]).result(60)
        steady = _Steady(target, work, lambda: killed_at[0]).start()
        try:
            time.sleep(load_s)
            burst = _burst(conn, victim, work, tokens)
            done: dict[int, float] = {}
            for i, (_, fut, _) in enumerate(burst):
                fut.add_done_callback(lambda _f, i=i: done.setdefault(i, time.monotonic()))
            time.sleep(0.3)
            killed_at[0] = seen.killed_at = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            end = killed_at[0] + timeout
            while not until() and time.monotonic() < end:
                time.sleep(0.05)
            seen.until_s = time.monotonic() - killed_at[0] if until() else None
            settled = time.monotonic() + settle_s
            while time.monotonic() < settled and \
                    not Seen(victim, pid, answers=list(steady.answers), probes=list(steady.probes)).back(
                        bool(target.gateway_url)):
                time.sleep(0.05)
        finally:
            steady.stop()
        for i, (name, fut, check) in enumerate(burst):
            try:
                out = fut.result(max(0.0, end - time.monotonic()))
                error, wrong = None, check(out)
            except (ConnectionLost, ServerError) as e:
                error, wrong = _client_error(e)
            except Exception as e:
                error, wrong = f"{type(e).__name__}: {e}", "no clear error"
            t = done.get(i, time.monotonic()) - killed_at[0]
            seen.inflight.append(Answer(name, -0.3, t, error, wrong))
    finally:
        conn.close(wait=False)
    seen.answers, seen.probes = steady.answers, steady.probes
    return seen
