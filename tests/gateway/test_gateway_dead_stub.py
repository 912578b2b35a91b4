"""A replica whose `rose` stub died, with no launcher to end and restart it (a tritonserver run on
its own): Triton 2.51 answers every request for the model with "Stub process 'rose_0_0' is not
healthy." about a second later, and keeps saying READY. rose_client and the gateway take that answer
as a replica failure, never as bad input: the call goes to the other replica (the session's server,
the same deployment), and where there is none rose_client raises AllReplicasDown and the gateway
answers 503 with Retry-After. One private server (its stub is killed) and two small gateways."""
from __future__ import annotations

import os
import signal
import time

import httpx
import numpy as np
import pytest

from rose_client import AllReplicasDown, EmbeddingClient, ServerError, StreamConnection
from rose_gateway.errors import from_triton
from rose_testing.compare import cos_dist
from support import leftovers
from support.gateway import gateway_for
from support.ports import free_ports
from rose_backend.launch.tritonserver import ServerOptions
from support.server import LOG_DIR, TEST_EXIT_TIMEOUT_S, WORKER, TritonProcess, stop_in_background

TEXTS = ["a replica lost its stub", "the other one answers", "naïve café"]


@pytest.fixture(scope="module")
def broken(server, minilm_shaped_dir):
    """A server of the session server's own repository (the same deployment) whose rose stub was
    killed: Triton answers "not healthy"."""
    LOG_DIR.mkdir(exist_ok=True)
    srv = TritonProcess(str(minilm_shaped_dir), server.repository, free_ports(),
                        log_file=LOG_DIR / f"dead-stub-{WORKER}.log", env=dict(os.environ),
                        options=ServerOptions(exit_timeout=TEST_EXIT_TIMEOUT_S))
    try:
        srv.start().wait_ready(300)
        stub = next(p for p, c in leftovers.processes([srv.shm_prefix]).items()
                    if "triton_python_backend_stub" in c and "/rose/1/model.py" in c)
        os.kill(stub, signal.SIGKILL)
        time.sleep(0.5)
        conn = StreamConnection(srv.grpc_url)
        try:
            with pytest.raises(ServerError, match="Stub process 'rose_0_0' is not healthy") as e:
                conn.infer("embed", [("TEXT", TEXTS)]).result(60)
            assert e.value.server_leaving and e.value.retryable
        finally:
            conn.close()
        yield srv
    finally:
        stop_in_background([srv])


def test_triton_reports_the_broken_replica_ready(broken):
    """Why Triton's own readiness cannot be trusted for it (the launcher ends such a server:
    tests/launch/test_stub_recovery.py)."""
    from rose_backend.launch.child import http_status
    assert http_status(f"http://127.0.0.1:{broken.ports.http}/v2/models/rose/ready") == 200


def test_rose_client_leaves_the_broken_replica(broken, server, sentence_model):
    ref = sentence_model.encode(TEXTS)
    with EmbeddingClient([broken.grpc_url, server.grpc_url], retries=3, backoff=0.05) as client:
        for _ in range(6):
            assert cos_dist(client.embed(TEXTS), ref).max() <= 1e-4
        assert client.stats()[broken.grpc_url]["failures"] >= 1
    with EmbeddingClient(broken.grpc_url, retries=2, backoff=0.05) as alone, \
            pytest.raises(AllReplicasDown, match="not healthy"):
        alone.embed(TEXTS)


def test_the_gateway_answers_from_the_other_replica_or_503(broken, server, sentence_model):
    ref = sentence_model.encode(TEXTS)
    with gateway_for(f"{broken.grpc_url},{server.grpc_url}", "dead-stub-two", extra_args=["--workers", "1"]) as gw:
        for _ in range(6):
            r = httpx.post(gw.url + "/v1/embeddings", json={"input": TEXTS}, timeout=60)
            assert r.status_code == 200, r.text
            got = np.array([d["embedding"] for d in r.json()["data"]], np.float32)
            assert cos_dist(got, ref).max() <= 1e-4
    with gateway_for(broken.grpc_url, "dead-stub-one", extra_args=["--workers", "1"]) as gw:
        for _ in range(3):
            r = httpx.post(gw.url + "/v1/embeddings", json={"input": TEXTS}, timeout=60)
            assert r.status_code == 503 and r.headers["Retry-After"] == "1", r.text
            assert r.json()["error"]["type"] == "service_unavailable" and "not healthy" in r.text


def test_a_dead_stub_maps_to_503_not_400():
    urls = ["127.0.0.1:8001"]
    for message in ("127.0.0.1:8001: Stub process 'rose_0_0' is not healthy.",
                    "127.0.0.1:8001: in ensemble 'embed', Stub process 'tokenize_batched_0_0' is not healthy."):
        e = from_triton(ServerError(message), urls)
        assert (e.status, e.retry_after) == (503, 1) and "127.0.0.1" not in e.message, e.message
    assert from_triton(ServerError("rose: INPUT_IDS[0] = 30522 is outside the vocabulary"), urls).status == 400
