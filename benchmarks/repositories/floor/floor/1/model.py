"""floor: read the ids, one GPU round trip (ids up, one kernel, D floats down), answer. Without CUDA
the round trip is left out. Measures what Triton's Python backend costs around any GPU model."""
import os
import sys

# The stub ignores PYTHONPATH: the launcher's paths, appended to import the helper that puts them
# first (rose_backend/triton/stub_path.py); numpy only after it.
sys.path += os.environ.get("ROSE_PYTHONPATH", "").split(os.pathsep)
from rose_backend.triton.stub_path import launcher_paths_first  # noqa: E402
launcher_paths_first()

import numpy as np  # noqa: E402

import torch  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        import json
        dim = int(json.loads(args["model_config"])["parameters"]["dim"]["string_value"])
        self.cuda = torch.cuda.is_available()
        self.out = np.zeros((1, dim), dtype=np.float32)
        if self.cuda:
            self.ids_host = torch.zeros(1 << 16, dtype=torch.int32, pin_memory=True)
            self.ids_dev = torch.zeros(1 << 16, dtype=torch.int32, device="cuda")
            self.dev = torch.zeros(1, dim, dtype=torch.float32, device="cuda")
            self.host = torch.zeros(1, dim, dtype=torch.float32, pin_memory=True)
            self.done = torch.cuda.Event()

    def execute(self, requests):
        for request in requests:
            ids = pb_utils.get_input_tensor_by_name(request, "INPUT_IDS").as_numpy()
            out = self.out
            if self.cuda:
                n = min(len(ids), self.ids_host.shape[0])
                self.ids_host.numpy()[:n] = ids[:n]
                self.ids_dev[:n].copy_(self.ids_host[:n], non_blocking=True)
                self.dev.fill_(float(n))
                self.host.copy_(self.dev, non_blocking=True)
                self.done.record()
                self.done.synchronize()
                out = self.host.numpy().copy()
            request.get_response_sender().send(pb_utils.InferenceResponse([pb_utils.Tensor("EMBEDDINGS", out)]),
                                               flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
