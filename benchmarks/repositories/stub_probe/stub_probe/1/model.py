"""stub_probe: times each step of serving a request inside Triton's Python stub, the way `rose` and
`tokenize` take them (pb_utils calls, our validation, one tokenizer call, building and sending the
answer). Steps of our own code run twice in a row: the first call shows what the request path pays
(caches cold after the stub waited for the request), the second the same code warm. The medians
are written as one JSON line to the file named by $ROSE_PROBE_OUT when the model unloads.
With $ROSE_PROBE_ASK_CANCELLED=1 it also times `request.is_cancelled()` from execute(), a round trip
to the server that `rose` never makes on a request's path (its scheduler asks only requests that
waited 50 ms in its pool)."""
import json
import os
import sys
import time

# The stub ignores PYTHONPATH: the launcher's paths, appended to import the helper that puts them
# first (rose_backend/triton/stub_path.py); numpy only after it.
sys.path += os.environ.get("ROSE_PYTHONPATH", "").split(os.pathsep)
from rose_backend.triton.stub_path import launcher_paths_first  # noqa: E402
launcher_paths_first()

import numpy as np  # noqa: E402

import triton_python_backend_utils as pb_utils  # noqa: E402

from rose_backend.triton.numpy_interop import check_numpy_interop  # noqa: E402
from rose_backend.triton.request_inputs import input_tensors  # noqa: E402
from rose_backend.serving.validation import RequestLimits, validate_tokens  # noqa: E402
from rose_ensemble.tokenization import TextTokenizer  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        check_numpy_interop(pb_utils, "stub_probe")     # as `rose`: refuse to time a stub that garbles arrays
        self.times: dict[str, list[int]] = {}
        self.out = np.zeros((1, 1024), np.float32)
        self.limits = RequestLimits(max_seq_len=8192, vocab_size=1 << 30)
        self.tok = TextTokenizer.from_folder(os.environ.get("ROSE_MODEL_DIR") or None)
        self.text = [" ".join(["the quick brown fox jumps over a lazy dog"] * 15)]    # ~135 tokens
        self.ask_cancelled = os.environ.get("ROSE_PROBE_ASK_CANCELLED") == "1"

    def _time(self, name, fn):
        t = time.perf_counter_ns()
        out = fn()
        self.times.setdefault(name, []).append(time.perf_counter_ns() - t)
        return out

    def execute(self, requests):
        for r in requests:
            sender = self._time("get_response_sender", r.get_response_sender)
            inputs = self._time("inputs (dict by name)", lambda: input_tensors(r))
            ids, lens = self._time("as_numpy x2", lambda: (inputs["INPUT_IDS"].as_numpy(), inputs["SEQ_LENS"].as_numpy()))
            self._time("parameters()", r.parameters)
            self._time("requested_output_names()", r.requested_output_names)
            if self.ask_cancelled:      # opt-in (see the docstring)
                self._time("is_cancelled() (asks the server)", r.is_cancelled)
            for run in ("first", "again"):
                self._time(f"validate_tokens, {run}", lambda: validate_tokens(ids, lens, self.limits))
            for run in ("first", "again"):
                self._time(f"tokenizer, one ~135-token text, {run}", lambda: self.tok.encode(self.text))
            resp = self._time("response built", lambda: pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("EMBEDDINGS", self.out)]))
            self._time("send", lambda: sender.send(resp, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL))
        return None

    def finalize(self):
        path = os.environ.get("ROSE_PROBE_OUT")
        if path:
            skip = 50                                  # warm-up requests
            stats = {k: {"p50_us": round(float(np.percentile(v[skip:], 50)) / 1e3, 1),
                         "p99_us": round(float(np.percentile(v[skip:], 99)) / 1e3, 1), "n": len(v) - skip}
                     for k, v in self.times.items() if len(v) > skip}
            with open(path, "w") as f:
                json.dump(stats, f)
