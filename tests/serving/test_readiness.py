"""Ready means ready: `rose` warms up (and on a GPU captures) its common configurations in
initialize(), before Triton reports READY; the compile caches live in one persistent folder."""
import time
from pathlib import Path

import pytest

from rose_backend.serving.warmup import DEFAULT_GPU_PRECAPTURE, precapture_plan, query_lane_plan
from rose_backend.launch.supervision import cache_env
from support.metrics import metric


def test_default_plans():
    gpu = precapture_plan("", True, max_tokens=16384, max_seqs=64, max_len=8192)
    assert gpu[:4] == [(1, 64), (1, 128), (1, 256), (1, 512)] and gpu[-1] == (64, 16384)
    assert len(gpu) == len(DEFAULT_GPU_PRECAPTURE.split(","))
    assert precapture_plan("", False, 16384, 64, 512) == [(1, 8)]          # CPU: one tiny batch
    assert precapture_plan("none", True, 16384, 64, 512) == []


def test_the_query_lanes_engine_warms_up_the_one_sequence_configurations():
    gpu = precapture_plan("", True, max_tokens=16384, max_seqs=64, max_len=8192)
    assert query_lane_plan(gpu, 8192) == [(1, 64), (1, 128), (1, 256), (1, 512)]
    assert query_lane_plan(gpu, 200) == [(1, 64), (1, 128)]      # longer ones are bulk by size
    assert query_lane_plan([(1, 8)], 8192) == [(1, 8)]             # the CPU's list


def test_plans_fit_the_engine_limits():
    # 512-position model, batches of at most 8 sequences and 2048 tokens
    plan = precapture_plan("1:4096,64:16384,1:64,1:64", True, max_tokens=2048, max_seqs=8, max_len=512)
    assert plan == [(4, 2048), (8, 2048), (1, 64)]
    assert all(t <= 2048 and s <= 8 and t <= s * 512 for s, t in plan)
    with pytest.raises(ValueError, match="seqs:tokens pairs"):
        precapture_plan("1x64", True, 2048, 8, 512)


def test_compile_caches_share_one_folder(tmp_path):
    env = cache_env({"ROSE_CACHE_DIR": str(tmp_path / "c"), "TRITON_CACHE_DIR": "/mine"})
    assert env["FLASHINFER_WORKSPACE_BASE"] == str(tmp_path / "c" / "flashinfer")
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "c" / "inductor")
    assert env["CUDA_CACHE_PATH"] == str(tmp_path / "c" / "cuda")
    assert env["TRITON_CACHE_DIR"] == "/mine"                             # what the user set wins
    home = cache_env({"HOME": "/h", "XDG_CACHE_HOME": "/x"})
    assert home["ROSE_CACHE_DIR"] == str(Path("/x/rose"))


@pytest.mark.server
def test_warm_up_runs_before_ready():
    """The configured batches ran before READY: the engine's batch counter holds them before any
    request was sent (each configuration runs twice: warm, then capture on a GPU)."""
    from support.server import running_server
    with running_server(params={"rose": {"precapture": "1:8,2:64"}}, name="warmup", models=("rose",)) as srv:
        end = time.monotonic() + 10                                        # metrics refresh once a second
        while metric(srv, "rose_sequences_total") == 0 and time.monotonic() < end:     # (refreshed last)
            time.sleep(0.2)
        assert metric(srv, "rose_batches_total") == 4
        assert metric(srv, "rose_sequences_total") == 2 * 1 + 2 * 2
