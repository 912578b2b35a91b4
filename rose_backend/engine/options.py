"""EngineOptions: how an Engine runs its model (dtype, attention, graphs, buckets, memory), all defaulted."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from rose_backend.engine.backend_table import BackendTable
from rose_backend.engine.graph_cache import bucket_limits


@dataclass(frozen=True, kw_only=True)
class EngineOptions:
    """The knobs of Engine(cfg, device, options); None picks the default named beside each field. True graphs
    on the CPU run the same bucketed static buffers with stand-in graphs (tests).

    >>> Engine(cfg, "cuda", EngineOptions(attention="torch_varlen", max_tokens=4096))
    """
    dtype: torch.dtype | None = None           # None: bf16 on CUDA, float32 on the CPU
    attention: str | None = None               # backend for every batch (attention.py); None, "", "auto": the table's
    graphs: bool | None = None                 # CUDA graphs, lazy capture; None: on CUDA only; False: eager, unpadded
    max_tokens: int | None = None              # largest token bucket (past it: eager); None: max(BATCH_TOKENS, max positions)
    max_seqs: int | None = None                # largest sequence-count bucket; None: 64
    max_inflight: int = 2                      # handles the caller keeps outstanding (pinned ring: max_inflight + 1)
    graph_memory_cap_bytes: int | None = None  # no new graph once graphs hold this much; None: no cap
    memory_limit_bytes: int | None = None      # refuse to start over it; None: a GPU's free memory less a margin,
    #                                            on the CPU no check (memory_budget.py)
    backend_table: BackendTable | str | Path | None = None   # or its JSON's path; None: engine/attention_table.json
    fp8_min_tokens: int | None = None          # FP8 projection GEMMs from this many tokens (layers/fp8.py); None: off

    def __post_init__(self):
        if self.dtype is not None and not isinstance(self.dtype, torch.dtype):
            raise ValueError(f"EngineOptions.dtype must be a torch.dtype or None, got {self.dtype!r}")
        if self.attention in ("", "auto"):
            object.__setattr__(self, "attention", None)
        for name, least in (("max_tokens", 1), ("max_seqs", 1), ("graph_memory_cap_bytes", 0),
                            ("memory_limit_bytes", 0), ("fp8_min_tokens", 0)):
            value = getattr(self, name)
            if value is not None and value < least:
                raise ValueError(f"EngineOptions.{name} must be at least {least} or None, got {value}")
        if self.max_inflight < 1:
            raise ValueError(f"EngineOptions.max_inflight must be at least 1, got {self.max_inflight}")

    def torch_dtype(self, device: torch.device) -> torch.dtype:
        """The dtype on `device`: the one given, else bf16 on CUDA and float32 on the CPU."""
        return self.dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)

    def graphs_on(self, device: torch.device) -> bool:
        """Whether the engine runs the bucketed static-buffer (graph) path on `device`."""
        return device.type == "cuda" if self.graphs is None else bool(self.graphs)

    def buckets(self, max_positions: int) -> tuple[int, int]:
        """(max_tokens, max_seqs) for a model of max_positions: the given ones, else bucket_limits' defaults."""
        limits = bucket_limits(max_positions)
        return self.max_tokens or limits["max_tokens"], self.max_seqs or limits["max_seqs"]
