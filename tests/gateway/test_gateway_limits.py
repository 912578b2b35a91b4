"""The gateway's limits, over raw sockets on loopback against the real gateway process in front of
the session's tritonserver: the connection cap, header size and count, header and body deadlines,
malformed framing, the JSON content type, clients that go away (and the work they leave, which is
cancelled), integer ranges, the bound on work per request, and no internal address in any answer."""
from __future__ import annotations

import json
import os
import re
import socket
import struct
import time

import httpx
import pytest
from support.gateway import LOG_DIR, gateway_for
from support.raw_http import connect, read_response, request, roundtrip
from support.metrics import metric, rose_metric, wait_for_backlog, wait_idle

from support.ports import free_port

pytestmark = pytest.mark.server
HEADER_S, BODY_S, RATE = 2.0, 2.0, 1000
MAX_TOKENS = 40_000
CAP = 12
# one worker: the connection cap is per worker process, and this file counts it exactly
ARGS = ["--workers", "1", "--max-connections", str(CAP), "--header-timeout", str(HEADER_S),
        "--body-timeout", str(BODY_S), "--min-body-rate", str(RATE), "--max-request-tokens", str(MAX_TOKENS),
        "--timeout", "2"]
WORDS = "embedding server replica chunk token budget balance latency queue triton rose graph kernel batch".split()


@pytest.fixture(scope="module")
def gw(server):
    with gateway_for(server.grpc_url, "limits", extra_args=ARGS) as g:
        yield g


def embed(gw, payload) -> httpx.Response:
    return httpx.post(gw.url + "/v1/embeddings", json=payload, timeout=120)


def assert_serving(gw):
    r = embed(gw, {"input": "still serving"})
    assert r.status_code == 200, r.text


def texts(n: int, words: int = 200) -> list[str]:
    return [f"{i} " + " ".join(WORDS[(i + j) % len(WORDS)] for j in range(words)) for i in range(n)]


# --------------------------------------------------------------------------- connections
def test_connection_cap_answers_503_in_json_and_slow_heads_get_408(gw):
    held = []
    try:
        t0 = time.monotonic()
        for _ in range(CAP):                         # the cap: connections each stuck in its headers
            s = connect(gw)
            s.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: gw\r\n")
            held.append(s)
        time.sleep(0.2)
        for _ in range(20 - CAP):                    # 20 sockets in all: those over the cap get 503
            status, headers, body = roundtrip(gw, request("/v1/embeddings", b'{"input": "x"}'))
            assert status == 503, body
            assert body["error"]["code"] == "too_many_connections" and f"{CAP} connections" in body["error"]["message"]
            assert headers["content-type"] == "application/json" and headers["retry-after"] == "1"
        assert time.monotonic() - t0 < HEADER_S, "the test itself was too slow to hold the cap"
        for s in held:                               # unfinished headers: 408 once header_timeout is over
            status, _, body = read_response(s)
            assert status == 408 and "headers did not arrive" in json.loads(body)["error"]["message"]
            assert s.recv(100) == b""                # and closed
        waited = time.monotonic() - t0
        assert HEADER_S - 0.5 <= waited <= HEADER_S + 3, waited
    finally:
        for s in held:
            s.close()
    assert_serving(gw)
    assert metric(gw.url + "/metrics", "rose_gateway_requests_total", endpoint="connection", status="503") >= 20 - CAP


def test_at_the_cap_an_idle_keep_alive_connection_makes_room(gw):
    idle = connect(gw)
    held = []
    try:
        idle.sendall(request("/v1/embeddings", b'{"input": "keep me alive"}'))
        assert read_response(idle)[0] == 200            # now idle, kept alive
        for _ in range(CAP - 1):
            s = connect(gw)
            s.sendall(b"POST /v1/embeddings HTTP/1.1\r\n")
            held.append(s)
        time.sleep(0.2)
        status, _, _ = roundtrip(gw, request("/v1/embeddings", b'{"input": "new client"}'))
        assert status == 200
        assert idle.recv(100) == b""                    # the idle one was closed for it
    finally:
        idle.close()
        for s in held:
            s.close()


def test_a_silent_connection_is_closed(gw):
    with connect(gw) as s:
        t0 = time.monotonic()
        assert s.recv(100) == b""                        # closed without an answer: it asked nothing
        assert HEADER_S - 0.5 <= time.monotonic() - t0 <= HEADER_S + 3


def test_a_stalled_body_gets_408(gw):
    with connect(gw) as s:
        s.sendall(request("/v1/embeddings", headers={"Content-Length": "100"}) + b'{"input": "half')
        t0 = time.monotonic()
        status, _, body = read_response(s)
        waited = time.monotonic() - t0
        assert s.recv(100) == b""
    assert status == 408 and "body did not arrive in time" in json.loads(body)["error"]["message"]
    assert BODY_S - 0.5 <= waited <= BODY_S + 2.5, waited


def test_a_trickling_body_is_cut_off_with_408(gw):
    with connect(gw) as s:
        s.sendall(request("/v1/embeddings", headers={"Content-Length": "100"}))
        t0 = time.monotonic()
        s.settimeout(0.1)
        answer = b""
        for _ in range(100):                             # one byte per 100 ms: the body would take 10 s
            try:
                s.sendall(b" ")
            except OSError:
                break
            try:
                answer = s.recv(65536)
                break
            except socket.timeout:
                continue
        waited = time.monotonic() - t0
        s.settimeout(10)
        status = int(answer.split()[1])
        body = json.loads(answer.split(b"\r\n\r\n", 1)[1] or read_response(s)[2])
    assert status == 408 and "body did not arrive in time" in body["error"]["message"], body
    assert BODY_S - 0.5 <= waited <= BODY_S + 2.5, waited
    assert_serving(gw)


# --------------------------------------------------------------------------- headers and framing
@pytest.mark.parametrize("extra", [
    {f"X-H{i}": "v" for i in range(200)},                 # too many fields
    {"X-Big": "v" * 40_000},                             # one field too large
    {f"X-H{i}": "v" * 1000 for i in range(60)},           # together too large
], ids=["200 headers", "one 40 KB header", "60 headers of 1 KB"])
def test_headers_over_the_limits_get_431(gw, extra):
    status, _, body = roundtrip(gw, request("/v1/embeddings", b'{"input": "x"}', extra))
    assert status == 431 and body["error"]["code"] == "request_header_fields_too_large", body
    assert_serving(gw)


def test_a_huge_request_line_and_a_million_headers_are_refused_fast(gw):
    status, _, body = roundtrip(gw, b"GET /" + b"a" * 50_000 + b" HTTP/1.1\r\nHost: gw\r\n\r\n")
    assert status == 431 and "request line" in body["error"]["message"]
    with connect(gw) as s:                               # the 3,000,000-header flood: cut off at 100
        t0 = time.monotonic()
        s.sendall(b"POST /v1/embeddings HTTP/1.1\r\n")
        try:
            for _ in range(30):
                s.sendall(b"".join(b"X-%d: v\r\n" % i for i in range(10_000)))
        except OSError:
            pass                                         # the gateway answered and stopped reading
        status, _, body = read_response(s)
    assert status == 431 and "100 header fields" in json.loads(body)["error"]["message"]
    assert time.monotonic() - t0 < 5
    assert_serving(gw)


@pytest.mark.parametrize("head,words", [
    (b"POST /v1/embeddings HTTP/1.1\r\nHost: gw\r\nContent-Length: abc\r\n\r\n", "Content-Length"),
    (b"POST /v1/embeddings HTTP/1.1\r\nHost: gw\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
     "Transfer-Encoding"),
    (b"GE T / HTTP/1.1\r\n\r\n", "method"),
])
def test_malformed_framing_gets_400_in_json(gw, head, words):
    status, headers, body = roundtrip(gw, head)
    assert status == 400 and headers["content-type"] == "application/json"
    assert body["error"]["code"] == "invalid_http" and words in body["error"]["message"], body
    assert_serving(gw)


def test_an_upgrade_request_is_answered_over_http_1_1_and_closed(gw):
    """curl --http2 on http:// asks to switch to h2c. The gateway does not switch: a request without a
    body is answered in HTTP/1.1 and the connection closed (the parser stops at an upgrade; left
    open, it would never time out); one with a body, which the parser would lose, gets a clear 400."""
    upgrade = {"Connection": "Upgrade, HTTP2-Settings", "Upgrade": "h2c", "HTTP2-Settings": "AAMAAABkAAQAoAAA"}
    with connect(gw) as s:
        s.sendall(request("/health", headers=upgrade, method="GET"))
        status, _, body = read_response(s)
        assert status == 200 and json.loads(body)["status"] == "ready", body
        s.sendall(request("/health", method="GET"))
        try:                         # closed: an orderly end, or a reset when the second request
            rest = s.recv(100)       # reached the gateway after its close
        except ConnectionResetError:
            rest = b""
        assert rest == b"", rest     # the second request is never served on that connection
    status, _, body = roundtrip(gw, request("/v1/embeddings", b'{"input": "x"}', upgrade))
    assert status == 400 and body["error"]["code"] == "upgrade_not_supported" and "Upgrade" in body["error"]["message"]
    assert_serving(gw)


@pytest.mark.parametrize("ctype", [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data"])
def test_post_needs_a_json_content_type(gw, ctype):
    headers = {"Content-Type": ctype} if ctype else {}
    r = httpx.post(gw.url + "/v1/embeddings", content=b'{"input": "x"}', headers=headers)
    assert r.status_code == 415, r.text
    err = r.json()["error"]
    assert err["param"] == "Content-Type" and "application/json" in err["message"]
    ok = httpx.post(gw.url + "/v1/embeddings", content=b'{"input": "x"}',
                    headers={"Content-Type": "application/json; charset=utf-8"})
    assert ok.status_code == 200


# --------------------------------------------------------------------------- clients that go away
def reset(s: socket.socket) -> None:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))   # close with RST
    s.close()


def test_a_client_reset_is_counted_as_499_not_an_error(gw, server):
    log = LOG_DIR / "gateway-limits.log"
    before = metric(gw.url + "/metrics", "rose_gateway_requests_total", endpoint="embeddings", status="499")
    s = connect(gw)                                      # reset while sending the body
    s.sendall(request("/v1/embeddings", headers={"Content-Length": "1000"}) + b'{"input": "')
    time.sleep(0.3)
    reset(s)
    s = connect(gw)                                      # reset while waiting for the answer
    s.sendall(request("/v1/embeddings", json.dumps({"input": texts(64)}).encode()))
    time.sleep(0.5)
    reset(s)
    deadline = time.monotonic() + 10
    while metric(gw.url + "/metrics", "rose_gateway_requests_total",
                 endpoint="embeddings", status="499") < before + 2:
        assert time.monotonic() < deadline, "the resets were not counted as 499"
        time.sleep(0.1)
    assert metric(gw.url + "/metrics", "rose_gateway_requests_total", endpoint="embeddings", status="500") == 0
    text = log.read_text()
    assert "Traceback" not in text and " ERROR " not in text, text[-3000:]
    wait_idle(server)                    # what of its work was running at the server (see below) is done
    assert_serving(gw)


def test_a_client_that_half_closes_after_its_request_is_answered(gw):
    """shutdown(SHUT_WR) after a whole request (the direct embeddings path, a Starlette route, two
    pipelined requests): every request is answered, then the gateway closes. A request cut short by
    the half-close is not answered (there is nothing whole to answer) and the connection closes."""
    one = request("/v1/embeddings", json.dumps({"input": "half closed"}).encode())
    models = request("/v1/models", method="GET")
    for data, answers in ((one, 1), (models, 1), (one + one, 2)):
        with connect(gw) as s:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            stream = b""
            while chunk := s.recv(65536):                # until the gateway closes (both answers may come in one read)
                stream += chunk
        assert re.findall(rb"HTTP/1\.1 (\d{3}) ", stream) == [b"200"] * answers, stream[:600]
    with connect(gw) as s:
        s.sendall(request("/v1/embeddings", headers={"Content-Length": "1000"}) + b'{"input": "')
        s.shutdown(socket.SHUT_WR)
        assert s.recv(65536) == b""
    assert_serving(gw)


@pytest.mark.parametrize("kind", ["texts", "token ids"])     # (the session server is this worker's own)
def test_work_of_clients_that_went_away_is_cancelled(gw, server, kind):
    """10 requests of 64 inputs of ~256 tokens, their clients reset once rose has a backlog of
    their chunks (at least 0.5 s after sending; the gateway may still be tokenizing the texts then,
    and the queue gauge is polled about once a second): sequences computed."""
    wait_idle(server)
    seqs0, cancelled0 = rose_metric(server, "rose_sequences_total"), rose_metric(server, "rose_requests_cancelled_total")
    inputs = texts(64) if kind == "texts" else [[101] + [2000 + (i + j) % 500 for j in range(254)] + [102]
                                                   for i in range(64)]
    socks = []
    for _ in range(10):
        s = connect(gw)
        s.sendall(request("/v1/embeddings", json.dumps({"input": inputs}).encode()))
        socks.append(s)
    time.sleep(0.5)
    wait_for_backlog(server)
    for s in socks:
        reset(s)
    wait_idle(server)
    computed = rose_metric(server, "rose_sequences_total") - seqs0
    cancelled = rose_metric(server, "rose_requests_cancelled_total") - cancelled0
    print(f"{kind}: {computed:.0f} of 640 sequences computed after the resets, {cancelled:.0f} requests cancelled")
    # all 640 before: chunks are no longer sent once the client has gone, and what was in flight at
    # rose is cancelled there; texts too (the gateway tokenizes them and sends rose their ids)
    assert cancelled >= 1 and computed <= 200, (computed, cancelled)
    assert_serving(gw)


# --------------------------------------------------------------------------- values and work
@pytest.mark.parametrize("payload,param", [
    ({"input": "x", "dimensions": 4294967424}, "dimensions"),        # wrapped to 128 at 32 bits before
    ({"input": "x", "dimensions": 1 << 63}, "dimensions"),           # an OverflowError, 500, before
    ({"input": "x", "dimensions": 1 << 64}, "dimensions"),           # a float once parsed
    ({"input": "x", "dimensions": 2147483648}, "dimensions"),
    ({"input": [101, 1 << 31, 102]}, "input"),
    ({"input": [[101, 102], [101, 1 << 63, 102]]}, "input[1]"),
    ({"input": [101, -1, 102]}, "input"),
])
def test_integers_out_of_range_get_400_naming_the_field(gw, payload, param):
    r = embed(gw, payload)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_a_request_over_the_work_bound_is_refused_at_once(gw):
    t0 = time.monotonic()
    r = embed(gw, {"input": texts(200)})                 # ~51,000 tokens (256 each after truncation)
    assert r.status_code == 413, r.text
    err = r.json()["error"]
    assert str(MAX_TOKENS) in err["message"] and "max_request_tokens" in err["message"]
    ids = embed(gw, {"input": [[101] + [2000] * 250 + [102]] * 200})
    assert ids.status_code == 413 and "max_request_tokens" in ids.json()["error"]["message"]
    assert time.monotonic() - t0 < 10


def test_a_long_request_that_progresses_is_no_timeout(server):
    """--timeout 0.75: a request of ~38,000 tokens takes longer than that here (1.6 s on an idle
    machine; its 19 chunks answered about 85 ms apart); they keep being answered, so it is served
    (it answered 503 'retry later' once `timeout` was over)."""
    with gateway_for(server.grpc_url, "limits-progress", extra_args=["--workers", "1", "--timeout", "0.75"]) as g:
        t0 = time.monotonic()
        r = embed(g, {"input": texts(150)})
        took = time.monotonic() - t0
    assert r.status_code == 200, r.text
    assert len(r.json()["data"]) == 150
    assert took > 0.75, f"took {took:.2f} s: too fast to show anything about the 0.75 s timeout"


# --------------------------------------------------------------------------- no internal addresses
def test_answers_name_no_internal_address(gw, server):
    port = server.grpc_url.rsplit(":", 1)[1]
    health = httpx.get(gw.url + "/health").json()
    assert list(health["replicas"]) == ["replica 0"] and port not in json.dumps(health)
    r = embed(gw, {"input": [[101, 99999999, 102]]})      # refused by the server
    assert r.status_code == 400 and "vocabulary" in r.text and port not in r.text and "127.0.0.1" not in r.text
    dead = f"127.0.0.1:{free_port()}"
    with gateway_for(dead, "limits-dead") as down:
        r = httpx.post(down.url + "/v1/embeddings", json={"input": "x"}, timeout=60)
        assert r.status_code == 503 and "replica 0" in r.text, r.text
        health = httpx.get(down.url + "/health", timeout=30)
        assert health.status_code == 503 and list(health.json()["replicas"]) == ["replica 0"]
        for text in (r.text, health.text):
            assert dead not in text and dead.split(":")[1] not in text and "127.0.0.1" not in text, text


# --------------------------------------------------------------------------- stopping
def test_sigterm_drains_for_drain_timeout_then_answers_503(server):
    import signal
    import threading
    ids = [[101] + [2000 + (i + j) % 500 for j in range(254)] + [102] for i in range(1000)]  # ~10 s of work here
    with gateway_for(server.grpc_url, "limits-drain", extra_args=["--drain-timeout", "2"]) as g:
        answer = {}
        t = threading.Thread(target=lambda: answer.setdefault("r", embed(g, {"input": ids})))
        t.start()
        time.sleep(1.0)
        t0 = time.monotonic()
        g.proc.send_signal(signal.SIGTERM)
        g.proc.wait(30)
        exited = time.monotonic() - t0
        t.join(30)
    r = answer["r"]
    assert r.status_code == 503 and "shutting down" in r.json()["error"]["message"], r.text
    assert 1.5 <= exited <= 6, exited
    wait_idle(server)


def test_a_worker_that_does_not_stop_is_killed_after_the_drain_time(server):
    """The supervising process bounds its workers' stop: one worker frozen (SIGSTOP, so it never
    handles its SIGTERM) is killed STOP_MARGIN s after the drain time, by the gateway itself, not
    left for whoever started it."""
    import signal
    from rose_backend.launch.connections import children
    from rose_gateway.workers import STOP_MARGIN
    drain = 1.0
    with gateway_for(server.grpc_url, "limits-frozen-worker", extra_args=["--workers", "2", "--drain-timeout",
                                                                           str(drain)]) as g:
        end = time.monotonic() + 60
        while httpx.get(g.url + "/health", timeout=10).json().get("workers", {}).get("serving") != 2:
            assert time.monotonic() < end, "the two workers did not serve"
            time.sleep(0.1)
        frozen = children(g.proc.pid)[0]
        os.kill(frozen, signal.SIGSTOP)
        t0 = time.monotonic()
        g.proc.send_signal(signal.SIGTERM)
        g.proc.wait(30)
        exited = time.monotonic() - t0
    assert drain + STOP_MARGIN <= exited <= drain + STOP_MARGIN + 1.5, exited
    assert not os.path.exists(f"/proc/{frozen}"), "the frozen worker outlived its gateway"
    assert "1 worker(s) still running" in (LOG_DIR / "gateway-limits-frozen-worker.log").read_text()
