"""The `tokenize` Triton models: TEXT (+ optional TASK) -> INPUT_IDS, SEQ_LENS (ragged, no padding).

`tokenize` (TokenizeModel, one response per request, so HTTP and unary gRPC calls work): for a
reranker folder also QUERY + DOCUMENTS (+ optional INSTRUCTION) -> INPUT_IDS, SEQ_LENS,
TOKEN_TYPE_IDS of the query-document pairs (pair_tokenization.py), one sequence per document.

`tokenize_batched` (TokenizeBatchedModel, decoupled; the `embed` ensemble's first step): the same
TEXT contract, but requests that arrive while the tokenizer is busy wait and are tokenized together
in one Rust call (tokenize_batcher.py); a lone request is tokenized and answered inside execute().
Triton hands a model one request per execute() call whatever its batcher (max_batch_size 0), and
a decoupled model cannot answer HTTP or unary gRPC calls, hence two models over the same code. Its
parameters are `tokenize`'s (read from ../tokenize/config.pbtxt: one place for prompts and limits).

Optional outputs TOKEN_COUNTS / TRUNCATED of `tokenize` (when named) and late chunking (DOC_CHUNKS
in, TOKEN_CHUNKS out): text_requests.py and late_chunks.py. `tokenize_batched` counts nothing:
`embed` sends EMBEDDINGS only; `encode` (triton_encode.py, on this model's code) serves the rest.

config.pbtxt parameters: rose_backend.triton.model_settings.TokenizeSettings (their types and
defaults; their meaning: docs/OPERATIONS.md). Bad input gets an INVALID_ARG error naming what is wrong.
"""
from __future__ import annotations

import gc
import json
import time
from dataclasses import dataclass
from pathlib import Path

import triton_python_backend_utils as pb_utils

from rose_backend.config import resolve_model_dir
from rose_backend.serving.outcomes import CANCELLED, SHUTTING_DOWN, Unavailable
from rose_backend.serving.stage_clock import StageClock
from rose_backend.triton.decoupled import DecoupledModel, send_final
from rose_backend.triton.model_settings import model_config_file
from rose_ensemble.tokenize_settings import TokenizeSettings
from rose_backend.triton.numpy_interop import check_numpy_interop
from rose_backend.triton.parent_watch import watch_parent
from rose_backend.triton.polled_metrics import PolledMetrics
from rose_backend.triton.request_inputs import input_tensors, request_parameters
from rose_ensemble.late_chunks import LateChunker
from rose_ensemble.pair_tokenization import PairTokenizer
from rose_ensemble.text_requests import encode_jobs, read_text_job, wants_counts
from rose_ensemble.tokenization import InputError, TextTokenizer
from rose_ensemble.tokenize_batcher import Job, TokenizeBatcher


@dataclass(slots=True)
class _Timed:
    marks: list


class TokenizeModel:
    def initialize(self, args):
        check_numpy_interop(pb_utils, "tokenize")
        watch_parent("tokenize")    # exit with the server (see rose_backend/triton/parent_watch.py)
        try:
            config = self._model_config(args)
            self.output_names = frozenset(o["name"] for o in json.loads(args["model_config"]).get("output", []))
            self.settings = s = TokenizeSettings.from_model_config(config)
            model_dir = resolve_model_dir(s.model_dir or None)
            self.tokenizer = TextTokenizer.from_folder(
                model_dir, max_seq_length=s.max_seq_length or None,
                prompts=s.prompt_map, fallback_prompts=s.fallback_prompt_map, default_prompt_name=s.default_prompt_name or None,
                max_text_bytes=s.max_text_bytes, max_texts=s.max_request_texts)
            from rose_backend.config import ModelConfig
            kind = ModelConfig.from_folder(model_dir, s.model_kind or None).kind
            self.pairs = None if kind == "embedding" else PairTokenizer.from_folder(
                model_dir, kind, max_seq_length=s.max_seq_length or None,
                max_text_bytes=s.max_text_bytes, max_texts=s.max_request_texts)
            self.chunker = LateChunker(self.tokenizer, s.overlap) if kind == "embedding" else None
        except Exception as e:
            raise pb_utils.TritonModelException(f"tokenize: cannot load the tokenizer: {e}") from e
        self.clock = StageClock.from_env(args.get("model_name", "tokenize"))   # $ROSE_STAGE_TIMES: time each request
        gc.collect()
        gc.freeze()        # start-up objects (the tokenizer's tables) leave the collector's scans

    @staticmethod
    def _model_config(args) -> dict:
        return json.loads(args["model_config"])

    def execute(self, requests):
        if self.clock is None:
            return [self._one(r) for r in requests]
        out = []
        for r in requests:
            timed = _Timed([("received", time.perf_counter_ns())])
            out.append(self._one(r))
            self.clock.mark(timed, "encoded_and_built")
            self.clock.finish(timed)
        return out

    def finalize(self):
        if self.clock is not None:
            self.clock.write()

    def _one(self, request):
        try:
            inputs = input_tensors(request)
            query, documents = inputs.get("QUERY"), inputs.get("DOCUMENTS")
            if query is not None or documents is not None:
                return self._pairs(inputs, query, documents)
            job = read_text_job(inputs, self.tokenizer, self.chunker,
                                wants_counts(outputs_parameter(request), request.requested_output_names(),
                                             self.output_names))
            result = encode_jobs(self.tokenizer, self.chunker, [job])[0]
            if isinstance(result, Exception):
                raise result
            return outputs_response(result)
        except Exception as e:  # never fail the whole batch of requests for one request's sake
            return error_response(e)

    def _pairs(self, inputs: dict, query, documents):
        if self.pairs is None:
            raise InputError("this model is an embedding model, not a reranker: send TEXT (the `embed` model)")
        if query is None or documents is None:
            raise InputError(f"missing input {'QUERY' if query is None else 'DOCUMENTS'} (reranking takes both)")
        q = query.as_numpy().reshape(-1)
        if len(q) != 1:
            raise InputError(f"QUERY must hold exactly one string, got {len(q)}")
        instruction = inputs.get("INSTRUCTION")
        if instruction is not None:
            instruction = instruction.as_numpy().reshape(-1)
            if len(instruction) != 1:
                raise InputError(f"INSTRUCTION must hold exactly one string, got {len(instruction)}")
            instruction = instruction[0]
        ids, lens, types = self.pairs.encode(*self.pairs.decode(q[0], documents.as_numpy().reshape(-1), instruction))
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("INPUT_IDS", ids), pb_utils.Tensor("SEQ_LENS", lens), pb_utils.Tensor("TOKEN_TYPE_IDS", types)])


def outputs_parameter(request) -> str | None:
    """The request parameter `outputs` (Triton forwards request parameters to ensemble steps)."""
    value = request_parameters(request).get("outputs")
    return None if value is None else str(value)


def outputs_response(outputs, extras=()):
    return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(n, a) for n, a in outputs] + list(extras))


_CODES = {CANCELLED: "CANCELLED", SHUTTING_DOWN: "UNAVAILABLE"}      # TritonError's names (set at run time)


def error_response(e: Exception | str, model: str = "tokenize"):
    """Bad input: INVALID_ARG with its message; cancelled; shutting down UNAVAILABLE; else INTERNAL
    (the message begins with the model's name)."""
    if isinstance(e, InputError):
        code, text = pb_utils.TritonError.INVALID_ARG, str(e)
    elif isinstance(e, Unavailable):           # submitted while stopping
        code, text = pb_utils.TritonError.UNAVAILABLE, str(e)
    elif isinstance(e, str):
        code, text = getattr(pb_utils.TritonError, _CODES.get(e, "INTERNAL")), e
    else:
        code, text = pb_utils.TritonError.INTERNAL, f"{type(e).__name__}: {e}"
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"{model}: {text}", code))


PASSED_ON = ("DIMENSIONS", "ENCODING")


def passed_on(inputs: dict) -> tuple:
    """`rose`'s own inputs, handed on unchanged: an ensemble step may take inputs from one decoupled
    model only (Triton's ensemble_utils.cc), so in `embed` they pass through this step to `rose`."""
    return tuple(pb_utils.Tensor(name, inputs[name].as_numpy()) for name in PASSED_ON if name in inputs)


class TokenizeBatchedModel(DecoupledModel, TokenizeModel):
    """Decoupled (execute(): rose_backend/triton/decoupled.py): admit() reads and checks each request,
    then hands it to the batcher, which encodes it at once on this thread when idle (and answers it
    here too when there is no backlog), or together with every request waiting (tokenize_batcher.py)."""

    COUNTERS = {
        "rose_tokenize_encode_calls_total": ("Rust encode calls (each holds one or more requests)",
                                             lambda m: m.batcher.stats.calls),
        "rose_tokenize_encoded_requests_total": ("requests tokenized by those calls", lambda m: m.batcher.stats.jobs),
        "rose_tokenize_answered_inline_total": ("requests encoded and answered inside execute() (no backlog)",
                                                lambda m: m.batcher.stats.answered_inline),
        "rose_tokenize_requests_cancelled_total": ("requests whose caller left before they were tokenized",
                                                   lambda m: m.batcher.stats.cancelled),
    }
    GAUGES = {"rose_tokenize_largest_batch": ("most requests tokenized in one call", lambda m: m.batcher.stats.largest),
              "rose_tokenize_queued_requests": ("requests waiting for the tokenizer", lambda m: m.batcher.queued)}

    def initialize(self, args):
        super().initialize(args)          # its config declares TEXT and TASK only: pairs go to `tokenize`
        self.batcher = TokenizeBatcher(self._encode, self._answer, backlog_gap_us=self.settings.batch_backlog_us)
        self.metrics = PolledMetrics(args, self, self.COUNTERS, self.GAUGES)

    @staticmethod
    def _model_config(args) -> dict:
        """`tokenize`'s parameters (parameter settings_from names the model; default tokenize)."""
        own = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in (own.get("parameters") or {}).items()}
        source = params.pop("settings_from", "") or "tokenize"
        if params:
            raise ValueError(f"tokenize_batched takes its parameters from {source!r}; unknown here: {sorted(params)}")
        return model_config_file(Path(args["model_repository"]).parent / source / "config.pbtxt")

    def admit(self, request, sender, received_ns: int) -> None:
        inputs = input_tensors(request)
        # no TOKEN_COUNTS / TRUNCATED: `embed` sends EMBEDDINGS only (the counts by name: `encode`)
        text_job = read_text_job(inputs, self.tokenizer, self.chunker, False)
        job = Job(text_job, sender, request.is_cancelled, passed_on(inputs))
        if self.clock is not None:
            job.marks += [("received", received_ns), ("read_and_decoded", time.perf_counter_ns())]
        self.batcher.submit(job)

    def refusal(self, error: Exception):
        return error_response(error)

    def _encode(self, jobs):
        return encode_jobs(self.tokenizer, self.chunker, jobs)

    def _answer(self, job: Job, result, error) -> None:
        clock = self.clock
        if clock is not None and job.marks:
            clock.mark(job, "picked_up")                # after "encoded": the hand-over to the worker
        response = error_response(error) if error is not None else outputs_response(result, job.extras)
        if clock is not None and job.marks:
            clock.mark(job, "response_built")
        send_final(job.handle, response)
        if clock is not None and job.marks:
            clock.mark(job, "sent")
            clock.finish(job)

    def finalize(self):
        self.batcher.stop(30.0)
        self.metrics.stop()
        super().finalize()
