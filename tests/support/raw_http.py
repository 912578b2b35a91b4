"""HTTP/1.1 over a plain socket, for tests that send what an HTTP library would not (partial
headers, malformed framing, a body one byte at a time) to a server on loopback."""
from __future__ import annotations

import json
import socket


def connect(gw, timeout: float = 15.0) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", int(gw.url.rsplit(":", 1)[1])), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_response(s: socket.socket) -> tuple[int, dict, bytes]:
    """One HTTP response: status, headers (lower-case names), body (by Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a response ({data[:200]!r})")
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    while len(body) < int(headers.get("content-length", 0)):
        chunk = s.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split()[1]), headers, body


def request(path: str, body: bytes = b"", headers: dict | None = None, method: str = "POST") -> bytes:
    h = {"Host": "gw", "Content-Type": "application/json", "Content-Length": str(len(body)), **(headers or {})}
    return (f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n").encode() + body


def roundtrip(gw, data: bytes) -> tuple[int, dict, dict | None]:
    with connect(gw) as s:
        s.sendall(data)
        status, headers, body = read_response(s)
    return status, headers, (json.loads(body) if body else None)
