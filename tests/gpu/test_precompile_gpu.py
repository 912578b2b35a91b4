"""rose_backend.launch.precompile on the GPU: an 8-layer pplx-embed-shaped folder (Qwen3 heads 16 / 8 x 128:
flashinfer attention, norm and SiLU-and-mul modules, and every Triton-language kernel) precompiled
into an empty folder; then a second process, started as the server is (ROSE_CACHE_DIR = that folder,
the other cache variables from supervision.cache_env, no FLASHINFER_CUDA_ARCH_LIST), builds the
engine and runs the server's warm-up without compiling: no flashinfer object or library is written
again, no Triton cache file appears, and it takes a fraction of the precompile's time. And --aot,
built with the GPU hidden (a builder without one): a process with an empty cache and no nvcc runs
the modules it placed in flashinfer's prebuilt-module folder.

    source .gpu/enter.sh && python3 -m pytest tests/gpu/test_precompile_gpu.py -q -s

With ROSE_GPU_PRECOMPILED=DIR (benchmarks/gpu/gpu_suite.sh: DIR filled by `python -m
rose_backend.launch.precompile` for the pplx-embed shape just before the suite) both tests precompile into
DIR instead of an empty folder: the build then finds its modules up to date, and what is checked is
that a server started from DIR compiles nothing and that --aot places loadable modules. Without it
the first test builds from nothing (about 90 s of nvcc on an H200 host).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rose_backend import env_vars
from rose_backend.launch.supervision import cache_env
from rose_testing.folders import make_folder

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

ROOT = Path(__file__).resolve().parents[2]
OURS = ("ROSE_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR",
        "CUDA_CACHE_PATH", "FLASHINFER_CUDA_ARCH_LIST", "MAX_JOBS")
SERVE = """
import json, sys, time
t0 = time.perf_counter()
from rose_backend.config import ModelConfig
from rose_backend.launch.precompile import load_settings, warm_engine
warm = warm_engine(ModelConfig.from_folder(sys.argv[1]), load_settings(None))
from flashinfer.jit import env
print(json.dumps({**warm, "seconds": time.perf_counter() - t0, "workspace": str(env.FLASHINFER_WORKSPACE_DIR)}))
"""
NO_NVCC = """
import torch, flashinfer
x = torch.randn(8, 128, device="cuda", dtype=torch.bfloat16)
flashinfer.norm.rmsnorm(x, torch.ones(128, device="cuda", dtype=torch.bfloat16))
flashinfer.activation.silu_and_mul(torch.randn(8, 256, device="cuda", dtype=torch.bfloat16))
torch.cuda.synchronize()
"""


PRECOMPILED = "ROSE_GPU_PRECOMPILED"


def precompiled_folder(empty: Path) -> Path:
    """The folder to precompile into: $ROSE_GPU_PRECOMPILED (already filled) or `empty`."""
    return Path(os.environ[PRECOMPILED]) if os.environ.get(PRECOMPILED) else empty


def built_files(cache: Path) -> dict[str, int]:
    """{path: mtime} of flashinfer's objects and libraries and of every Triton cache file."""
    fi = [p for p in (cache / "flashinfer").rglob("*") if p.suffix in (".o", ".so")]
    return {str(p): p.stat().st_mtime_ns for p in fi + list((cache / "triton").rglob("*")) if p.is_file()}


def test_a_precompiled_folder_serves_without_compiling(gpu_tmp, tmp_path):
    folder = make_folder("pplx-embed", gpu_tmp / "precompile-pplx-8l", device="cuda", num_hidden_layers=8,
                         vocab_size=4096)
    cache = precompiled_folder(tmp_path / "cache")
    base = {k: v for k, v in os.environ.items() if k not in OURS}
    r = subprocess.run([sys.executable, "-m", "rose_backend.launch.precompile", "--model", str(folder), "--out", str(cache)],
                       cwd=ROOT, env=base, capture_output=True, text=True, timeout=900)
    print(r.stdout[-3000:], r.stderr[-3000:])
    assert r.returncode == 0, r.stderr[-3000:]
    record = json.loads((cache / "precompile.json").read_text())
    modules = record["flashinfer"]["modules"]
    # fa3 on Hopper, unless $ROSE_ATTENTION_EXCLUDE leaves it out (a run with another backend forced)
    fa3 = torch.cuda.get_device_capability(0)[0] == 9 and "flashinfer_fa3" not in env_vars.ROSE_ATTENTION_EXCLUDE.names()
    assert {m["kind"] for m in modules} >= {"silu_and_mul"} and (not fa3 or
                                                                  any(m["backend"] == "fa3" for m in modules))
    fi_root = cache / "flashinfer" / ".cache" / "flashinfer"
    assert all(Path(m["library"]).is_file() and Path(m["library"]).is_relative_to(fi_root) for m in modules)
    # the warm-up compiled the Triton-language kernels here (new files: this run's; found: an earlier's)
    assert record["triton"]["triton_cache_files"] > 0 or (os.environ.get(PRECOMPILED) and any(
        p.is_file() for p in (cache / "triton").rglob("*"))), record["triton"]
    before = built_files(cache)

    serve_env = cache_env({**base, "ROSE_CACHE_DIR": str(cache)})
    s = subprocess.run([sys.executable, "-c", SERVE, str(folder)], cwd=ROOT, env=serve_env,
                       capture_output=True, text=True, timeout=600)
    assert s.returncode == 0, s.stderr[-3000:]
    served = json.loads(s.stdout.strip().splitlines()[-1])
    print(f"precompile {record['seconds']} s, then the server's engine + warm-up {served['seconds']:.1f} s: {served}")
    after = built_files(cache)
    assert sorted(set(after) - set(before)) == []                             # nothing compiled
    assert [p for p in before if after.get(p) != before[p]] == []             # nothing rebuilt
    assert all(Path(m["library"]).is_relative_to(served["workspace"]) for m in modules)   # the same arch folder
    if fa3:
        assert "flashinfer_fa3" in served["attention"]                        # the prebuilt module was loaded
    if not os.environ.get(PRECOMPILED):                                    # a build from nothing
        assert served["seconds"] < record["seconds"] / 2


def test_aot_modules_load_without_nvcc(gpu_tmp, tmp_path):
    from flashinfer.jit import env
    folder = make_folder("tiny-qwen3", gpu_tmp / "precompile-tiny-qwen3")      # head_dim 16: norm, silu_and_mul
    major, minor = torch.cuda.get_device_capability(0)
    base = {k: v for k, v in os.environ.items() if k not in OURS}
    aot = Path(env.FLASHINFER_AOT_DIR)
    before = {p.name for p in aot.iterdir()} if aot.is_dir() else set()
    cache = precompiled_folder(tmp_path / "cache")
    try:
        r = subprocess.run([sys.executable, "-m", "rose_backend.launch.precompile", "--model", str(folder), "--out",
                            str(cache), "--arch", f"{major}.{minor}", "--aot"], cwd=ROOT,
                           env={**base, "CUDA_VISIBLE_DEVICES": ""}, capture_output=True, text=True, timeout=600)
        print(r.stdout[-2000:])
        assert r.returncode == 0, r.stderr[-3000:]
        assert "skipped: the Triton-language kernels" in r.stdout                 # no GPU seen
        modules = json.loads((cache / "precompile.json").read_text())["flashinfer"]["modules"]
        assert "silu_and_mul" in {m["kind"] for m in modules}
        assert all(Path(m["aot"]).is_file() and Path(m["aot"]).parent.parent == aot for m in modules)
        no_nvcc = os.pathsep.join(d for d in base.get("PATH", "").split(os.pathsep) if not (Path(d) / "nvcc").exists())
        empty = tmp_path / "empty"
        s = subprocess.run([sys.executable, "-c", NO_NVCC], cwd=ROOT, capture_output=True, text=True, timeout=300,
                           env={**base, "PATH": no_nvcc, "CUDA_HOME": str(tmp_path / "no-cuda"),
                                "FLASHINFER_WORKSPACE_BASE": str(empty)})
        assert s.returncode == 0, s.stderr[-3000:]
        assert [p for p in empty.rglob("*") if p.suffix in (".o", ".so")] == []     # loaded, not compiled
    finally:
        for p in (aot.iterdir() if aot.is_dir() else ()):
            if p.name not in before:
                shutil.rmtree(p)
