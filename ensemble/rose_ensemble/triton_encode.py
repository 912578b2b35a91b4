"""The `encode` Triton model (decoupled): texts in, whichever outputs a request names out.

The inputs of `embed` (TEXT, TASK, DIMENSIONS, ENCODING, DOC_CHUNKS) and every output of `rose`:
EMBEDDINGS, SPARSE_IDS, SPARSE_WEIGHTS, SPARSE_LENS, COLBERT, COLBERT_LENS, TOKEN_COUNTS,
TRUNCATED. A request gets exactly the outputs it names, as any Triton client names them; one it
cannot have (the sparse and ColBERT outputs of a model without BGE-M3's heads, ColBERT with late
chunking) is an INVALID_ARG error naming it. A request naming none gets all of them (Triton's
convention), which a model without the heads refuses: name the outputs wanted.

Why a model of its own: Triton 2.51's ensemble asks each step for every output it maps, whatever
the client named, and passes the names on nowhere, so `embed` could only leave a named output out
(rose_backend/serving/output_choice.py). `embed` therefore declares EMBEDDINGS only and stays the
dense path; this model sees the names and hands them to `rose`.

A request is read and checked as `tokenize_batched` reads it (text_requests.py), tokenized in one
Rust call with the requests waiting beside it (tokenize_batcher.py), then sent to `rose` through
BLS naming the outputs chosen, with the request's parameters (lane); rose's one answer, its tensors
or its error, is this request's one answer. The BLS calls wait on threads of a pool (at most
max_inflight_calls at once; more queue): a call blocks its thread until `rose` answers.

config.pbtxt parameters: settings_from (the model whose tokenize parameters it takes; default
tokenize), rose_model (the model it calls; default rose), max_inflight_calls (default 64).
"""
from __future__ import annotations

import json
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import triton_python_backend_utils as pb_utils

from rose_backend.serving.outcomes import CANCELLED, SHUTTING_DOWN
from rose_backend.serving.output_choice import ALL_OUTPUTS, COUNT_OUTPUTS, choose_outputs
from rose_backend.triton.decoupled import send_final
from rose_backend.triton.model_settings import model_config_file
from rose_backend.triton.request_inputs import input_tensors, request_parameters
from rose_ensemble.text_requests import read_text_job
from rose_ensemble.tokenization import InputError
from rose_ensemble.tokenize_batcher import Job, TokenizeBatcher
from rose_ensemble.triton_tokenize import TokenizeBatchedModel, TokenizeModel, error_response, passed_on

log = logging.getLogger(__name__)
OWN_PARAMETERS = {"settings_from": "tokenize", "rose_model": "rose", "max_inflight_calls": "64"}


def own_parameters(model_config: dict) -> dict[str, str]:
    """This model's parameters (OWN_PARAMETERS' defaults); ValueError naming an unknown one."""
    given = {k: v.get("string_value", "") for k, v in (model_config.get("parameters") or {}).items()}
    unknown = sorted(set(given) - set(OWN_PARAMETERS))
    if unknown:
        raise ValueError(f"encode takes the parameters {sorted(OWN_PARAMETERS)}; unknown: {unknown}")
    out = {k: given.get(k) or v for k, v in OWN_PARAMETERS.items()}
    if not out["max_inflight_calls"].isdigit() or int(out["max_inflight_calls"]) < 1:
        raise ValueError(f"max_inflight_calls must be a positive integer, got {out['max_inflight_calls']!r}")
    return out


def _error(e: Exception | str):
    return error_response(e, "encode")


class EncodeModel(TokenizeBatchedModel):
    def initialize(self, args):
        TokenizeModel.initialize(self, args)        # the tokenizer, with the settings of settings_from
        own = own_parameters(json.loads(args["model_config"]))
        self.rose_model = own["rose_model"]
        self.clock = None                           # stage timing: `embed`'s path (tokenize_batched, rose)
        self.batcher = TokenizeBatcher(self._encode, self._answer, backlog_gap_us=self.settings.batch_backlog_us)
        self.pool = ThreadPoolExecutor(int(own["max_inflight_calls"]), thread_name_prefix="rose-encode")

    @staticmethod
    def _model_config(args) -> dict:
        own = own_parameters(json.loads(args["model_config"]))
        return model_config_file(Path(args["model_repository"]).parent / own["settings_from"] / "config.pbtxt")

    def admit(self, request, sender, received_ns: int) -> None:
        inputs = input_tensors(request)
        params = request_parameters(request)
        choice = params.pop("outputs", None)        # applied here: rose is sent the names it chose
        try:
            names, _ = choose_outputs(request.requested_output_names(), None if choice is None else str(choice),
                                      self.output_names, none_means=ALL_OUTPUTS)
        except ValueError as e:
            raise InputError(str(e)) from None
        text_job = read_text_job(inputs, self.tokenizer, self.chunker, bool(names & set(COUNT_OUTPUTS)))
        self.batcher.submit(Job(text_job, sender, request.is_cancelled, (passed_on(inputs), sorted(names), params)))

    def refusal(self, error: Exception):
        return _error(error)

    def _answer(self, job: Job, result, error) -> None:
        """The batcher's answer: a tokenizer error at once, else the call to rose on a pool thread."""
        if error is not None:
            send_final(job.handle, _error(error))
            return
        try:
            self.pool.submit(self._call_rose, job.handle, job.is_cancelled, result, *job.extras)
        except RuntimeError:                        # the pool has shut down: the model is unloading
            send_final(job.handle, _error(SHUTTING_DOWN))

    def _call_rose(self, sender, is_cancelled, tokens, extras: tuple, names: list, params: dict) -> None:
        try:
            if is_cancelled():
                send_final(sender, _error(CANCELLED))
                return
            call = pb_utils.InferenceRequest(
                model_name=self.rose_model, inputs=[pb_utils.Tensor(n, a) for n, a in tokens] + list(extras),
                requested_output_names=names, parameters=params)
            answer = None
            for response in call.exec(decoupled=True):
                if response.has_error() or response.output_tensors():
                    answer = response
            if answer is None:
                raise RuntimeError(f"{self.rose_model} sent no answer")
            if answer.has_error():
                error = answer.error()
                reply = pb_utils.InferenceResponse(error=pb_utils.TritonError(error.message(), error.code()))
            else:
                reply = pb_utils.InferenceResponse(output_tensors=answer.output_tensors())
            send_final(sender, reply)
        except Exception as e:                      # every request gets its one FINAL response
            log.exception("encode: calling %s failed", self.rose_model)
            send_final(sender, _error(e))

    def finalize(self):
        self.batcher.stop(30.0)                     # every queued request tokenized and handed on
        self.pool.shutdown(wait=True)               # every call to rose answered
