"""The import picture of docs/DESIGN.md ("Layers of the code"), read from the source with ast (every
import, module level or inside a function): the client imports nothing of the server side; in
rose_backend each layer imports only the ones below it (serving -> engine -> models -> layers ->
config / loading); only the serving layer and the Triton shims know Triton's Python backend; no
import cycles; no module over 350 lines outside tests/."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"rose_backend": ROOT / "rose_backend", "rose_ensemble": ROOT / "ensemble" / "rose_ensemble",
            "rose_client": ROOT / "client" / "rose_client", "rose_bench": ROOT / "benchmarks" / "rose_bench"}
# rose_backend's layers, bottom up; a module may import its own layer and those below it.
RANKS = [("rose_backend.config", 0), ("rose_backend.loading", 0), ("rose_backend.layers", 1),
         ("rose_backend.models", 2), ("rose_backend.engine", 3), ("rose_backend.serving", 4),
         ("rose_backend.triton", 4.5), ("rose_backend.launch", 5), ("rose_backend.precompile", 5),
         ("rose_backend.testing", 5), ("rose_backend", 0)]
SERVER_SIDE = ("rose_backend", "rose_ensemble", "rose_bench", "torch", "transformers", "safetensors",
               "triton_python_backend_utils", "sentence_transformers")
MAX_LINES = 350
# The one module of rose_client the server side may import: the key headers and the keys' allowed form
# (rose_client/auth.py: no imports of its own), defined once for the client, the gateway and the launcher.
SHARED_WITH_THE_CLIENT = {"rose_client.auth"}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg, root in PACKAGES.items():
        for f in sorted(root.rglob("*.py")):
            parts = f.relative_to(root).with_suffix("").parts
            out[".".join((pkg, *parts[:-1])) if parts[-1] == "__init__" else ".".join((pkg, *parts))] = f
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Every module name `path` imports (absolute; relative imports resolved)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES)
    return found


IMPORTS = {m: _imports(m, p) for m, p in MODULES.items()}


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _rank(name: str) -> int:
    return next(r for prefix, r in RANKS if _within(name, prefix))


def test_the_picture_covers_every_package():
    assert all(any(_within(m, pkg) for m in MODULES) for pkg in PACKAGES), sorted(MODULES)
    assert "rose_backend.triton.rose_model" in MODULES and "rose_client.client" in MODULES


def test_client_imports_nothing_of_the_server_side():
    bad = {m: sorted(i for i in imps if any(_within(i, s) for s in SERVER_SIDE))
           for m, imps in IMPORTS.items() if _within(m, "rose_client")}
    assert not any(bad.values()), {m: v for m, v in bad.items() if v}


def test_rose_backend_layers_import_only_downwards():
    upward = []
    for m, imps in IMPORTS.items():
        if not _within(m, "rose_backend"):
            continue
        for i in imps:
            if i in SHARED_WITH_THE_CLIENT:
                continue
            if any(_within(i, p) for p in ("rose_ensemble", "rose_client", "rose_bench")):
                upward.append(f"{m} -> {i} (outside rose_backend)")
            elif _within(i, "rose_backend") and i != "rose_backend" and _rank(i) > _rank(m):
                upward.append(f"{m} (layer {_rank(m)}) -> {i} (layer {_rank(i)})")
    assert not upward, upward


def test_only_the_serving_layer_and_the_shims_know_triton():
    knows = sorted(m for m, imps in IMPORTS.items() if "triton_python_backend_utils" in imps)
    assert knows and all(_within(m, "rose_backend.triton") or m == "rose_ensemble.triton_tokenize"
                         for m in knows), knows


def test_no_import_cycles():
    graph = {m: {i for i in imps if i in MODULES and i != m} for m, imps in IMPORTS.items()}
    state: dict[str, int] = {}                       # 1: on the current path, 2: done
    cycles = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycles.append(path[path.index(n):] + [n] if n in path else [m, n])
            elif n not in state:
                visit(n, path + [n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, cycles


@pytest.mark.parametrize("folder", ["rose_backend", "ensemble", "client", "benchmarks", "model_repository"])
def test_no_module_over_350_lines(folder):
    long = {str(f.relative_to(ROOT)): n for f in sorted((ROOT / folder).rglob("*.py"))
            if (n := len(f.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these (one job per module, at most {MAX_LINES} lines): {long}"
