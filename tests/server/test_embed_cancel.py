"""A client that gives up: stop_stream(cancel_requests=True) with requests still queued.

On `rose` directly the queued requests see is_cancelled() and are dropped uncomputed. Through
`embed` only those not yet handed to `rose` are: Triton 2.51's ensemble scheduler passes a
cancellation on between steps (a step not started is not started, or starts cancelled), never to a
step already running, so a request waiting in rose's pool is computed in full (a Python `embed`
calling rose through BLS could not do better: the BLS response iterator has no cancel() before
the Python backend of r25.04). This test holds that limit to what docs/API.md says, and checks
that the server serves the next client normally."""
import queue
import time

import numpy as np
import tritonclient.grpc as grpcclient

from support.metrics import rose_metric, wait_for_backlog, wait_idle

REQUESTS, SEQS, WORDS = 24, 8, 400     # rose: 77k tokens; embed: 49k (texts cut at 256): seconds on a CPU


def give_up_on_a_backlog(server, model: str, all_in_rose: bool = False) -> tuple[float, float]:
    """Queue REQUESTS requests of SEQS sequences on one stream and cancel the stream once rose
    has a backlog of them, or (all_in_rose) once every request is tokenized and rose still has a
    backlog (the metrics are polled about once a second: the backlog must outlast that);
    (requests rose cancelled, sequences it computed), once the server is idle again."""
    wait_idle(server)
    cancelled0, seqs0 = rose_metric(server, "rose_requests_cancelled_total"), rose_metric(server, "rose_sequences_total")
    tokenized0 = rose_metric(server, "rose_tokenize_encoded_requests_total")
    c = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue = queue.Queue()
    c.start_stream(callback=lambda result, error: answers.put((result, error)))
    for i in range(REQUESTS):
        if model == "rose":
            ids = np.full(SEQS * (WORDS + 2), 2773 + i, np.int32)
            inputs = [grpcclient.InferInput("INPUT_IDS", [ids.size], "INT32"),
                      grpcclient.InferInput("SEQ_LENS", [SEQS], "INT32")]
            inputs[0].set_data_from_numpy(ids)
            inputs[1].set_data_from_numpy(np.full(SEQS, WORDS + 2, np.int32))
        else:
            inputs = [grpcclient.InferInput("TEXT", [SEQS], "BYTES")]
            inputs[0].set_data_from_numpy(np.array([(f"word{i} " * WORDS).encode()] * SEQS, dtype=object))
        c.async_stream_infer(model, inputs, request_id=str(i))
    # on rose, until half the requests wait in its pool (a poll can come before most have arrived)
    wait_for_backlog(server, min_tokens=REQUESTS // 2 * SEQS * (WORDS + 2) if model == "rose" else 1)
    deadline = time.monotonic() + 30
    while all_in_rose and (rose_metric(server, "rose_tokenize_encoded_requests_total") - tokenized0 < REQUESTS
                           or rose_metric(server, "rose_queue_tokens") == 0):
        assert time.monotonic() < deadline and not answers.qsize() == REQUESTS, "rose had no backlog left"
        time.sleep(0.05)
    c.stop_stream(cancel_requests=True)
    c.close()
    wait_idle(server)
    return (rose_metric(server, "rose_requests_cancelled_total") - cancelled0,
            rose_metric(server, "rose_sequences_total") - seqs0)


def test_a_cancelled_stream_on_rose_leaves_its_backlog_uncomputed(server):
    cancelled, computed = give_up_on_a_backlog(server, "rose")
    assert cancelled >= REQUESTS / 2, (cancelled, computed)
    # those answered, plus the parts of at most the two batches in flight when the stream went
    assert computed <= (REQUESTS - cancelled + 2) * SEQS


def test_embed_requests_already_in_rose_are_computed_and_the_server_serves_on(server, client):
    cancelled, computed = give_up_on_a_backlog(server, "embed", all_in_rose=True)
    # the documented limit: if this fails, Triton now cancels running ensemble steps (docs/API.md outdated)
    assert cancelled == 0 and computed == REQUESTS * SEQS, (cancelled, computed)
    assert client.embed(["the next client"]).shape == (1, 384)
