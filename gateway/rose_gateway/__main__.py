"""python -m rose_gateway --triton-urls 127.0.0.1:8001 [--port 8080] [--host 127.0.0.1] [--api-key-file PATH]

The API key comes from $API_KEY or --api-key-file (never the command line: `ps` shows it), Triton's
admin key from $ROSE_ADMIN_KEY. On SIGTERM the gateway stops taking connections, gives requests in
flight --drain-timeout seconds (default 10), answers what is left with 503 and exits.
"""
from __future__ import annotations

import logging
import sys

import uvicorn

from rose_gateway.app import create_app
from rose_gateway.protocol import ConnectionLimits, default_max_connections, protocol_class
from rose_gateway.settings import parse_args


def main(argv: list[str] | None = None) -> int:
    try:
        settings, log_level = parse_args(argv)
    except ValueError as e:
        print(f"rose_gateway: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s rose_gateway %(levelname)s %(message)s")
    app = create_app(settings)
    s = settings
    limits = ConnectionLimits(default_max_connections(s.max_connections), s.header_timeout, s.body_timeout,
                              s.min_body_rate, s.max_header_bytes, s.max_headers, s.retry_after)
    metrics = app.state.gateway.metrics
    print(f"rose gateway: http://{s.host}:{s.port}/v1/embeddings -> {','.join(s.triton_urls)} "
          f"(at most {limits.max_connections} connections)", flush=True)
    # uvloop and httptools (the `gateway` extra pins them) under protocol.py's limits, which answer in
    # OpenAI's JSON where uvicorn's own (limit_concurrency, its 400s) answer plain text; no WebSocket
    # upgrades; access log off: it costs more than the gateway's own work per request
    uvicorn.run(app, host=s.host, port=s.port, log_level=log_level, access_log=False, ws="none",
                http=protocol_class(limits, metrics.refused), timeout_keep_alive=s.keep_alive,
                timeout_graceful_shutdown=s.drain_timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
