"""The environment variables the product reads are one documented table: what the code reads
(through rose_backend/env_vars.py and rose_client/env_vars.py, or, before those can be imported, in
each model.py and triton/stub_path.py) is exactly what docs/ENVIRONMENT.md lists, with the
defaults the code uses."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from rose_backend import env_vars

ROOT = Path(__file__).resolve().parent.parent
PLACES = ["rose_backend", "ensemble", "gateway", "client/rose_client", "model_repository"]
TABLES = {ROOT / "rose_backend/env_vars.py", ROOT / "client/rose_client/env_vars.py"}
# read before rose_backend can be imported: the model.py files and what they call first
BOOTSTRAP = {*ROOT.glob("model_repository/*/1/model.py"), ROOT / "rose_backend/triton/stub_path.py"}
NOT_VARIABLES = {"VARIABLES", "TRUE", "CLIENT_VARIABLES"}


def _sources():
    for place in PLACES:
        yield from sorted((ROOT / place).rglob("*.py"))


def _table_names(tree: ast.AST) -> set[str]:
    """The env_vars names a module uses: env_vars.NAME, and NAME imported from an env_vars module."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "env_vars":
            names.add(node.attr)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").endswith("env_vars"):
            names |= {a.name for a in node.names}
    return {n for n in names if n.isupper() and n not in NOT_VARIABLES}


def _is_environ(node) -> bool:
    """os.environ, or (os.environ if ... else ...)."""
    if isinstance(node, ast.IfExp):
        return _is_environ(node.body) or _is_environ(node.orelse)
    return (isinstance(node, ast.Attribute) and node.attr == "environ" and isinstance(node.value, ast.Name)
            and node.value.id == "os")


def raw_reads(tree: ast.AST) -> list[tuple[int, str | None]]:
    """(line, name or None where it is neither a literal nor a module constant) of each
    os.environ.get(...), os.getenv(...) and os.environ[...] read; copying os.environ for a child and
    writing into it are not reads."""
    constants = {t.id: n.value.value for n in getattr(tree, "body", []) if isinstance(n, ast.Assign)
                 and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                 for t in n.targets if isinstance(t, ast.Name)}
    found = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            f = node.func
            if (f.attr == "get" and _is_environ(f.value)) or (
                    f.attr == "getenv" and isinstance(f.value, ast.Name) and f.value.id == "os"):
                key = node.args[0]
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _is_environ(node.value):
            key = node.slice
        if key is not None:
            name = key.value if isinstance(key, ast.Constant) else constants.get(getattr(key, "id", None))
            found.append((node.lineno, name))
    return found


def read_by_the_code() -> tuple[set[str], list[str]]:
    """(the variables the product reads, the raw reads found outside the table modules and the bootstrap)."""
    names, stray = set(), []
    for f in _sources():
        if f in TABLES:
            continue
        tree = ast.parse(f.read_text())
        names |= _table_names(tree)
        for line, name in raw_reads(tree):
            if f in BOOTSTRAP and name:
                names.add(name)
            else:
                stray.append(f"{f.relative_to(ROOT)}:{line}: {name}")
    return names, stray


def documented() -> dict[str, str]:
    """{variable: its default cell} of the table in docs/ENVIRONMENT.md."""
    rows = re.findall(r"^\| `([A-Z_][A-Z0-9_]*)` \| ([^|]*) \|", (ROOT / "docs/ENVIRONMENT.md").read_text(), re.M)
    assert rows, "docs/ENVIRONMENT.md has no table of variables"
    assert len(rows) == len({name for name, _ in rows}), "a variable listed twice"
    return dict(rows)


def test_the_code_reads_the_environment_only_through_the_table_modules():
    _, stray = read_by_the_code()
    assert not stray, f"read os.environ through rose_backend/env_vars.py instead: {stray}"


def test_what_the_code_reads_is_the_documented_table():
    read, _ = read_by_the_code()
    table = {v.name for v in env_vars.VARIABLES}
    assert read - table == set(), f"names used that env_vars does not define: {sorted(read - table)}"
    assert table - read == set(), f"defined in env_vars but read nowhere: {sorted(table - read)}"
    docs = set(documented())
    assert read == docs, {"read, not documented": sorted(read - docs), "documented, not read": sorted(docs - read)}


def test_each_default_the_code_uses_is_the_documented_one():
    docs = documented()
    wrong = {v.name: (v.default, docs[v.name]) for v in env_vars.VARIABLES
             if v.default and f"`{v.default}`" not in docs[v.name]}
    assert not wrong, wrong


def test_the_scan_finds_each_kind_of_read():
    tree = ast.parse('x = os.environ.get("A")\ny = os.getenv("B")\nz = os.environ["C"]\nos.environ["D"] = "1"\n'
                     'env = dict(os.environ)\nw = (os.environ if env is None else env).get("E")\n'
                     'v = os.environ.get(NAME)\nshown = \'os.environ["F"]\'\nG = "G_VAR"\nu = os.environ.get(G)\n')
    assert sorted(raw_reads(tree)) == [(1, "A"), (2, "B"), (3, "C"), (6, "E"), (7, None), (10, "G_VAR")]
    assert _table_names(ast.parse("from rose_client.env_vars import API_KEY, TRUE\nenv_vars.ROSE_MODEL_DIR.get()\n"
                                  "env_vars.VARIABLES")) == {"API_KEY", "ROSE_MODEL_DIR"}
