"""The naive baseline: Hugging Face transformers on a padded batch inside a Triton Python model.

What a Triton user writes first: AutoModel.from_pretrained (bf16, sdpa) on the instance's device,
each request padded to a rectangle, one forward, pooling as the folder's sentence-transformers files
say, one response. No CUDA graphs, no ragged batching, no overlap of host and device work.
"""
import json
import os
import sys
from pathlib import Path

# The stub ignores PYTHONPATH: the launcher's paths, appended to import the helper that puts them
# first (rose_backend/triton/stub_path.py); numpy only after it.
sys.path += os.environ.get("ROSE_PYTHONPATH", "").split(os.pathsep)
from rose_backend.triton.stub_path import launcher_paths_first  # noqa: E402
launcher_paths_first()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.utils.dlpack  # noqa: E402

from rose_backend.config import ModelConfig  # noqa: E402

try:
    import triton_python_backend_utils as pb_utils  # noqa: E402
except ImportError:       # imported outside Triton (tests use NaiveEmbedder directly)
    pb_utils = None


class NaiveEmbedder:
    def __init__(self, model_dir, device="cpu", dtype=None, attn_implementation="sdpa"):
        from transformers import AutoModel, AutoTokenizer

        self.folder = Path(model_dir)
        self.device = torch.device(device)
        dtype = dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        self.config = json.loads((self.folder / "config.json").read_text())
        self.model = AutoModel.from_pretrained(str(self.folder), dtype=dtype,
                                               attn_implementation=attn_implementation).to(self.device).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.folder))
        # pooling, normalization and attention mode as the server reads the folder (one reader)
        cfg = ModelConfig.from_folder(self.folder)
        self.pooling, self.normalize = cfg.pooling, cfg.normalize
        self.pad_id = self.config.get("pad_token_id")
        if self.pad_id is None:
            self.pad_id = self.tokenizer.pad_token_id or 0
        # pplx-embed style decoders attend both ways: no causal mask anywhere.
        self.is_decoder = cfg.is_decoder
        self.bidirectional = cfg.is_decoder and not cfg.causal
        if self.bidirectional:
            for m in self.model.modules():
                if hasattr(m, "is_causal"):
                    m.is_causal = False

    @torch.inference_mode()
    def embed_padded(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> np.ndarray:
        input_ids = input_ids.to(self.device)
        attention_mask = attention_mask.to(self.device)
        if self.is_decoder and self.bidirectional:
            # a [B, 1, 1, L] key mask (None when nothing is padded) instead of the causal one
            padded = not bool(attention_mask.all())
            mask = {"full_attention": attention_mask.bool()[:, None, None, :] if padded else None}
            hidden = self.model(input_ids=input_ids, attention_mask=mask).last_hidden_state
        else:
            hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        if self.pooling == "cls":
            emb = hidden[:, 0]
        elif self.pooling == "lasttoken":
            emb = hidden[torch.arange(hidden.shape[0], device=hidden.device), attention_mask.sum(1) - 1]
        else:
            m = attention_mask.unsqueeze(-1).to(hidden.dtype)
            emb = (hidden * m).sum(1) / m.sum(1)
        emb = emb.float()
        if self.normalize:
            emb = torch.nn.functional.normalize(emb, dim=-1)
        return emb.cpu().numpy()

    def embed_ids(self, ids: np.ndarray, seq_lens: np.ndarray) -> np.ndarray:
        longest = int(seq_lens.max())
        batch = torch.full((len(seq_lens), longest), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seq_lens), longest), dtype=torch.long)
        start = 0
        for i, n in enumerate(seq_lens.tolist()):
            batch[i, :n] = torch.from_numpy(ids[start:start + n].astype(np.int64))
            mask[i, :n] = 1
            start += n
        return self.embed_padded(batch, mask)

    def embed_texts(self, texts: list) -> np.ndarray:
        enc = self.tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
        return self.embed_padded(enc["input_ids"], enc["attention_mask"])


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        model_dir = params.get("model_dir") or os.environ.get("ROSE_MODEL_DIR")
        if not model_dir:
            raise pb_utils.TritonModelException("naive: set the model_dir parameter or $ROSE_MODEL_DIR")
        if args.get("model_instance_kind") == "GPU" and torch.cuda.is_available():
            device = f"cuda:{args.get('model_instance_device_id', 0)}"
        else:
            device = "cpu"
        dtype = getattr(torch, params["dtype"]) if params.get("dtype") else None
        self.embedder = NaiveEmbedder(model_dir, device, dtype, params.get("attn_implementation") or "sdpa")

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                text = pb_utils.get_input_tensor_by_name(request, "TEXT")
                if text is not None:
                    texts = [t.decode("utf-8") if isinstance(t, bytes) else str(t) for t in text.as_numpy().reshape(-1)]
                    emb = self.embedder.embed_texts(texts)
                else:
                    ids = pb_utils.get_input_tensor_by_name(request, "INPUT_IDS")
                    lens = pb_utils.get_input_tensor_by_name(request, "SEQ_LENS")
                    if ids is None or lens is None:
                        raise ValueError("send TEXT, or INPUT_IDS and SEQ_LENS")
                    # DLPack, not as_numpy(): Triton 2.51's backend misreads numpy 2 arrays
                    ids, lens = (torch.utils.dlpack.from_dlpack(t.to_dlpack()).reshape(-1).numpy() for t in (ids, lens))
                    if len(lens) == 0 or lens.min() <= 0 or int(lens.sum()) != len(ids):
                        raise ValueError("SEQ_LENS must be positive and sum to the length of INPUT_IDS")
                    emb = self.embedder.embed_ids(ids, lens)
                out = torch.from_numpy(np.ascontiguousarray(emb, dtype=np.float32))
                response = pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor.from_dlpack("EMBEDDINGS", torch.utils.dlpack.to_dlpack(out))])
            except Exception as e:
                response = pb_utils.InferenceResponse(error=pb_utils.TritonError(f"naive: {e}"))
            sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
