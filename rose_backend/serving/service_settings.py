"""ServiceSettings: what an EmbeddingService is told, in one frozen object.

    EmbeddingService(engine, on_complete, ServiceSettings(max_batch_tokens=4096))
    ServiceSettings.of(rose_settings, inline=True, backlog_us=150)   # the same-named fields of any object

The fields are the `rose` parameters of the same names (docs/OPERATIONS.md), and these defaults are
theirs: RoseSettings takes its defaults from here. `inline` and `backlog_us` are `inline_execute` and
`inline_backlog_us` resolved (None: no request is run whole).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rose_backend.engine.batch_limits import BATCH_SEQS, BATCH_TOKENS
from rose_backend.serving.lanes import LaneSettings


@dataclass(frozen=True)
class ServiceSettings(LaneSettings):
    max_batch_tokens: int = BATCH_TOKENS
    max_batch_seqs: int = BATCH_SEQS
    max_inflight: int = 2
    max_queued_tokens: int = 1 << 20        # 0: unbounded
    response_threads: int = 4
    host_memory_trim: str = "idle"
    inline: bool = True
    backlog_us: int | None = 150

    @classmethod
    def of(cls, source=None, **overrides) -> ServiceSettings:
        """The fields `source` has under the same names, then `overrides`."""
        names = [f.name for f in dataclasses.fields(cls)]
        taken = {n: getattr(source, n) for n in names if source is not None and hasattr(source, n)}
        return cls(**{**taken, **overrides})
