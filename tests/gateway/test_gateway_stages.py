"""The gateway's stage clock ($ROSE_STAGE_TIMES, rose_gateway/stages.py): each worker writes, as it
stops, where its POST /v1/embeddings requests spent their time, stage by stage, and each request's
marks."""
from __future__ import annotations

import json

import httpx
import pytest
from support.gateway import gateway_for

pytestmark = pytest.mark.server

TEXT_STAGES = ["body_read", "parsed", "tokenized", "sent", "answered", "response_built", "written", "total"]


def test_each_request_is_timed_stage_by_stage(server, tmp_path, monkeypatch):
    monkeypatch.setenv("ROSE_STAGE_TIMES", str(tmp_path))
    with gateway_for(server.grpc_url, "stages", extra_args=["--workers", "1"]) as gw:
        assert httpx.get(gw.url + "/health", timeout=30).json()["tokenizes_texts"]
        for i in range(5):
            r = httpx.post(gw.url + "/v1/embeddings", json={"input": f"text number {i}"}, timeout=60)
            assert r.status_code == 200, r.text
    summary = json.loads(next(tmp_path.glob("gateway_*.json")).read_text())
    assert list(summary) == TEXT_STAGES, summary
    assert all(summary[s]["n"] == 5 for s in TEXT_STAGES), summary
    assert summary["total"]["p50_us"] >= summary["answered"]["p50_us"] > 0
    lines = next(tmp_path.glob("gateway_*.marks.jsonl")).read_text().splitlines()
    assert len(lines) == 5 and [m[0] for m in json.loads(lines[0])["marks"]] == ["received"] + TEXT_STAGES[:-1]

