"""Model definitions on packed (tokens, hidden) input, and the registry that builds them."""
from __future__ import annotations

import torch

from rose_backend.config import ModelConfig


def build_model(cfg: ModelConfig, device: torch.device | str = "cpu",
                dtype: torch.dtype = torch.float32, attention: str = "sdpa_loop") -> torch.nn.Module:
    """Construct the model for cfg.model_type and load its weights from cfg.model_dir."""
    if cfg.model_type in ("bert", "xlm-roberta", "roberta"):
        from rose_backend.models.bert import BertEncoder as cls
    elif cfg.model_type == "qwen3":
        from rose_backend.models.qwen3 import Qwen3Decoder as cls
    else:
        raise ValueError(f"no model for model_type {cfg.model_type!r}")
    device = torch.device(device)
    with torch.device("meta"):
        model = cls(cfg)
    model.to_empty(device=device)
    model.load_from_folder(cfg.model_dir)
    model.to(dtype)
    model.set_attention_backend(attention)
    return model.eval().requires_grad_(False)
