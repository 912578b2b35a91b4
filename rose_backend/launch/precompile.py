"""Build ahead every kernel a model folder uses, into a folder laid out as the server's compile cache.

    python -m rose_backend.launch.precompile --model FOLDER --out DIR [--arch sm_90] [--repository REPO]
    ROSE_CACHE_DIR=DIR make serve MODEL=FOLDER          # then nothing compiles at start-up

DIR is laid out as supervision.cache_env lays out $ROSE_CACHE_DIR (flashinfer's JIT cache under
DIR/flashinfer/.cache/flashinfer, Triton's in DIR/triton). Two parts:
1. flashinfer's modules, through its own JitSpecs (gen_batch_prefill_module, gen_norm_module,
   gen_act_and_mul_module) and JitSpec.build(): the sources, ninja file and build folder the server's
   first use makes, so its ninja run finds them up to date. Ragged batch prefill as
   FlashInferBackend.plan loads it (q / kv / out in the model's dtype, int32 indptr, head_dim qk = vo,
   no RoPE, sliding window, soft cap or fp16 qk reduction; causal is a run-time mask of the same
   module) for each backend (fa2, fa3) Engine.backend_for can choose from attention_table.json over
   every graph bucket (the settings' `attention` alone when set; --all-backends: fa2, and fa3 on
   sm_90); for Qwen3 in bf16 / fp16 also silu_and_mul and the norm module (when flashinfer's norms
   take their CUDA path: the CuTe DSL one compiles in the serving process, keeping nothing on disk).
   No GPU needed: --arch sets FLASHINFER_CUDA_ARCH_LIST, which flashinfer's CompilationContext reads
   instead of asking the devices; nvcc (CUDA_HOME or PATH) and ninja must be there.
2. With a GPU of that architecture: the engine built as `rose` builds it runs the server's warm-up
   configurations once, so the Triton-language kernels (split-K GEMM, fused norms, q/k norm + RoPE)
   compile into DIR/triton. Without one this is skipped, and said so (they then compile at the
   server's warm-up: seconds).
flashinfer's ninja files hold absolute paths (DIR, flashinfer's package, CUDA) and ninja compares
file times: serve from the same DIR path and flashinfer install (installed before the build), else
the first use compiles again. --aot also copies each module where flashinfer looks for prebuilt ones
first (flashinfer.jit.env.FLASHINFER_AOT_DIR, in its package): that install then loads them with no
nvcc, ninja or matching paths (e.g. copied from a Docker builder stage), on that architecture only.
Writes DIR/precompile.json. Exit status 0: built; 1: a build failed (said why); 2: bad arguments.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from rose_backend import env_vars
from rose_backend.engine.batch_limits import BATCH_SEQS, BATCH_TOKENS
from rose_backend.launch.supervision import cache_env

HALF_DTYPES = ("bfloat16", "float16")
FLASHINFER_HEAD_DIMS = (64, 128, 256)       # FlashInferBackend.unavailable_reason (layers/attention_gpu.py)
FLASHINFER_BACKENDS = {"flashinfer": "fa2", "flashinfer_fa3": "fa3"}    # engine backend -> flashinfer's
FA3_MAJOR = 9                               # fa3 kernels: Hopper only
# model_type -> the flashinfer modules of layers/norm.py (AddRMSNorm, Gemma's) and layers/activation.py (gated)
FUSED_MODULES = {"qwen3": ("norm", "silu_and_mul"), "qwen2": ("norm", "silu_and_mul"), "llama": ("norm", "silu_and_mul"),
                 "mistral": ("norm", "silu_and_mul"), "gemma3_text": ("norm", "gelu_tanh_and_mul"),
                 "modernbert": ("gelu_and_mul",)}


class PrecompileError(RuntimeError):
    pass


@dataclass(frozen=True)
class Module:
    """One flashinfer JIT module: kind batch_prefill (backend, dtype, head_dim), norm or <act>_and_mul."""
    kind: str
    backend: str = ""
    dtype: str = ""
    head_dim: int = 0

    @property
    def label(self) -> str:
        if self.kind == "batch_prefill":
            return f"batch_prefill {self.backend} {self.dtype} head_dim {self.head_dim}"
        return self.kind

    def jit_spec(self):
        """flashinfer's JitSpec for this module (writes its generated sources)."""
        import torch
        import flashinfer.jit as fjit
        if self.kind == "batch_prefill":
            dt = getattr(torch, self.dtype)
            return fjit.gen_batch_prefill_module(self.backend, dt, dt, dt, torch.int32, self.head_dim,
                                                 self.head_dim, 0, False, False, False)
        if self.kind == "norm":
            from flashinfer.jit.norm import gen_norm_module
            return gen_norm_module()
        return fjit.gen_act_and_mul_module(self.kind.removesuffix("_and_mul"))


def parse_arch(value: str) -> tuple[int, int]:
    """"sm_90", "sm_90a", "90" or "9.0" -> (9, 0)."""
    m = re.fullmatch(r"(?:sm_?)?(\d+?)\.?(\d)[af]?", value.strip().lower())
    if not m or int(m.group(1)) < 7:
        raise ValueError(f"--arch takes a CUDA architecture such as sm_90 (or 9.0), got {value!r}")
    return int(m.group(1)), int(m.group(2))


def chosen_backends(cfg, runnable: list[str], dtype: str, max_tokens: int, max_seqs: int, table=None) -> set[str]:
    """The attention backends Engine.backend_for picks over every graph bucket (seqs x tokens) for
    cfg's heads, where `runnable` flashinfer backends, torch varlen and (if installed) FlashAttention 4 run."""
    import torch

    from rose_backend.engine.backend_table import BackendTable
    from rose_backend.engine.graph_cache import seq_buckets, token_buckets
    from rose_backend.layers.attention import BACKENDS, backend_class
    from rose_backend.layers.attention_gpu import installed
    from rose_backend.models.registry import attention_shape
    shape = attention_shape(cfg, getattr(torch, dtype))
    cuda = list(runnable)
    if cfg.head_dim % 8 == 0 and cfg.head_dim <= 256:          # TorchVarlenBackend.unavailable_reason
        cuda.append("torch_varlen")
    if installed("flash_attn.cute"):
        cuda.append("flash_attn4")
    excluded = env_vars.ROSE_ATTENTION_EXCLUDE.names()
    available = [n for n in BACKENDS if n in cuda and n not in excluded]
    if not available:
        return set()
    table = table if table is not None else BackendTable.load()
    chosen = set()
    for s in seq_buckets(max_seqs):
        for t in token_buckets(max_tokens):
            fits = [n for n in available if t <= getattr(backend_class(n), "max_tokens", t)] or available
            chosen.add(table.choose(shape.key, s, t, fits, cfg.num_layers,
                                    {n: backend_class(n).host_plan_us for n in fits}))
    return chosen


def flashinfer_modules(cfg, arch: tuple[int, int], dtype: str, attention: str | None = None,
                       all_backends: bool = False, max_tokens: int = BATCH_TOKENS, max_seqs: int = BATCH_SEQS,
                       cuda_norm: bool = True, table=None) -> list[Module]:
    """The flashinfer JIT modules a server of `cfg` loads on `arch` (see the module docstring)."""
    if dtype not in HALF_DTYPES:
        return []
    out = []
    if cfg.head_dim in FLASHINFER_HEAD_DIMS:
        runnable = ["flashinfer"] + (["flashinfer_fa3"] if arch[0] == FA3_MAJOR else [])
        if attention:
            names = {attention}
        elif all_backends:
            names = set(runnable)
        else:
            names = chosen_backends(cfg, runnable, dtype, max_tokens, max_seqs, table)
        out += [Module("batch_prefill", FLASHINFER_BACKENDS[n], dtype, cfg.head_dim) for n in runnable if n in names]
    for kind in FUSED_MODULES.get(cfg.model_type, ()):
        if kind != "norm" or cuda_norm:
            out.append(Module(kind))
    return out


def cache_layout(out: str | Path) -> dict[str, str]:
    """The compile-cache variables of a server started with ROSE_CACHE_DIR=out (supervision.cache_env)."""
    return cache_env({"ROSE_CACHE_DIR": str(out)})


def up_to_date(spec) -> bool:
    """What the server's JitSpec.build will find: ninja has nothing to do for the module."""
    r = subprocess.run(["ninja", "-n", "-C", str(spec.build_dir), "-f", str(spec.ninja_path)],
                       capture_output=True, text=True)
    return r.returncode == 0 and "no work to do" in r.stdout


def build_modules(modules: list[Module], jobs: int) -> list[dict]:
    """Build each module (side by side, `jobs` at a time); one record per module."""
    specs = [m.jit_spec() for m in modules]          # each ninja runs its own jobs ($MAX_JOBS, else ninja's)

    def build(spec) -> float:
        t0 = time.perf_counter()
        spec.build(need_lock=True)
        return time.perf_counter() - t0

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        futures = [pool.submit(build, s) for s in specs]
        rows = []
        for m, spec, f in zip(modules, specs, futures):
            try:
                seconds = f.result()
            except Exception as e:
                raise PrecompileError(f"flashinfer module {m.label} ({spec.name}) did not build: {e}") from e
            if not up_to_date(spec):
                raise PrecompileError(f"flashinfer module {m.label}: built, but ninja still finds work in "
                                      f"{spec.build_dir}, so the server would compile it again")
            rows.append({**asdict(m), "name": spec.name, "library": str(spec.get_library_path()),
                         "seconds": round(seconds, 1)})
    return rows


def install_aot(rows: list[dict]) -> None:
    """Copy each built module to flashinfer's prebuilt-module folder, where JitSpec.try_load looks first."""
    from flashinfer.jit import env as jit_env
    for r in rows:
        dest = Path(jit_env.FLASHINFER_AOT_DIR) / r["name"] / f"{r['name']}.so"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(r["library"], dest)
        r["aot"] = str(dest)


def warm_engine(cfg, settings, device: str = "cuda") -> dict:
    """Build the engine as `rose` builds it (its options from the same settings) and run its warm-up
    configurations (the GPU default when the settings say none): every kernel they launch compiles now."""
    import torch

    from rose_backend.engine.engine import Engine
    from rose_backend.serving.warmup import precapture_plan
    from rose_backend.triton.engine_options import engine_options
    limits = settings.engine_limits(cfg)
    engine = Engine(cfg, device, engine_options(settings, cfg, device))
    value = "" if settings.precapture.strip().lower() == "none" else settings.precapture
    warm = precapture_plan(value, True, max_len=cfg.max_positions, **limits)
    engine.precapture(warm)
    torch.cuda.synchronize()
    keys = [engine.graphs.key_for(s, t) for s, t in warm]
    return {"configurations": [f"{s}:{t}" for s, t in warm],
            "attention": sorted({engine.backend_for(*k) for k in keys if k is not None})}


def count_files(folder: str | Path) -> int:
    return sum(len(files) for _, _, files in os.walk(folder)) if Path(folder).is_dir() else 0


def load_settings(repository: str | None):
    """`rose`'s settings: from REPOSITORY/rose/config.pbtxt, else the defaults."""
    from rose_backend.triton.model_settings import RoseSettings, model_config_file
    if not repository:
        return RoseSettings()
    return RoseSettings.from_model_config(model_config_file(Path(repository) / "rose" / "config.pbtxt"))


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m rose_backend.launch.precompile", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="Hugging Face model folder")
    p.add_argument("--out", required=True, help="compile-cache folder to fill (serve with ROSE_CACHE_DIR=it)")
    p.add_argument("--arch", help="CUDA architecture, e.g. sm_90 (default: this machine's GPU)")
    p.add_argument("--repository", help="model repository whose rose/config.pbtxt the server reads (default: defaults)")
    p.add_argument("--kind", help="model kind (default: the settings', else detected from the folder)")
    p.add_argument("--all-backends", action="store_true", help="every flashinfer attention backend of the arch")
    p.add_argument("--aot", action="store_true", help="also copy the flashinfer modules into flashinfer's "
                   "prebuilt-module folder (loaded with no nvcc; GPUs of this architecture only)")
    p.add_argument("--flashinfer-only", action="store_true", help="skip the engine warm-up even with a GPU")
    p.add_argument("--jobs", type=int, default=4, help="flashinfer modules built side by side (default 4)")
    p.add_argument("--dry-run", action="store_true", help="print what would be built, build nothing")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    from rose_backend.config import ModelConfig, ModelFolderError
    try:
        arch = parse_arch(args.arch) if args.arch else None
        settings = load_settings(args.repository)
        cfg = ModelConfig.from_folder(Path(args.model).expanduser(), args.kind or settings.model_kind or None)
    except (ValueError, OSError, ModelFolderError) as e:
        print(f"rose precompile: {e}", file=sys.stderr)
        return 2
    layout = cache_layout(Path(args.out).expanduser().resolve())
    os.environ.update(layout)                                   # before torch, flashinfer, Triton are imported
    import torch
    gpu = torch.cuda.get_device_capability(0) if torch.cuda.is_available() else None
    if arch is None and gpu is None:
        print("rose precompile: no CUDA device here: say which architecture to build for (--arch sm_90)",
              file=sys.stderr)
        return 2
    arch = arch or gpu
    os.environ["FLASHINFER_CUDA_ARCH_LIST"] = f"{arch[0]}.{arch[1]}"    # read when flashinfer is imported
    dtype = settings.torch_dtype_name or "bfloat16"
    attention = settings.attention if settings.attention not in ("", "auto") else None
    try:
        import flashinfer.norm as fi_norm
        cuda_norm = fi_norm._USE_CUDA_NORM
    except ImportError:
        fi_norm = cuda_norm = None
    except Exception as e:                                      # flashinfer present but broken here
        print(f"rose precompile: failed: flashinfer does not import: {e!r}", file=sys.stderr)
        return 1
    modules = flashinfer_modules(cfg, arch, dtype, attention, args.all_backends,
                                 cuda_norm=cuda_norm is not False, **settings.engine_limits(cfg))
    print(f"rose precompile: {cfg.model_dir} ({cfg.model_type}, {cfg.num_heads} heads / {cfg.num_kv_heads} kv "
          f"heads of {cfg.head_dim}, {dtype}) for sm_{arch[0]}{arch[1]} into {layout['ROSE_CACHE_DIR']}", flush=True)
    for var in ("FLASHINFER_WORKSPACE_BASE", "TRITON_CACHE_DIR"):
        print(f"  {var}={layout[var]}")
    for m in modules:
        print(f"  flashinfer module: {m.label}")
    if cuda_norm is False and cfg.model_type in FUSED_MODULES:
        print("  not built: flashinfer's norms run on CuTe DSL here, compiled in the serving process")
    if args.dry_run:
        return 0
    record = {"model": str(cfg.model_dir), "arch": f"sm_{arch[0]}{arch[1]}", "dtype": dtype, "layout": layout}
    try:
        if modules and fi_norm is None:
            raise PrecompileError("flashinfer is not installed here (pip install flashinfer-python)")
        t0 = time.perf_counter()
        rows = build_modules(modules, args.jobs)
        if args.aot:
            install_aot(rows)
        for r in rows:
            print(f"  built {r['name']}  {r['seconds']:.1f} s" + (f" -> {r['aot']}" if args.aot else ""), flush=True)
        record["flashinfer"] = {"seconds": round(time.perf_counter() - t0, 1), "modules": rows}
        print(f"flashinfer: {len(rows)} modules in {record['flashinfer']['seconds']:.1f} s", flush=True)
        if args.flashinfer_only or gpu != arch:
            why = ("--flashinfer-only" if args.flashinfer_only else
                   f"no GPU of sm_{arch[0]}{arch[1]} here" + (f" (sm_{gpu[0]}{gpu[1]})" if gpu else ""))
            record["triton"] = {"skipped": why}
            print(f"skipped: the Triton-language kernels (split-K GEMM, fused norms, q/k norm + RoPE) and "
                  f"the engine warm-up: {why}; they compile at the server's warm-up")
        else:
            t0, before = time.perf_counter(), count_files(layout["TRITON_CACHE_DIR"])
            warm = warm_engine(cfg, settings)
            warm.update(seconds=round(time.perf_counter() - t0, 1),
                        triton_cache_files=count_files(layout["TRITON_CACHE_DIR"]) - before)
            record["triton"] = warm
            print(f"engine warm-up: {len(warm['configurations'])} configurations ({', '.join(warm['configurations'])}), "
                  f"attention {', '.join(warm['attention'])}; {warm['triton_cache_files']} new Triton cache files "
                  f"in {warm['seconds']:.1f} s", flush=True)
    except Exception as e:
        print(f"rose precompile: failed: {e}", file=sys.stderr)
        return 1
    record["seconds"] = round(time.perf_counter() - t_start, 1)
    Path(layout["ROSE_CACHE_DIR"], "precompile.json").write_text(json.dumps(record, indent=1))
    print(f"done in {record['seconds']:.1f} s: serve with ROSE_CACHE_DIR={layout['ROSE_CACHE_DIR']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
