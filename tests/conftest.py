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
from support import leftovers  # noqa: E402,F401 (marks this session's environment before any process starts)
# One torch thread in the test processes and in every server, stub and tool they start (set before
# torch is imported): on the 2-core machine a second thread bought little time and cost CPU that the
# other workers' tests wait for (a one-text forward pass of all-MiniLM: 12 CPU-ms on one thread, 28
# on two, in the same 12-14 ms).
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def default_model_dir():
    """The shipped default model (all-MiniLM-L6-v2, real weights)."""
    from rose_backend.config import default_model_dir
    return default_model_dir()


@pytest.fixture(scope="session")
def minilm_shaped_dir(tmp_path_factory):
    """all-MiniLM-L6-v2's tokenizer, prompts and 384 dimensions with random weights in one narrow
    layer (rose_testing.folders.minilm_shaped_folder): what the test servers serve (`server`,
    `replicas`, private servers that compare with `sentence_model`) and the in-process engine and
    service tests run, so that the thousands of texts they embed cost a tenth of the CPU (a
    512-token pass: 21 against 205 CPU-ms). The shipped weights are checked in tests/models and
    through the launcher's shipped deployment (test_server.py). Made once per run: the xdist workers
    share it through their common temp folder."""
    import fcntl
    from rose_testing.folders import minilm_shaped_folder
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    with open(root / "minilm-shaped.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)                  # one worker writes it, the others wait
        return minilm_shaped_folder(root / "minilm-shaped")


# The default deployment as most server tests see it: a small token budget, so that multi-text
# requests are split across batches and the split path is exercised, and "query: " / "passage: "
# prompts (which change the vectors, unlike the shipped empty fallback prompts of all-MiniLM).
# 32 sequences a batch: every forward pass has a fixed cost however few its tokens (2 CPU-ms for one
# short text on minilm_shaped_dir), so that thousands of short texts are not thousands of passes.
DEFAULT_TEST_PARAMS = {"rose": {"max_batch_tokens": "512", "max_batch_seqs": "32"},
                       "tokenize": {"prompts": '{"query": "query: ", "passage": "passage: "}'}}


@pytest.fixture(scope="session")
def shared_server():
    """shared_server(params=None, model_dir=None, name="shared") -> a running tritonserver, one per
    distinct (params, model_dir) for the whole session, stopped at its end. For tests that only talk
    to a server: a test that kills, restarts or reconfigures its server starts its own
    (tests/support/server.py: running_server, running_servers). params as in running_server, e.g.
    {"rose": {"max_batch_tokens": "256"}}; None: the shipped repository."""
    from support.server import running_server
    cache: dict = {}
    with contextlib.ExitStack() as stack:
        def get(params: dict | None = None, model_dir: str | None = None, name: str = "shared"):
            key = (json.dumps(params, sort_keys=True), str(model_dir))
            if key not in cache:
                cache[key] = stack.enter_context(running_server(model_dir, params, name=name))
            return cache[key]
        yield get


# The rerankers' deployment: small batches, so that one request's pairs are spread over several
# forward passes.
RERANK_PARAMS = {"rose": {"max_batch_tokens": "512", "max_batch_seqs": "16"}}


@pytest.fixture(scope="session")
def reranker_server(shared_server, tmp_path_factory):
    """reranker_server(kind) -> (folder, server): a random-weight reranker folder of that kind
    (rose_testing.reranker_folders) served with RERANK_PARAMS, one per kind for the session."""
    folders: dict = {}

    def get(kind: str):
        if kind not in folders:
            from rose_testing.reranker_folders import write_reranker_folder
            folders[kind] = write_reranker_folder(kind, tmp_path_factory.mktemp(kind) / "model")
        return folders[kind], shared_server(RERANK_PARAMS, model_dir=str(folders[kind]), name=f"rerank-{kind}")
    return get


@pytest.fixture(scope="session")
def server(shared_server, minilm_shaped_dir):
    """The session's default server (the shipped repository with DEFAULT_TEST_PARAMS, serving
    minilm_shaped_dir)."""
    return shared_server(DEFAULT_TEST_PARAMS, model_dir=str(minilm_shaped_dir), name="default")


@pytest.fixture(scope="session")
def replicas(minilm_shaped_dir):
    """Three replicas serving minilm_shaped_dir (a "query: " prompt), each with one CPU thread
    (OMP_NUM_THREADS=1) so that on this 2-core machine they work as independent workers, as GPUs
    would: the client's multi-server tests. test_client.py kills the second one; later users take
    the live ones ([s for s in replicas if s.proc.poll() is None])."""
    from support.server import running_servers
    params = {"tokenize": {"prompts": '{"query": "query: "}'}}
    env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with running_servers(3, model_dir=str(minilm_shaped_dir), params=params, name="replica", env=env) as servers:
        yield servers


@pytest.fixture(scope="session")
def m3_deployment(shared_server, tmp_path_factory):
    """(folder, ranges, server): a random-weight BGE-M3 folder (rose_testing/m3_folders.py,
    max_seq_length support.server.M3_MAX_LEN), its int8/uint8 calibration ranges (from random unit
    vectors, saved beside it as ranges.npy) and the session's server of both, with small batches:
    the M3 outputs' and the requested outputs' tests."""
    import numpy as np
    from rose_testing.m3_folders import make_m3_folder
    from support.server import M3_MAX_LEN
    folder = make_m3_folder(tmp_path_factory.mktemp("m3") / "model", max_seq_length=M3_MAX_LEN)
    rng = np.random.default_rng(1)
    cal = rng.normal(size=(200, 64)).astype(np.float32)
    cal /= np.linalg.norm(cal, axis=1, keepdims=True)
    ranges = np.stack([cal.min(0), cal.max(0)]).astype(np.float32)
    np.save(folder.parent / "ranges.npy", ranges)
    params = {"rose": {"max_batch_tokens": "64", "max_batch_seqs": "4",
                       "quantization_ranges": str(folder.parent / "ranges.npy")}}
    return folder, ranges, shared_server(params, model_dir=str(folder), name="m3")


@pytest.fixture(scope="session")
def qwen3_deployment(shared_server, tmp_path_factory):
    """(folder, server): a small random-weight Qwen3-Embedding-style folder (rose_testing/qwen3.py)
    and the session's server of it (the shipped repository's settings)."""
    from rose_testing.qwen3 import write_qwen3_folder
    folder = write_qwen3_folder(tmp_path_factory.mktemp("qwen3") / "qwen3-embedding", style="qwen3-embedding",
                                num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32, hidden_size=96)
    return folder, shared_server(None, model_dir=str(folder), name="qwen3")


@pytest.fixture(scope="session")
def sentence_model(minilm_shaped_dir):
    """sentence-transformers on minilm_shaped_dir: the reference of the test servers."""
    from sentence_transformers import SentenceTransformer
    return SentenceTransformer(str(minilm_shaped_dir), device="cpu")


@pytest.fixture(scope="session")
def shipped_sentence_model(default_model_dir):
    """sentence-transformers on the shipped default model (real weights)."""
    from sentence_transformers import SentenceTransformer
    return SentenceTransformer(str(default_model_dir), device="cpu")


@pytest.fixture(scope="module")
def conn(server):
    """One gRPC stream connection (rose_client.StreamConnection) to the session's server per module."""
    from rose_client import StreamConnection
    c = StreamConnection(server.grpc_url)
    yield c
    c.close()


@pytest.fixture
def client(server):
    from rose_client import EmbeddingClient
    c = EmbeddingClient(server.grpc_url)
    yield c
    c.close()


# `make test` runs the suite on three pytest-xdist workers (-n 3). Each test module is one unit of work,
# run on one worker (its module-scoped servers start once); the two modules of the session's
# `replicas` are one unit (three servers, not six), the reranker modules another (one server per
# reranker kind; the docs' examples too), the M3 modules a third (one M3 server), the Qwen3 ones a fourth, and test_soak
# runs right after test_server on the same session server; the tests of a SPLIT module are units
# of their own. The longest units go first, so that no worker is left
# with a long one at the end. Each worker has its own session servers and checks its own leftovers;
# the controller fails the run if a worker found any (pytest_testnodedown).
GROUPS = {"test_client": "replicas", "test_client_balance": "replicas", "test_soak": "test_server",
          "test_lanes_server": "rerankers", "test_truncation_server": "rerankers", "test_rerank_server": "rerankers",
          "test_m3_outputs": "m3", "test_requested_outputs": "m3", "test_tei_m3": "m3", "test_tei_rerank": "rerankers",
          "test_docs_examples": "rerankers",
          "test_qwen3_server": "qwen3", "test_gateway_tokens": "qwen3"}
# Modules whose tests share nothing (each runs its own processes): every test is a unit of its own,
# so that their minutes are spread over the workers. (test_fp8_accuracy is one unit: its tests share
# the corpus, parsed once per process.)
SPLIT = {"test_bench", "test_supervision", "test_stop_bound"}
LONGEST_FIRST = ("test_server", "test_bench", "test_fp8_accuracy", "replicas", "test_stub_recovery",
                 "test_supervision", "test_gateway_limits", "test_security", "test_two_models",
                 "test_stop_bound", "test_gateway_watch", "test_api_keys", "test_hardening",
                 "test_gateway_failover", "rerankers")


def module_group(nodeid: str) -> str:
    name = Path(nodeid.split("::")[0]).stem
    return GROUPS.get(name, name)


def group_of(nodeid: str) -> str:
    return nodeid if Path(nodeid.split("::")[0]).stem in SPLIT else module_group(nodeid)


def pytest_collection_modifyitems(config, items):
    rank = {g: i for i, g in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(module_group(item.nodeid), len(rank)))   # stable: file order within


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's scope scheduling with group_of() as the scope, in collection order."""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    config.option.loadscopereorder = False
    return ModuleGroups(config, log)


def pytest_sessionfinish(session, exitstatus):
    """Fail the session if it leaves a tritonserver, a stub or a /dev/shm/rose_* segment behind
    (only what this session started: tests/support/leftovers.py), once every server stopped in the
    background (tests/support/server.py) has exited. Stubs get 10 s to notice a dead server."""
    from support import leftovers
    from support import server
    server.wait_stopped()
    procs, segs = leftovers.wait_gone(timeout=10.0)
    lines = [f"  process {pid}: {cmd[:200]}" for pid, cmd in procs.items()] + [f"  /dev/shm/{name}" for name in segs]
    leftovers.remove(procs, segs)
    if hasattr(session.config, "workeroutput"):                  # an xdist worker: the controller reports
        session.config.workeroutput["rose_leftovers"] = lines
        return
    lines += getattr(session.config, "rose_worker_leftovers", [])
    if not lines:
        return
    text = "\n".join(["the test session left behind:"] + lines)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(text, red=True)
    else:
        print(text)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """xdist's controller: collect what a worker's session left behind (pytest_sessionfinish)."""
    lines = getattr(node, "workeroutput", {}).get("rose_leftovers", [])
    found = getattr(node.config, "rose_worker_leftovers", [])
    node.config.rose_worker_leftovers = found + [f"{line} (worker {node.gateway.id})" for line in lines]
