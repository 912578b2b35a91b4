"""POST /v1/embeddings past the ASGI app (rose_gateway/direct.py), over raw sockets against the real
gateway in front of the session's tritonserver: pipelined requests answered in order, a body sent
after `Expect: 100-continue`, `Connection: close`, HTTP/1.0, a body in pieces, the same answer as the
app's route (a %-escaped path goes through Starlette), and the gateway's metrics counting it."""
from __future__ import annotations

import json
import socket
import time

import numpy as np
import pytest
from support.gateway import gateway_for
from support.raw_http import connect, read_response, request

pytestmark = pytest.mark.server
KEY = "direct-key"
TEXTS = ["what is rose?", "pipelined requests are answered in order", "a third text"]


@pytest.fixture(scope="module")
def gw(server):
    with gateway_for(server.grpc_url, "direct", api_key=KEY, extra_args=["--workers", "1"]) as g:
        yield g


def post(body: dict, path: str = "/v1/embeddings", headers: dict | None = None) -> bytes:
    return request(path, json.dumps(body).encode(), {"Authorization": f"Bearer {KEY}", **(headers or {})})


def read_all(s: socket.socket, n: int) -> list[tuple[int, dict, bytes]]:
    """n responses from one connection, in the order they came (Content-Length framing)."""
    data, out = b"", []
    while len(out) < n:
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            assert chunk, f"closed after {len(out)} of {n} responses"
            data += chunk
        head, rest = data.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines[1:])}
        size = int(headers["content-length"])
        while len(rest) < size:
            chunk = s.recv(65536)
            assert chunk
            rest += chunk
        out.append((int(lines[0].split()[1]), headers, rest[:size]))
        data = rest[size:]
    return out


def vector(body: bytes) -> np.ndarray:
    return np.array(json.loads(body)["data"][0]["embedding"], np.float32)


def test_pipelined_requests_answered_in_order(gw, sentence_model):
    want = sentence_model.encode(TEXTS)
    with connect(gw) as s:
        s.sendall(b"".join(post({"input": t, "encoding_format": "float"}) for t in TEXTS) +
                  request("/health", method="GET"))
        answers = read_all(s, len(TEXTS) + 1)
    assert [a[0] for a in answers] == [200] * (len(TEXTS) + 1)
    for (_, headers, body), w in zip(answers, want):
        assert headers["content-type"] == "application/json"
        assert float(vector(body) @ w) > 0.9999
    assert json.loads(answers[-1][2])["status"] == "ready"


def test_expect_100_continue_and_a_body_in_pieces(gw, sentence_model):
    body = json.dumps({"input": TEXTS[0], "encoding_format": "float"}).encode()
    head = (f"POST /v1/embeddings HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nExpect: 100-continue\r\n\r\n").encode()
    with connect(gw) as s:
        s.sendall(head)
        assert s.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        for i in range(0, len(body), 7):                 # the body in small pieces, a little apart
            s.sendall(body[i:i + 7])
            time.sleep(0.01)
        status, headers, answer = read_response(s)
    assert status == 200 and float(vector(answer) @ sentence_model.encode(TEXTS[:1])[0]) > 0.9999


def test_connection_close_and_http_1_0(gw):
    for raw in (post({"input": "bye"}, headers={"Connection": "close"}),
                post({"input": "old client"}).replace(b"HTTP/1.1", b"HTTP/1.0", 1)):
        with connect(gw) as s:
            s.sendall(raw)
            status, headers, body = read_response(s)
            assert status == 200 and json.loads(body)["usage"]["prompt_tokens"] > 0
            assert headers.get("connection") == "close"
            assert s.recv(100) == b""                    # and closed


def test_the_app_route_answers_the_same(gw):
    """/v1/%65mbeddings is /v1/embeddings once unescaped: served by the Starlette route."""
    answers = []
    for path in ("/v1/embeddings", "/v1/%65mbeddings"):
        with connect(gw) as s:
            s.sendall(post({"input": TEXTS[1], "encoding_format": "float", "dimensions": 64}, path))
            status, _, body = read_response(s)
        assert status == 200, body
        answers.append(json.loads(body))
    assert answers[0]["usage"] == answers[1]["usage"] and answers[0]["model"] == answers[1]["model"]
    np.testing.assert_allclose(answers[0]["data"][0]["embedding"], answers[1]["data"][0]["embedding"], atol=1e-6)


def test_errors_and_metrics_on_the_direct_path(gw):
    def count(status: int) -> float:
        with connect(gw) as s:
            s.sendall(request("/metrics", method="GET"))
            text = read_response(s)[2].decode()
        line = f'rose_gateway_requests_total{{endpoint="embeddings",status="{status}"}} '
        return sum(float(x.split()[-1]) for x in text.splitlines() if x.startswith(line))

    ok, bad, unauth = count(200), count(400), count(401)
    with connect(gw) as s:
        s.sendall(post({"input": ""}) + request("/v1/embeddings", b'{"input": "x"}') + post({"input": "fine"}))
        (s400, h400, b400), (s401, _, b401), (s200, _, _) = read_all(s, 3)
    assert s400 == 400 and json.loads(b400)["error"]["param"] == "input" and h400["content-type"] == "application/json"
    assert s401 == 401 and json.loads(b401)["error"]["code"] == "invalid_api_key"
    assert s200 == 200
    assert (count(200), count(400), count(401)) == (ok + 1, bad + 1, unauth + 1)
