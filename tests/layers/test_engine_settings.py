"""The engine's settings outside config.pbtxt: the three an operator sets through the environment
(rose_backend/env_vars.py) and the kernel switches that are module attributes (layers/fused.py,
layers/projection.py, layers/small_gemm.py)."""
import pytest

from rose_backend import env_vars


def test_the_main_engine_runs_on_the_threads_stream_on_the_cpu_whatever_rose_main_engine_sms_says(monkeypatch):
    import torch
    from rose_backend.engine.streams import EngineStream
    monkeypatch.setenv("ROSE_MAIN_ENGINE_SMS", "120")
    assert env_vars.ROSE_MAIN_ENGINE_SMS.integer() == 120
    for query_lane in (False, True):
        s = EngineStream(torch.device("cpu"), query_lane)
        assert s.stream is None and s.capture_stream is None and s.sms == 0
    monkeypatch.delenv("ROSE_MAIN_ENGINE_SMS")
    assert env_vars.ROSE_MAIN_ENGINE_SMS.integer() == 0


def test_an_excluded_attention_backend_is_never_available(monkeypatch):
    import torch
    from rose_backend.layers.attention import AttentionShape, available_backends
    shape = AttentionShape(num_heads=4, num_kv_heads=4, head_dim=16, dtype=torch.float32)
    monkeypatch.setenv("ROSE_ATTENTION_EXCLUDE", " flashinfer_fa3 , sdpa_loop,")
    assert available_backends(shape, "cpu") == []
    monkeypatch.setenv("ROSE_ATTENTION_EXCLUDE", "flashinfer_fa3")
    assert available_backends(shape, "cpu") == ["sdpa_loop"]


def test_a_malformed_number_is_refused_naming_the_variable(monkeypatch):
    monkeypatch.setenv("ROSE_FLASHINFER_WORKSPACE_MB", "lots")
    with pytest.raises(ValueError, match=r"\$ROSE_FLASHINFER_WORKSPACE_MB must be an integer, got 'lots'"):
        env_vars.ROSE_FLASHINFER_WORKSPACE_MB.integer()
    monkeypatch.setenv("ROSE_FLASHINFER_WORKSPACE_MB", "")          # empty: the default
    assert env_vars.ROSE_FLASHINFER_WORKSPACE_MB.integer() == 512


def test_the_kernel_switches_are_module_attributes_with_their_defaults(monkeypatch):
    from rose_backend.layers import fused, projection
    for name in ("ROSE_SPLITK_MAX_TOKENS", "ROSE_SMALL_GEMM_MAX_TOKENS", "ROSE_TRITON_PDL", "ROSE_FLASHINFER_PDL"):
        assert all(v.name != name for v in env_vars.VARIABLES)     # settled: not read from the environment
    assert (projection.max_tokens, projection.gemm_max_tokens, fused.flashinfer_pdl) == (256, 128, None)
