"""Model definitions on packed (tokens, hidden) input, and the registry that builds them."""
from __future__ import annotations

import contextlib
import importlib

import torch

from rose_backend.config import ModelConfig

# The model file and class of each family; config.py's ENCODER_TYPES / DECODER_TYPES say which
# model_type values belong to which family (the one list of supported types; from_folder refuses others).
MODEL_FILES = {"encoder": ("bert", "BertEncoder"), "decoder": ("qwen3", "Qwen3Decoder")}


_INITS = ("normal_", "uniform_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_", "xavier_normal_",
          "trunc_normal_", "zeros_", "ones_", "constant_")


@contextlib.contextmanager
def _no_init():
    """torch.nn.init's fills as no-ops while the modules are made on the meta device, whose weights
    are all loaded from the folder next: the fills do nothing there but on meta tensors they run
    torch's reference kernels, whose first use imports torch._dynamo (~0.9 CPU-s of every start)."""
    saved = {name: getattr(torch.nn.init, name) for name in _INITS}
    try:
        for name in _INITS:
            setattr(torch.nn.init, name, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.nn.init, name, fn)


def build_model(cfg: ModelConfig, device: torch.device | str = "cpu",
                dtype: torch.dtype = torch.float32, attention: str = "sdpa_loop") -> torch.nn.Module:
    """Construct the model for cfg.model_type and load its weights from cfg.model_dir."""
    module, name = MODEL_FILES["decoder" if cfg.is_decoder else "encoder"]
    cls = getattr(importlib.import_module(f"rose_backend.models.{module}"), name)
    device = torch.device(device)
    with torch.device("meta"), _no_init():
        model = cls(cfg)
    model.to_empty(device=device)
    model.load_from_folder(cfg.model_dir)
    model.to(dtype)
    model.set_attention_backend(attention)
    return model.eval().requires_grad_(False)
