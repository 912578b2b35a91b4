"""The engine's switches that come from the environment, in one place (for A/B measurements and for
hosts where a kernel misbehaves; the served settings are the `rose` parameters, not these):

    ROSE_ATTENTION_EXCLUDE         comma-separated attention backends never chosen (e.g. flashinfer_fa3);
                                   read at each call, so a test or a tool may set it late
    ROSE_FLASHINFER_WORKSPACE_MB   flashinfer's float workspace per backend in MiB (default 512; its
                                   largest batch scales with it: 8,192 tokens per 256 MiB)
    ROSE_SPLITK_MAX_TOKENS         largest token count that runs the split-K projections (default 256;
                                   0: never); layers/projection.py keeps it as `max_tokens`
    ROSE_SMALL_GEMM_MAX_TOKENS     largest token count whose gate/up projection runs the small-GEMM kernel
                                   with the SwiGLU in its epilogue (layers/small_gemm.py; default 128;
                                   0: cuBLAS, then flashinfer's SiLU-and-mul)
    ROSE_TRITON_PDL                largest token count whose triton-language kernels launch with
                                   programmatic dependent launch (default 128; 0: never); read when a
                                   graph is captured or an eager pass runs
    ROSE_FLASHINFER_PDL            0: flashinfer's norm and SiLU-and-mul kernels launch without
                                   programmatic dependent launch (default: flashinfer's choice, on
                                   from sm_90); read when a graph is captured or an eager pass runs
    ROSE_MAIN_ENGINE_SMS           the main engine's kernels on a CUDA green context of this many SMs
                                   (default 0: the whole device); with the query lane the other SMs
                                   stay free for its engine (engine/streams.py); read when an engine
                                   is built

The fused-kernel switch is a module attribute, not an environment variable: layers/fused.py.
"""
from __future__ import annotations

import os


def attention_excluded() -> set[str]:
    """The backend names in $ROSE_ATTENTION_EXCLUDE."""
    return {n.strip() for n in os.environ.get("ROSE_ATTENTION_EXCLUDE", "").split(",") if n.strip()}


def flashinfer_workspace_mb() -> int:
    return int(os.environ.get("ROSE_FLASHINFER_WORKSPACE_MB", "512"))


def splitk_max_tokens() -> int:
    return int(os.environ.get("ROSE_SPLITK_MAX_TOKENS", "256"))


def small_gemm_max_tokens() -> int:
    return int(os.environ.get("ROSE_SMALL_GEMM_MAX_TOKENS", "128"))


def triton_pdl_max_tokens() -> int:
    return int(os.environ.get("ROSE_TRITON_PDL", "128"))


def flashinfer_pdl() -> bool | None:
    """enable_pdl for flashinfer's kernels: False under ROSE_FLASHINFER_PDL=0, else None (flashinfer's default)."""
    return False if os.environ.get("ROSE_FLASHINFER_PDL", "") == "0" else None


def main_engine_sms() -> int:
    return int(os.environ.get("ROSE_MAIN_ENGINE_SMS", "0"))
