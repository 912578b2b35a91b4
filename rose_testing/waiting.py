"""Polling for a condition, for the tests and tools that wait on a service or a server."""
from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.001) -> bool:
    """Poll `predicate` until it holds or `timeout` seconds pass; its last value."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
