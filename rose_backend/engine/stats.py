"""What an Engine counts (Engine.stats)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class EngineStats:
    batches: int = 0
    tokens: int = 0                  # real tokens
    sequences: int = 0
    eager_runs: int = 0              # each batch is exactly one of eager_runs / graph_captures / graph_replays
    graph_captures: int = 0
    graph_replays: int = 0
    padded_tokens: int = 0           # tokens run including bucket padding
    unbucketed_runs: int = 0         # batches larger than every bucket (eager, unpadded; part of eager_runs)
    capture_refused: int = 0         # captures skipped because the graph memory cap was reached
    graphs: int = 0                  # graphs held now
    graph_memory_bytes: int = 0      # allocator bytes reserved by graphs and their pool
    capture_seconds: float = 0.0     # host time spent capturing
    startup_seconds: float = 0.0     # Engine() construction, weights and pre-capture included
