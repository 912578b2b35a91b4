"""rose_backend.launch.precompile on the CPU: its arguments, the flashinfer modules it derives from a folder's
config for both model families (and the engine's backend choice behind them), and the cache layout
it writes into (the one a server started with ROSE_CACHE_DIR reads). The builds themselves need
nvcc and flashinfer: tests/gpu/test_precompile_gpu.py."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rose_backend.config import ModelConfig
from rose_backend.engine.backend_table import BackendTable
from rose_backend.launch.precompile import Module, chosen_backends, flashinfer_modules, main, parse_arch
from rose_backend.launch.supervision import cache_env
from rose_testing.folders import make_folder
from rose_testing.qwen3 import write_qwen3_folder

ROOT = Path(__file__).resolve().parents[2]
LIMITS = {"max_tokens": 16384, "max_seqs": 64}


def real_depth(folder: Path, layers: int) -> Path:
    """The module list reads config.json only: one layer of weights, the real model's layer count."""
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "num_hidden_layers": layers}))
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("precompile")
    return {
        "bge-m3": real_depth(make_folder("bge-m3", root / "bge", num_hidden_layers=1, vocab_size=1000), 24),
        "pplx-embed": real_depth(make_folder("pplx-embed", root / "pplx", num_hidden_layers=1, vocab_size=1000), 28),
        "qwen3-causal": real_depth(write_qwen3_folder(root / "qwen3", style="qwen3-embedding", num_heads=4,
                                                      num_kv_heads=2, head_dim=64, hidden_size=64, num_layers=1), 28),
        "tiny-bert": make_folder("tiny-bert", root / "tiny"),
    }


def cfg_of(folders, name) -> ModelConfig:
    return ModelConfig.from_folder(folders[name])


def run(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rose_backend.launch.precompile", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize("value,want", [("sm_90", (9, 0)), ("sm_90a", (9, 0)), ("90", (9, 0)), ("9.0", (9, 0)),
                                        ("sm_80", (8, 0)), ("sm_100", (10, 0)), ("12.0", (12, 0))])
def test_arch_spellings(value, want):
    assert parse_arch(value) == want


@pytest.mark.parametrize("value", ["hopper", "sm_", "sm_61", "9", ""])
def test_bad_arch_is_refused(value):
    with pytest.raises(ValueError, match="--arch takes a CUDA architecture"):
        parse_arch(value)


def test_arguments_are_checked(folders, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--model", str(folders["bge-m3"])])                          # no --out
    assert e.value.code == 2
    assert main(["--model", str(tmp_path / "absent"), "--out", str(tmp_path / "o"), "--arch", "sm_90"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["--model", str(folders["bge-m3"]), "--out", str(tmp_path / "o"), "--arch", "volta"]) == 2
    assert "--arch takes a CUDA architecture" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the architecture comes from the GPU here")
def test_without_a_gpu_the_arch_must_be_named(folders, tmp_path):
    r = run("--model", folders["pplx-embed"], "--out", tmp_path / "o")
    assert r.returncode == 2 and "no CUDA device here" in r.stderr and "--arch sm_90" in r.stderr


@pytest.mark.skipif(importlib.util.find_spec("flashinfer") is not None, reason="flashinfer is installed here")
def test_a_build_without_flashinfer_fails_saying_so(folders, tmp_path):
    r = run("--model", folders["pplx-embed"], "--out", tmp_path / "o", "--arch", "sm_90")
    assert r.returncode == 1 and "flashinfer is not installed" in r.stderr
    assert not (tmp_path / "o" / "precompile.json").exists()


def test_bge_m3_on_hopper(folders):
    """BGE-M3's heads (16 x 64, bidirectional): the table has fa3 beating torch varlen on long
    batches only (flashinfer's plan costs host time), so both run, and the fa3 module is built."""
    cfg = cfg_of(folders, "bge-m3")
    assert chosen_backends(cfg, ["flashinfer", "flashinfer_fa3"], "bfloat16", **LIMITS) == {"flashinfer_fa3", "torch_varlen"}
    assert flashinfer_modules(cfg, (9, 0), "bfloat16", **LIMITS) == [Module("batch_prefill", "fa3", "bfloat16", 64)]


def test_pplx_embed_on_hopper(folders):
    """Qwen3 family: the attention module plus flashinfer's norm and SiLU-and-mul."""
    cfg = cfg_of(folders, "pplx-embed")
    assert flashinfer_modules(cfg, (9, 0), "bfloat16", **LIMITS) == [
        Module("batch_prefill", "fa3", "bfloat16", 128), Module("norm"), Module("silu_and_mul")]
    assert flashinfer_modules(cfg, (9, 0), "bfloat16", cuda_norm=False, **LIMITS) == [
        Module("batch_prefill", "fa3", "bfloat16", 128), Module("silu_and_mul")]       # CuTe DSL norms


def test_every_backend_on_request(folders):
    cfg = cfg_of(folders, "pplx-embed")
    assert [m.label for m in flashinfer_modules(cfg, (9, 0), "float16", all_backends=True, **LIMITS)] == [
        "batch_prefill fa2 float16 head_dim 128", "batch_prefill fa3 float16 head_dim 128", "norm", "silu_and_mul"]
    # off Hopper there is no fa3, and the table leaves flashinfer's fa2 unpicked (torch varlen has the cells)
    assert [m.label for m in flashinfer_modules(cfg, (8, 0), "bfloat16", all_backends=True, **LIMITS)] == [
        "batch_prefill fa2 bfloat16 head_dim 128", "norm", "silu_and_mul"]
    assert [m.label for m in flashinfer_modules(cfg, (8, 0), "bfloat16", **LIMITS)] == ["norm", "silu_and_mul"]


def test_a_backend_named_by_the_settings_runs_alone(folders):
    cfg = cfg_of(folders, "bge-m3")
    assert [m.backend for m in flashinfer_modules(cfg, (9, 0), "bfloat16", attention="flashinfer", **LIMITS)] == ["fa2"]
    assert flashinfer_modules(cfg, (9, 0), "bfloat16", attention="torch_varlen", **LIMITS) == []


def test_causal_heads_share_the_module(folders):
    """Causal is a mask mode at run time: Qwen3-Embedding's heads need the same module kinds; a
    shape the table never measured falls back to the engine's preference (fa3 on Hopper)."""
    cfg = cfg_of(folders, "qwen3-causal")
    assert cfg.causal and cfg.head_dim == 64
    assert flashinfer_modules(cfg, (9, 0), "bfloat16", **LIMITS) == [
        Module("batch_prefill", "fa3", "bfloat16", 64), Module("norm"), Module("silu_and_mul")]
    assert chosen_backends(cfg, ["flashinfer", "flashinfer_fa3"], "bfloat16", table=BackendTable(), **LIMITS) == {"flashinfer_fa3"}


def test_nothing_for_shapes_flashinfer_does_not_serve(folders):
    tiny = cfg_of(folders, "tiny-bert")                                    # head_dim 16: torch varlen
    assert tiny.head_dim == 16 and flashinfer_modules(tiny, (9, 0), "bfloat16", all_backends=True, **LIMITS) == []
    assert flashinfer_modules(cfg_of(folders, "pplx-embed"), (9, 0), "float32", **LIMITS) == []   # fp32: no fused kernels


def test_excluded_backends_are_not_built(folders, monkeypatch):
    monkeypatch.setenv("ROSE_ATTENTION_EXCLUDE", "flashinfer_fa3")
    assert flashinfer_modules(cfg_of(folders, "bge-m3"), (9, 0), "bfloat16", **LIMITS) == []


def test_the_layout_is_the_servers(folders, tmp_path):
    """The dry run names the folders it would fill: those cache_env gives a server started with
    ROSE_CACHE_DIR=out, even where the caller's environment points the caches elsewhere."""
    out = tmp_path / "cache"
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "elsewhere"), "FLASHINFER_WORKSPACE_BASE": "/nope"}
    r = run("--model", folders["pplx-embed"], "--out", out, "--arch", "sm_90", "--dry-run", env=env)
    assert r.returncode == 0, r.stderr
    served = cache_env({"ROSE_CACHE_DIR": str(out)})
    for var in ("FLASHINFER_WORKSPACE_BASE", "TRITON_CACHE_DIR"):
        assert f"{var}={served[var]}" in r.stdout
    assert served["FLASHINFER_WORKSPACE_BASE"] == str(out / "flashinfer")
    assert "batch_prefill fa3 bfloat16 head_dim 128" in r.stdout and "silu_and_mul" in r.stdout
    assert not out.exists()                                               # a dry run builds nothing


def test_settings_come_from_the_repository(folders, tmp_path):
    from rose_backend.launch.deployment import DEFAULT_REPOSITORY, repository_copy
    repo = repository_copy(DEFAULT_REPOSITORY, tmp_path / "repo", {"rose": {"dtype": "float16", "attention": "flashinfer"}})
    r = run("--model", folders["bge-m3"], "--out", tmp_path / "o", "--arch", "sm_90", "--dry-run", "--repository", repo)
    assert r.returncode == 0, r.stderr
    assert "float16" in r.stdout and "batch_prefill fa2 float16 head_dim 64" in r.stdout and "fa3" not in r.stdout
