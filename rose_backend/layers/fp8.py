"""FP8 projections for large batches: e4m3 weights with per-output-channel scales, activations with
per-token scales computed on the device (inside a CUDA graph), one `torch._scaled_mm` per GEMM.

The row-wise scaled FP8 GEMM beats bf16 on large batches and loses to it on small ones (the
activations' quantization is a pass of its own). So a quantized layer keeps its model-dtype weight
too and runs FP8 only for batches of at least `min_tokens` tokens (the engine's `fp8_min_tokens`),
as the attention backend is chosen per configuration; each configuration's graph captures one path.

    quantize_linears(model, min_tokens=4096)     # every projection of the transformer layers
    y = layer(x)                                 # Fp8Linear: FP8 at >= min_tokens rows, else F.linear

Accumulation is float32 inside the GEMM; the output, the bias add and everything after it stay in
the model's dtype. `unavailable_reason(device)` says why a device cannot run it (CUDA GPUs before
compute capability 8.9 have no FP8 tensor cores); the CPU runs the same arithmetic (slowly), which
is what the CPU tests check against float32 references.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)            # 448
_EPS = 1e-12
# the transformer layers' projections, by the attribute names of models/bert.py and models/qwen3.py
PROJECTIONS = ("qkv", "o_proj", "ffn_up", "ffn_down", "qkv_proj", "gate_up_proj", "down_proj")
# The batch size, in tokens, from which a forward pass with FP8 projections takes less device time
# than with bf16 ones, per model family (`python -m rose_bench engine --fp8-min-tokens 1` finds it).
DEFAULT_MIN_TOKENS = {"encoder": 8192, "decoder": 4096}


def default_min_tokens(cfg) -> int:
    """fp8_min_tokens where none is set: the crossover of the model's family (ModelConfig)."""
    return DEFAULT_MIN_TOKENS["decoder" if cfg.is_decoder else "encoder"]


def unavailable_reason(device: torch.device | str) -> str | None:
    device = torch.device(device)
    if not hasattr(torch, "_scaled_mm"):
        return f"this torch ({torch.__version__}) has no torch._scaled_mm"
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) < (8, 9):
            name = torch.cuda.get_device_name(device)
            return (f"dtype=fp8 needs FP8 tensor cores (compute capability 8.9 or newer: Ada, Hopper, "
                    f"Blackwell); {name} is {major}.{minor}")
    return None


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (w_fp8 [N, K], scale [N] float32) with w ~= w_fp8 * scale[:, None]."""
    scale = w.detach().abs().amax(dim=1).float().clamp(min=_EPS) / FP8_MAX
    return (w.float() / scale[:, None]).to(FP8), scale


def fp8_matmul(x: torch.Tensor, w_fp8_t: torch.Tensor, w_scale: torch.Tensor,
               bias: torch.Tensor | None) -> torch.Tensor:
    """x [T, K] (model dtype) @ W.T + bias with x quantized per token: w_fp8_t [K, N] (column-major
    view of the row-quantized weight), w_scale [1, N] float32. On CUDA the quantization is one
    kernel (fp8_kernels.py) and the bias is added inside the GEMM."""
    if x.is_cuda:
        from rose_backend.layers.fp8_kernels import quantize_rows_fp8
        xq, x_scale = quantize_rows_fp8(x if x.stride(-1) == 1 else x.contiguous())
        return torch._scaled_mm(xq, w_fp8_t, scale_a=x_scale, scale_b=w_scale, bias=bias, out_dtype=x.dtype)
    x_scale = x.abs().amax(dim=1, keepdim=True).float().clamp(min=_EPS) / FP8_MAX    # [T, 1]
    xq = (x.float() / x_scale).to(FP8)
    y = torch._scaled_mm(xq, w_fp8_t, scale_a=x_scale, scale_b=w_scale, out_dtype=x.dtype)
    return y if bias is None else y + bias


class Fp8Linear(nn.Module):
    """An nn.Linear's replacement: FP8 GEMM for inputs of >= min_tokens rows, the original weight below.
    Keeps `weight` and `bias` (model dtype) so that code reading them (split-K, the GELU epilogue) works."""

    def __init__(self, linear: nn.Linear, min_tokens: int):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.min_tokens = max(1, int(min_tokens))
        w_fp8, scale = quantize_rows(linear.weight)
        # _scaled_mm takes the second operand column-major: the transpose of a row-major [N, K]
        self.register_buffer("w_fp8_t", w_fp8.t(), persistent=False)
        self.register_buffer("w_scale", scale[None, :].contiguous(), persistent=False)

    def uses_fp8(self, x: torch.Tensor) -> bool:
        return x.dim() == 2 and x.shape[0] >= self.min_tokens

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.uses_fp8(x):
            return fp8_matmul(x, self.w_fp8_t, self.w_scale, self.bias)
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp8 from {self.min_tokens} tokens"


def quantize_linears(model: nn.Module, min_tokens: int, names: tuple[str, ...] = PROJECTIONS) -> int:
    """Replace every nn.Linear child named in `names` (the layers' projections; embeddings, norms and
    heads stay as they are) by an Fp8Linear; returns how many were replaced."""
    swaps = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
             if name in names and type(child) is nn.Linear]
    for parent, name, child in swaps:
        setattr(parent, name, Fp8Linear(child, min_tokens))
    return len(swaps)


def fp8_copy_bytes(cfg) -> int:
    """Bytes the FP8 copies of a model's projections add (one byte a weight, a float32 scale a row)."""
    h, f, q, kv = cfg.hidden_size, cfg.intermediate_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    if cfg.is_decoder:                                   # qkv_proj, o_proj, gate_up_proj, down_proj
        weights, rows = h * (q + 2 * kv) + q * h + 3 * h * f, (q + 2 * kv) + h + 2 * f + h
    else:                                                # qkv, o_proj, ffn_up, ffn_down
        weights, rows = 4 * h * h + 2 * h * f, 3 * h + h + f + h
    return cfg.num_layers * (weights + 4 * rows)


def quantize_for_fp8(model: nn.Module, device: torch.device | str, min_tokens: int | None) -> int:
    """The engine's dtype=fp8 step (min_tokens None or 0: none): refuse a device without FP8 GEMMs
    (ValueError saying why), then quantize_linears(model, min_tokens)."""
    if not min_tokens:
        return 0
    why = unavailable_reason(device)
    if why:
        raise ValueError(why)
    return quantize_linears(model, min_tokens)
