"""The import picture of docs/DESIGN.md ("Layers of the code"), read from the source with ast (every
import, module level or inside a function), over every package: the client imports nothing of the
server side; every module imports only its own layer and those below it (rose_backend's serving core
-> engine -> models -> layers -> config / loading, the Triton glue above the core, the launch room's
process control above the served models, the gateway and the benchmarks on top); of the client the
server side imports only its key rules and its environment variables' type; the gateway takes of
rose_backend only what it shares with the server (process helpers, model folder, tokenize settings,
stage clock, environment variables), nothing of process control; only the Triton glue knows Triton's Python backend; the
shipped packages import none of the fixtures (rose_testing), which the distribution leaves out; no
import cycles; no module over 350 lines outside tests/."""
from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"rose_client": ROOT / "client" / "rose_client", "rose_backend": ROOT / "rose_backend",
            "rose_ensemble": ROOT / "ensemble" / "rose_ensemble", "rose_gateway": ROOT / "gateway" / "rose_gateway",
            "rose_bench": ROOT / "benchmarks" / "rose_bench", "rose_testing": ROOT / "rose_testing"}
# Every module's layer, bottom up (the first prefix that holds it); a module may import its own layer
# and those below it.
RANKS = [("rose_client", 0),                  # the client: gRPC streaming, balancing, the key rules
         ("rose_backend.config", 1), ("rose_backend.loading", 1), ("rose_backend.model_kind", 1),
         ("rose_backend.st_folder", 1),       # the sentence-transformers chain a folder declares (config reads it)
         ("rose_backend.model_families", 1),  # which model_type / architectures a native file serves (torch-free)
         ("rose_backend.model_folder", 1),    # where the folder is and whether it can be served
         ("rose_backend.processes", 1),       # port check, parent death, owned folders: launcher and gateway
         ("rose_backend.env_vars", 1),        # every environment variable the product reads (docs/ENVIRONMENT.md)
         ("rose_backend.layers", 2), ("rose_backend.models", 3), ("rose_backend.engine", 4),
         ("rose_backend.serving", 5),         # the serving core: pool, scheduler, completion (no Triton)
         ("rose_backend.triton", 6),          # the Triton glue: the rose model, settings, stub helpers
         ("rose_ensemble", 7),                # the tokenize stage (its Triton models stand on the glue)
         ("rose_backend.launch", 8),          # process control: tritonserver and the gateway as children
         ("rose_testing", 9),                 # the tests' and benchmarks' fixtures (not shipped)
         ("rose_gateway", 10),                # the HTTP gateway: the client, the tokenize code, GATEWAY_TAKES
         ("rose_bench", 11),
         ("rose_backend", 1)]                 # the package's own __init__ (its version)
SERVER_SIDE = ("rose_backend", "rose_ensemble", "rose_gateway", "rose_bench", "rose_testing", "torch", "transformers",
               "safetensors", "triton_python_backend_utils", "sentence_transformers")
# What the product distribution ships (pyproject.toml): none of it imports the fixtures (rose_testing).
SHIPPED = ("rose_client", "rose_backend", "rose_ensemble", "rose_gateway")
MAX_LINES = 350
# The modules of rose_client the server side (rose_backend, rose_ensemble) may import, each defined once
# for the client, the gateway and the server: the key headers and the keys' allowed form
# (rose_client/auth.py), the lane names and the int32 bound (rose_client/contract.py), the environment
# variables' type (rose_client/env_vars.py); none imports anything of the client, and rose_client's
# __init__ imports lazily (test_shared_facts.py checks what they load).
SHARED_WITH_THE_CLIENT = {"rose_client.auth", "rose_client.contract", "rose_client.env_vars"}
# What the gateway takes of rose_backend: what it shares with the server, each in its one home. The
# launcher starts the gateway by its command line, and the gateway imports nothing of process control.
GATEWAY_TAKES = {"rose_backend.processes", "rose_backend.config", "rose_backend.serving.stage_clock",
                 "rose_backend.env_vars"}


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


def _layer(name: str) -> str:
    return next(prefix for prefix, _ in RANKS if _within(name, prefix))


def _rank(name: str) -> int:
    return dict(RANKS)[_layer(name)]


def _ours(name: str) -> bool:
    return any(_within(name, pkg) for pkg in PACKAGES)


def test_the_picture_covers_every_package():
    assert all(any(_within(m, pkg) for m in MODULES) for pkg in PACKAGES), sorted(MODULES)
    assert {"rose_backend.triton.rose_model", "rose_backend.launch.serve", "rose_client.client",
            "rose_gateway.app", "rose_ensemble.triton_tokenize", "rose_bench.e2e"} <= set(MODULES)
    unranked = sorted(m for m in MODULES if _layer(m) == "rose_backend" and m != "rose_backend")
    assert not unranked, f"give these a layer in RANKS: {unranked}"


def test_client_imports_nothing_of_the_server_side():
    bad = {m: sorted(i for i in imps if any(_within(i, s) for s in SERVER_SIDE))
           for m, imps in IMPORTS.items() if _within(m, "rose_client")}
    assert not any(bad.values()), {m: v for m, v in bad.items() if v}


def test_every_import_points_down():
    upward = [f"{m} (layer {_rank(m)}) -> {i} (layer {_rank(i)})"
              for m, imps in IMPORTS.items() for i in imps
              if _ours(i) and i != "rose_backend" and _rank(i) > _rank(m)]
    assert not upward, upward


def test_the_server_side_takes_only_the_key_rules_of_the_client():
    taken = sorted(f"{m} -> {i}" for m, imps in IMPORTS.items() if _within(m, "rose_backend") or _within(m, "rose_ensemble")
                   for i in imps if _within(i, "rose_client") and i not in SHARED_WITH_THE_CLIENT)
    assert not taken, taken


def test_the_gateway_takes_of_rose_backend_only_what_it_shares():
    taken = {f"{m} -> {i}" for m, imps in IMPORTS.items() if _within(m, "rose_gateway")
             for i in imps if _within(i, "rose_backend") and i != "rose_backend"}
    assert not [t for t in taken if "rose_backend.launch" in t], sorted(taken)
    assert not [t for t in taken if t.split(" -> ")[1] not in GATEWAY_TAKES], sorted(taken)


def test_the_shipped_packages_import_no_fixtures():
    taken = sorted(f"{m} -> {i}" for m, imps in IMPORTS.items() if any(_within(m, p) for p in SHIPPED)
                   for i in imps if _within(i, "rose_testing"))
    assert not taken, taken
    shipped = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert not [p for p in shipped if _within(p, "rose_testing")], shipped


def test_only_the_triton_glue_knows_triton():
    knows = sorted(m for m, imps in IMPORTS.items() if "triton_python_backend_utils" in imps)
    assert knows and all(_within(m, "rose_backend.triton") or m in ("rose_ensemble.triton_tokenize",
                                                                   "rose_ensemble.triton_encode") for m in knows), knows


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


@pytest.mark.parametrize("folder", ["rose_backend", "ensemble", "client", "gateway", "benchmarks", "model_repository",
                                    "rose_testing"])
def test_no_module_over_350_lines(folder):
    long = {str(f.relative_to(ROOT)): n for f in sorted((ROOT / folder).rglob("*.py"))
            if (n := len(f.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these (one job per module, at most {MAX_LINES} lines): {long}"
