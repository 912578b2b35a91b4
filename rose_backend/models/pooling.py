"""Pooling of packed hidden states into one vector per sequence."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def pool(hidden: torch.Tensor, cu_seqlens: torch.Tensor, seq_ids: torch.Tensor,
         inv_lens: torch.Tensor, mode: str) -> torch.Tensor:
    """hidden [T, H] packed; cu_seqlens [S + 1] int; seq_ids [T] int64 (sequence of each token);
    inv_lens [S, 1] float32 (1 / length). Returns [S, H] float32.

    Everything is tensor math on the device with fixed shapes, so it can live inside a CUDA graph.
    """
    if mode == "cls":
        return hidden[cu_seqlens[:-1].long()].float()
    if mode == "lasttoken":
        return hidden[cu_seqlens[1:].long() - 1].float()
    if mode == "mean":
        sums = torch.zeros(inv_lens.shape[0], hidden.shape[1], dtype=torch.float32, device=hidden.device)
        sums.index_add_(0, seq_ids, hidden.float())
        return sums * inv_lens
    raise ValueError(f"unknown pooling mode {mode!r}")


def maybe_normalize(x: torch.Tensor, normalize: bool) -> torch.Tensor:
    return F.normalize(x, p=2.0, dim=-1) if normalize else x
