"""rose_server_restarts_total on Triton's metrics port: how many times the launcher has started this
tritonserver again because one of its Python stubs died (rose_backend/launch/stub_watch.py).

The launcher carries the count into each new server's environment ($ROSE_SERVER_RESTARTS, 0 at the
first start); the stub of the `rose` model's first instance (EXPORTER) exports it as it loads, so
there is one series per server, present from the first start on.
"""
from __future__ import annotations

import logging

from rose_backend import env_vars

log = logging.getLogger(__name__)

METRIC = "rose_server_restarts_total"
EXPORTER = "rose_0_0"            # Triton's name of the `rose` model's first instance
DESCRIPTION = "times the launcher restarted this tritonserver because one of its Python stubs died"

_exported: list = []             # the family and its metric, alive for as long as the stub


def restarts_from(env) -> int:
    try:
        return max(0, env_vars.ROSE_SERVER_RESTARTS.integer(env))
    except ValueError:
        return 0


def export_restarts(instance: str | None, env=None) -> bool:
    """In the EXPORTER stub: register the counter and count the restarts the launcher passed.
    Returns whether this stub exports it."""
    if instance != EXPORTER or _exported:
        return False
    import triton_python_backend_utils as pb_utils
    family = pb_utils.MetricFamily(name=METRIC, description=DESCRIPTION, kind=pb_utils.MetricFamily.COUNTER)
    metric = family.Metric(labels={})
    count = restarts_from(env)
    if count:
        metric.increment(count)
    _exported.extend((family, metric))
    return True
