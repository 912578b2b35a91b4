"""How the service answers a request other than with its embeddings, and the service's counters.

Failure handling (the service keeps serving through all of these):
    overload      submit() raises Overloaded once `max_queued_tokens` are waiting (answer at once,
                  "retry later"; nothing queues without bound)
    cancellation  requests that waited in the pool are asked whether their caller is gone; a
                  cancelled request leaves the pool, its remaining sequences are never computed
                  and it gets its one FINAL response (an error) like every other request
    out of memory a batch whose forward pass runs out of memory is split in halves and retried,
                  down to single sequences; a single sequence that still fails gets an error
    other errors  the batch's requests get an error response
    shutdown      stop(timeout) finishes what was admitted; whatever is left when the time is up
                  gets an explicit "shutting down" error, so no request is left unanswered
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)


class Unavailable(RuntimeError):
    """The service cannot take this request now; the caller should retry later (or elsewhere)."""


class Overloaded(Unavailable):
    """The pool holds more queued tokens than allowed; the caller should retry later."""


class ShuttingDown(Unavailable):
    """The service is stopping and takes no new requests."""


CANCELLED = "the request was cancelled"
SHUTTING_DOWN = "the server is shutting down; retry later (on another server)"


def is_out_of_memory(e: BaseException) -> bool:
    """torch.cuda.OutOfMemoryError, or a RuntimeError saying so (other allocators, older torch)."""
    return type(e).__name__ == "OutOfMemoryError" or (isinstance(e, RuntimeError) and "out of memory" in str(e).lower())


@dataclass(slots=True)
class ServiceStats:
    requests: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    batches: int = 0
    batch_tokens: int = 0
    oom_splits: int = 0             # batches that ran out of memory and were split and retried
    whole_inline: int = 0           # lone requests launched, waited for and answered on the submitting thread
    lone: int = 0                   # one-sequence requests run whole by the engine's lone path (run_lone)


def drop_caller_objects(r) -> None:
    """The default release: the caller's objects (its response handle, its cancellation check) go as
    soon as the request is answered. Triton counts a request in flight until its sender and request
    are gone, and unloading the model at shutdown waits for that."""
    r.handle = r.is_cancelled = None


def abort_all(service, lock) -> None:
    """stop()'s time is up, with an EmbeddingService's `lock` held: what is in flight is collected
    (without the lock), and every request still waiting is answered SHUTTING_DOWN."""
    left = service.scheduler.waiting() + service.scheduler.take_cancelled()
    for r in left:
        service.scheduler.remove(r)
    lock.release()
    try:
        try:
            while service.running():
                service.collect(block=True)
        except Exception:
            log.exception("collecting a batch during shutdown failed")
        for r in left:
            if not r.finished:
                r.error, r.error_kind = SHUTTING_DOWN, "unavailable"
                service.done.finish(r)
    finally:
        lock.acquire()
