"""The engine of a folder: Engine (a native model file) or FallbackEngine (transformers), as choice.py says.

    engine, choice = build_engine(cfg, "cuda:0", options, trust_remote_code=False)
    log(startup_line(cfg, choice, str(engine.dtype), "cuda:0"))
"""
from __future__ import annotations

import torch

from rose_backend.config import ModelConfig
from rose_backend.engine.choice import EngineChoice, check_remote_code, engine_choice, trust_remote_code  # noqa: F401
from rose_backend.engine.options import EngineOptions


def build_engine(cfg: ModelConfig, device: str | torch.device = "cpu", options: EngineOptions | None = None, *,
                 trust_remote_code: bool = False):
    """(engine, EngineChoice): ModelFolderError where the choice cannot run (check_remote_code)."""
    choice: EngineChoice = engine_choice(cfg)
    check_remote_code(cfg, choice, trust_remote_code)
    if choice.native:
        from rose_backend.engine.engine import Engine
        return Engine(cfg, device, options), choice
    from rose_backend.engine.fallback import FallbackEngine
    return FallbackEngine(cfg, device, options, trust_remote_code=trust_remote_code), choice
