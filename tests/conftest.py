import contextlib
import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "ensemble", ROOT / "client", ROOT / "benchmarks", ROOT / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def default_model_dir():
    from rose_backend.config import default_model_dir
    return default_model_dir()


# The default deployment as most server tests see it: small batches, so that multi-text requests are
# split across batches and the split path is exercised, and "query: " / "passage: " prompts (which
# change the vectors, unlike the shipped empty fallback prompts of all-MiniLM).
DEFAULT_TEST_PARAMS = {"rose": {"max_batch_tokens": "512", "max_batch_seqs": "8"},
                       "tokenize": {"prompts": '{\\"query\\": \\"query: \\", \\"passage\\": \\"passage: \\"}'}}


@pytest.fixture(scope="session")
def shared_server():
    """shared_server(params=None, model_dir=None, name="shared") -> a running tritonserver, one per
    distinct (params, model_dir) for the whole session, stopped at its end. For tests that only talk
    to a server: a test that kills, restarts or reconfigures its server starts its own
    (tests/server.py: running_server, running_servers). params as in running_server, e.g.
    {"rose": {"max_batch_tokens": "256"}}; None: the shipped repository."""
    from server import running_server
    cache: dict = {}
    with contextlib.ExitStack() as stack:
        def get(params: dict | None = None, model_dir: str | None = None, name: str = "shared"):
            key = (json.dumps(params, sort_keys=True), str(model_dir))
            if key not in cache:
                cache[key] = stack.enter_context(running_server(model_dir, params, name=name))
            return cache[key]
        yield get


@pytest.fixture(scope="session")
def server(shared_server):
    """The session's default server (DEFAULT_TEST_PARAMS, the default model)."""
    return shared_server(DEFAULT_TEST_PARAMS, name="default")


@pytest.fixture(scope="session")
def replicas():
    """Three replicas of the default model (a "query: " prompt), each with one CPU thread
    (OMP_NUM_THREADS=1) so that on this 2-core machine they work as independent workers, as GPUs
    would: the client's multi-server tests. test_client.py kills the second one; later users take
    the live ones ([s for s in replicas if s.proc.poll() is None])."""
    from server import running_servers
    params = {"tokenize": {"prompts": '{\\"query\\": \\"query: \\"}'}}
    env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with running_servers(3, params=params, name="replica", env=env) as servers:
        yield servers


@pytest.fixture(scope="session")
def sentence_model(default_model_dir):
    from sentence_transformers import SentenceTransformer
    return SentenceTransformer(str(default_model_dir), device="cpu")


@pytest.fixture
def client(server):
    from rose_client import EmbeddingClient
    c = EmbeddingClient(server.grpc_url)
    yield c
    c.close()


def pytest_sessionfinish(session, exitstatus):
    """Fail the session if it leaves a tritonserver, a stub or a /dev/shm/rose_* segment behind
    (only what this session started: tests/leftovers.py). Stubs get 10 s to notice a dead server."""
    import leftovers
    procs, segs = leftovers.wait_gone(timeout=10.0)
    if not procs and not segs:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = ["the test session left behind:"] + [f"  process {pid}: {cmd[:200]}" for pid, cmd in procs.items()]
    lines += [f"  /dev/shm/{name}" for name in segs]
    if reporter is not None:
        reporter.write_line("\n".join(lines), red=True)
    else:
        print("\n".join(lines))
    leftovers.remove(procs, segs)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
