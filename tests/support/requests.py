"""Requests as the tests build them: token ids for `rose` (gRPC inputs) and the serving core's
Request objects, random or filled, one way each."""
from __future__ import annotations

import numpy as np

from rose_backend.serving.scheduler import Request

LOW, HIGH = 1000, 30000          # ordinary word-piece ids of the default model's vocabulary


def random_ids(seed_or_rng, n: int, length: int, low: int = LOW, high: int = HIGH) -> tuple[np.ndarray, np.ndarray]:
    """n sequences of `length` random ids: (INPUT_IDS int32 [n * length], SEQ_LENS int32 [n])."""
    rng = np.random.default_rng(seed_or_rng)
    return rng.integers(low, high, size=n * length).astype(np.int32), np.full(n, length, np.int32)


def rose_inputs(seed: int, n: int, length: int) -> list[tuple[str, np.ndarray]]:
    """random_ids as the named inputs of a `rose` request (StreamConnection.infer)."""
    ids, lens = random_ids(seed, n, length)
    return [("INPUT_IDS", ids), ("SEQ_LENS", lens)]


def uniform_request(seed: int, n: int, length: int, lane: str | None = None) -> Request:
    """A serving Request of n random sequences of `length` tokens."""
    return Request(*random_ids(seed, n, length), lane=lane)


def random_request(rng, n: int, max_len: int = 60, high: int = 30522) -> Request:
    """A serving Request of n random sequences of 1 to max_len - 1 tokens."""
    lens = rng.integers(1, max_len, size=n).astype(np.int32)
    return Request(rng.integers(LOW, high, size=int(lens.sum())).astype(np.int32), lens)


def filled_request(*lens: int, tag=0, lane: str | None = None, fill: int | None = None) -> Request:
    """A Request with sequences of these lengths, every id `fill` (default: the tag where it is an
    int, else 0), handle=tag: for the batch former, which never looks at the ids' values."""
    lens_a = np.array(lens, dtype=np.int32)
    value = fill if fill is not None else tag if isinstance(tag, int) else 0
    return Request(np.full(int(lens_a.sum()), value, dtype=np.int32), lens_a, handle=tag, lane=lane)


def drain(scheduler, **kw) -> list:
    """Every batch the scheduler forms now, in order."""
    out = []
    while (b := scheduler.next_batch(**kw)) is not None:
        out.append(b)
    return out


def run_service(engine, requests, **kw):
    """An EmbeddingService on `engine` (kw: its settings) answering `requests`: (service, answered in order)."""
    from rose_backend.serving.service import EmbeddingService
    from rose_backend.serving.service_settings import ServiceSettings
    from rose_testing.waiting import wait_until
    done = []
    svc = EmbeddingService(engine, done.append, ServiceSettings(**kw))
    try:
        for r in requests:
            svc.submit(r)
        assert wait_until(lambda: len(done) == len(requests), 120)
    finally:
        svc.stop(10)
    return svc, done
