"""The real gateway process (rose_gateway) in front of a real tritonserver, for the gateway's tests."""
from __future__ import annotations

import contextlib

from support.server import LOG_DIR

from support.ports import free_port
from rose_backend.launch.gateway import GatewayProcess

# the deployment prompts of conftest.py's session server (DEFAULT_TEST_PARAMS)
PROMPTS = {"tokenize": {"prompts": '{"query": "query: ", "passage": "passage: "}'}}


@contextlib.contextmanager
def gateway_for(grpc_url: str, name: str, api_key: str | None = None, extra_args: list[str] | None = None):
    """A gateway in front of grpc_url (it reads the deployment's tokenize settings and tokenizes texts
    itself), logging to tests/.logs/gateway-<name>.log."""
    LOG_DIR.mkdir(exist_ok=True)
    log = LOG_DIR / f"gateway-{name}.log"
    log.unlink(missing_ok=True)
    with GatewayProcess(grpc_url, free_port(), api_key=api_key, extra_args=extra_args, log_file=log) as gw:
        yield gw
