"""The headers that carry rose's keys to Triton and to the HTTP gateway.

A deployment started with an API key (`API_KEY`) has Triton check it on inference, metadata,
model-config and statistics requests, through Triton's restricted-protocol options. Triton's gRPC server reads a restricted
key `k` from the request header `triton-grpc-protocol-<k>`; its HTTP server from the header `<k>`.
The gateway takes the same key as `Authorization: Bearer <key>` (OpenAI's convention).

    client = EmbeddingClient("host:8001", api_key="secret")     # sends grpc_api_key_headers("secret")
    perf_analyzer ... -H "triton-grpc-protocol-api-key:secret"

The admin key (`ADMIN_KEY`, or one the launcher makes per start) guards Triton's control plane:
model repository (load / unload), shared memory, trace and logging. No command line takes a key (a
process listing shows it): refuse_keys_on_the_command_line() is the refusal of rose-embed, the
gateway and the launcher.
"""
from __future__ import annotations

import argparse
from pathlib import Path

API_KEY_NAME = "api-key"          # Triton's restricted-protocol key for inference, metadata, config, statistics
ADMIN_KEY_NAME = "admin-key"      # ... and for the control plane
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"


def grpc_api_key_headers(api_key: str | None) -> dict[str, str] | None:
    """gRPC metadata for Triton's inference, metadata, model-config and statistics requests (None: no key)."""
    return {GRPC_HEADER_PREFIX + API_KEY_NAME: api_key} if api_key else None


def grpc_admin_headers(admin_key: str | None, api_key: str | None = None) -> dict[str, str] | None:
    """gRPC metadata for Triton's control-plane requests (model repository, shared memory, trace, logging)."""
    headers = dict(grpc_api_key_headers(api_key) or {})
    if admin_key:
        headers[GRPC_HEADER_PREFIX + ADMIN_KEY_NAME] = admin_key
    return headers or None


def http_api_key_headers(api_key: str | None) -> dict[str, str]:
    """HTTP headers for Triton's own HTTP port (inference, metadata)."""
    return {API_KEY_NAME: api_key} if api_key else {}


def check_key(key: str | None, what: str = "API_KEY") -> str | None:
    """A key as Triton's command line can carry it: printable ASCII without spaces, ':' or '=',
    8 to 256 characters. Raises ValueError naming `what` otherwise; None / "" pass as None."""
    if not key:
        return None
    if not 8 <= len(key) <= 256 or not all(33 <= ord(c) < 127 and c not in ":=," for c in key):
        raise ValueError(f"{what} must be 8 to 256 printable ASCII characters without spaces, ':', '=' or ','")
    return key


def read_key_file(path: str, what: str = "--api-key-file") -> str:
    """The first line of a key file, stripped; ValueError naming the file (never its content)."""
    try:
        lines = Path(path).read_text().strip().splitlines()
    except OSError as e:
        raise ValueError(f"{what} {path}: cannot read it ({e.strerror})") from None
    key = lines[0].strip() if lines else ""
    if not key:
        raise ValueError(f"{what} {path}: the file is empty")
    return key


def refuse_keys_on_the_command_line(parser: argparse.ArgumentParser, instead: str) -> None:
    """Make `parser` refuse --api-key / --admin-key without repeating the key, saying where it goes
    `instead` (e.g. "set $API_KEY or pass --api-key-file PATH")."""

    class _NoKeyOnTheCommandLine(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            parser.error(f"{option_string} is not taken: a key on the command line shows in process listings; "
                         + instead)

    parser.add_argument("--api-key", "--admin-key", nargs="?", action=_NoKeyOnTheCommandLine, help=argparse.SUPPRESS)
