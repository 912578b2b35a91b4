"""The `tokenize` Triton model: TEXT (+ optional TASK) -> INPUT_IDS, SEQ_LENS (ragged, no padding);
for a reranker folder also QUERY + DOCUMENTS (+ optional INSTRUCTION) -> INPUT_IDS, SEQ_LENS,
TOKEN_TYPE_IDS of the query-document pairs (pair_tokenization.py), one sequence per document.

config.pbtxt parameters: rose_backend.serving.settings.TokenizeSettings (their meaning and defaults).
Bad input gets an INVALID_ARG error naming what is wrong.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import triton_python_backend_utils as pb_utils

from rose_backend.config import resolve_model_dir
from rose_backend.serving.parent_watch import watch_parent
from rose_backend.serving.settings import TokenizeSettings
from rose_backend.serving.stage_clock import StageClock
from rose_backend.serving.triton_interop import check_numpy_interop
from rose_ensemble.pair_tokenization import PairTokenizer
from rose_ensemble.tokenization import InputError, TextTokenizer


@dataclass(slots=True)
class _Timed:
    marks: list


class TokenizeModel:
    def initialize(self, args):
        check_numpy_interop(pb_utils, "tokenize")
        watch_parent("tokenize")    # exit with the server (see rose_backend/serving/parent_watch.py)
        try:
            s = TokenizeSettings.from_model_config(args["model_config"])
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
        except Exception as e:
            raise pb_utils.TritonModelException(f"tokenize: cannot load the tokenizer: {e}") from e
        self.clock = StageClock.from_env("tokenize")     # $ROSE_STAGE_TIMES: time each request

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
            query = pb_utils.get_input_tensor_by_name(request, "QUERY")
            documents = pb_utils.get_input_tensor_by_name(request, "DOCUMENTS")
            if query is not None or documents is not None:
                return self._pairs(request, query, documents)
            text = pb_utils.get_input_tensor_by_name(request, "TEXT")
            if text is None:
                raise InputError("missing input TEXT")
            task = pb_utils.get_input_tensor_by_name(request, "TASK")
            prompt_name = None
            if task is not None:
                values = task.as_numpy().reshape(-1)
                if len(values) != 1:
                    raise InputError(f"TASK must hold exactly one string, got {len(values)}")
                raw = values[0]
                prompt_name = (raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else str(raw)) or None
            texts = self.tokenizer.decode_texts(text.as_numpy().reshape(-1))
            ids, lens = self.tokenizer.encode(texts, prompt_name)
            return pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("INPUT_IDS", ids), pb_utils.Tensor("SEQ_LENS", lens)])
        except InputError as e:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"tokenize: {e}", pb_utils.TritonError.INVALID_ARG))
        except Exception as e:  # never fail the whole batch of requests for one request's sake
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(
                f"tokenize: {type(e).__name__}: {e}", pb_utils.TritonError.INTERNAL))

    def _pairs(self, request, query, documents):
        if self.pairs is None:
            raise InputError("this model is an embedding model, not a reranker: send TEXT (the `embed` model)")
        if query is None or documents is None:
            raise InputError(f"missing input {'QUERY' if query is None else 'DOCUMENTS'} (reranking takes both)")
        q = query.as_numpy().reshape(-1)
        if len(q) != 1:
            raise InputError(f"QUERY must hold exactly one string, got {len(q)}")
        instruction = pb_utils.get_input_tensor_by_name(request, "INSTRUCTION")
        if instruction is not None:
            instruction = instruction.as_numpy().reshape(-1)
            if len(instruction) != 1:
                raise InputError(f"INSTRUCTION must hold exactly one string, got {len(instruction)}")
            instruction = instruction[0]
        ids, lens, types = self.pairs.encode(*self.pairs.decode(q[0], documents.as_numpy().reshape(-1), instruction))
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("INPUT_IDS", ids), pb_utils.Tensor("SEQ_LENS", lens), pb_utils.Tensor("TOKEN_TYPE_IDS", types)])
