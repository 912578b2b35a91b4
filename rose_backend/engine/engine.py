"""Engine: step(batch) -> LazyTensor.

The engine owns the model, its device and the per-batch work around the forward pass: building
device tensors from a PackedBatch, planning the attention backend, pooling, normalizing, and
queueing the copy back. On the GPU, configurations are replayed from CUDA graphs (see
graph_cache.py when present); on the CPU every step runs eagerly and returns a ready handle.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from rose_backend.config import ModelConfig
from rose_backend.engine.batch import PackedBatch
from rose_backend.engine.lazy_tensor import LazyTensor
from rose_backend.layers.attention import AttentionMetadata
from rose_backend.models import build_model
from rose_backend.models.pooling import maybe_normalize, pool

log = logging.getLogger(__name__)


@dataclass(slots=True)
class EngineStats:
    batches: int = 0
    tokens: int = 0
    sequences: int = 0
    eager_runs: int = 0
    graph_captures: int = 0
    graph_replays: int = 0


class Engine:
    """Runs packed batches through one model on one device.

    >>> eng = Engine(ModelConfig.from_folder(None))
    >>> emb = eng.step(PackedBatch(ids, lens)).synchronize()     # [S, D] float32
    """

    def __init__(self, cfg: ModelConfig, device: str | torch.device = "cpu",
                 dtype: torch.dtype | None = None, attention: str | None = None):
        self.cfg = cfg
        self.device = torch.device(device)
        self.dtype = dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        self.attention = attention or "sdpa_loop"
        self.model = build_model(cfg, self.device, self.dtype, self.attention)
        self.stats = EngineStats()

    @property
    def embedding_dim(self) -> int:
        return self.cfg.embedding_dim

    def step(self, batch: PackedBatch) -> LazyTensor:
        """Launch the forward pass of `batch` and return a handle on its [S, D] embeddings."""
        self.stats.batches += 1
        self.stats.tokens += batch.num_tokens
        self.stats.sequences += batch.num_seqs
        self.stats.eager_runs += 1
        with torch.inference_mode():
            out = self._forward_eager(batch)
        return LazyTensor.launch(out, batch.num_seqs)

    def _forward_eager(self, batch: PackedBatch) -> torch.Tensor:
        dev = self.device
        lens = batch.seq_lens
        ids = torch.from_numpy(batch.input_ids.astype(np.int64)).to(dev)
        positions = torch.from_numpy(batch.positions().astype(np.int64)).to(dev)
        cu = torch.from_numpy(batch.cu_seqlens()).to(dev)
        seq_ids = torch.from_numpy(batch.seq_ids()).to(dev)
        inv_lens = torch.from_numpy((1.0 / lens.astype(np.float32))[:, None]).to(dev)
        self.model.attn.plan(AttentionMetadata(cu, batch.max_seqlen, lens.tolist(), self.cfg.causal))
        hidden = self.model(ids, positions)                                   # [T, H]
        emb = pool(hidden, cu, seq_ids, inv_lens, self.cfg.pooling)           # [S, H] float32
        return maybe_normalize(emb, self.cfg.normalize)

    def embed(self, token_lists: list[list[int]]) -> np.ndarray:
        """Convenience for tests and tools: token id lists -> [n, D] float32, in one batch."""
        lens = np.array([len(t) for t in token_lists], dtype=np.int32)
        ids = np.concatenate([np.asarray(t, dtype=np.int32) for t in token_lists])
        return self.step(PackedBatch(ids, lens)).synchronize()
