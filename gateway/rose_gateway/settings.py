"""The gateway's settings: one dataclass, filled from the command line or the environment.

Keys are never taken from the command line (a process listing shows it): the API key comes from
$API_KEY or a file (--api-key-file). It is checked on /v1/* (Authorization: Bearer) and sent to
Triton on every request (inference, readiness, the `tokenize` model's configuration).
"""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field

from rose_backend import env_vars
from rose_client.auth import read_key_file, refuse_keys_on_the_command_line
from rose_client.client import parse_urls
from rose_gateway.workers import default_workers


@dataclass(slots=True)
class GatewaySettings:
    triton_urls: list[str]
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = field(default=None, repr=False)      # Bearer token on /v1/*, and Triton's key
    model_dir: str | None = None        # the served model's folder (default: the default model)
    served_model_name: str | None = None    # default: the folder's name
    max_body_bytes: int = 8 << 20       # larger bodies: 413
    max_inputs: int = 2048              # inputs per request (OpenAI's limit); more: 413
    max_request_tokens: int = 300_000   # tokens per request, summed over its inputs (OpenAI's limit); more: 413
    timeout: float = 60.0               # seconds without an answer from Triton before 503 (a chunk, a request)
    retry_after: int = 1                # Retry-After seconds on 503
    max_connections: int | None = None  # open HTTP connections; more: 503 (None: 1024, less if RLIMIT_NOFILE is low)
    header_timeout: float = 5.0         # seconds to receive a request's line and headers; then 408 / closed
    body_timeout: float = 10.0          # seconds to receive a body, plus its size / min_body_rate; then 408
    min_body_rate: int = 65536          # bytes per second a large body must keep up
    max_header_bytes: int = 32768       # request line and headers together; more: 431
    max_headers: int = 100              # header fields per request; more: 431
    keep_alive: float = 30.0            # seconds an idle keep-alive connection is kept
    drain_timeout: float = 10.0         # seconds requests in flight get to finish on SIGTERM
    workers: int = 1                    # gateway processes on the port (workers.py); 1: this process serves

    def __post_init__(self):
        self.triton_urls = parse_urls(self.triton_urls)
        if self.max_body_bytes < 1024 or self.max_inputs < 1 or self.timeout <= 0 or self.max_request_tokens < 1:
            raise ValueError("max_body_bytes must be >= 1024, max_inputs and max_request_tokens >= 1, and timeout > 0")
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError("max_connections must be >= 1")
        if min(self.header_timeout, self.body_timeout, self.keep_alive) <= 0 or self.drain_timeout < 0:
            raise ValueError("header_timeout, body_timeout and keep_alive must be > 0, drain_timeout >= 0")
        if self.workers < 1:
            raise ValueError("workers must be >= 1")
        if self.min_body_rate < 1 or self.max_header_bytes < 1024 or self.max_headers < 8:
            raise ValueError("min_body_rate must be >= 1, max_header_bytes >= 1024 and max_headers >= 8")


DEFAULTS = {f.name: f.default for f in dataclasses.fields(GatewaySettings) if f.default is not dataclasses.MISSING}


def parse_args(argv: list[str] | None = None) -> tuple[GatewaySettings, str]:
    d = DEFAULTS
    p = argparse.ArgumentParser(prog="python -m rose_gateway", allow_abbrev=False,
                                description="OpenAI-compatible HTTP gateway in front of rose's Triton servers. "
                                            "API key: $API_KEY or --api-key-file")
    refuse_keys_on_the_command_line(p, "set $API_KEY or pass --api-key-file PATH")
    p.add_argument("--triton-urls", default="127.0.0.1:8001",
                   help="gRPC host:port of each Triton replica, comma-separated")
    p.add_argument("--host", default=d["host"], help="address to bind")
    p.add_argument("--port", type=int, default=d["port"])
    p.add_argument("--api-key-file", default=None, metavar="PATH",
                   help="a file holding the API key (else $API_KEY): required as 'Authorization: Bearer KEY' "
                        "on /v1/*, and sent to Triton")
    p.add_argument("--model", dest="model_dir", default=d["model_dir"],
                   help="the served model's folder, for token counts ($MODEL; default: the default model)")
    p.add_argument("--served-model-name", default=d["served_model_name"],
                   help="model id in /v1/models (default: the folder's name)")
    p.add_argument("--max-body-bytes", type=int, default=d["max_body_bytes"])
    p.add_argument("--max-inputs", type=int, default=d["max_inputs"])
    p.add_argument("--max-request-tokens", type=int, default=d["max_request_tokens"],
                   help="tokens per request over all its inputs (default %(default)s, OpenAI's); more: 413")
    p.add_argument("--timeout", type=float, default=d["timeout"],
                   help="seconds without an answer from Triton before a request fails over or answers 503")
    p.add_argument("--max-connections", type=int, default=d["max_connections"],
                   help="open HTTP connections (default 1024, fewer when the file limit is low); more: 503")
    p.add_argument("--header-timeout", type=float, default=d["header_timeout"], help="seconds to send a request's headers")
    p.add_argument("--body-timeout", type=float, default=d["body_timeout"],
                   help="seconds to send a request body, plus its size / --min-body-rate")
    p.add_argument("--min-body-rate", type=int, default=d["min_body_rate"], help="bytes per second (see --body-timeout)")
    p.add_argument("--max-header-bytes", type=int, default=d["max_header_bytes"])
    p.add_argument("--max-headers", type=int, default=d["max_headers"])
    p.add_argument("--keep-alive", type=float, default=d["keep_alive"], help="seconds an idle connection is kept open")
    p.add_argument("--drain-timeout", type=float, default=d["drain_timeout"],
                   help="seconds requests in flight get to finish on SIGTERM before the gateway exits")
    p.add_argument("--workers", type=int, default=env_vars.GATEWAY_WORKERS.integer() if env_vars.GATEWAY_WORKERS.get() else default_workers(),
                   help="gateway processes sharing the port ($GATEWAY_WORKERS; default: the cores this process "
                        "may use, %(default)s here)")
    p.add_argument("--log-level", default="warning")
    args = vars(p.parse_args(argv))
    log_level = args.pop("log_level")
    key_file = args.pop("api_key_file")
    args["api_key"] = read_key_file(key_file) if key_file else (env_vars.API_KEY.get() or None)
    settings = GatewaySettings(**args)
    return settings, log_level
