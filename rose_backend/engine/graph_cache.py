"""CUDA graph cache: bucketing, the lazy-capture state machine, and capture itself.

A configuration is (sequence-count bucket, token bucket). Token counts are padded up to a multiple
of 64, then of 256 past 1024; sequence counts up to a power of two. The padding is held by one
dummy sequence at the end and the unused sequence slots are empty (length 0), so a
configuration's cu_seqlens always has `seq_bucket + 2` entries and every kernel sees fixed shapes.

Lazy capture, per configuration (nano-vllm's pattern, in three states):
    first sight   -> "eager"    run eagerly on the static buffers (warms kernels, JIT, workspaces)
    second sight  -> "capture"  capture the forward pass into a graph, then replay it
    later         -> "replay"
All graphs share one memory pool. Memory cap policy: once the memory the graphs hold reaches
`memory_cap_bytes`, no new graph is captured; configurations not yet captured keep running eagerly
on their static buffers (counted in `refused`), graphs already captured stay and keep replaying.
Nothing is evicted: graphs of one shared pool free no memory when dropped, so eviction would buy
nothing back.
What the graphs hold (`graph_bytes`): on CUDA the growth of the allocator's reserved bytes across
each capture (torch.cuda.graph empties the cache first, so it is the pool's growth, not the eager
batches' cache nor an attention workspace); on the CPU the bytes of the stand-ins' static outputs,
the only memory they keep. The cap is the `graphs` part of the engine's budget (memory_budget.py).

The state machine (`action`) knows nothing about CUDA, so it is tested on the CPU; the capture
(`capture`) makes a torch.cuda.CUDAGraph on CUDA and, on the CPU, a stand-in that re-runs the
function into the same output tensor (the same static-buffer discipline, for tests).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from rose_backend.engine.batch_limits import BATCH_SEQS, BATCH_TOKENS


def bucket_limits(max_positions: int, batch_tokens: int = BATCH_TOKENS, batch_seqs: int = BATCH_SEQS) -> dict:
    """The engine's bucket limits for a model of max_positions under a batch budget: the token buckets
    cover every batch the scheduler forms (one sequence of the model's full length may exceed
    batch_tokens), the sequence buckets batch_seqs. EngineOptions(max_tokens=..., max_seqs=...) keywords."""
    return {"max_tokens": max(batch_tokens, max_positions), "max_seqs": batch_seqs}


# (sequence-count bucket, token bucket), plus a max_seqlen bound for backends whose launch grid
# follows it, plus "m3" for the graph that also runs BGE-M3's heads (the engine adds both; see
# Engine._run_static)
Key = tuple[int, int] | tuple[int, int, int] | tuple  # (sb, tb[, bound][, "m3"])


def token_buckets(max_tokens: int, small: int = 64, switch: int = 1024, big: int = 256) -> list[int]:
    """64, 128, ..., 1024, 1280, 1536, ... up to the first bucket >= max_tokens."""
    out = list(range(small, min(switch, max_tokens) + small, small))
    while out[-1] < max_tokens:
        out.append(out[-1] + (small if out[-1] < switch else big))
    return out


def seq_buckets(max_seqs: int) -> list[int]:
    """1, 2, 4, ... up to the first power of two >= max_seqs."""
    out = [1]
    while out[-1] < max_seqs:
        out.append(out[-1] * 2)
    return out


def pick(buckets: list[int], n: int) -> int | None:
    """Smallest bucket >= n, or None when n is past the largest."""
    return next((b for b in buckets if b >= n), None)


@dataclass(slots=True)
class Entry:
    state: str = "warm"                 # "warm" (seen once, ran eagerly) | "captured"
    hits: int = 0
    graph: object | None = None
    output: torch.Tensor | None = None


class CpuGraph:
    """CPU stand-in for torch.cuda.CUDAGraph: replay re-runs the function into the captured output."""

    def __init__(self, fn: Callable[[], torch.Tensor]):
        self.fn = fn
        self.output = fn()

    def replay(self) -> None:
        with torch.inference_mode():                # the captured output is an inference tensor
            self._replay()

    def _replay(self) -> None:
        new = self.fn()
        if isinstance(self.output, tuple):          # several outputs (the heads' graphs)
            for out, value in zip(self.output, new):
                out.copy_(value)
        else:
            self.output.copy_(new)


@dataclass
class GraphCache:
    max_tokens: int
    max_seqs: int
    memory_cap_bytes: int | None = None
    enabled: bool = True
    entries: dict[Key, Entry] = field(default_factory=dict)
    refused: int = 0
    pool: object | None = None
    held_bytes: int = 0
    full: bool = False

    def __post_init__(self):
        self.t_buckets = token_buckets(self.max_tokens)
        self.s_buckets = seq_buckets(self.max_seqs)

    def key_for(self, num_seqs: int, num_tokens: int) -> Key | None:
        """The configuration of a batch, or None when it is larger than every bucket (run unpadded).

        The dummy padding sequence needs no token of its own (it may be empty), so a batch fits
        bucket (s, t) when num_seqs <= s and num_tokens <= t."""
        s, t = pick(self.s_buckets, num_seqs), pick(self.t_buckets, num_tokens)
        if s is None or t is None:
            return None
        return s, t

    def action(self, key: Key) -> str:
        """Advance `key`'s state and say what to do with this batch: eager | capture | replay."""
        e = self.entries.get(key)
        if e is None:
            self.entries[key] = Entry(hits=1)
            return "eager"
        e.hits += 1
        if e.state == "captured":
            return "replay"
        if not self.enabled:
            return "eager"
        if self.full:
            self.refused += 1
            return "eager"
        return "capture"

    # ---- capture (device-specific) ----
    def start(self, device: torch.device, capture_stream: torch.cuda.Stream | None = None) -> None:
        """Call once the weights and backends are in place: memory counted from here is the graphs'.
        capture_stream: where to capture (None: a side stream of our own on `device`)."""
        self.device = torch.device(device)
        if self.device.type == "cuda":
            # Our own side stream on this device: torch.cuda.graph's default capture stream is one
            # per process, made on whichever device was current first, and capturing on it would
            # send a second engine's kernels (another GPU) to that device.
            self.capture_stream = capture_stream or torch.cuda.Stream(device=self.device)

    def graph_bytes(self) -> int:
        """Bytes the captured graphs hold (module docstring)."""
        return self.held_bytes

    def capture(self, key: Key, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Capture fn (a forward pass on static buffers) for `key`; return its static output.
        The caller replays it (the capture itself computes nothing on CUDA)."""
        e = self.entries[key]
        if self.device.type == "cuda":
            g = torch.cuda.CUDAGraph()
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()             # as torch.cuda.graph does: what grows now is the pool
            before = torch.cuda.memory_reserved(self.device)
            with torch.cuda.graph(g, pool=self.pool, stream=self.capture_stream):
                out = fn()
            if self.pool is None:
                self.pool = g.pool()
            self.held_bytes += max(0, torch.cuda.memory_reserved(self.device) - before)
        else:
            g = CpuGraph(fn)
            out = g.output
            self.held_bytes += sum(t.numel() * t.element_size() for t in (out if isinstance(out, tuple) else (out,)))
        e.state, e.graph, e.output = "captured", g, out
        if self.memory_cap_bytes is not None and self.graph_bytes() >= self.memory_cap_bytes:
            self.full = True
        return out

    def replay(self, key: Key) -> torch.Tensor:
        e = self.entries[key]
        e.graph.replay()
        return e.output

    def captured(self, key: Key) -> Entry | None:
        """`key`'s entry once its graph is captured (a replay may follow without action()), else None."""
        e = self.entries.get(key)
        return e if e is not None and e.state == "captured" else None

    @property
    def num_captured(self) -> int:
        return sum(e.state == "captured" for e in self.entries.values())
