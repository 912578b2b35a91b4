"""python -m rose_gateway --triton-urls 127.0.0.1:8001 [--port 8080] [--host 127.0.0.1] [--workers N]
                          [--api-key-file PATH]

The API key comes from $API_KEY or --api-key-file (never the command line: `ps` shows it).
--workers (or $GATEWAY_WORKERS; default: the cores this process
may use) gateway processes share the port (workers.py); with 1 this process serves itself. On
SIGTERM the gateway stops taking connections, gives requests in flight --drain-timeout seconds
(default 10), answers what is left with 503 and exits.
"""
from __future__ import annotations

import logging
import sys

import uvicorn

from rose_gateway.settings import parse_args
from rose_gateway.workers import STATE, mark_serving, reuseport_socket, supervise, unmark_serving, worker_of


class _Server(uvicorn.Server):
    """uvicorn's server that marks its worker serving once it listens (workers.py)."""

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            mark_serving(STATE.get())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        settings, log_level = parse_args(argv)
    except ValueError as e:
        print(f"rose_gateway: {e}", file=sys.stderr)
        return 2
    s = settings
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s rose_gateway %(levelname)s %(message)s")
    worker = worker_of()
    from rose_gateway.protocol import default_max_connections
    cap = default_max_connections(s.max_connections)
    if worker is None and s.workers > 1:
        return supervise(s.host, s.port, s.workers, argv,
                         f"rose gateway: http://{s.host}:{s.port}/v1/embeddings -> {','.join(s.triton_urls)} "
                         f"({s.workers} workers, at most {cap} connections each)", s.drain_timeout)
    # the app is built here, in the process that serves it: no gRPC channel crosses a fork
    from rose_gateway.app import create_app
    from rose_gateway.protocol import ConnectionLimits, protocol_class
    app = create_app(settings)
    limits = ConnectionLimits(cap, s.header_timeout, s.body_timeout, s.min_body_rate, s.max_header_bytes,
                              s.max_headers, s.retry_after)
    metrics = app.state.gateway.metrics
    if worker is None:
        print(f"rose gateway: http://{s.host}:{s.port}/v1/embeddings -> {','.join(s.triton_urls)} "
              f"(at most {limits.max_connections} connections)", flush=True)
    # uvloop (loop="auto": uvloop when importable) and httptools (the `gateway` extra pins both) under
    # protocol.py's limits, which answer in OpenAI's JSON where uvicorn's own (limit_concurrency, its
    # 400s) answer plain text; POST /v1/embeddings past the app (app.state.direct); no WebSocket
    # upgrades; access log off: it costs more than the gateway's own work per request; no proxy-header
    # rewriting of the client's address (nothing here reads it; it parsed an IP address per request)
    config = uvicorn.Config(app, host=s.host, port=s.port, log_level=log_level, access_log=False, ws="none",
                            proxy_headers=False,
                            http=protocol_class(limits, metrics.refused, app.state.direct),
                            timeout_keep_alive=s.keep_alive, timeout_graceful_shutdown=s.drain_timeout)
    server = _Server(config)
    # a worker binds its own SO_REUSEPORT socket now; uvicorn listens on it once the app has started
    sockets = [reuseport_socket(s.host, s.port)] if worker is not None else None
    try:
        server.run(sockets=sockets)
    finally:
        unmark_serving(STATE.get())
    return 0 if server.started else 3           # 3: it never served (uvicorn's start-up failure)


if __name__ == "__main__":
    sys.exit(main())
