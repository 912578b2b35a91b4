"""GPU suite: skipped as a whole without CUDA. Model folders:
ROSE_GPU_MINILM_DIR (default: the default model) and a BGE-M3-shaped random folder built under
ROSE_GPU_TMP (default /tmp/rose-gpu)."""
import os
from pathlib import Path

import pytest
import torch


def pytest_sessionstart(session):
    """Compile the flashinfer kernels of the suite's shapes in parallel first (tests/gpu/precompile.py);
    ROSE_GPU_PRECOMPILE=0 leaves it out. Only when the GPU suite is what runs on a CUDA host."""
    args = " ".join(str(a) for a in session.config.args).replace(os.sep, "/")
    if torch.cuda.is_available() and "tests/gpu" in args and os.environ.get("ROSE_GPU_PRECOMPILE", "1") != "0":
        from tests.gpu.precompile import precompile_all
        print(f"\nflashinfer precompile: {precompile_all()}", flush=True)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if "tests/gpu" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def gpu_tmp() -> Path:
    p = Path(os.environ.get("ROSE_GPU_TMP", "/tmp/rose-gpu"))
    p.mkdir(parents=True, exist_ok=True)
    return p
