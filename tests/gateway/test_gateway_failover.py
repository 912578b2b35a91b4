"""The gateway in front of two real Triton replicas: one stopped, the other serves; both stopped, 503
with Retry-After (and /health 503); one back, it recovers. (`make serve`'s launcher starting and
stopping the gateway with the servers: tests/server/test_server.py.)"""
from __future__ import annotations

import signal
import time

import httpx
import pytest
from support.gateway import PROMPTS, gateway_for
from support.server import running_server

from rose_backend.launch.serve import start_gateway

pytestmark = pytest.mark.server


def embed(gw, text="failover"):
    return httpx.post(gw.url + "/v1/embeddings", json={"input": [text, text + " two"]}, timeout=60)


def wait_for_200(gw, timeout=60.0) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if embed(gw).status_code == 200:
            return time.monotonic() - t0
        time.sleep(0.2)
    raise AssertionError(f"the gateway did not recover within {timeout:.0f} s")


def stop_under_traffic(srv, gw, expect: set[int]) -> float:
    srv.proc.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    while srv.proc.poll() is None and time.monotonic() - t0 < 45:
        r = embed(gw)
        assert r.status_code in expect, r.text
        time.sleep(0.02)            # a steady stream of requests, not one that takes every core
    srv.stop()
    return time.monotonic() - t0


def test_replicas_down_then_back(minilm_shaped_dir):
    # minilm_shaped_dir: the requests under which the replicas stop cost a tenth of the CPU
    model = str(minilm_shaped_dir)
    with running_server(model, PROMPTS, name="gw-a") as a, running_server(model, PROMPTS, name="gw-b") as b, \
            gateway_for(f"{a.grpc_url},{b.grpc_url}", "failover") as gw:
        assert embed(gw).status_code == 200
        # one replica stopping (SIGTERM) under traffic: the other answers every request, and the
        # stopping one is let go (its stream closed), so it exits before its 30 s exit timeout
        leaving_s = stop_under_traffic(a, gw, expect={200})
        assert leaving_s < 25, f"replica a took {leaving_s:.1f} s to exit"
        for i in range(4):
            assert embed(gw, f"one down {i}").status_code == 200
        # the last replica stopping: what it still takes while it drains is answered, the rest is 503
        print(f"a left in {leaving_s:.1f} s; b in {stop_under_traffic(b, gw, expect={200, 503}):.1f} s")
        for _ in range(3):
            t0 = time.monotonic()
            r = embed(gw)
            assert r.status_code == 503, r.text
            assert r.headers["Retry-After"] == "1" and time.monotonic() - t0 < 10
            err = r.json()["error"]
            assert err["type"] == "service_unavailable" and "retry later" in err["message"]
            assert "Traceback" not in r.text
        health = httpx.get(gw.url + "/health", timeout=30)
        assert health.status_code == 503 and health.json()["status"] == "unavailable"
        assert httpx.get(gw.url + "/metrics").status_code == 200            # the gateway itself is fine
        # recovery
        b.start()                                              # one back, on the same ports
        b.wait_ready()
        print(f"recovered {wait_for_200(gw):.2f} s after the replica was ready")
        for _ in range(50):                                    # /health follows within a few seconds
            health = httpx.get(gw.url + "/health", timeout=30)
            if health.status_code == 200:
                break
            time.sleep(0.2)
        assert health.status_code == 200, health.text
        for i in range(4):
            assert embed(gw, f"one back {i}").status_code == 200
        metrics = httpx.get(gw.url + "/metrics").text
        assert 'rose_gateway_errors_total{endpoint="embeddings",status="503"}' in metrics


def test_gateway_port_0_starts_no_gateway():
    """GATEWAY=0. That the launcher starts and stops the gateway with its servers is checked with
    the rest of `make serve` (tests/server/test_server.py::test_launcher_serves_and_stops_on_sigterm)."""
    assert start_gateway(0, "127.0.0.1", None, "127.0.0.1:1") is None
