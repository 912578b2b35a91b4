"""The naive reranker baseline: CrossEncoder.predict (or the Qwen3-Reranker card's code) per request.

The model is rose_testing.reranker_folders.PeerReranker, the same code the tests take as
the reference, loaded once on the instance's device.
"""
import json
import os
import sys

# The stub ignores PYTHONPATH: the launcher's paths, appended to import the helper that puts them
# first (rose_backend/triton/stub_path.py); numpy only after it.
sys.path += os.environ.get("ROSE_PYTHONPATH", "").split(os.pathsep)
from rose_backend.triton.stub_path import launcher_paths_first  # noqa: E402
launcher_paths_first()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.utils.dlpack  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

from rose_testing.reranker_folders import PeerReranker  # noqa: E402


def _strings(tensor) -> list[str]:
    return [t.decode("utf-8") if isinstance(t, bytes) else str(t) for t in tensor.as_numpy().reshape(-1)]


def _unpack(tensor) -> list[str]:
    """TEXTS: UINT8 in Triton's BYTES wire format, read through DLPack (safe under numpy 2)."""
    buf = torch.utils.dlpack.from_dlpack(tensor.to_dlpack()).reshape(-1).numpy().tobytes()
    out, i = [], 0
    while i < len(buf):
        n = int.from_bytes(buf[i:i + 4], "little")
        out.append(buf[i + 4:i + 4 + n].decode("utf-8"))
        i += 4 + n
    return out


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        model_dir = params.get("model_dir") or os.environ.get("ROSE_MODEL_DIR")
        if not model_dir:
            raise pb_utils.TritonModelException("naive_rerank: set the model_dir parameter or $ROSE_MODEL_DIR")
        if args.get("model_instance_kind") == "GPU" and torch.cuda.is_available():
            device = f"cuda:{args.get('model_instance_device_id', 0)}"
        else:
            device = "cpu"
        dtype = getattr(torch, params["dtype"]) if params.get("dtype") else None
        self.batch_size = int(params.get("batch_size") or 32)
        self.reranker = PeerReranker(model_dir, device, dtype)

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                packed = pb_utils.get_input_tensor_by_name(request, "TEXTS")
                if packed is not None:
                    query, *docs = _unpack(packed)
                else:
                    query = _strings(pb_utils.get_input_tensor_by_name(request, "QUERY"))[0]
                    docs = _strings(pb_utils.get_input_tensor_by_name(request, "DOCUMENTS"))
                instr = pb_utils.get_input_tensor_by_name(request, "INSTRUCTION")
                scores = self.reranker.scores(query, docs, _strings(instr)[0] if instr is not None else None,
                                              self.batch_size)
                out = torch.from_numpy(np.ascontiguousarray(scores, dtype=np.float32))
                response = pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor.from_dlpack("SCORES", torch.utils.dlpack.to_dlpack(out))])
            except Exception as e:
                response = pb_utils.InferenceResponse(error=pb_utils.TritonError(f"naive_rerank: {e}"))
            sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
