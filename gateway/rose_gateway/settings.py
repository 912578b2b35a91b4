"""The gateway's settings: one dataclass, filled from the command line or the environment."""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from rose_client.client import parse_urls


@dataclass(slots=True)
class GatewaySettings:
    triton_urls: list[str]
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None          # Bearer token required on /v1/* when set
    model_dir: str | None = None        # the served model's folder (default: the default model)
    served_model_name: str | None = None    # default: the folder's name
    max_body_bytes: int = 8 << 20       # larger bodies: 413
    max_inputs: int = 2048              # inputs per request (OpenAI's limit); more: 413
    timeout: float = 60.0               # seconds per request to Triton
    retry_after: int = 1                # Retry-After seconds on 503

    def __post_init__(self):
        self.triton_urls = parse_urls(self.triton_urls)
        if self.max_body_bytes < 1024 or self.max_inputs < 1 or self.timeout <= 0:
            raise ValueError("max_body_bytes must be >= 1024, max_inputs >= 1 and timeout > 0")


def parse_args(argv: list[str] | None = None) -> tuple[GatewaySettings, str]:
    env = os.environ
    p = argparse.ArgumentParser(prog="python -m rose_gateway",
                                description="OpenAI-compatible HTTP gateway in front of rose's Triton servers")
    p.add_argument("--triton-urls", default=env.get("TRITON_URLS", "127.0.0.1:8001"),
                   help="gRPC host:port of each Triton replica, comma-separated ($TRITON_URLS)")
    p.add_argument("--host", default=env.get("ADDRESS", "127.0.0.1"), help="address to bind ($ADDRESS)")
    p.add_argument("--port", type=int, default=int(env.get("GATEWAY_PORT") or 8080), help="($GATEWAY_PORT)")
    p.add_argument("--api-key", default=env.get("API_KEY") or None,
                   help="require 'Authorization: Bearer KEY' on /v1/* ($API_KEY)")
    p.add_argument("--model", dest="model_dir", default=env.get("MODEL") or None,
                   help="the served model's folder, for token counts ($MODEL; default: the default model)")
    p.add_argument("--served-model-name", default=None, help="model id in /v1/models (default: the folder's name)")
    p.add_argument("--max-body-bytes", type=int, default=8 << 20)
    p.add_argument("--max-inputs", type=int, default=2048)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--log-level", default="warning")
    p.add_argument("--owner", default=None, help="a label naming who started this gateway, for process "
                   "listings only (GatewayProcess passes rose_<its pid>_, the prefix the tests' leak check looks for)")
    args = vars(p.parse_args(argv))
    log_level = args.pop("log_level")
    args.pop("owner")
    settings = GatewaySettings(**args)
    return settings, log_level
