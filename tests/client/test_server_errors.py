"""How rose_client reads a server's error, on Triton 2.51's own messages: a replica that is stopping
(SIGTERM) or whose model's Python stub died hands its request to another replica; bad input is the
caller's and is not retried."""
from __future__ import annotations

import pytest

from rose_client.transport import AccessDenied, ServerError

LEAVING = [
    # an ensemble's scheduler once SIGTERM reached the server, before the models unload
    "in ensemble 'embed', [request id: 29] Server is stopping, scheduler for model has stopped accepting "
    "new inference requests",
    # the models unloaded
    "Request for unknown model: 'rose' has no available versions",
    # a model's Python stub died (python_backend r24.10), directly and through an ensemble
    "Stub process 'rose_0_0' is not healthy.",
    "in ensemble 'embed', Stub process 'tokenize_batched_0_1' is not healthy.",
    "Failed to process the request(s) for model instance 'tokenize_0_0', message: Stub process is not healthy.",
    "Failed to obtain the health mutex.",
]
REFUSED = ["rose: INPUT_IDS[0] = 30522 is outside the vocabulary",
           "rose: the request has 17 sequences; the limit is max_request_seqs=16"]


@pytest.mark.parametrize("message", LEAVING)
def test_a_stopping_server_is_left_for_another_replica(message):
    e = ServerError(f"127.0.0.1:8001: {message}")
    assert e.server_leaving and e.retryable


@pytest.mark.parametrize("message", REFUSED)
def test_bad_input_is_not_retried(message):
    e = ServerError(message)
    assert not e.server_leaving and not e.retryable


def test_overload_is_retried_without_leaving():
    e = ServerError("rose: overloaded: 9 tokens already queued; retry later")
    assert e.retryable and not e.server_leaving
    assert not AccessDenied("This protocol is restricted, expecting header 'authorization'").retryable
