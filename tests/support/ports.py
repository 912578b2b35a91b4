"""Ports for the servers, gateways and launches the tests start.

rose_backend.launch.deployment.free_ports asks the kernel (bind to port 0), which hands out ports of
its ephemeral range: the range client connections take their own ports from, and the same pool every
pytest-xdist worker draws on. A port is free when it is picked, but tritonserver binds its ports
seconds later (after loading its models), and meanwhile another worker's pick or a client
connection could take it (seen: a gateway that could not bind while another worker's Triton metrics
port answered in its place). Here each worker has a block of its own below the ephemeral range, and
walks it in order, so a port is handed out once per run and never to two workers.

    ports = free_ports()          # Ports(grpc, http, metrics)
    port = free_port()
"""
from __future__ import annotations

import itertools
import os
import socket
from pathlib import Path

from rose_backend.launch.deployment import Ports

# below: the well-known services' neighbourhood; $ROSE_TEST_FIRST_PORT moves the blocks up, so that
# two test runs on one machine (two checkouts) never share a port
FIRST_PORT = int(os.environ.get("ROSE_TEST_FIRST_PORT") or 10000)


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def worker_block() -> range:
    """This worker's ports: its share of [FIRST_PORT, the ephemeral range's start)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    count = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1), index + 1)
    size = (_ephemeral_start() - FIRST_PORT) // count
    if size < 100:
        raise RuntimeError(f"no room below the ephemeral port range for {count} workers' ports")
    return range(FIRST_PORT + index * size, FIRST_PORT + (index + 1) * size)


BLOCK = worker_block()
_next = itertools.cycle(BLOCK)


def free_port(host: str = "127.0.0.1") -> int:
    """The next port of this worker's block that nothing holds now."""
    for _ in range(len(BLOCK)):
        port = next(_next)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"every port of {BLOCK} is taken")


def free_ports(host: str = "127.0.0.1") -> Ports:
    """Three ports (gRPC, HTTP, metrics) as deployment.free_ports gives, from this worker's block."""
    return Ports(free_port(host), free_port(host), free_port(host))
