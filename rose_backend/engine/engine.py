"""Engine: step(batch) -> LazyTensor.

The engine owns the model, its device and the work around a forward pass: the batch staged in pinned
memory, one copy into static buffers, the attention plan (outside any graph), the pass (eager,
captured, or replayed from a CUDA graph), pooling and normalizing, and the copy back behind an event.
On the CPU the same code runs eagerly (graphs off by default) and returns ready handles.

Token-level outputs (BGE-M3's heads, models/m3_heads.py; "hidden" for late chunking) run in the same
pass, from a graph of their own per configuration, and come back as the handle's `extras` ({"sparse":
[T] f32, "colbert": [T, Dc] f32, "hidden": [T, H] f32}, real tokens only), in the step's slot's pinned
buffers (valid until the slot comes round again). A lone sequence whose graph is captured has a
shorter way: `engine.lone` (lone.py).
"""
from __future__ import annotations

import logging
import time

import numpy as np
import torch

from rose_backend.config import ModelConfig
from rose_backend.engine.backend_table import BackendTable
from rose_backend.engine.batch import HEAD_OUTPUTS, PackedBatch, graph_tags, row_names
from rose_backend.engine.graph_cache import GraphCache, Key
from rose_backend.engine.lazy_tensor import LazyTensor
from rose_backend.engine.memory_budget import check_fits, device_limit, engine_budget
from rose_backend.engine.lone import LonePath
from rose_backend.engine.options import EngineOptions
from rose_backend.engine.staging import DeviceViews, Layout, Slot, SlotRing, stage
from rose_backend.engine.stats import EngineStats
from rose_backend.engine.streams import EngineStream
from rose_backend.layers.attention import (AttentionBackend, AttentionMetadata, available_backends, backend_class,
                                           make_backend)
from rose_backend.layers.fp8 import quantize_for_fp8
from rose_backend.models import build_model
from rose_backend.models.heads import build_head
from rose_backend.models.m3_heads import HeadsMissing, M3Heads
from rose_backend.models.pooling import pool
from rose_backend.models.registry import attention_shape
from rose_backend.models.st_chain import SentenceHead

log = logging.getLogger(__name__)


class Engine:
    """Runs packed batches through one model on one device.

    >>> eng = Engine(ModelConfig.from_folder(None))
    >>> emb = eng.step(PackedBatch(ids, lens)).synchronize()     # [S, D] float32

    device is "cpu", "cuda", "cuda:1", ... (the serving layer passes Triton's device id), options the
    knobs (options.py; None: every default). weights_from: another Engine whose weights this one runs
    (the query lane, serving/query_lane.py), with buckets, buffers, graphs and attention workspaces of its
    own, on a high-priority stream. Each batch runs eagerly (first sight, or graphs off), captured
    (second sight) or replayed.
    """

    def __init__(self, cfg: ModelConfig, device: str | torch.device = "cpu", options: EngineOptions | None = None,
                 *, weights_from: "Engine | None" = None):
        t0 = time.perf_counter()
        self.cfg = cfg
        self.options = o = options or EngineOptions()
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        cuda = self.device.type == "cuda"
        self.bind_thread()
        self.dtype = o.torch_dtype(self.device)
        self.attention = o.attention
        self.shape = attention_shape(cfg, self.dtype)
        self.graphs_on = o.graphs_on(self.device)
        self.budget = engine_budget(cfg, self.device, o, shared_weights=weights_from is not None)
        check_fits(self.budget, device_limit(self.device, o.memory_limit_bytes), f"on {self.device}")
        self.streams = EngineStream(self.device, query_lane=weights_from is not None)
        self.stream = self.streams.stream           # None: the calling thread's current stream
        if weights_from is not None:
            self.model, self.heads, self.head = weights_from.model, weights_from.heads, weights_from.head
            self.chain = weights_from.chain
        else:
            self.model = build_model(cfg, self.device, self.dtype, "sdpa_loop")
            quantize_for_fp8(self.model, self.device, o.fp8_min_tokens)         # dtype=fp8 (None: nothing)
            self.heads = M3Heads.from_folder(cfg.model_dir, cfg.hidden_size, self.device)   # None: no heads
            self.head = build_head(cfg, self.device)        # rerankers: pooled [S, H] -> scores [S, 1]
            # embeddings: pooled [S, k x H] -> Dense modules -> Normalize, as the folder's modules.json says
            self.chain = SentenceHead.from_chain(cfg.chain, self.device) if self.head is None else None
        self.type_stride = cfg.max_positions if cfg.uses_token_types else 0
        self._backends: dict[str, AttentionBackend] = {}
        if self.attention is not None:
            self.backend(self.attention)                     # fail early on a backend that cannot run
            self.available = [self.attention]
        else:
            avail = available_backends(self.shape, self.device)
            graphable = [n for n in avail if not cuda or backend_class(n).supports_cuda_graphs]
            self.available = graphable or avail
        self._chosen: dict[tuple[int, int], str] = {}     # (seqs, tokens) -> backend_for's answer
        table = o.backend_table
        self.table = table if isinstance(table, BackendTable) else BackendTable.load(table)
        self.max_len = cfg.max_positions
        self.graphs = GraphCache(*o.buckets(cfg.max_positions), o.graph_memory_cap_bytes, enabled=self.graphs_on)
        tb, sb = self.graphs.t_buckets[-1], self.graphs.s_buckets[-1]
        words = Layout(sb, tb).words
        self._static = torch.zeros(words, dtype=torch.int32, device=self.device)
        self._arange = np.arange(tb, dtype=np.int32)             # positions of a lone sequence
        self._views: dict[Key, DeviceViews] = {}
        self.last_key: tuple | None = None       # graph key of the last bucketed batch (tools)
        self._slots = SlotRing([Slot(words, sb + 1, cfg.embedding_dim, cuda) for _ in range(o.max_inflight + 1)])
        self.stats = EngineStats()
        self.mark_stages = False                 # True: step() leaves its stage times in last_marks
        self.last_marks: list[tuple[str, int]] = []
        self.graphs.start(self.device, self.streams.capture_stream)
        self.lone = LonePath(self)                       # one sequence, nothing else in flight (lone.py)
        self.stats.startup_seconds = time.perf_counter() - t0

    def bind_thread(self) -> None:
        """Make this engine's GPU the calling thread's current CUDA device. The current device is per
        thread, and kernels launched by Triton, flashinfer and CUDA graphs go to it: every thread that
        runs this engine must call this (one Triton instance per GPU puts the second instance's engine
        on cuda:1 while its threads start on cuda:0)."""
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)

    @property
    def embedding_dim(self) -> int:
        return self.cfg.embedding_dim

    # ---- backends ----
    def backend(self, name: str) -> AttentionBackend:
        """The attention backend of that name for this engine (made once)."""
        be = self._backends.get(name)
        if be is None:
            be = self._backends[name] = make_backend(name, self.shape, self.device)
        return be

    def backend_for(self, seqs: int, tokens: int) -> str:
        """The attention backend this engine runs for a configuration (chosen once per configuration)."""
        if self.attention is not None:
            return self.attention
        name = self._chosen.get((seqs, tokens))
        if name is None:
            fits = [n for n in self.available if tokens <= getattr(backend_class(n), "max_tokens", tokens)]
            name = self._chosen[(seqs, tokens)] = self.table.choose(
                self.shape.key, seqs, tokens, fits or self.available, self.cfg.num_layers,
                {n: backend_class(n).host_plan_us for n in fits or self.available})
        return name

    def use_backend(self, name: str) -> AttentionBackend:
        """The backend of that name, set on the model for the next forward pass."""
        be = self.backend(name)
        if self.model.attn is not be:
            self.model.set_attention_backend(be)
        return be

    # ---- the step ----
    def step(self, batch: PackedBatch) -> LazyTensor:
        """Launch the forward pass of `batch` and return a handle on its [S, D] embeddings."""
        if self.stream is not None:
            with torch.cuda.stream(self.stream):
                return self._step(batch)
        return self._step(batch)

    def _step(self, batch: PackedBatch) -> LazyTensor:
        s, t = batch.num_seqs, batch.num_tokens
        if s == 0:
            return LazyTensor(torch.zeros(0, self.embedding_dim), None, 0)
        if batch.max_seqlen > self.max_len:
            raise ValueError(f"a sequence of {batch.max_seqlen} tokens is longer than this model's "
                             f"{self.max_len} positions; truncate it (the tokenizer's max_seq_length)")
        want = batch.token_outputs
        if not want.isdisjoint(HEAD_OUTPUTS) and self.heads is None:
            raise HeadsMissing(f"{', '.join(sorted(want))} output asked for, but the model folder "
                               f"{self.cfg.model_dir} has no sparse_linear / colbert_linear heads")
        st = self.stats
        st.batches += 1
        st.tokens += t
        st.sequences += s
        self.last_marks = marks = [] if self.mark_stages else None
        slot = self._slots.take()
        key = self.graphs.key_for(s, t) if self.graphs_on else None
        try:
            with torch.inference_mode():
                if key is None:
                    out = self._run_unpadded(batch, slot, want)
                else:
                    out = self._run_static(batch, key, slot, marks, want)
                extras = {}
                if want:       # sparse [T] f32, colbert [T, Dc] f32, hidden [T, H] f32
                    out, *rows = out
                    extras = {n: r[:t] for n, r in zip(row_names(want), rows) if n in want}
            if marks is not None:
                marks.append(("launched", time.perf_counter_ns()))
            # all rows of the output (a graph's [Sb + 1, D]: one copy, no slicing on the device side)
            fits = out.shape[0] <= slot.out.shape[0]
            lt = LazyTensor.launch(out, s, host=slot.out_rows(out.shape[0]) if fits else None,
                                   event=slot.done if fits else None, extras=extras,
                                   extras_host=slot.extras_host(extras) if fits and slot.pinned else None,
                                   static=key is not None)     # a graph's static outputs, overwritten by its next replay
        except BaseException:
            # the staging may still be read by a queued host-to-device copy: drain the stream before
            # the slot is reused (its `done` event no longer follows that copy)
            slot.lt = None
            if self.device.type == "cuda":
                try:
                    torch.cuda.current_stream(self.device).synchronize()
                except Exception:
                    pass
            raise
        slot.lt = lt
        if marks is not None:
            marks.append(("copy_queued", time.perf_counter_ns()))
        return lt

    def _run_static(self, batch: PackedBatch, key: Key, slot: Slot, marks: list | None = None,
                    want: frozenset = frozenset()):
        sb, tb = key
        st = self.stats
        v = self.device_views(key)
        layout = v.layout
        staging, cu_host = slot.layout_views(layout)
        types = batch.token_type_ids is not None and self.type_stride     # BERT segment ids: positions + type rows
        stage(batch, layout, slot.np, self.cfg.pad_token_id, self._arange,
              batch.embedding_positions(self.type_stride) if types else None)
        v.inputs.copy_(staging, non_blocking=True)
        if marks is not None:
            marks.append(("staged", time.perf_counter_ns()))
        be = self.use_backend(self.backend_for(sb, tb))
        bound, plan_key, key = self.graph_keys(be, key, batch.max_seqlen, batch.num_tokens, want)
        self.last_key = key
        be.plan(AttentionMetadata(v.cu, bound, None, self.cfg.causal, graph_key=plan_key, cu_seqlens_host=cu_host))
        if marks is not None:
            marks.append(("planned", time.perf_counter_ns()))
        st.padded_tokens += tb
        action = self.graphs.action(key)
        if action != "eager" and self.device.type == "cuda" and not be.supports_cuda_graphs:
            action = "eager"
        if action == "eager":
            st.eager_runs += 1
            st.capture_refused = self.graphs.refused
            return self._forward(v, want)
        if action == "capture":
            t0 = time.perf_counter()
            self.graphs.capture(key, lambda: self._forward(v, want))
            st.capture_seconds += time.perf_counter() - t0
            st.graph_captures += 1
            st.graphs, st.graph_memory_bytes = self.graphs.num_captured, self.graphs.graph_bytes()
        else:
            st.graph_replays += 1
        return self.graphs.replay(key)

    def graph_keys(self, be: AttentionBackend, key: Key, longest: int, tokens: int, want: frozenset):
        """(max_seqlen bound, attention plan key, graph key) of a batch in configuration `key`.

        max_seqlen is baked into captured launches: a fixed bound per configuration (real sequences
        fit the model's positions; the dummy holds < 256 tokens of padding). Backends whose grid
        follows it (FlashAttention varlen) get a power-of-two bound on the batch's longest sequence
        as a third key element, so 100 x 512 does not launch 8192-row grids."""
        sb, tb = key
        bound = min(tb, max(self.max_len, 256))
        if be.graph_max_seqlen:
            longest = max(longest, tb - tokens, 1)
            bound = min(bound, max(64, 1 << (longest - 1).bit_length()))
            key = (sb, tb, bound)
        plan_key = key
        if want:                        # the graph with the heads / hidden states; the attention plan is shared
            key = (*key, *graph_tags(want))
        return bound, plan_key, key

    def device_views(self, key: Key) -> DeviceViews:
        """The device views of configuration key = (sb, tb) into the static input buffer (made once)."""
        v = self._views.get(key)
        if v is None:
            v = self._views[key] = DeviceViews(self._static, Layout(*key[:2]))
        return v

    def _forward(self, v: DeviceViews, want: frozenset = frozenset()):
        hidden = self.model(v.ids, v.pos)                                     # [Tb, H]
        # empty slots and an empty dummy start at row Tb: clamp so CLS gathers stay in bounds
        cu = v.cu.clamp(max=v.ids.shape[0] - 1) if "cls" in self.cfg.pooling else v.cu
        emb = self._output(pool(hidden, cu, v.seq, v.inv, self.cfg.pooling, v.pos))  # [Sb + 1, D] float32
        if not want:
            return emb
        return (emb, *self._token_rows(hidden, want))

    def _token_rows(self, hidden: torch.Tensor, want: frozenset) -> list[torch.Tensor]:
        """The token-level outputs of `want`, in batch.row_names' order."""
        rows = [] if want.isdisjoint(HEAD_OUTPUTS) else list(self.heads(hidden))   # [T] f32, [T, Dc] f32
        if "hidden" in want:
            rows.append(hidden.float())                                       # [T, H] f32
        return rows

    def _output(self, pooled: torch.Tensor) -> torch.Tensor:
        """Pooled [S, k x H] float32 -> embeddings [S, D] (the folder's Dense and Normalize modules) or
        scores [S, 1]."""
        return self.head(pooled) if self.head is not None else self.chain(pooled)

    def _run_unpadded(self, batch: PackedBatch, slot: Slot, want: frozenset = frozenset()):
        """Eager on exact shapes: the CPU path, and batches larger than every bucket."""
        dev = self.device
        st = self.stats
        st.eager_runs += 1
        st.padded_tokens += batch.num_tokens
        st.unbucketed_runs += self.device.type == "cuda"
        lens = batch.seq_lens
        cu_np = batch.cu_seqlens()
        ids = torch.from_numpy(batch.input_ids.astype(np.int32)).to(dev)
        positions = torch.from_numpy(batch.embedding_positions(self.type_stride)).to(dev)
        cu_host = torch.from_numpy(cu_np)
        cu = cu_host.to(dev)
        seq_ids = torch.from_numpy(batch.seq_ids()).to(dev)
        inv_lens = torch.from_numpy((1.0 / lens.astype(np.float32))[:, None]).to(dev)
        s_b = self.graphs.s_buckets
        be = self.use_backend(self.backend_for(min(batch.num_seqs, s_b[-1]), batch.num_tokens))
        be.plan(AttentionMetadata(cu, batch.max_seqlen, lens.tolist(), self.cfg.causal,
                                  cu_seqlens_host=cu_host))
        hidden = self.model(ids, positions)                                   # [T, H]
        emb = self._output(pool(hidden, cu, seq_ids, inv_lens, self.cfg.pooling, positions))   # [S, D] float32
        if not want:
            return emb
        return (emb, *self._token_rows(hidden, want))

    # ---- helpers ----
    def precapture(self, configs) -> None:
        """Warm and capture each (num_seqs, num_tokens) configuration now (two steps each)."""
        rng = np.random.default_rng(0)
        for s, t in configs:
            batch = PackedBatch.filler(s, t, self.cfg.vocab_size, rng)
            self.step(batch).synchronize()
            self.step(batch).synchronize()

    def embed(self, token_lists: list[list[int]], type_lists: list[list[int]] | None = None) -> np.ndarray:
        """Tests and tools: token id (and segment id) lists -> [n, D] float32 ([n, 1] scores), one batch."""
        return self.step(PackedBatch.of_lists(token_lists, type_lists)).synchronize()
