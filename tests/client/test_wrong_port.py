"""A client pointed at an HTTP/1 port (Triton's HTTP port, the gateway) is told where gRPC is."""
import http.server
import threading

import pytest

from rose_client import EmbeddingClient


def test_an_http1_port_gets_a_hint_naming_the_grpc_port():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"127.0.0.1:{server.server_address[1]}"
        with EmbeddingClient(url, timeout=20, retries=1) as c, pytest.raises(ConnectionError) as e:
            c.embed(["hello"])
        assert "answers HTTP/1, not gRPC" in str(e.value) and "8001" in str(e.value), str(e.value)
    finally:
        server.shutdown()
        server.server_close()
