"""The cross-talk checker: many clients at once, each answer held against its own request's rows.

    requests = distinct_requests(seed=0, count=64, vocab=(1000, 30000))
    reference = reference_rows(engine, requests)                  # {sequence (tuple of ids): row}
    report = run_clients(embed, requests, clients=8)              # embed(list of id lists) -> [n, D]
    report.check(reference)                                       # AssertionError naming what went wrong
    client = ServiceClient(); client.service = EmbeddingService(engine, client.on_complete, ...)
    run_clients(client.embed, requests, clients=8)                # in-process, as the `rose` model calls it

Every request is a few sequences of distinct lengths and random ids, so no two requests share a
row: an answer that holds another request's row (cross-talk), a row out of order, a missing or an
extra row, or a client's exception is reported with the request it belongs to. What answers is any
callable (an EmbeddingService in-process, a real server through rose_client, the HTTP gateway).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np

Request = list[list[int]]            # the sequences of one request, as token id lists


def distinct_requests(seed: int, count: int, vocab: tuple[int, int], max_seqs: int = 3,
                      lengths: tuple[int, int] = (3, 60)) -> list[Request]:
    """`count` requests of 1..max_seqs sequences of random ids in [vocab[0], vocab[1]) and random
    lengths; every sequence differs from every other (a row can name the request it belongs to)."""
    rng = np.random.default_rng(seed)
    seen: set[tuple[int, ...]] = set()
    out = []
    for _ in range(count):
        req = []
        for _ in range(int(rng.integers(1, max_seqs + 1))):
            while True:
                seq = tuple(int(i) for i in rng.integers(*vocab, size=int(rng.integers(*lengths))))
                if seq not in seen:
                    break
            seen.add(seq)
            req.append(list(seq))
        out.append(req)
    return out


def reference_rows(embed_one, requests: list[Request]) -> dict[tuple[int, ...], np.ndarray]:
    """Each sequence's row from `embed_one(list of id lists) -> [n, D]`, called one sequence at a time
    (the reference: nothing else in its batch)."""
    return {tuple(s): np.asarray(embed_one([s]), dtype=np.float32)[0] for req in requests for s in req}


@dataclass
class Report:
    requests: list[Request]
    answers: dict[int, np.ndarray] = field(default_factory=dict)       # request index -> rows
    errors: dict[int, str] = field(default_factory=dict)               # request index -> what was raised

    def check(self, reference: dict[tuple[int, ...], np.ndarray], max_cos_dist: float = 1e-5) -> None:
        """Raise AssertionError listing every request answered wrongly (and whose rows it holds)."""
        keys = list(reference)
        table = np.stack([reference[k] for k in keys])
        table = table / np.linalg.norm(table, axis=1, keepdims=True)
        owner = {k: i for i, req in enumerate(self.requests) for k in map(tuple, req)}
        wrong = [f"request {i}: {e}" for i, e in sorted(self.errors.items())]
        for i, req in enumerate(self.requests):
            if i in self.errors:
                continue
            rows = self.answers.get(i)
            if rows is None or rows.shape[0] != len(req):
                wrong.append(f"request {i}: {len(req)} rows expected, got "
                             f"{'none' if rows is None else rows.shape[0]}")
                continue
            for j, seq in enumerate(req):
                row = rows[j] / max(float(np.linalg.norm(rows[j])), 1e-30)
                dists = 1.0 - table @ row
                if dists[keys.index(tuple(seq))] <= max_cos_dist:
                    continue
                nearest = keys[int(np.argmin(dists))]
                whose = owner.get(nearest)
                wrong.append(f"request {i} row {j}: 1 - cos {dists[keys.index(tuple(seq))]:.2e} to its own "
                             f"row; it is request {whose}'s row {self.requests[whose].index(list(nearest))} "
                             f"(1 - cos {dists.min():.2e})" if dists.min() <= max_cos_dist else
                             f"request {i} row {j}: 1 - cos {dists[keys.index(tuple(seq))]:.2e} to its own row")
        assert not wrong, f"{len(wrong)} of {len(self.requests)} requests answered wrongly:\n" + "\n".join(wrong[:20])


def run_clients(embed, requests: list[Request], clients: int, pause_s: float = 0.0) -> Report:
    """Send `requests` from `clients` threads at once (client c sends requests c, c + clients, ...,
    each `pause_s` after the previous answered), `embed` being called from each thread; the answers."""
    report = Report(requests)
    start = threading.Barrier(clients)

    def client(c: int) -> None:
        start.wait()
        for i in range(c, len(requests), clients):
            if pause_s and i >= clients:
                time.sleep(pause_s)
            try:
                report.answers[i] = np.asarray(embed(requests[i]), dtype=np.float32)
            except Exception as e:            # recorded: check() names it
                report.errors[i] = f"{type(e).__name__}: {e}"

    threads = [threading.Thread(target=client, args=(c,), name=f"cross-talk-{c}") for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return report


class ServiceClient:
    """Calls an EmbeddingService as the `rose` model does: a one-sequence request tries the lone path
    (run_lone), anything else is submitted and waited for. `on_complete` is the service's callback."""

    def __init__(self):
        self.service = None                      # the EmbeddingService, set once it is made
        self._answered: dict[int, threading.Event] = {}

    def on_complete(self, r) -> None:
        self._answered[id(r)].set()

    def embed(self, seqs: list[list[int]]) -> np.ndarray:
        ids = np.concatenate([np.asarray(s, np.int32) for s in seqs])
        if len(seqs) == 1:
            got = []
            if self.service.run_lone(ids, lambda row: got.append(row if isinstance(row, Exception) else row.copy())):
                if isinstance(got[0], Exception):
                    raise got[0]
                return got[0]
        from rose_backend.serving.scheduler import Request
        r = Request(ids, np.array([len(s) for s in seqs], np.int32))
        self._answered[id(r)] = done = threading.Event()
        self.service.submit(r)
        assert done.wait(60), "no answer within 60 s"
        if r.error:
            raise RuntimeError(r.error)
        return r.output
