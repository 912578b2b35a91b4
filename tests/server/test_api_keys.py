"""API keys end to end: a real tritonserver started with restricted protocols (inference and
metadata under an API key, the model configuration under an admin key), rose_client's clients
with and without the key, over gRPC streams, and the gateway passing its keys on to Triton."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from support.gateway import LOG_DIR, gateway_for
from rose_backend.launch.tritonserver import ServerOptions
from support.server import TEST_EXIT_TIMEOUT_S, WORKER, TritonProcess, free_ports, stop_in_background

from rose_testing.compare import cos_dist
from rose_client import AccessDenied, AsyncEmbeddingClient, EmbeddingClient

KEY, ADMIN = "testkey123", "adminkey456"
TEXTS = ["what is rose?", "Triton serves embeddings over gRPC."]
ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- the command line
@pytest.mark.parametrize("args", [["--api-key", "s3cret-key"], ["--api-key=s3cret-key"], ["--admin-key", "s3cret-key"]])
def test_a_key_on_the_command_line_is_refused_without_being_repeated(args):
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'gateway'}:{ROOT / 'client'}:{ROOT}"}
    r = subprocess.run([sys.executable, "-m", "rose_gateway", *args], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 2 and "process listings" in r.stderr and "API_KEY" in r.stderr
    assert "s3cret" not in r.stderr + r.stdout


def test_the_key_comes_from_the_environment_or_a_file(tmp_path, monkeypatch):
    from rose_gateway.settings import parse_args
    monkeypatch.setenv("API_KEY", "from-the-env")
    settings, _ = parse_args([])
    assert settings.api_key == "from-the-env"
    assert "from-the-env" not in repr(settings)
    (tmp_path / "key").write_text("from-a-file\n")
    assert parse_args(["--api-key-file", str(tmp_path / "key")])[0].api_key == "from-a-file"
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        parse_args(["--api-key-file", str(tmp_path / "empty")])


# --------------------------------------------------------------------------- a restricted server
@pytest.fixture(scope="module")
def restricted():
    LOG_DIR.mkdir(exist_ok=True)
    log = LOG_DIR / f"restricted-{WORKER}server.log"
    log.unlink(missing_ok=True)
    srv = TritonProcess(ports=free_ports(), log_file=log,
                        options=ServerOptions(exit_timeout=TEST_EXIT_TIMEOUT_S, api_key=KEY, admin_key=ADMIN))
    try:
        srv.start()
        srv.wait_ready(300)
        yield srv
    finally:
        stop_in_background([srv])          # as the other test servers: nothing here is about its stop


@pytest.mark.server
@pytest.mark.parametrize("key", [None, "wrong-key-42"], ids=["no key", "a wrong key"])
def test_without_the_key_a_call_is_refused_at_once(restricted, key):
    t0 = time.monotonic()
    with EmbeddingClient(restricted.grpc_url, api_key=key) as c:
        with pytest.raises(AccessDenied) as e:
            c.embed(TEXTS)
    assert "API key" in str(e.value) and (key is None or key not in str(e.value))
    assert time.monotonic() - t0 < 10                     # not retried: every replica checks the same key

    async def call():
        async with AsyncEmbeddingClient(restricted.grpc_url, api_key=key) as ac:
            return await ac.embed_tokens([[101, 7592, 102]])

    with pytest.raises(AccessDenied):
        asyncio.run(call())


@pytest.mark.server
def test_with_the_key_calls_work_over_streams(restricted, shipped_sentence_model):
    """The shipped default model (real weights) behind the key."""
    sentence_model = shipped_sentence_model
    want = sentence_model.encode(TEXTS)
    with EmbeddingClient(restricted.grpc_url, api_key=KEY) as c:
        got = c.embed(TEXTS)
        assert got.shape == (2, 384) and cos_dist(got, want).max() <= 1e-4
        ids = sentence_model.tokenizer(TEXTS)["input_ids"]
        assert cos_dist(c.embed_tokens(ids), want).max() <= 1e-4

    async def call():
        async with AsyncEmbeddingClient(restricted.grpc_url, api_key=KEY) as ac:
            return await asyncio.gather(ac.embed(TEXTS), ac.embed(TEXTS[:1]))

    both, one = asyncio.run(call())
    assert cos_dist(both, want).max() <= 1e-4 and cos_dist(one, want[:1]).max() <= 1e-4


# --------------------------------------------------------------------------- the gateway
@pytest.mark.server
def test_the_gateway_sends_its_keys_to_triton(restricted, tmp_path, monkeypatch):
    key_file = tmp_path / "api-key"
    key_file.write_text(KEY + "\n")
    monkeypatch.setenv("ROSE_ADMIN_KEY", ADMIN)           # an admin key in the launcher's environment
    with gateway_for(restricted.grpc_url, "restricted", extra_args=["--api-key-file", str(key_file)]) as gw:
        auth = {"Authorization": f"Bearer {KEY}"}
        r = httpx.post(gw.url + "/v1/embeddings", json={"input": TEXTS}, headers=auth, timeout=60)
        assert r.status_code == 200 and len(r.json()["data"]) == 2, r.text
        assert httpx.post(gw.url + "/v1/embeddings", json={"input": TEXTS}, timeout=60).status_code == 401
        # the model configuration came with the API key alone: the gateway knows the deployment's
        # prompts and refuses an unknown task itself (without them, the server's refusal would answer)
        r = httpx.post(gw.url + "/v1/embeddings", json={"input": "x", "task": "nope"}, headers=auth, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_value", r.text
        assert "unknown task" in r.json()["error"]["message"]
        health = httpx.get(gw.url + "/health", timeout=30).json()
        assert health["status"] == "ready" and health["tokenizes_texts"], health
        cmdline = Path(f"/proc/{gw.proc.pid}/cmdline").read_bytes()
        assert KEY.encode() not in cmdline and ADMIN.encode() not in cmdline
        # the control plane's key stays with the launcher: the gateway never holds it
        assert ADMIN.encode() not in Path(f"/proc/{gw.proc.pid}/environ").read_bytes()
    log = (LOG_DIR / "gateway-restricted.log").read_text()
    assert KEY not in log and ADMIN not in log


@pytest.mark.server
def test_a_gateway_with_the_wrong_key_answers_503_without_it(restricted):
    wrong = "not-the-key-7"
    with gateway_for(restricted.grpc_url, "restricted-wrong", api_key=wrong) as gw:
        r = httpx.post(gw.url + "/v1/embeddings", json={"input": TEXTS}, headers={"Authorization": f"Bearer {wrong}"},
                       timeout=60)
        assert r.status_code == 503 and "refused the gateway's API key" in r.json()["error"]["message"], r.text
        assert wrong not in r.text
    log = (LOG_DIR / "gateway-restricted-wrong.log").read_text()
    assert wrong not in log
