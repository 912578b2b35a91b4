"""The fallback engine: step(batch) -> LazyTensor over the folder's own transformers model, for every
family without a native model file (choice.py says which folders). Slower than the native engines.

    eng = FallbackEngine(cfg, "cpu")                        # AutoModel in float32 (bf16 on a GPU)
    emb = eng.step(PackedBatch(ids, lens)).synchronize()    # [S, D]: the chain's output, as Engine's

A batch is cut into padded micro-batches of sequences of like length (longest first; rows x length
within the token budget), each run through the transformers model with an attention mask, then
pooled and sent through the sentence-transformers chain (models/pooling.py, models/st_chain.py, the
native engines' own code) on the padded hidden states: padding tokens pool into a row that is dropped.
On a GPU each micro-batch shape (rows bucket, length bucket) is run eagerly once, then captured into a
CUDA graph and replayed (graph_cache.py's lazy capture); a model whose forward cannot be captured runs
eagerly from then on, and says so once. On the CPU (graphs off) shapes are exact. There is no lone
path, no query lane, no FP8 and no attention backend of rose's own: transformers' attention runs.
A micro-batch's inputs go to the device from pageable memory, a copy that waits for the device, so
on a GPU the host work of one batch does not overlap the device work of the one before.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import torch

from rose_backend.config import ModelConfig
from rose_backend.engine.batch import HEAD_OUTPUTS, PackedBatch
from rose_backend.engine.graph_cache import GraphCache, pick
from rose_backend.engine.lazy_tensor import LazyTensor
from rose_backend.engine.memory_budget import MemoryBudget, check_fits, device_limit, safetensors_shapes
from rose_backend.engine.options import EngineOptions
from rose_backend.engine.staging import Slot, SlotRing
from rose_backend.engine.stats import EngineStats
from rose_backend.models.m3_heads import HeadsMissing
from rose_backend.models.pooling import pool_rows
from rose_backend.models.st_chain import SentenceHead
from rose_backend.models.transformers_model import last_hidden_state, load_transformers_model

log = logging.getLogger(__name__)


class NoLonePath:
    """The fallback has no lone path: every request takes the batched one (serving/service.py)."""

    def run_for(self, tokens: int) -> None:
        return None


@dataclass(slots=True)
class Padded:
    """One micro-batch laid out padded: rows x length, flattened for pooling; device tensors."""
    ids: torch.Tensor        # [R, L] int64, padding = the pad id
    mask: torch.Tensor       # [R, L] int64, 1 for real tokens
    seq: torch.Tensor        # [R x L] int64, each position's row; padding -> R (dropped)
    first: torch.Tensor      # [R + 1] int64, each row's first position in the flat layout
    last: torch.Tensor       # [R + 1] int64, each row's last real position
    inv: torch.Tensor        # [R + 1, 1] float32, 1 / length (0: the dropped row)
    pos: torch.Tensor        # [R x L] int64, each position's index in its row

    def fill(self, other: "Padded") -> None:
        for f in fields(self):
            getattr(self, f.name).copy_(getattr(other, f.name), non_blocking=True)


class FallbackEngine:
    supports_query_lane = False

    def __init__(self, cfg: ModelConfig, device: str | torch.device = "cpu", options: EngineOptions | None = None,
                 *, trust_remote_code: bool = False):
        t0 = time.perf_counter()
        self.cfg, self.options = cfg, (o := options or EngineOptions())
        if o.fp8_min_tokens is not None or o.attention is not None:
            raise ValueError(f"model_type {cfg.model_type!r} runs on the fallback engine (transformers), which has "
                             "no FP8 and no attention backend of rose's: leave dtype=fp8 and attention unset")
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.bind_thread()
        self.dtype = o.torch_dtype(self.device)
        self.graphs_on = o.graphs_on(self.device)
        self.max_len = cfg.max_positions
        self.max_tokens, max_seqs = o.buckets(cfg.max_positions)
        self.graphs = GraphCache(self.max_len, max_seqs, o.graph_memory_cap_bytes, enabled=self.graphs_on)
        self.budget = fallback_budget(cfg, self.device, o)
        check_fits(self.budget, device_limit(self.device, o.memory_limit_bytes), f"on {self.device}")
        self.model = load_transformers_model(cfg, self.device, self.dtype, trust_remote_code)
        self.chain = SentenceHead.from_chain(cfg.chain, self.device)
        self.heads = self.head = None
        cuda = self.device.type == "cuda"
        self._slots = SlotRing([Slot(1, self.graphs.s_buckets[-1] + 1, cfg.embedding_dim, cuda) for _ in range(o.max_inflight + 1)])
        self._static: dict[tuple, Padded] = {}
        self.stats = EngineStats()
        self.lone = NoLonePath()
        self.mark_stages = False
        self.last_marks: list = []
        self.graphs.start(self.device)
        self.stats.startup_seconds = time.perf_counter() - t0

    def bind_thread(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)

    @property
    def embedding_dim(self) -> int:
        return self.cfg.embedding_dim

    def step(self, batch: PackedBatch) -> LazyTensor:
        """Launch `batch` and return a handle on its [S, D] embeddings (extras: "hidden" [T, H] if asked)."""
        s = batch.num_seqs
        if s == 0:
            return LazyTensor(torch.zeros(0, self.embedding_dim), None, 0)
        if batch.max_seqlen > self.max_len:
            raise ValueError(f"a sequence of {batch.max_seqlen} tokens is longer than this model's "
                             f"{self.max_len} positions; truncate it (the tokenizer's max_seq_length)")
        want = batch.token_outputs
        if not want.isdisjoint(HEAD_OUTPUTS):
            raise HeadsMissing(f"{', '.join(sorted(want))} output asked for, but the model folder "
                               f"{self.cfg.model_dir} has no sparse_linear / colbert_linear heads")
        st = self.stats
        st.batches, st.tokens, st.sequences = st.batches + 1, st.tokens + batch.num_tokens, st.sequences + s
        slot = self._slots.take()
        with torch.inference_mode():
            out = torch.empty(s, self.embedding_dim, dtype=torch.float32, device=self.device)
            hidden = torch.empty(batch.num_tokens, self.cfg.hidden_size, dtype=torch.float32,
                                 device=self.device) if "hidden" in want else None
            cu = batch.cu_seqlens()
            for rows in self._groups(batch.seq_lens):
                emb, flat, width = self._run(batch, cu, rows, hidden is not None)
                out.index_copy_(0, torch.from_numpy(rows).to(self.device), emb)
                if hidden is not None:
                    dst = np.concatenate([np.arange(cu[k], cu[k + 1]) for k in rows])
                    src = np.concatenate([j * width + np.arange(batch.seq_lens[k]) for j, k in enumerate(rows)])
                    hidden[torch.from_numpy(dst).to(self.device)] = flat[torch.from_numpy(src).to(self.device)].float()
            extras = {"hidden": hidden} if hidden is not None else {}
            fits = s <= slot.out.shape[0]
            lt = LazyTensor.launch(out, s, host=slot.out_rows(s) if fits else None, event=slot.done if fits else None,
                                   extras=extras, static=False)        # out and hidden: this step's own
        slot.lt = lt
        return lt

    def _groups(self, lens: np.ndarray) -> list[np.ndarray]:
        """The batch's sequences (indices) in micro-batches: longest first, rows x padded length within
        the token budget, rows a power of two when graphs are on (their buckets)."""
        order = np.argsort(-lens, kind="stable")
        out, i = [], 0
        while i < len(order):
            width = self._width(int(lens[order[i]]))
            rows = max(1, min(self.graphs.s_buckets[-1], self.max_tokens // width))
            if self.graphs_on:
                rows = 1 << (rows.bit_length() - 1)
            out.append(order[i:i + rows])
            i += rows
        return out

    def _width(self, longest: int) -> int:
        return pick(self.graphs.t_buckets, longest) or longest if self.graphs_on else longest

    def _run(self, batch: PackedBatch, cu: np.ndarray, rows: np.ndarray, eager: bool):
        """One micro-batch: ([g, D] embeddings, [R x L, H] flat hidden states, L)."""
        lens = batch.seq_lens[rows]
        width = self._width(int(lens.max()))
        r = pick(self.graphs.s_buckets, len(rows)) if self.graphs_on and not eager else len(rows)
        padded = self._layout(batch, cu, rows, r, width)
        self.stats.padded_tokens += r * width
        key = (r, width)
        if eager or not self.graphs_on:
            self.stats.eager_runs += 1
            emb, flat = self._forward(padded, keep_hidden=True)
            return emb[:len(rows)], flat, width
        static = self._static.get(key)
        if static is None:
            static = self._static[key] = padded
        else:
            static.fill(padded)
        action = self.graphs.action(key)
        if action == "capture":
            try:
                t0 = time.perf_counter()
                self.graphs.capture(key, lambda: self._forward(static)[0])
                self.stats.capture_seconds += time.perf_counter() - t0
                self.stats.graph_captures += 1
                self.stats.graphs, self.stats.graph_memory_bytes = self.graphs.num_captured, self.graphs.graph_bytes()
            except Exception as e:              # transformers' forward is not capturable: eager from now on
                log.warning("rose: the fallback engine's forward pass of %s cannot be captured in a CUDA graph "
                            "(%s: %s); it runs eagerly", self.cfg.model_type, type(e).__name__, e)
                self.graphs.enabled = self.graphs_on = False
                self.graphs.entries.pop(key, None)
                action = "eager"
        if action == "eager":
            self.stats.eager_runs += 1
            self.stats.capture_refused = self.graphs.refused
            return self._forward(static)[0][:len(rows)], None, width
        if action == "replay":
            self.stats.graph_replays += 1
        return self.graphs.replay(key)[:len(rows)], None, width

    def _forward(self, p: Padded, keep_hidden: bool = False):
        """Padded micro-batch -> ([R + 1, D] float32 embeddings, the flat hidden states or None)."""
        h = last_hidden_state(self.model, p.ids, p.mask)                        # [R, L, H]
        flat = h.reshape(-1, h.shape[-1])                                       # [R x L, H]
        emb = self.chain(pool_rows(flat, p.first, p.last, p.seq, p.inv, self.cfg.pooling, p.pos))
        return emb, flat if keep_hidden else None

    def _layout(self, batch: PackedBatch, cu: np.ndarray, rows: np.ndarray, r: int, width: int) -> Padded:
        """The micro-batch's sequences right-padded to `width` in `r` rows (rows past the sequences hold
        one padding token each, so that no row is all masked)."""
        g = len(rows)
        ids = np.full((r, width), self.cfg.pad_token_id, dtype=np.int64)
        mask = np.zeros((r, width), dtype=np.int64)
        lens = np.ones(r, dtype=np.int64)
        for j, k in enumerate(rows):
            n = int(batch.seq_lens[k])
            ids[j, :n] = batch.input_ids[cu[k]:cu[k + 1]]
            lens[j] = n
        mask[np.arange(width)[None, :] < lens[:, None]] = 1
        seq = np.where(mask > 0, np.arange(r)[:, None], r).reshape(-1)
        starts = np.arange(r, dtype=np.int64) * width
        first, last = np.append(starts, 0), np.append(starts + lens - 1, 0)
        inv = np.append(1.0 / lens, 0.0).astype(np.float32)[:, None]
        inv[g:r] = 0.0
        pos = np.tile(np.arange(width, dtype=np.int64), r)
        dev = self.device
        return Padded(*(torch.from_numpy(a).to(dev) for a in (ids, mask, seq, first, last, inv, pos)))

    def precapture(self, configs) -> None:
        """Warm (and on a GPU capture) each (num_seqs, num_tokens) configuration now (two steps each)."""
        rng = np.random.default_rng(0)
        for s, t in configs:
            batch = PackedBatch.filler(s, min(t, s * self.max_len), self.cfg.vocab_size, rng)
            self.step(batch).synchronize()
            self.step(batch).synchronize()

    def embed(self, token_lists: list[list[int]]) -> np.ndarray:
        """Tests and tools: token id lists -> [n, D] float32, one batch."""
        return self.step(PackedBatch.of_lists(token_lists)).synchronize()


def fallback_budget(cfg: ModelConfig, device: torch.device, o: EngineOptions) -> MemoryBudget:
    """An upper estimate of what the fallback engine holds (its transformers model is not measured):
    weights, every tensor of the folder's safetensors files at the engine's dtype plus the chain's
    Dense modules (float32); activations, one padded micro-batch of the token budget at
    max(8H, 6H + 2F) bytes-per-element a token, plus the attention scores of the longest rows
    ([rows, heads, L, L] float32 three times on the CPU, the mask once on a GPU); graphs, the cap."""
    cuda = device.type == "cuda"
    elt = torch.empty(0, dtype=o.torch_dtype(device)).element_size()
    weights = sum(int(np.prod(shape)) * elt for path in sorted(Path(cfg.model_dir).glob("*.safetensors"))
                  for shape in safetensors_shapes(path).values())
    weights += sum(int(np.prod(shape)) * 4 for d in (cfg.chain.dense if cfg.chain else ())
                   for shape in safetensors_shapes(d.folder / "model.safetensors").values())
    max_tokens, max_seqs = o.buckets(cfg.max_positions)
    h, f, length = cfg.hidden_size, cfg.intermediate_size, cfg.max_positions
    scores = (elt if cuda else 3 * cfg.num_heads * 4) * max_tokens * length
    act = max_tokens * (max(8 * h, 6 * h + 2 * f) * elt + 4 * h * len(cfg.pooling.split("+")) + 48) + scores
    graphs = 0 if not o.graphs_on(device) else (act if o.graph_memory_cap_bytes is None else o.graph_memory_cap_bytes)
    ring = 0 if cuda else (o.max_inflight + 1) * (max_seqs + 1) * cfg.embedding_dim * 4
    return MemoryBudget(weights=weights, graphs=graphs, workspace=0, buffers=ring, activations=act)
