"""Which attention backend runs which configuration, from measurements.

`python -m rose_bench attention-sweep` (benchmarks/rose_bench/attention_sweep.py) times every backend per (attention shape, sequence-count bucket,
token bucket) on the GPU and writes attention_table.json beside this file:

    {"device": "NVIDIA H200", "dtype": "bfloat16", "shapes": {
        "h16kv16d64": [{"seqs": 1, "tokens": 128, "us": {"flashinfer": 9.1, "torch_varlen": 11.0},
                        "best": "flashinfer", "margin": 1.21}, ...]}}

`choose` takes the measured cell nearest to the configuration (log distance in tokens, then in
sequences) among the backends that can run here; with no table or no cell for the shape it falls
back to a fixed preference order. No torch at import.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

TABLE_PATH = Path(__file__).with_name("attention_table.json")
# With no measured cell: flashinfer's Hopper kernels first (fastest whole forward at 1 x 128, 1 x 512,
# 1 x 4096 and 100 x 512 for both the BGE-M3 and the pplx-embed heads on the H200, and correct in
# graphs there: benchmarks/RESULTS-engine.md), then torch varlen, flashinfer fa2,
# flash-attn; fa3 needs sm_90, so elsewhere torch varlen leads.
PREFERENCE = ("flashinfer_fa3", "torch_varlen", "flashinfer", "flash_attn", "sdpa_loop")


class BackendTable:
    def __init__(self, data: dict | None = None):
        self.data = data or {}
        self.shapes: dict[str, list[dict]] = self.data.get("shapes", {})
        self._chosen: dict[tuple, str] = {}        # choose() runs per batch: remember its answers

    @classmethod
    def load(cls, path: str | Path | None = None) -> "BackendTable":
        path = Path(path) if path else TABLE_PATH
        if not path.exists():
            return cls()
        with open(path) as f:
            return cls(json.load(f))

    def choose(self, shape_key: str, seqs: int, tokens: int, available: list[str], layers: int = 1,
               plan_us: dict[str, float] | None = None) -> str:
        """Backend name for one configuration, among `available` (non-empty): the least
        `layers` x (measured us per layer call) + (host us to plan the batch, `plan_us`), since the
        plan runs on the host before the forward pass and a lone request waits for both."""
        if not available:
            raise ValueError("no attention backend can run here")
        key = (shape_key, seqs, tokens, tuple(available), layers)
        hit = self._chosen.get(key)
        if hit is not None:
            return hit
        cells = self.shapes.get(shape_key, [])
        plan_us = plan_us or {}

        def dist(c):
            return (abs(math.log2(c["tokens"] / tokens)), abs(math.log2(c["seqs"] / seqs)))

        choice = None
        for cell in sorted(cells, key=dist):
            cost = {n: t * layers + plan_us.get(n, 0.0) for n, t in cell.get("us", {}).items()
                    if n in available and t is not None}
            if cost:
                choice = min(cost, key=cost.get)
                break
        if choice is None:
            choice = next((n for n in PREFERENCE if n in available), available[0])
        self._chosen[key] = choice
        return choice
