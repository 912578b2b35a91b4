"""Model definitions on packed (tokens, hidden) input, one file per family, built through the registry
(registry.py: config.json's model_type / architectures -> the family's class)."""
from __future__ import annotations

import torch

from rose_backend.config import ModelConfig
from rose_backend.models.registry import model_class


class _NoMetaFills(torch.overrides.TorchFunctionMode):
    """While the modules are made on the meta device (their weights are all loaded from the folder
    next), torch.nn.init's random fills of meta tensors are skipped: on meta tensors they run torch's
    reference kernels, whose first use imports torch._dynamo (~0.9 CPU-s of every start). A torch
    function mode is the calling thread's own, so other threads' modules are made as usual."""

    _FILLS = frozenset(getattr(torch.nn.init, n) for n in (
        "normal_", "uniform_", "trunc_normal_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_",
        "xavier_normal_")) | {torch.Tensor.normal_, torch.Tensor.uniform_}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self._FILLS:
            tensor = args[0] if args else kwargs.get("tensor")      # torch.nn.init passes it by name
            if getattr(tensor, "is_meta", False):
                return tensor
        return func(*args, **kwargs)


def build_model(cfg: ModelConfig, device: torch.device | str = "cpu",
                dtype: torch.dtype = torch.float32, attention: str = "sdpa_loop") -> torch.nn.Module:
    """Construct the model of cfg's family (registry.py) and load its weights from cfg.model_dir."""
    cls = model_class(cfg)
    device = torch.device(device)
    with torch.device("meta"), _NoMetaFills():
        model = cls(cfg)
    model.to_empty(device=device)
    model.load_from_folder(cfg.model_dir)
    model.to(dtype)
    model.set_attention_backend(attention)
    return model.eval().requires_grad_(False)
