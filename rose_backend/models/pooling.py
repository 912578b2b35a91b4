"""Pooling of packed hidden states into one vector per sequence: sentence-transformers' Pooling modes.

Each mode as sentence_transformers/sentence_transformer/modules/pooling.py computes it (float32):
    cls                    the first token
    lasttoken              the last token
    mean                   the sum of the tokens / their count
    mean_sqrt_len_tokens   the sum of the tokens / sqrt(their count)
    max                    the largest value of each dimension over the tokens
    weightedmean           sum of (position + 1) x token / sum of (position + 1), positions from 0
Several modes ("cls+mean") are concatenated in the order named, [S, k x H].
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def pool(hidden: torch.Tensor, cu_seqlens: torch.Tensor, seq_ids: torch.Tensor,
         inv_lens: torch.Tensor, mode: str, positions: torch.Tensor | None = None) -> torch.Tensor:
    """hidden [T, H] packed; cu_seqlens [S + 1] int (a row's tokens are cu[i]:cu[i + 1]); seq_ids [T]
    int (the row of each token); inv_lens [S, 1] float32 (1 / length); positions [T] int (each token's
    position in its sequence; weightedmean only). Returns [S, k x H] float32.

    Everything is tensor math on the device with fixed shapes, so it can live inside a CUDA graph.
    """
    return pool_rows(hidden, cu_seqlens[:-1].long(), cu_seqlens[1:].long() - 1, seq_ids, inv_lens, mode, positions)


def pool_rows(hidden: torch.Tensor, first: torch.Tensor, last: torch.Tensor, seq_ids: torch.Tensor,
              inv_lens: torch.Tensor, mode: str, positions: torch.Tensor | None = None) -> torch.Tensor:
    """pool() with each row's first and last token index given ([S] int64 each; padded layouts, where a
    row's tokens are not contiguous with the next row's). Tokens of no row (padding) point seq_ids at a
    row the caller drops."""
    rows, width = inv_lens.shape[0], hidden.shape[1]
    h = hidden.float()
    seq = seq_ids.long()
    out, sums = [], None
    for m in mode.split("+"):
        if m == "cls":
            out.append(h[first])
        elif m == "lasttoken":
            out.append(h[last])
        elif m in ("mean", "mean_sqrt_len_tokens"):
            if sums is None:
                sums = torch.zeros(rows, width, dtype=torch.float32, device=h.device).index_add_(0, seq, h)
            out.append(sums * (inv_lens if m == "mean" else inv_lens.sqrt()))
        elif m == "max":
            init = torch.full((rows, width), float("-inf"), dtype=torch.float32, device=h.device)
            out.append(init.scatter_reduce_(0, seq[:, None].expand(-1, width), h, "amax"))
        elif m == "weightedmean":
            if positions is None:
                raise ValueError("weightedmean pooling needs each token's position")
            w = (positions.float() + 1.0)[:, None]                                      # [T, 1]
            num = torch.zeros(rows, width, dtype=torch.float32, device=h.device).index_add_(0, seq, h * w)
            den = torch.zeros(rows, 1, dtype=torch.float32, device=h.device).index_add_(0, seq, w)
            out.append(num / den.clamp(min=1e-9))
        else:
            raise ValueError(f"unknown pooling mode {m!r}")
    return out[0] if len(out) == 1 else torch.cat(out, dim=1)


def maybe_normalize(x: torch.Tensor, normalize: bool) -> torch.Tensor:
    return F.normalize(x, p=2.0, dim=-1) if normalize else x
