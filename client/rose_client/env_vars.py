"""The environment variables the client reads, and the Variable type the server's table
(rose_backend/env_vars.py) is written in; docs/ENVIRONMENT.md documents them all.

    API_KEY.get()              # the value, or the default where it is unset or empty
    ROSE_URL.get(env)          # read from another mapping (a child's environment, a test's)
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

TRUE = ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Variable:
    name: str
    default: str          # the value where the variable is unset or empty
    help: str             # one line: what it does

    def get(self, env: Mapping[str, str] | None = None) -> str:
        return (os.environ if env is None else env).get(self.name) or self.default

    def integer(self, env: Mapping[str, str] | None = None) -> int:
        return self._as(int, "an integer", env)

    def number(self, env: Mapping[str, str] | None = None) -> float:
        return self._as(float, "a number", env)

    def _as(self, kind, what: str, env: Mapping[str, str] | None):
        value = self.get(env)
        try:
            return kind(value)
        except ValueError:
            raise ValueError(f"${self.name} must be {what}, got {value!r}") from None

    def flag(self, env: Mapping[str, str] | None = None) -> bool:
        """1 / true / yes / on (any case) is true; anything else false."""
        return self.get(env).strip().lower() in TRUE

    def names(self, env: Mapping[str, str] | None = None) -> set[str]:
        """A comma-separated list, its items stripped, empty ones left out."""
        return {n.strip() for n in self.get(env).split(",") if n.strip()}


API_KEY = Variable("API_KEY", "", "the deployment's API key: the launcher requires it on Triton's inference and "
                   "metadata and the gateway's /v1/*; the gateway and rose-embed send it (else --api-key-file)")
ROSE_URL = Variable("ROSE_URL", "127.0.0.1:8001", "rose-embed's replicas (--url): comma-separated gRPC host:port")

VARIABLES = (API_KEY, ROSE_URL)
