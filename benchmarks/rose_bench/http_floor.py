"""The HTTP floor: what perf_analyzer's OpenAI client and the gateway's HTTP stack cost with nothing
behind them. One uvicorn process with the gateway's own connection class (protocol.py), direct path
(direct.py) and endpoint wrapper (endpoint.py), whose handler answers every POST /v1/embeddings with
one prepared `dim`-float embedding: no parsing, tokenization, call to Triton or answer building.
The gateway's p50 minus this floor's is what its handler costs (`rose_bench http --paths ...,floor`).

    python -m rose_bench.http_floor --port 8090 [--dim 1024] [--host 127.0.0.1]
"""
from __future__ import annotations

import argparse
import sys

import numpy as np


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rose_bench.http_floor", description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--dim", type=int, default=1024)
    args = p.parse_args(argv)
    import uvicorn
    from starlette.applications import Starlette

    from rose_gateway.embeddings import embedding_response
    from rose_gateway.endpoint import direct_endpoint
    from rose_gateway.metrics import GatewayMetrics
    from rose_gateway.protocol import ConnectionLimits, protocol_class

    emb = np.random.default_rng(0).standard_normal((1, args.dim)).astype(np.float32)
    body = embedding_response(emb / np.linalg.norm(emb), "float", "floor", 130)

    async def answer(_raw: bytes) -> bytes:
        return body

    metrics = GatewayMetrics()
    direct = direct_endpoint("embeddings", answer, metrics, None, 8 << 20)
    config = uvicorn.Config(Starlette(), host=args.host, port=args.port, log_level="warning", access_log=False,
                            ws="none", proxy_headers=False, lifespan="off",
                            http=protocol_class(ConnectionLimits(1024), metrics.refused, direct))
    print(f"http floor: http://{args.host}:{args.port}/v1/embeddings", flush=True)
    uvicorn.Server(config).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
