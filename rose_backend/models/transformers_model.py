"""The folder's own transformers model, for families without a native model file (engine/fallback.py).

    model = load_transformers_model(cfg, "cpu", torch.float32)       # AutoModel (or T5EncoderModel, ...)
    hidden = last_hidden_state(model, ids, mask)                       # [S, L, H] padded

The class is the one sentence-transformers' Transformer module loads for `feature-extraction`: AutoModel,
except the encoder-decoder families whose encoder it loads alone (T5, mT5, UMT5, LongT5, Switch
Transformers: *EncoderModel). Weights come from the folder's safetensors only (transformers is asked
for nothing else: local files, use_safetensors); a weight the folder lacks, other than a pooler that
no embedding reads, is refused rather than initialised at random. Remote code runs only with
trust_remote_code (engine/choice.py says when).
"""
from __future__ import annotations

import torch
from torch import nn

from rose_backend.config import ModelConfig, ModelFolderError

ENCODER_ONLY = {"t5": "T5EncoderModel", "mt5": "MT5EncoderModel", "umt5": "UMT5EncoderModel",
                "longt5": "LongT5EncoderModel", "switch_transformers": "SwitchTransformersEncoderModel"}


def load_transformers_model(cfg: ModelConfig, device: torch.device | str, dtype: torch.dtype,
                            trust_remote_code: bool = False) -> nn.Module:
    try:
        import transformers
    except ImportError:
        raise ModelFolderError(f"{cfg.model_dir}: model_type {cfg.model_type!r} runs on transformers, which is not "
                               "installed: pip install 'transformers>=4.56'") from None
    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    kwargs = {"local_files_only": True, "trust_remote_code": trust_remote_code, "use_safetensors": True,
              "output_loading_info": True, ("dtype" if (major, minor) >= (4, 56) else "torch_dtype"): dtype}
    name = ENCODER_ONLY.get(cfg.model_type)
    own_code = "AutoModel" in (cfg.raw.get("auto_map") or {})
    cls = getattr(transformers, name) if name and not own_code else transformers.AutoModel
    try:
        model, info = cls.from_pretrained(str(cfg.model_dir), **kwargs)
    except (ValueError, OSError, KeyError) as e:
        raise ModelFolderError(f"{cfg.model_dir}: transformers cannot load model_type {cfg.model_type!r}: {e}") from None
    missing = [k for k in info.get("missing_keys", ()) if "pooler" not in k.split(".")]
    if missing:
        raise ModelFolderError(f"{cfg.model_dir}: the weights lack {len(missing)} tensors {cls.__name__} needs "
                               f"({', '.join(sorted(missing)[:4])}{', ...' if len(missing) > 4 else ''})")
    return model.to(device).eval().requires_grad_(False)


def last_hidden_state(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[S, L, H]: the model's final hidden states of right-padded ids [S, L] under mask [S, L]."""
    out = model(input_ids=ids, attention_mask=mask)
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
