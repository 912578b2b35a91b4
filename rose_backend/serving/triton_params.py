"""Reading a Triton model's config.pbtxt parameters (shared by the Triton shims)."""
from __future__ import annotations

import json


class ModelParameters:
    """`parameters { key: "k" value { string_value: "v" } }` entries, with typed getters and checks."""

    def __init__(self, model_config: str | dict):
        cfg = json.loads(model_config) if isinstance(model_config, str) else model_config
        self.model_name = cfg.get("name", "?")
        self.values = {k: v.get("string_value", "") for k, v in (cfg.get("parameters") or {}).items()}

    def str(self, key: str, default: str = "") -> str:
        value = self.values.get(key, "")
        return value if value.strip() else default

    def int(self, key: str, default: int, minimum: int | None = None) -> int:
        raw = self.str(key)
        if not raw:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"model {self.model_name!r}: parameter {key!r} must be an integer, got {raw!r}") from None
        if minimum is not None and value < minimum:
            raise ValueError(f"model {self.model_name!r}: parameter {key!r} must be >= {minimum}, got {value}")
        return value

    def bool(self, key: str, default: bool) -> bool:
        raw = self.str(key).lower()
        if not raw:
            return default
        if raw in ("1", "true", "yes", "on"):
            return True
        if raw in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"model {self.model_name!r}: parameter {key!r} must be true or false, got {raw!r}")
