"""python -m rose_gateway --triton-urls 127.0.0.1:8001 [--port 8080] [--host 127.0.0.1] [--api-key KEY]"""
from __future__ import annotations

import logging
import sys

import uvicorn

from rose_gateway.app import create_app
from rose_gateway.settings import parse_args


def main(argv: list[str] | None = None) -> int:
    settings, log_level = parse_args(argv)
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s rose_gateway %(levelname)s %(message)s")
    app = create_app(settings)
    print(f"rose gateway: http://{settings.host}:{settings.port}/v1/embeddings -> {','.join(settings.triton_urls)}",
          flush=True)
    # uvloop and httptools when installed (the `gateway` extra pins them); access log off: it costs
    # more than the gateway's own work per request; idle keep-alive connections kept 30 s (default 5)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=log_level, access_log=False,
                timeout_graceful_shutdown=10, timeout_keep_alive=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
