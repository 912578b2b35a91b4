"""The `rose` model's engines' options (engine/options.py) from its settings (model_settings.RoseSettings):
the main engine's, and the query lane's engine's beside it. Imports torch: import it where torch may load."""
from __future__ import annotations

import dataclasses

import torch

from rose_backend.config import ModelConfig
from rose_backend.engine.memory_budget import MIB, MemoryBudgetExceeded, device_limit
from rose_backend.engine.options import EngineOptions
from rose_backend.triton.model_settings import RoseSettings


def engine_options(s: RoseSettings, cfg: ModelConfig, device: str) -> EngineOptions:
    """The main engine's options for model `cfg` on `device` under settings `s`. Its memory limit is
    memory_limit_mb, else device_limit's (a GPU's free memory less a margin; None on the CPU: no check)."""
    return EngineOptions(dtype=getattr(torch, s.torch_dtype_name) if s.torch_dtype_name else None,
                         attention=s.attention or None, graphs=s.graphs, max_inflight=s.max_inflight,
                         graph_memory_cap_bytes=s.graph_memory_mb * MIB or None,
                         memory_limit_bytes=device_limit(device, s.memory_limit_mb * MIB or None),
                         fp8_min_tokens=s.engine_fp8_min_tokens(cfg), **s.engine_limits(cfg))


def query_options(main: EngineOptions, main_bytes: int) -> EngineOptions:
    """The query lane's engine's options: the main engine's, with one handle in flight and, as its
    memory limit, what the main engine (main_bytes, its budget's total) leaves of the main limit."""
    left = None if main.memory_limit_bytes is None else main.memory_limit_bytes - main_bytes
    return dataclasses.replace(main, max_inflight=1, memory_limit_bytes=left)


def query_engine_for(choice: str, main, options: EngineOptions, warn):
    """The query lane's engine on `main`'s weights for interactive_stream=`choice`, or None: `off`; `auto`
    on the CPU, or where it does not fit in what `main` leaves of the memory limit (warn(message) says
    so); `on` builds it anywhere and raises MemoryBudgetExceeded where it does not fit."""
    from rose_backend.engine.engine import Engine
    if not (choice == "on" or (choice == "auto" and main.device.type == "cuda")):
        return None
    if not getattr(main, "supports_query_lane", True):       # the fallback engine (transformers) has none
        if choice == "on":
            raise ValueError(f"interactive_stream=on: model_type {main.cfg.model_type!r} runs on the fallback "
                             "engine, which has no query lane; use auto or off")
        warn(f"rose: no query lane (interactive_stream=auto): model_type {main.cfg.model_type!r} runs on the "
             "fallback engine, which has none")
        return None
    try:
        return Engine(main.cfg, main.device, query_options(options, main.budget.total), weights_from=main)
    except MemoryBudgetExceeded as e:
        if choice == "on":
            raise
        warn(f"rose: no query lane (interactive_stream=auto): its engine {e}")
        return None
