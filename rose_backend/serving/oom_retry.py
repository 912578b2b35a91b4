"""Out of memory in a forward pass: the batch run again in halves, each half split again while it
still does not fit (EmbeddingService's slow path, outcomes.py)."""
from __future__ import annotations

import logging

from rose_backend.serving.memory import free_device_cache
from rose_backend.serving.outcomes import is_out_of_memory

log = logging.getLogger(__name__)


def retry_in_halves(service, batch, error: BaseException) -> None:
    """The forward pass of `batch` ran out of memory. Collect the batches in flight (their
    memory comes back), then run the batch in halves, each half split again while it still
    does not fit, synchronously (a slow path); a single sequence that does not fit fails."""
    service.stats.oom_splits += 1
    log.warning("out of memory on a batch of %d sequences / %d tokens (%s); splitting it and retrying",
                batch.num_seqs, batch.num_tokens, error)
    while service.inflight:
        service.collect(block=True)
    todo = [batch]                        # a stack: halves are pushed second-first, so order holds
    while todo:
        b = todo.pop().live()
        if b is None:
            continue
        free_device_cache()
        try:
            handle = service.engine.step(b.pack())
            emb = handle.synchronize()                           # [S, D] float32
        except Exception as e:
            if is_out_of_memory(e) and b.num_seqs > 1:
                first, second = b.split()
                todo += [second, first]
                continue
            log.error("forward pass failed for %d sequences / %d tokens: %s", b.num_seqs, b.num_tokens, e)
            if is_out_of_memory(e):
                service.fail(b, f"out of memory embedding a single sequence of {b.num_tokens} tokens "
                              f"({type(e).__name__}); send it shorter")
            else:
                service.fail(b, f"the forward pass failed: {type(e).__name__}: {e}")
            continue
        service.stats.batches += 1
        service.stats.batch_tokens += b.num_tokens
        service.deliver(b, emb, getattr(handle, "extras", None))
