"""The float32 Hugging Face reference of a model folder, for the tests and the benchmarks.

    ref = Reference(folder, device="cpu")
    ref.embed([[5, 6, 7], [9]])      # np.float32 [2, D]: pooled (and normalized) as the folder says
    ref.hidden([5, 6, 7])            # torch.float32 [3, H]: the last hidden states of one sequence

transformers in float32 with eager attention, one sequence at a time and unpadded; pooling,
normalization and the attention mode (causal or bidirectional decoder) come from
rose_backend.config.ModelConfig, the server's own reading of the folder. Qwen3-family folders
(qwen3, pplx-embed's bidirectional_pplx_qwen3, Qwen3ForCausalLM weights) are built as
transformers' Qwen3Model; bidirectional ones run without a mask. Every other folder is AutoModel's,
which reads its attention (causal, bidirectional, sliding windows) from config.json itself.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np


class Reference:
    def __init__(self, folder: str | Path, device: str = "cpu"):
        from rose_backend.config import ModelConfig

        self.folder, self.device = Path(folder), device
        self.cfg = ModelConfig.from_folder(self.folder)
        self.model = _load(self.folder, self.cfg).to(device).eval()

    def hidden(self, ids):
        """Final hidden states [L, H] (float32, on the CPU) of one sequence."""
        return self.hidden_batch([ids])[0].cpu()

    def hidden_batch(self, token_lists):
        """Final hidden states [B, L, H] (float32, on the device) of sequences of one length L,
        run together unpadded (no mask needed)."""
        import torch

        with torch.inference_mode():
            x = torch.as_tensor(np.asarray(token_lists, dtype=np.int64), device=self.device)
            if self.cfg.model_type == "qwen3":
                # Qwen3Model builds a causal mask; a precomputed mapping of None gives no mask at all
                mask = None if self.cfg.causal else {"full_attention": None}
                h = self.model(input_ids=x, attention_mask=mask).last_hidden_state
            else:
                h = self.model(input_ids=x, attention_mask=torch.ones_like(x)).last_hidden_state
        return h.float()

    def pool(self, h):
        """[B, L, H] hidden states -> [B, D] embeddings, pooled (and normalized) as the folder says."""
        import torch

        e = {"cls": h[:, 0], "mean": h.mean(1), "lasttoken": h[:, -1]}[self.cfg.pooling]
        return torch.nn.functional.normalize(e, dim=-1) if self.cfg.normalize else e

    def embed(self, token_lists) -> np.ndarray:
        return np.stack([self.pool(self.hidden(ids)[None])[0].numpy() for ids in token_lists])

    def close(self) -> None:
        import torch

        del self.model
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()


def _load(folder: Path, cfg):
    import torch
    from transformers import AutoModel

    if cfg.model_type != "qwen3":
        kwargs = dict(dtype=torch.float32, attn_implementation="eager")
        try:                                              # BERT-likes: no pooler
            return AutoModel.from_pretrained(str(folder), add_pooling_layer=False, **kwargs)
        except TypeError:                                 # models without one (DistilBERT, ModernBERT, decoders)
            return AutoModel.from_pretrained(str(folder), **kwargs)
    from safetensors.torch import load_file
    from transformers import Qwen3Model

    from rose_testing.folders import hf_qwen3_config

    raw = json.loads((folder / "config.json").read_text())
    model = Qwen3Model(hf_qwen3_config(raw))
    model.config._attn_implementation = "eager"
    state = {}
    for f in sorted(folder.glob("*.safetensors")):
        state.update({k.removeprefix("model."): v.float() for k, v in load_file(str(f)).items()
                      if not k.startswith("lm_head.")})
    model.load_state_dict(state, strict=True)
    return model.float()
