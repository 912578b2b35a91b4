"""The environment switches (layers/switches.py) that choose launch modes per batch size."""
from rose_backend.layers import switches


def test_flashinfer_pdl_is_flashinfers_choice_up_to_the_limit_and_off_past_it(monkeypatch):
    monkeypatch.delenv("ROSE_FLASHINFER_PDL", raising=False)
    assert switches.flashinfer_pdl(1) is None and switches.flashinfer_pdl(128) is None   # None: flashinfer decides
    assert switches.flashinfer_pdl(129) is False and switches.flashinfer_pdl(16384) is False
    monkeypatch.setenv("ROSE_FLASHINFER_PDL", "0")
    assert switches.flashinfer_pdl(1) is False
    monkeypatch.setenv("ROSE_FLASHINFER_PDL", "1000000")
    assert switches.flashinfer_pdl(16384) is None



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
