"""The lone path: one sequence through its configuration's captured graph, with nothing else in flight.

    run = engine.lone.run_for(tokens)         # None until that configuration's graph is captured
    engine.lone.launch(run, ids)              # staged, copied in, planned, replayed, row copy queued
    row = engine.lone.wait()                  # [1, D] float32, a reused pinned buffer

What a length needs and that does not change between requests is prepared once (LoneRun): the
staging template, the attention metadata, the device views, the raw pointers. A launch is then a
handful of calls: two numpy copies into the path's own pinned buffer, one driver copy in, the plan
(flashinfer keeps an unchanged one), the replay, one driver copy out (cuda_copy.py); no slot, no
handle, no allocation. The caller owns the engine from launch to wait (the service's lone path,
serving/service.py); a graph is captured only by Engine.step(), which runs a configuration eagerly,
then captures it, on its first two sights.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from rose_backend.engine.staging import LONE_TEMPLATE_MAX_TOKENS, Layout, lone_template, stage_lone
from rose_backend.layers.attention import AttentionMetadata


@dataclass(slots=True)
class LoneRun:
    """Everything a lone sequence of `tokens` tokens needs that does not change between requests."""
    tokens: int
    layout: Layout
    backend: str
    graph_key: tuple
    meta: AttentionMetadata            # planned before every replay
    inputs: torch.Tensor               # the configuration's device input words
    staging: torch.Tensor              # the same words of the path's pinned buffer
    template: np.ndarray | None        # staged words but the ids (small layouts), else None: stage_lone
    out_row: torch.Tensor | None = None   # the graph's first output row, once captured
    pointers: tuple = ()               # (inputs, staging, bytes, out_row, out bytes) for the driver copies


class LonePath:
    def __init__(self, engine):
        self.engine = engine
        cuda = engine.device.type == "cuda"
        tb = engine.graphs.t_buckets[-1]
        self._runs: dict[int, LoneRun | None] = {}
        self._staging = torch.zeros(Layout(1, tb).words, dtype=torch.int32, pin_memory=cuda)
        self._staging_np = self._staging.numpy()
        self._arange = np.arange(tb, dtype=np.int32)
        self._out: torch.Tensor | None = None               # [1, D] float32, made at the first capture seen
        self._out_np: np.ndarray | None = None
        self._out_ptr = 0
        self._copies = None
        if cuda:
            from rose_backend.engine.cuda_copy import DriverCopies
            self._copies = DriverCopies()
        self._stream = 0                                     # the stream of the launch in flight

    def run_for(self, tokens: int) -> LoneRun | None:
        """The prepared run of one sequence of `tokens` tokens once its configuration's graph is
        captured; None until then, or where one such sequence runs no graph."""
        run = self._runs.get(tokens)
        if run is None:
            if tokens in self._runs:
                return None
            run = self._runs[tokens] = self._prepare(tokens)
            if run is None:
                return None
        if run.out_row is None:
            e = self.engine.graphs.captured(run.graph_key)
            if e is None:
                return None
            with torch.inference_mode():
                run.out_row = e.output[:1]                           # [1, D] float32, the sequence's row
            if self._out is None:
                self._out = torch.empty(run.out_row.shape, dtype=torch.float32, pin_memory=self._copies is not None)
                self._out_np, self._out_ptr = self._out.numpy(), self._out.data_ptr()
            run.pointers = (run.inputs.data_ptr(), run.staging.data_ptr(), run.staging.numel() * 4,
                            run.out_row.data_ptr(), run.out_row.numel() * 4)
        return run

    def _prepare(self, tokens: int) -> LoneRun | None:
        eng = self.engine
        key = eng.graphs.key_for(1, tokens) if eng.graphs_on and eng.stream is None else None
        if key is None or not 0 < tokens <= eng.max_len:
            return None
        be = eng.backend(eng.backend_for(*key))
        if eng.device.type == "cuda" and not be.supports_cuda_graphs:
            return None
        layout = Layout(*key)
        bound, plan_key, graph_key = eng.graph_keys(be, key, tokens, tokens, frozenset())
        v = eng.device_views(key)
        meta = AttentionMetadata(v.cu, bound, None, eng.cfg.causal, graph_key=plan_key,
                                 cu_seqlens_host=self._staging[layout.cu])
        template = (lone_template(*key, tokens, eng.cfg.pad_token_id) if layout.tb <= LONE_TEMPLATE_MAX_TOKENS
                    else None)
        return LoneRun(tokens, layout, be.name, graph_key, meta, v.inputs, self._staging[:layout.words], template)

    def launch(self, run: LoneRun, ids: np.ndarray, marks: list | None = None) -> None:
        """ids [run.tokens] int32 staged, copied in, replayed; the row's copy back queued. `marks`:
        the stage clock's (stage, ns) list, or None."""
        eng, out = self.engine, self._staging_np
        if run.template is not None:
            out[:run.layout.words] = run.template
            out[:run.tokens] = ids
        else:
            stage_lone(ids, run.layout, out, eng.cfg.pad_token_id, self._arange)
        copies = self._copies
        if copies is not None:
            stream = self._stream = torch.cuda.current_stream(eng.device).cuda_stream
            inputs, staging, nbytes, out_row, out_bytes = run.pointers
            copies.to_device(inputs, staging, nbytes, stream)
        else:
            run.inputs.copy_(run.staging)
        if marks is not None:
            marks.append(("staged", time.perf_counter_ns()))
        eng.use_backend(run.backend).plan(run.meta)
        if marks is not None:
            marks.append(("planned", time.perf_counter_ns()))
        e = eng.graphs.entries[run.graph_key]
        e.hits += 1
        e.graph.replay()
        if marks is not None:
            marks.append(("launched", time.perf_counter_ns()))
        if copies is not None:
            copies.to_host(self._out_ptr, out_row, out_bytes, stream)
        else:
            self._out.copy_(run.out_row)
        if marks is not None:
            marks.append(("copy_queued", time.perf_counter_ns()))
        st = eng.stats
        st.batches += 1
        st.tokens += run.tokens
        st.sequences += 1
        st.graph_replays += 1
        st.padded_tokens += run.layout.tb

    def wait(self) -> np.ndarray:
        """The launch's row: [1, D] float32, a view of a pinned buffer that the next launch overwrites."""
        if self._copies is not None:
            self._copies.wait(self._stream)
        return self._out_np

    def run(self, run: LoneRun, ids: np.ndarray, marks: list | None = None) -> np.ndarray:
        """launch, then wait: the row, on the calling thread."""
        self.launch(run, ids, marks)
        return self.wait()
