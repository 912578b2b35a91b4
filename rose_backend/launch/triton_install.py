"""Where tritonserver comes from and what its Python stub needs (TritonProcess, tritonserver.py).

find_triton(): $TRITONSERVER_BIN, then `tritonserver` on PATH (the NGC image), then the binary bundled
in the nvidia-pytriton wheel, with the stub for the running Python placed beside libtriton_python.so.
server_env(): the environment that makes this project importable inside the stub (PYTHONPATH, and
the interpreter's own libpython first on LD_LIBRARY_PATH); stub_site(): ROSE_STUB_SITE.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from rose_backend import env_vars
from rose_backend.launch.deployment import REPO_ROOT


class LaunchError(RuntimeError):
    pass


@dataclass
class TritonInstall:
    binary: Path
    backend_dir: Path | None          # None: the binary's built-in default (NGC image)
    extra_ld_paths: list[str] = field(default_factory=list)


def find_triton() -> TritonInstall:
    env_bin = env_vars.TRITONSERVER_BIN.get()
    if env_bin:
        binary = Path(env_bin)
        if not binary.exists():
            raise LaunchError(f"TRITONSERVER_BIN={env_bin} does not exist")
        backend_dir = env_vars.TRITON_BACKEND_DIR.get()
        if backend_dir:
            return TritonInstall(binary, Path(backend_dir))
        return _pytriton_layout(binary) if (binary.parent.parent / "backends").exists() else TritonInstall(binary, None)
    on_path = shutil.which("tritonserver", path=env_vars.PATH.get() or None)
    if on_path:
        return TritonInstall(Path(on_path), None)
    # The nvidia-pytriton wheel (installed with --no-deps, only for its bundled server): located,
    # not imported, since its own Python API needs packages this project does not install.
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise LaunchError("no tritonserver found: set TRITONSERVER_BIN, put tritonserver on PATH (NGC image), "
                          "or `pip install --no-deps nvidia-pytriton==0.7.0`")
    pkg = Path(spec.submodule_search_locations[0])
    return _pytriton_layout(pkg / "tritonserver" / "bin" / "tritonserver")


def _pytriton_layout(binary: Path) -> TritonInstall:
    """The nvidia-pytriton wheel's layout: bin/, backends/python/, python_backend_stubs/X.Y/."""
    root = binary.parent.parent
    backend_dir = root / "backends"
    python_dir = backend_dir / "python"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / version / "triton_python_backend_stub"
    libs = root.parent.parent / "nvidia_pytriton.libs"
    target = python_dir / "triton_python_backend_stub"
    if stub.exists() and (not target.exists() or target.stat().st_size != stub.stat().st_size):
        try:
            shutil.copy2(stub, target)
        except OSError:
            # read-only install: use a private copy of the backend dir; the stub then finds its
            # bundled libraries through LD_LIBRARY_PATH instead of its relative rpath
            private = Path(env_vars.XDG_CACHE_HOME.get() or Path.home() / ".cache") / "rose" / "backends"
            shutil.copytree(backend_dir, private, dirs_exist_ok=True)
            shutil.copy2(stub, private / "python" / "triton_python_backend_stub")
            return TritonInstall(binary, private, [str(libs)])
    elif not target.exists():
        raise LaunchError(f"the Triton Python backend has no stub for Python {version} ({stub} is missing)")
    return TritonInstall(binary, backend_dir, [str(libs)] if libs.exists() else [])


def server_env(model_dir: str | None, install: TritonInstall, base: dict | None = None) -> dict:
    env = dict(os.environ if base is None else base)
    # The stub embeds libpython: load this interpreter's own, not another build of the same version.
    ld = [sysconfig.get_config_var("LIBDIR") or ""] + install.extra_ld_paths
    ld.append(env_vars.LD_LIBRARY_PATH.get(env))
    env[env_vars.LD_LIBRARY_PATH.name] = ":".join(p for p in ld if p)
    # The stub runs the models with this Python: make the project and this environment importable.
    # ROSE_STUB_SITE, if set, comes first (see stub_site()).
    paths = [p for p in [stub_site(env)] if p] + [str(REPO_ROOT), str(REPO_ROOT / "ensemble"), str(REPO_ROOT / "client")]
    paths += [p for p in sys.path if p and ("site-packages" in p or p.endswith("dist-packages"))]
    if env_vars.PYTHONPATH.get(env):
        paths.append(env_vars.PYTHONPATH.get(env))
    env[env_vars.PYTHONPATH.name] = ":".join(dict.fromkeys(paths))
    env[env_vars.ROSE_PYTHONPATH.name] = env["PYTHONPATH"]   # the stub ignores PYTHONPATH; model.py reads this
    if model_dir:
        env[env_vars.ROSE_MODEL_DIR.name] = str(Path(model_dir).expanduser().resolve())
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "true")
    return env


def stub_site(env: dict | None = None) -> str | None:
    """$ROSE_STUB_SITE: a folder of packages the backend stub imports before anything else.

    Where the interpreter has numpy 2 it holds numpy<2 (`pip install --target DIR numpy==1.26.4`): Triton
    2.51's Python backend (pybind11 2.10) misreads numpy 2 arrays (python_backend#384). The stub
    imports numpy from its own sys.path, whose first entry is the working directory, so the server
    is started in this folder."""
    path = env_vars.ROSE_STUB_SITE.get(env).strip()
    if path and not Path(path, "numpy").is_dir():
        raise LaunchError(f"ROSE_STUB_SITE={path} holds no numpy package")
    return path or None
