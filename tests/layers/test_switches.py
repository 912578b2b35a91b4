"""The environment switches (layers/switches.py)."""
from rose_backend.layers import switches


def test_the_main_engine_runs_on_the_threads_stream_on_the_cpu_whatever_rose_main_engine_sms_says(monkeypatch):
    import torch
    from rose_backend.engine.streams import EngineStream
    monkeypatch.setenv("ROSE_MAIN_ENGINE_SMS", "120")
    assert switches.main_engine_sms() == 120
    for query_lane in (False, True):
        s = EngineStream(torch.device("cpu"), query_lane)
        assert s.stream is None and s.capture_stream is None and s.sms == 0
    monkeypatch.delenv("ROSE_MAIN_ENGINE_SMS")
    assert switches.main_engine_sms() == 0
