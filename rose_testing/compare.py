"""Comparing embeddings: the one cosine-distance helper of the tests and the benchmarks."""
from __future__ import annotations

import numpy as np


def cos_dist(a, b) -> np.ndarray:
    """1 - cos between matching rows of a and b ([N, D] each; numpy arrays or CPU tensors), as float64 [N].
    The worst row is cos_dist(a, b).max()."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return 1 - (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
