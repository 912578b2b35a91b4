import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "ensemble", ROOT / "client", ROOT / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def default_model_dir():
    from rose_backend.config import default_model_dir
    return default_model_dir()


@pytest.fixture(scope="session")
def server():
    """One tritonserver with the default model for the whole session (small batches, so that
    multi-text requests are split across batches and the split path is exercised)."""
    from server import running_server
    params = {"rose": {"max_batch_tokens": "512", "max_batch_seqs": "8"},
              "tokenize": {"prompts": '{\\"query\\": \\"query: \\", \\"passage\\": \\"passage: \\"}'}}
    with running_server(params=params, name="default") as srv:
        yield srv


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
