"""What Triton's ports expose and what the launcher's keys cover, against real processes.

- Triton's control plane (model repository, shared memory, trace, logging) requires the admin key
  on HTTP and gRPC: loading a model whose model.py a caller sends (a repository load with a file
  override: code execution) and unloading `embed` are refused. A model's config and statistics
  follow inference: open without an API key (perf_analyzer runs against a plain deployment), under
  it when one is set. Health is always open.
- `make serve API_KEY=...` (the launcher with $API_KEY): the gateway's /v1/* and Triton's inference,
  model config and statistics require the key (perf_analyzer runs with the API key alone); no process's command line, and no line of the launch's output, carries a key;
  the printed client command works as printed.
- Bad keys, keys on the command line and an exposed address without a key get clear messages.
"""
from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from support.launcher import LauncherRun
from support.perf_analyzer import WINDOWS, perf_analyzer_sh
from tritonclient.utils import InferenceServerException

from rose_backend.launch.keys import launch_keys
from rose_backend.launch.tritonserver import ServerOptions, TritonProcess
from rose_backend.launch.triton_install import LaunchError
from rose_client import AccessDenied, EmbeddingClient
from rose_client.auth import grpc_admin_headers, grpc_api_key_headers, http_api_key_headers

ROOT = Path(__file__).resolve().parents[2]
API_KEY, ADMIN_KEY = "api-key-for-tests-7f3a", "admin-key-for-tests-91c2"


def evil_model(marker: Path) -> tuple[str, dict[str, str]]:
    """A model config and a model.py that, if Triton ever ran it, would write `marker`."""
    code = f"open({str(marker)!r}, 'w').write('ran')\nclass TritonPythonModel:\n    def execute(self, r):\n        return []\n"
    config = json.dumps({"backend": "python", "max_batch_size": 0,
                         "input": [{"name": "X", "data_type": "TYPE_INT32", "dims": [1]}],
                         "output": [{"name": "Y", "data_type": "TYPE_INT32", "dims": [1]}]})
    return config, {"file:1/model.py": code}


def http(srv, method: str, path: str, body: dict | None = None, headers: dict | None = None) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
    req = urllib.request.Request(f"http://127.0.0.1:{srv.ports.http}{path}", data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.fixture(scope="module")
def srv(server):
    """The session's default server (conftest.py): keys and the control plane do not depend on its
    parameters, and nothing here changes it (the loads and unloads tried are refused)."""
    return server


@pytest.mark.server
def test_loading_a_model_with_sent_code_is_refused_over_http_and_grpc(srv, tmp_path):
    marker = tmp_path / "ran"
    config, files = evil_model(marker)
    body = {"parameters": {"config": config,
                           **{k: base64.b64encode(v.encode()).decode() for k, v in files.items()}}}
    code, text = http(srv, "POST", "/v2/repository/models/evil/load", body)
    assert code == 403 and "admin-key" in text, (code, text)
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    with pytest.raises(InferenceServerException, match="restricted"):
        client.load_model("evil", config=config, files={k: v.encode() for k, v in files.items()})
    assert not marker.exists()
    index = client.get_model_repository_index(headers=grpc_admin_headers(srv.admin_key), as_json=True)
    assert "evil" not in {m["name"] for m in index["models"]}
    client.close()


@pytest.mark.server
def test_embed_cannot_be_unloaded_and_still_serves(srv):
    code, text = http(srv, "POST", "/v2/repository/models/embed/unload", {})
    assert code == 403, (code, text)
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    with pytest.raises(InferenceServerException, match="restricted"):
        client.unload_model("embed")
    client.close()
    with EmbeddingClient(srv.grpc_url) as c:
        assert c.embed(["still here"]).shape == (1, 384)


@pytest.mark.server
@pytest.mark.parametrize("method,path", [("GET", "/v2/trace/setting"), ("GET", "/v2/logging"),
                                         ("GET", "/v2/systemsharedmemory/status"), ("POST", "/v2/repository/index")])
def test_the_control_plane_needs_the_admin_key_over_http(srv, method, path):
    code, text = http(srv, method, path)
    assert code == 403 and "admin-key" in text, (code, text)
    assert http(srv, method, path, headers={"wrong": "x", "admin-key": "not-the-key"})[0] == 403
    code, text = http(srv, method, path, headers={"admin-key": srv.admin_key})
    assert code == 200, (code, text)


@pytest.mark.server
def test_the_control_plane_needs_the_admin_key_over_grpc(srv):
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    calls = {"trace": lambda h: client.get_trace_settings(headers=h),
             "logging": lambda h: client.get_log_settings(headers=h),
             "shared memory": lambda h: client.get_system_shared_memory_status(headers=h),
             "repository": lambda h: client.get_model_repository_index(headers=h)}
    for name, call in calls.items():
        with pytest.raises(InferenceServerException, match="triton-grpc-protocol-admin-key"):
            call(None)
        assert call(grpc_admin_headers(srv.admin_key)) is not None, name
    client.close()


@pytest.mark.server
def test_metadata_config_statistics_and_health_are_open_without_an_api_key(srv):
    for path in ("/v2/health/ready", "/v2/health/live", "/v2/models/embed/ready", "/v2/models/embed", "/v2",
                 "/v2/models/rose/config", "/v2/models/stats", "/v2/models/embed/stats"):
        assert http(srv, "GET", path)[0] == 200, path
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    assert client.is_server_ready() and client.is_model_ready("embed")
    assert client.get_model_config("rose", as_json=True)["config"]["name"] == "rose"
    assert client.get_inference_statistics("embed", as_json=True)["model_stats"][0]["name"] == "embed"
    client.close()


@pytest.mark.server
def test_a_served_config_names_no_local_path(srv, default_model_dir):
    """Every model's config is open to inference callers: none names a folder of this machine (the
    model folder comes from the server's environment)."""
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    for model in srv.models:
        text = json.dumps(client.get_model_config(model, as_json=True))
        assert str(ROOT) not in text and str(default_model_dir) not in text and "/tmp/" not in text, (model, text)
    client.close()


@pytest.mark.server
def test_the_admin_key_is_not_on_tritonservers_command_line(srv):
    cmdline = Path(f"/proc/{srv.proc.pid}/cmdline").read_bytes()
    assert srv.scrubbed and srv.admin_key.encode() not in cmdline
    assert b"admin-key=***" in cmdline        # the options are still there, the mask says nothing of the key
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert srv.admin_key not in ps


def test_keys_are_checked_and_never_echoed(tmp_path):
    with pytest.raises(ValueError, match="ADMIN_KEY must be"):
        TritonProcess(env={"ADMIN_KEY": "short"})
    with pytest.raises(ValueError, match="api_key must be") as e:
        TritonProcess(options=ServerOptions(api_key="has a space in it"))
    assert "space in it" not in str(e.value)
    with pytest.raises(LaunchError, match=r"pass ServerOptions\(api_key=..., admin_key=...\)"):
        TritonProcess(options=ServerOptions(extra_args=("--grpc-restricted-protocol=inference:k=v",)))
    assert len(TritonProcess().admin_key) >= 32 and TritonProcess().admin_key != TritonProcess().admin_key
    assert TritonProcess(env={"ADMIN_KEY": ADMIN_KEY}).admin_key == ADMIN_KEY
    (tmp_path / "key").write_text(API_KEY + "\n")
    assert launch_keys({}, str(tmp_path / "key")).api_key == API_KEY
    (tmp_path / "empty").write_text("")
    with pytest.raises(ValueError, match="empty"):
        launch_keys({}, str(tmp_path / "empty"))
    assert launch_keys({}).api_key is None


def run_launcher(*args, env=None, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rose_backend.launch", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


@pytest.mark.parametrize("args,env,message", [
    (["--api-key", "s3cret-on-argv"], {}, "is not taken"),
    (["--admin-key=s3cret-on-argv"], {}, "is not taken"),
    ([], {"API_KEY": "s3cret with spaces"}, "API_KEY must be"),
    ([], {"ADMIN_KEY": "s3cret:x"}, "ADMIN_KEY must be"),
])
def test_the_launcher_refuses_bad_keys_without_echoing_them(args, env, message):
    r = run_launcher(*args, env=env)
    assert r.returncode == 2 and message in r.stderr, r.stdout + r.stderr
    assert "s3cret" not in r.stdout + r.stderr


def test_an_exposed_address_without_a_key_is_warned_about():
    r = run_launcher("--address", "192.0.2.1", env={"API_KEY": ""})     # TEST-NET: not this machine's
    assert r.returncode == 1, r.stdout + r.stderr
    assert "WARNING: serving on 192.0.2.1 without an API key" in r.stderr
    assert "cannot bind 192.0.2.1" in r.stderr
    keyed = run_launcher("--address", "192.0.2.1", env={"API_KEY": API_KEY})
    assert "WARNING" not in keyed.stderr and "cannot bind 192.0.2.1" in keyed.stderr
    assert API_KEY not in keyed.stdout + keyed.stderr


@pytest.fixture(scope="module")
def keyed_launch():
    with LauncherRun(env={"API_KEY": API_KEY, "ADMIN_KEY": ADMIN_KEY}) as run:
        assert run.wait_for("rose: serving", 300), run.output
        assert run.wait_for("HTTP (OpenAI-compatible)", 30), run.output
        yield run


@pytest.mark.server
def test_make_serve_with_api_key_requires_it_on_the_gateway(keyed_launch):
    url = keyed_launch.gateway_url + "/v1/embeddings"
    assert httpx.post(url, json={"input": "hello"}, timeout=60).status_code == 401
    wrong = httpx.post(url, json={"input": "hello"}, headers={"Authorization": "Bearer not-the-key"}, timeout=60)
    assert wrong.status_code == 401
    r = httpx.post(url, json={"input": ["hello", "world"]}, headers={"Authorization": f"Bearer {API_KEY}"},
                   timeout=60)
    assert r.status_code == 200 and len(r.json()["data"]) == 2, r.text
    assert httpx.get(keyed_launch.gateway_url + "/health", timeout=30).json()["status"] == "ready"


@pytest.mark.server
def test_make_serve_with_api_key_requires_it_on_triton(keyed_launch):
    ids = grpcclient.InferInput("TEXT", [1], "BYTES")
    ids.set_data_from_numpy(np.array([b"hello"], object))
    client = grpcclient.InferenceServerClient(keyed_launch.grpc_url)
    with pytest.raises(InferenceServerException, match="triton-grpc-protocol-api-key"):
        client.infer("tokenize", [ids])
    assert client.infer("tokenize", [ids], headers=grpc_api_key_headers(API_KEY)).as_numpy("INPUT_IDS").size == 3
    assert client.is_model_ready("embed")                                       # health stays open
    for read in (lambda h: client.get_model_config("embed", headers=h),         # config and statistics: the
                 lambda h: client.get_inference_statistics("embed", headers=h)):  # API key's, like inference
        with pytest.raises(InferenceServerException, match="triton-grpc-protocol-api-key"):
            read(None)
        assert read(grpc_api_key_headers(API_KEY)) is not None
    with pytest.raises(InferenceServerException, match="admin-key"):            # the API key is not the admin's
        client.get_model_repository_index(headers=grpc_api_key_headers(API_KEY))
    assert client.get_model_repository_index(headers=grpc_admin_headers(ADMIN_KEY, API_KEY)) is not None
    client.close()
    with EmbeddingClient(keyed_launch.grpc_url) as c, pytest.raises(AccessDenied):
        c.embed(["hello"])
    with EmbeddingClient(keyed_launch.grpc_url, api_key=API_KEY) as c:          # the stream, too
        assert c.embed(["hello"]).shape == (1, 384)
    srv = type("S", (), {"ports": keyed_launch.ports})
    assert http(srv, "GET", "/v2/models/embed/config")[0] == 403
    assert http(srv, "GET", "/v2/models/embed/config", headers=http_api_key_headers(API_KEY))[0] == 200
    assert http(srv, "GET", "/v2/health/ready")[0] == 200


@pytest.mark.server
def test_perf_analyzer_needs_the_api_key_alone(keyed_launch):
    """perf_analyzer reads the model's metadata and config, then infers: with the API key header
    (benchmarks/perf_analyzer.sh sends $API_KEY) it runs, without it it is refused."""
    r = perf_analyzer_sh(keyed_launch.grpc_url, *WINDOWS, env={"API_KEY": API_KEY})
    assert r.returncode == 0 and re.search(r"Throughput: [0-9.]+ infer/sec", r.stdout), r.stdout[-2000:] + r.stderr[-2000:]
    refused = perf_analyzer_sh(keyed_launch.grpc_url, *WINDOWS)
    assert refused.returncode != 0 and "triton-grpc-protocol-api-key" in refused.stdout + refused.stderr, \
        refused.stdout[-2000:] + refused.stderr[-2000:]


@pytest.mark.server
def test_no_command_line_and_no_output_line_carries_a_key(keyed_launch):
    procs = keyed_launch.processes()
    kinds = {"tritonserver": 0, "stub": 0, "gateway": 0}
    for cmd in procs.values():
        kinds["stub" if "triton_python_backend_stub" in cmd else "gateway" if "rose_gateway" in cmd
              else "tritonserver" if "tritonserver" in cmd else "other"] = 1
    assert kinds == {"tritonserver": 1, "stub": 1, "gateway": 1}, procs
    for pid in [keyed_launch.proc.pid, *procs]:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        assert API_KEY.encode() not in cmdline and ADMIN_KEY.encode() not in cmdline, cmdline
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert API_KEY not in ps and ADMIN_KEY not in ps
    assert API_KEY not in keyed_launch.output and ADMIN_KEY not in keyed_launch.output
    server = next(p for p, c in procs.items() if c.split()[0].endswith("/tritonserver"))
    environ = Path(f"/proc/{server}/environ").read_bytes()                      # nor Triton's environment
    assert API_KEY.encode() not in environ and ADMIN_KEY.encode() not in environ


@pytest.mark.server
def test_the_printed_client_command_works_with_the_key(keyed_launch):
    line = next(ln for ln in keyed_launch.lines if "EmbeddingClient(" in ln).strip()
    assert 'api_key=os.environ["API_KEY"]' in line
    r = subprocess.run(line, shell=True, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "API_KEY": API_KEY})
    assert r.returncode == 0 and "(1, 384)" in r.stdout, r.stdout + r.stderr
    refused = subprocess.run(line, shell=True, capture_output=True, text=True, timeout=120,
                             env={**os.environ, "API_KEY": "not-the-key-1"})
    assert refused.returncode != 0 and "API key" in refused.stderr


TOKENIZE_BODY = {"inputs": [{"name": "TEXT", "shape": [1], "datatype": "BYTES", "data": ["hello world"]}]}


@pytest.mark.server
def test_inference_over_tritons_http_port_needs_the_admin_key(srv):
    """Callers infer through gRPC and the gateway; Triton's own HTTP inference answers the
    deployment's admin key only (and so refuses any other caller before reading a body)."""
    code, text = http(srv, "POST", "/v2/models/tokenize/infer", TOKENIZE_BODY)
    assert code == 403 and "admin-key" in text, (code, text)
    code, text = http(srv, "POST", "/v2/models/tokenize/infer", TOKENIZE_BODY, {"admin-key": srv.admin_key})
    assert code == 200 and '"data":[101,7592,2088,102]' in text.replace(" ", ""), (code, text)


def nested_json_request(path: str, depth: int = 60_000, headers: dict | None = None) -> bytes:
    """A 120 KB POST whose JSON body nests `depth` arrays: Triton 2.51's HTTP server parses a body
    recursively and crashes (SIGSEGV) on it when it parses it at all."""
    body = ('{"inputs":[{"name":"TEXT","shape":[1],"datatype":"BYTES","data":' + "[" * depth + '"a"'
            + "]" * depth + "}]}").encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{head}"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


def send_raw(port: int, request: bytes) -> bytes:
    """The raw answer to `request` on 127.0.0.1:port (what came before the server closed)."""
    import socket
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(request)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return answer


@pytest.mark.server
def test_a_deeply_nested_body_crashes_no_process(srv, keyed_launch):
    """The nested body on every HTTP port a deployment opens, to every route that reads a JSON body
    (Triton's inference and control plane with and without a key, the gateway's routes with the
    API key, so that the body is read, and Triton's metrics port): each is answered with an error,
    and every process still serves."""
    plain = [(srv.ports.http, p, h) for p in ("/v2/models/tokenize/infer", "/v2/models/embed/generate",
                                              "/v2/repository/index", "/v2/logging")
             for h in (None, http_api_key_headers(API_KEY))]
    keyed = [(keyed_launch.ports.http, "/v2/models/tokenize/infer", http_api_key_headers(API_KEY)),
             (keyed_launch.ports.metrics, "/metrics", None)]
    gateway_port = int(keyed_launch.gateway_url.rsplit(":", 1)[1])
    bearer = {"Authorization": f"Bearer {API_KEY}"}
    keyed += [(gateway_port, p, bearer) for p in ("/v1/embeddings", "/embeddings", "/v1/rerank", "/embed", "/",
                                                    "/rerank", "/embed_sparse", "/embed_all", "/tokenize", "/decode")]
    for port, path, headers in plain + keyed:
        answer = send_raw(port, nested_json_request(path, headers=headers))
        status = answer.split(b"\r\n", 1)[0]
        assert re.match(rb"HTTP/1\.[01] (4\d\d)", status), (port, path, answer[:300])
    assert srv.proc.poll() is None
    assert keyed_launch.proc.poll() is None and "restarted" not in keyed_launch.output, keyed_launch.output[-3000:]
    with EmbeddingClient(srv.grpc_url) as c:
        assert c.embed(["still serving"]).shape == (1, 384)
    with EmbeddingClient(keyed_launch.grpc_url, api_key=API_KEY) as c:
        assert c.embed(["still serving"]).shape == (1, 384)
    r = httpx.post(keyed_launch.gateway_url + "/v1/embeddings", json={"input": "still serving"}, headers=bearer,
                   timeout=60)
    assert r.status_code == 200, r.text
