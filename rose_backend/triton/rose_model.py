"""The `rose` Triton model (decoupled): INPUT_IDS, SEQ_LENS (+ DIMENSIONS, ENCODING) -> EMBEDDINGS
(+ SPARSE_IDS, SPARSE_WEIGHTS, SPARSE_LENS, COLBERT, COLBERT_LENS, TOKEN_COUNTS, TRUNCATED when named:
serving/outputs.py; a named output that will not be sent is an INVALID_ARG error naming it,
serving/output_choice.py).
A reranker folder (rose_backend/model_kind.py) answers SCORES [S] instead, one score per
query-document pair (the sequences are the pairs, tokenized by `tokenize`); TOKEN_TYPE_IDS
(optional, INT32 beside INPUT_IDS) carries BERT cross-encoders' segment ids (zeros elsewhere).

execute() (triton/decoupled.py) validates each request, admits it into the EmbeddingService pool and
returns None; the service's loop thread batches, runs the engine and calls back here to send each
request exactly one response, with the FINAL flag. Bad input gets an error response at once; nothing
else waits. A lone query (one sequence, no options, on an idle instance) is run and answered inside
execute() itself (EmbeddingService.run_lone).

config.pbtxt parameters: rose_backend.triton.model_settings.RoseSettings (their meaning and defaults).
Stage timing: with $ROSE_STAGE_TIMES set to a folder, each request's host path is timed per stage
and the summary written to <folder>/rose_<pid>.json when the model unloads (serving/stage_clock.py).

Error codes: bad input INVALID_ARG; overloaded / shutting down UNAVAILABLE ("retry later");
cancelled CANCELLED; a failed forward pass INTERNAL. Every request gets exactly one response,
with the FINAL flag, and nothing after it.
"""
from __future__ import annotations

import functools
import gc
import json
import logging
import time

import triton_python_backend_utils as pb_utils

from rose_backend.config import ModelConfig, resolve_model_dir
from rose_backend.serving.lanes import parse_lane
from rose_backend.serving.outcomes import Unavailable
from rose_backend.serving.output_choice import dense_only, parameter_kinds, refuse_unsent
from rose_backend.serving.outputs import (TOKEN_INPUTS, OutputOptions, build_outputs, collect_piece, load_ranges,
                                          parse_options, refuse_token_inputs, special_token_ids, with_token_inputs)
from rose_backend.serving.scheduler import Request
from rose_backend.serving.service import EmbeddingService
from rose_backend.serving.service_settings import ServiceSettings
from rose_backend.serving.stage_clock import StageClock
from rose_backend.serving.validation import RequestLimits, validate_token_types, validate_tokens
from rose_backend.serving.whole_runs import BACKLOG_HOLD_S, BATCH_HOLD_S
from rose_backend.serving.warmup import cap_gpu_memory, precapture_plan, query_lane_plan
from rose_backend.triton.decoupled import DecoupledModel, send_final
from rose_backend.triton.lane_metrics import lane_histograms, lane_series
from rose_backend.triton.model_settings import RoseSettings
from rose_backend.triton.numpy_interop import check_numpy_interop
from rose_backend.triton.parent_watch import drop_triton_objects, watch_parent
from rose_backend.triton.polled_metrics import PolledMetrics, Series
from rose_backend.triton.request_inputs import input_tensors, request_parameters

log = logging.getLogger("rose")

class RoseModel(DecoupledModel):
    def initialize(self, args):
        import torch   # loaded here so that importing this module stays cheap

        check_numpy_interop(pb_utils, "rose")
        watch_parent("rose")        # exit with the server, even if the stub's own exit deadlocks
        try:
            s = RoseSettings.from_model_config(args["model_config"])
            cfg = ModelConfig.from_folder(resolve_model_dir(s.model_dir or None), s.model_kind or None)
            self.output_name = "SCORES" if cfg.is_reranker else "EMBEDDINGS"
            # the outputs config.pbtxt declares: a request naming none arrives naming all of them
            self.declared = frozenset(o["name"] for o in json.loads(args["model_config"]).get("output", []))
            device = self._device(s.device, args, torch)
            query_engine = self._start_engines(s, cfg, device)      # None: no query lane; sets self.engine
            cap_gpu_memory(device, s.gpu_memory_headroom_mb, torch)
            self.limits = RequestLimits(max_seq_len=cfg.max_positions, vocab_size=cfg.vocab_size,
                                        max_request_seqs=s.max_request_seqs, max_request_tokens=s.max_request_tokens,
                                        type_vocab_size=cfg.type_vocab_size if cfg.uses_token_types else 1)
            self.clock = StageClock.from_env("rose")
            for engine in (self.engine, query_engine):
                if engine is not None:
                    engine.mark_stages = self.clock is not None
            self.drain_timeout = s.drain_timeout_s
            self.normalize = cfg.normalize
            self.ranges = load_ranges(s.quantization_ranges or None, cfg.model_dir)
            self.service = self._service(s, cfg, query_engine)
        except Exception as e:
            raise pb_utils.TritonModelException(f"rose: cannot start: {e}") from e
        self.metrics = PolledMetrics(args, self, _COUNTERS, _GAUGES, labelled=[*lane_series(), *_BUDGET],
                                     histograms=lane_histograms())
        gc.collect()
        gc.freeze()      # start-up objects (weights' modules, tables) leave the collector's scans

    def _start_engines(self, s: RoseSettings, cfg: ModelConfig, device: str):
        """Build and warm self.engine, then the query lane's engine where interactive_stream asks for one
        (auto: on a GPU, where it fits in what the main engine leaves of the memory limit), on the main
        engine's weights; returns it, or None. Sets self.memory_limit and self.budget (what the engines
        hold), and logs each engine's budget."""
        from rose_backend.engine.choice import startup_line
        from rose_backend.engine.factory import build_engine, trust_remote_code
        from rose_backend.engine.memory_budget import MIB
        from rose_backend.triton.engine_options import engine_options, query_engine_for
        options = engine_options(s, cfg, device)
        self.memory_limit = options.memory_limit_bytes          # None: no check
        self.engine, choice = build_engine(cfg, device, options, trust_remote_code=trust_remote_code(s.trust_remote_code))
        self.late_chunking_refusal = cfg.chain.late_chunking_refusal() if cfg.chain is not None else None
        dtype = str(self.engine.dtype).removeprefix("torch.")
        if options.fp8_min_tokens is not None:
            dtype += f" (FP8 projections from {options.fp8_min_tokens} tokens)"
        pb_utils.Logger.log_info(startup_line(cfg, choice, dtype, device))
        self.budget = self.engine.budget
        limit = "none" if self.memory_limit is None else f"{self.memory_limit / MIB:.0f} MiB"
        pb_utils.Logger.log_info(f"rose: memory budget on {device}: {self.engine.budget.describe()} (limit {limit})")
        warm = self._warm_up(s, cfg)
        query_engine = query_engine_for(s.interactive_stream, self.engine, options, pb_utils.Logger.log_warn)
        if query_engine is None:
            return None
        self.budget = self.engine.budget + query_engine.budget
        pb_utils.Logger.log_info(f"rose: memory budget of the query lane's engine: {query_engine.budget.describe()}; "
                                 f"both engines {self.budget.total / MIB:.0f} MiB (limit {limit})")
        plan, t0 = query_lane_plan(warm, s.bulk_threshold_tokens), time.perf_counter()
        query_engine.precapture(plan)
        pb_utils.Logger.log_info(f"rose: warmed up the query lane's engine on {len(plan)} configurations in "
                                 f"{time.perf_counter() - t0:.1f} s: {plan}")
        return query_engine

    def _warm_up(self, s: RoseSettings, cfg: ModelConfig) -> list[tuple[int, int]]:
        """Run the warm-up configurations on self.engine before READY (kernels compiled, graphs captured)
        and return them; warns when the graph pool filled up meanwhile."""
        from rose_backend.engine.memory_budget import MIB
        warm = precapture_plan(s.precapture, self.engine.device.type == "cuda",
                               max_len=cfg.max_positions, **s.engine_limits(cfg))
        t0 = time.perf_counter()
        self.engine.precapture(warm)
        pb_utils.Logger.log_info(f"rose: warmed up {len(warm)} configurations in {time.perf_counter() - t0:.1f} s: {warm}")
        stats = self.engine.stats
        if stats.capture_refused:
            pb_utils.Logger.log_warn(
                f"rose: the graph pool reached graph_memory_mb={s.graph_memory_mb} during warm-up "
                f"({stats.graph_memory_bytes / MIB:.0f} MiB held, {stats.graphs} graphs): "
                f"configurations past it run eagerly; raise graph_memory_mb or shorten precapture")
        return warm

    def _service(self, s: RoseSettings, cfg: ModelConfig, query_engine) -> EmbeddingService:
        """The EmbeddingService that batches requests, runs the engines and answers through _respond."""
        inline = s.inline_execute
        if inline == "auto":
            inline = "true" if self.engine.device.type == "cuda" else "false"
        on_piece = functools.partial(collect_piece, skip_ids=special_token_ids(cfg.model_dir)
                                     if self.engine.heads is not None else None)    # heads, late chunking
        settings = ServiceSettings.of(s, inline=inline == "true",
                                      backlog_us=None if s.inline_backlog_us < 0 else s.inline_backlog_us)
        return EmbeddingService(self.engine, self._respond, settings, clock=self.clock, on_piece=on_piece,
                                release=_release, query_engine=query_engine)

    @staticmethod
    def _device(choice: str, args, torch) -> str:
        kind = args.get("model_instance_kind", "CPU")
        gpu_id = int(args.get("model_instance_device_id", 0) or 0)
        if choice == "cpu" or (choice == "auto" and (kind != "GPU" or not torch.cuda.is_available())):
            return "cpu"
        if not torch.cuda.is_available():
            raise ValueError("parameter device=cuda but no CUDA device is visible")
        return f"cuda:{gpu_id if kind == 'GPU' else 0}"

    def admit(self, request, sender, received_ns: int) -> None:
        clock = self.clock
        inputs = input_tensors(request)
        ids, lens, types = inputs.get("INPUT_IDS"), inputs.get("SEQ_LENS"), inputs.get("TOKEN_TYPE_IDS")
        ids, lens = None if ids is None else ids.as_numpy(), None if lens is None else lens.as_numpy()
        t1 = time.perf_counter_ns() if clock is not None else 0
        input_ids, seq_lens = validate_tokens(ids, lens, self.limits)
        token_types = validate_token_types(None if types is None else types.as_numpy(), input_ids.size, self.limits)
        params = request_parameters(request)
        requested = request.requested_output_names()
        if (seq_lens.size == 1 and len(inputs) == 2 and not params and self.output_name == "EMBEDDINGS"
                and dense_only(requested, self.declared) and self._run_lone(input_ids, sender, received_ns, t1)):
            return
        opts = self._refuse_for_scores(requested, params, inputs) if self.output_name == "SCORES" else \
            self._options(requested, params, inputs, seq_lens)
        lane = parse_lane(params.get("lane"))                # interactive | bulk | None: by size
        r = Request(input_ids, seq_lens, handle=sender, is_cancelled=request.is_cancelled, lane=lane,
                    token_outputs=opts.token_outputs if opts else frozenset(), options=opts,
                    token_type_ids=token_types)
        if clock is not None:
            r.marks += [("received", received_ns), ("inputs_read", t1), ("validated", time.perf_counter_ns())]
        self.service.submit(r)

    def refusal(self, error: Exception):
        if isinstance(error, Unavailable):
            code = pb_utils.TritonError.UNAVAILABLE
        elif isinstance(error, ValueError):
            code = pb_utils.TritonError.INVALID_ARG
        else:
            log.exception("rose: admitting a request failed")
            code = pb_utils.TritonError.INTERNAL
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"rose: {error}", code))

    def _run_lone(self, input_ids, sender, received_ns: int, inputs_read_ns: int) -> bool:
        """A lone query, run and answered on this thread (service.run_lone); False: not taken."""
        clock = self.clock
        holder = None
        if clock is not None:
            holder = _Marks([("received", received_ns), ("inputs_read", inputs_read_ns),
                             ("validated", time.perf_counter_ns())])

        def answer(row):
            if isinstance(row, Exception):
                send_final(sender, pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    f"rose: the forward pass failed: {type(row).__name__}: {row}", pb_utils.TritonError.INTERNAL)))
                return
            if holder is not None:
                holder.marks.append(("result_on_host", time.perf_counter_ns()))
            send_final(sender, pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("EMBEDDINGS", row)]))
            if holder is not None:
                holder.marks.append(("sent", time.perf_counter_ns()))
                clock.finish(holder)

        return self.service.run_lone(input_ids, answer, None if holder is None else holder.marks)

    def _refuse_for_scores(self, requested, params: dict, inputs: dict) -> None:
        """A reranker answers SCORES only: other named outputs, the `outputs` parameter's kinds, late
        chunking and token counts are refused, never ignored (ValueError)."""
        refuse_unsent(requested, self.declared, frozenset({"SCORES"}), "this reranker")
        choice = params.get("outputs")
        if choice is not None and parameter_kinds(str(choice)):
            raise ValueError(f"request parameter 'outputs' ({choice!r}): this reranker sends SCORES only")
        refuse_token_inputs(inputs)

    def _options(self, requested, params: dict, inputs: dict, seq_lens) -> OutputOptions:
        """The request's outputs (`requested`: the names it gives), DIMENSIONS, ENCODING, late chunking
        and token counts (serving/outputs.py, serving/output_choice.py); ValueError if bad."""
        choice = params.get("outputs")
        if self.late_chunking_refusal and "TOKEN_CHUNKS" in inputs:
            raise ValueError(self.late_chunking_refusal)
        dims, enc = inputs.get("DIMENSIONS"), inputs.get("ENCODING")
        opts = parse_options(requested, None if choice is None else str(choice),
                             None if dims is None else dims.as_numpy(), None if enc is None else enc.as_numpy(),
                             self.engine.embedding_dim, self.ranges, self.engine.heads is not None, self.declared)
        return with_token_inputs(opts, {n: inputs[n].as_numpy() for n in TOKEN_INPUTS if n in inputs}, seq_lens,
                                 self.limits)

    _CODES = {"cancelled": "CANCELLED", "unavailable": "UNAVAILABLE", "internal": "INTERNAL"}

    def _respond(self, r: Request) -> None:
        if r.error is None:
            try:
                outputs = [("SCORES", r.output[:, 0].copy())] if self.output_name == "SCORES" else \
                    build_outputs(r, r.options or _DENSE, self.normalize, self.ranges)
            except Exception as e:
                log.exception("rose: building the outputs of a request failed")
                r.error = f"building the outputs failed: {type(e).__name__}: {e}"
            if self.clock is not None:
                self.clock.mark(r, "outputs_built")
        if r.error is None:
            response = pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, a) for n, a in outputs])
        else:
            code = getattr(pb_utils.TritonError, self._CODES.get(r.error_kind, "INTERNAL"))
            response = pb_utils.InferenceResponse(error=pb_utils.TritonError(f"rose: {r.error}", code))
        if self.clock is not None:
            self.clock.mark(r, "response_built")
        send_final(r.handle, response)
        if self.clock is not None:
            self.clock.mark(r, "sent")

    def finalize(self):
        log.info("rose: stopping; %d tokens queued", self.service.queued_tokens)
        self.service.stop(self.drain_timeout)
        self.metrics.stop()
        if self.clock is not None:
            self.clock.write()


_DENSE = OutputOptions(frozenset({"EMBEDDINGS"}), frozenset())


class _Marks:
    """A lone request's stage marks (it has no Request object to hold them)."""
    __slots__ = ("marks",)

    def __init__(self, marks: list):
        self.marks = marks


def _release(r: Request) -> None:
    """The service's release of an answered request: Triton's sender and request go at once (Triton
    counts the request in flight until then), unless the server is gone (parent_watch.server_gone)."""
    drop_triton_objects(r, "handle", "is_cancelled")


_COUNTERS = {  # metric name -> (description, where the value comes from)
    "rose_batches_total": ("forward passes launched", lambda m: m.engine.stats.batches),
    "rose_batch_tokens_total": ("tokens in launched forward passes", lambda m: m.engine.stats.tokens),
    "rose_sequences_total": ("sequences embedded", lambda m: m.engine.stats.sequences),
    "rose_eager_runs_total": ("forward passes run eagerly", lambda m: m.engine.stats.eager_runs),
    "rose_graph_captures_total": ("CUDA graphs captured", lambda m: m.engine.stats.graph_captures),
    "rose_graph_replays_total": ("forward passes replayed from a CUDA graph", lambda m: m.engine.stats.graph_replays),
    "rose_requests_failed_total": ("requests answered with an error after admission", lambda m: m.service.stats.failed),
    "rose_requests_cancelled_total": ("requests cancelled by their caller before they were computed",
                                      lambda m: m.service.stats.cancelled),
    "rose_oom_splits_total": ("batches that ran out of memory and were split and retried",
                              lambda m: m.service.stats.oom_splits),
    "rose_lone_requests_total": ("one-sequence queries replayed and answered inside execute() (the lone path)",
                                 lambda m: m.service.stats.lone),
    "rose_whole_inline_requests_total": ("requests launched, waited for and answered inside execute() "
                                         "through the batch path", lambda m: m.service.stats.whole_inline),
    "rose_backlog_arrivals_total": ("requests that came within inline_backlog_us of execute() returning (Triton had "
                                    f"them queued): none is run whole for {BACKLOG_HOLD_S * 1e3:g} ms",
                                    lambda m: m.service.whole_runs.backlogs),
    "rose_concurrent_arrivals_total": ("requests that came while another was unanswered: none is run whole for "
                                       f"{BATCH_HOLD_S * 1e3:g} ms",
                                       lambda m: m.service.whole_runs.concurrent_arrivals),
    "rose_graph_captures_refused_total": ("batches run eagerly because the graph pool had reached graph_memory_mb",
                                          lambda m: m.engine.stats.capture_refused),
}
_GAUGES = {
    "rose_queue_tokens": ("tokens waiting in the request pool", lambda m: m.service.queued_tokens),
    "rose_graph_memory_bytes": ("bytes the captured CUDA graphs hold (capped at graph_memory_mb)",
                                lambda m: m.engine.stats.graph_memory_bytes),
    "rose_memory_limit_bytes": ("the memory the budget must fit in (memory_limit_mb, or a GPU's free memory "
                                "less a margin at start; 0: no limit)", lambda m: m.memory_limit or 0),
}
# the memory budget computed at start (engine/memory_budget.py's MemoryBudget), one series per part
_BUDGET = [Series("rose_memory_budget_bytes", "gauge", "the memory budget at start, per part (with the query lane: "
                  "both engines)", {"part": part},
                  lambda m, part=part: getattr(m.budget, part))
           for part in ("weights", "graphs", "workspace", "buffers", "activations")]
