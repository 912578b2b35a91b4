"""The `tokenize` Triton model: TEXT (+ optional TASK) -> INPUT_IDS, SEQ_LENS (ragged, no padding).

config.pbtxt parameters: model_dir (default: $ROSE_MODEL_DIR, else the default model),
prompts (JSON {name: prefix}, added to / overriding the model's), default_prompt_name,
max_seq_length (default: the model's), max_text_bytes (texts are cut to this many bytes before
tokenizing, so a huge string costs no more than a long one; default 65536), max_request_texts
(texts per request, default 4096; more is refused with an error naming the limit).
Bad input gets an INVALID_ARG error naming what is wrong.
"""
from __future__ import annotations

import triton_python_backend_utils as pb_utils

from rose_backend.config import resolve_model_dir
from rose_backend.serving.parent_watch import watch_parent
from rose_backend.triton_interop import check_numpy_interop
from rose_backend.triton_params import ModelParameters
from rose_ensemble.tokenization import InputError, TextTokenizer, parse_prompts


class TokenizeModel:
    def initialize(self, args):
        check_numpy_interop(pb_utils, "tokenize")
        watch_parent("tokenize")    # exit with the server (see rose_backend/serving/parent_watch.py)
        params = ModelParameters(args["model_config"])
        try:
            self.tokenizer = TextTokenizer.from_folder(
                resolve_model_dir(params.str("model_dir") or None),
                max_seq_length=params.int("max_seq_length", 0, minimum=0) or None,
                prompts=parse_prompts(params.str("prompts")),
                default_prompt_name=params.str("default_prompt_name") or None,
                max_text_bytes=params.int("max_text_bytes", 65536, minimum=0),
                max_texts=params.int("max_request_texts", 4096, minimum=1),
            )
        except Exception as e:
            raise pb_utils.TritonModelException(f"tokenize: cannot load the tokenizer: {e}") from e

    def execute(self, requests):
        return [self._one(r) for r in requests]

    def _one(self, request):
        try:
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
