"""Which attention backend runs which configuration, from measurements.

`python -m rose_bench attention-sweep` times every backend per (attention shape, sequence-count
bucket, token bucket) on the GPU and writes attention_table.json beside this file:

    {"device": "<the GPU's name>", "dtype": "bfloat16", "shapes": {
        "h16kv16d64": [{"seqs": 1, "tokens": 128, "us": {"flashinfer": 9.1, "torch_varlen": 11.0},
                        "best": "flashinfer", "margin": 1.21}, ...]}}

`choose` estimates each backend's time at the configuration from the measured cells of the nearest
sequence count, interpolated in tokens (`estimate`), and takes the cheapest that can run here; with
no table or no cell for the shape it falls back to a fixed preference order. No torch at import.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

TABLE_PATH = Path(__file__).with_name("attention_table.json")
# With no measured cell: flashinfer's Hopper kernels first (the fastest whole forward from lone
# queries to full batches for both the BGE-M3 and the pplx-embed heads, and correct in graphs), then
# torch varlen, flashinfer fa2, FlashAttention 4; fa3 needs sm_90, so elsewhere torch varlen leads.
PREFERENCE = ("flashinfer_fa3", "torch_varlen", "flashinfer", "flash_attn4", "sdpa_loop")


class BackendTable:
    def __init__(self, data: dict | None = None):
        self.data = data or {}
        self.shapes: dict[str, list[dict]] = self.data.get("shapes", {})

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
        plan runs on the host before the forward pass and a lone request waits for both. Not memoised
        here: Engine.backend_for remembers its configurations' answers."""
        if not available:
            raise ValueError("no attention backend can run here")
        plan_us = plan_us or {}
        cost = {n: t * layers + plan_us.get(n, 0.0) for n, t in self.estimate(shape_key, seqs, tokens).items()
                if n in available}
        if cost:
            return min(cost, key=cost.get)
        return next((n for n in PREFERENCE if n in available), available[0])

    def estimate(self, shape_key: str, seqs: int, tokens: int) -> dict[str, float]:
        """{backend: us per layer call} at (seqs, tokens): the cells of the nearest measured sequence
        count (the smaller on a tie), interpolated between the measured token counts on either side of
        `tokens` in log-log space (attention time grows as a power of the tokens), or the nearest cell
        past the ends. A lone 4,096-token sequence lies halfway between the 2,048 and 8,192 cells, and
        the nearest of them alone (2,048) would hide a backend's lead that grows with the tokens."""
        cells = self.shapes.get(shape_key, [])
        if not cells:
            return {}
        near = min({c["seqs"] for c in cells}, key=lambda s: (abs(math.log2(s / seqs)), s))
        row = sorted((c for c in cells if c["seqs"] == near), key=lambda c: c["tokens"])
        lo = next((c for c in reversed(row) if c["tokens"] <= tokens), row[0])
        hi = next((c for c in row if c["tokens"] >= tokens), row[-1])
        lo_us = {n: t for n, t in lo.get("us", {}).items() if t}
        if lo is hi:
            return lo_us
        w = math.log(tokens / lo["tokens"]) / math.log(hi["tokens"] / lo["tokens"])
        hi_us = hi.get("us", {})
        return {n: math.exp((1 - w) * math.log(a) + w * math.log(hi_us[n])) for n, a in lo_us.items() if hi_us.get(n)}
