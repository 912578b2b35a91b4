"""Compile flashinfer's JIT kernels for the GPU suite's attention shapes in parallel, before the tests.

On a fresh H200 each (shape, fa2 | fa3) module compiles for 70-140 s the first time a test plans it;
one after the other that alone outlasted the suite's time. tests/gpu/conftest.py starts one process
per module at session start and waits for all (about as long as the slowest). Compiled modules land
in flashinfer's cache folder ($FLASHINFER_WORKSPACE_BASE, default ~/.cache), so a second run on the
same machine finds them and this takes seconds.

    python -m tests.gpu.precompile            # all of them, in parallel
"""
from __future__ import annotations

import subprocess
import sys
import time

SHAPES = [(16, 16, 64, False), (16, 8, 128, False), (16, 8, 128, True)]     # BGE-M3, pplx, Qwen3-Embedding
BACKENDS = ("flashinfer", "flashinfer_fa3")


def warm(heads: int, kv_heads: int, head_dim: int, causal: bool, name: str) -> str:
    import torch

    from rose_backend.layers.attention import AttentionMetadata, AttentionShape, make_backend, unavailable_reason
    shape = AttentionShape(heads, kv_heads, head_dim, torch.bfloat16, causal)
    why = unavailable_reason(name, shape, "cuda")
    if why:
        return f"skipped: {why}"
    be = make_backend(name, shape, "cuda")
    cu = torch.tensor([0, 64], dtype=torch.int32)
    be.plan(AttentionMetadata(cu.cuda(), 64, [64], causal, cu_seqlens_host=cu))
    q = torch.randn(64, heads, head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(64, kv_heads, head_dim, device="cuda", dtype=torch.bfloat16)
    be.run(q, k, torch.randn_like(k))
    torch.cuda.synchronize()
    return "compiled"


def precompile_all(timeout: float = 420.0) -> dict[str, str]:
    """One process per (shape, backend); returns what each said (or that it timed out)."""
    t0 = time.monotonic()
    procs = {f"h{h}kv{kv}d{d}{'c' if c else ''}/{b}": subprocess.Popen(
        [sys.executable, "-m", "tests.gpu.precompile", str(h), str(kv), str(d), str(int(c)), b],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for h, kv, d, c in SHAPES for b in BACKENDS}
    out = {}
    for key, p in procs.items():
        try:
            text, _ = p.communicate(timeout=max(1.0, timeout - (time.monotonic() - t0)))
            out[key] = text.strip().splitlines()[-1] if text.strip() else f"exit {p.returncode}"
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            out[key] = "timed out"
    out["seconds"] = f"{time.monotonic() - t0:.0f}"
    return out


if __name__ == "__main__":
    if len(sys.argv) == 6:
        h, kv, d, c, name = sys.argv[1:]
        print(warm(int(h), int(kv), int(d), bool(int(c)), name), flush=True)
    else:
        print(precompile_all())
