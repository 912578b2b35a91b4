"""What the documentation tells a user to type works.

In README.md, the pages under docs/ and the other READMEs:
- every literal example key (API_KEY=..., ADMIN_KEY=..., api_key="...") is one the launcher accepts;
- every relative link names a file or folder of the repository, and an anchor a heading of that page.
In README.md and the user's pages (RUN_DOCS):
- every command in a code block (and every `make ...` / `python -m ...` in inline code) names what
  exists: make targets and variables of the Makefile, scripts and repository paths, `python -m`
  modules with the options they take, rose_bench subcommands;
- every Python block compiles; the blocks that call a server run against real ones (the session's
  server and a gateway in front of it, the BGE-M3 deployment for sparse / ColBERT calls, a reranker
  deployment for rerank calls), each `print(...)  # expected` line printing what its comment says,
  and every curl call to the gateway answers 200.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from rose_client.auth import check_key

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
        *sorted(p for p in ROOT.glob("*/README.md") if not p.parent.name.startswith("."))]
RUN_DOCS = [ROOT / "README.md", *(ROOT / "docs" / name for name in
                                  ("API.md", "DEPLOY.md", "PERFORMANCE.md", "TEI.md", "MODELS.md"))]
# Pages that links may name before they are in this tree (written on another branch).
GRPC, GATEWAY = "127.0.0.1:8001", "http://127.0.0.1:8080"


def _rel(doc: Path) -> str:
    return doc.relative_to(ROOT).as_posix()


# ------------------------------------------------------------------------------------ example keys
# a literal value: not a placeholder (...), a shell expansion ($...) or a path
EXAMPLE = re.compile(r"""\b(API_KEY|ADMIN_KEY)=([^\s`'"$.<]\S*)""")


def examples() -> list[tuple[str, str, str]]:
    found = []
    for doc in DOCS:
        for name, value in EXAMPLE.findall(doc.read_text()):
            if name == "API_KEY" and value.startswith(("FILE", "_FILE")):
                continue
            found.append((_rel(doc), name, value.rstrip(",;)")))
    return found


def test_the_docs_show_at_least_one_example_key():
    assert any(doc.startswith(("README.md", "docs/")) for doc, _, _ in examples()), examples()


@pytest.mark.parametrize("doc,name,value", examples())
def test_every_example_key_is_accepted(doc, name, value):
    assert check_key(value, name) == value, f"{doc}: {name}={value} is refused by the launcher"


# ------------------------------------------------------------------------------------------- links
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def _prose(text: str) -> str:
    """The page without its fenced code blocks."""
    return FENCE.sub("", text)


def slug(heading: str) -> str:
    """A heading's anchor as GitHub writes it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def links() -> list[tuple[str, str]]:
    return [(_rel(doc), target) for doc in DOCS for target in LINK.findall(_prose(doc.read_text()))
            if not target.startswith(("http://", "https://", "mailto:"))]


@pytest.mark.parametrize("doc,target", links())
def test_every_link_names_what_is_there(doc, target):
    path, _, anchor = target.partition("#")
    where = (ROOT / doc).parent / path if path else ROOT / doc
    assert where.exists(), f"{doc}: the link {target} names {where.relative_to(ROOT)}, which is not there"
    if anchor and where.suffix == ".md":
        headings = {slug(h) for h in re.findall(r"^#+ (.*)$", _prose(where.read_text()), re.M)}
        assert anchor in headings, f"{doc}: {target}: no heading of {path or doc} has the anchor #{anchor}"


# ---------------------------------------------------------------------------------------- commands
SHELLS = {"", "bash", "sh", "shell", "console"}
COMMANDS = {"make", "python", "python3", ".venv/bin/python", "bash", "source", "curl", "docker", "kubectl",
            "pip", "export", "hf", "perf_analyzer", ".venv/bin/rose-embed", "rose-embed"}
REPO_DIRS = ("benchmarks", "docker", "deploy", "docs", "tests", "client", "gateway", "ensemble", "rose_backend",
             "model_repository", "rose_testing")
REPO_PATH = re.compile(rf"^(?:\./)?(?:{'|'.join(REPO_DIRS)})(?:/[\w.\-/]*)?$")
ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def _indented_blocks(text: str) -> list[str]:
    """Markdown's indented code blocks (four spaces after a blank line), outside fenced blocks."""
    blocks, current, previous = [], [], ""
    for line in FENCE.sub("", text).split("\n"):
        if line.startswith("    ") and (current or not previous.strip()):
            current.append(line[4:])
        elif current and not line.strip():
            current.append("")
        else:
            if current:
                blocks.append("\n".join(current).strip("\n"))
            current = []
        previous = line
    if current:
        blocks.append("\n".join(current).strip("\n"))
    return blocks


def _command_lines(block: str) -> list[str]:
    return [line.strip() for line in block.replace("\\\n", " ").split("\n") if line.strip()]


def commands(doc: Path) -> list[str]:
    """The shell commands a page shows: lines of its shell and indented blocks whose first word (after
    VAR=value assignments) is a command, and inline `make ...` / `python -m ...` spans of its prose."""
    text = doc.read_text()
    lines = [line for lang, body in FENCE.findall(text) if lang in SHELLS for line in _command_lines(body)]
    lines += [line for block in _indented_blocks(text) for line in _command_lines(block)]
    lines += [span for span in re.findall(r"`([^`\n]+)`", _prose(text))
              if re.match(r"(make|python3? -m|bash) \S", span)]
    found = []
    for line in lines:
        words = [w for w in line.split() if not ASSIGN.match(w)]
        if words and (words[0] in COMMANDS or words[0].endswith(".sh")):
            found.append(line)
    return list(dict.fromkeys(found))


def _segments(line: str) -> list[list[str]]:
    """The simple commands of a line (split at &&, ;, | and &), each without its VAR=value prefix."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:                  # an unbalanced quote: a placeholder, not a command
        return []
    out, cur = [], []
    for w in words + [";"]:
        if w in ("&&", ";", "|", "&", "||"):
            while cur and ASSIGN.match(cur[0]):
                cur.pop(0)
            if cur:
                out.append(cur)
            cur = []
        else:
            cur.append(w)
    return out


@functools.lru_cache
def _makefile() -> tuple[set[str], set[str]]:
    text = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][\w-]*):", text, re.M))
    variables = set(re.findall(r"\$\((\w+)\)", text)) | set(re.findall(r"^(\w+) \?=", text, re.M))
    return targets, variables


@functools.lru_cache
def _help(module: str, sub: str | None = None) -> str:
    """What `python -m module [sub] --help` prints."""
    if module == "rose_bench":
        from rose_bench.__main__ import SUBCOMMANDS
        bench = importlib.import_module(f"rose_bench.{SUBCOMMANDS[sub]}")
        source = Path(bench.__file__).read_text()
        if "ArgumentParser" not in source:          # a command that reads its arguments itself
            return source
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
            bench.main(["--help"])
        return out.getvalue()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(ROOT / p) for p in ("", "ensemble", "client", "gateway",
                                                                             "benchmarks")))
    p = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120,
                       env=env, cwd=ROOT)
    assert p.returncode == 0, (module, p.stdout[-1000:], p.stderr[-2000:])
    return p.stdout


def _check_python_m(words: list[str], where: str) -> None:
    module, args = words[words.index("-m") + 1], words[words.index("-m") + 2:]
    assert importlib.util.find_spec(module) is not None, f"{where}: no module {module}"
    sub = None
    if module == "rose_bench":
        from rose_bench.__main__ import SUBCOMMANDS
        if not args or args[0].startswith("-"):
            return
        sub, args = args[0], args[1:]
        assert sub in SUBCOMMANDS, f"{where}: rose_bench has no subcommand {sub!r}"
    options = [a.split("=")[0] for a in args if a.startswith("--")]
    if options:
        text = _help(module, sub)
        for option in options:
            assert re.search(rf"{re.escape(option)}\b", text), f"{where}: {module} {sub or ''} takes no {option}"


def _check_paths(words: list[str], where: str) -> None:
    for w in words:
        w = re.sub(r"\[[\w,]*\]$", "", w.split("=")[-1])
        if REPO_PATH.match(w) and not any(c in w for c in "$<*{"):
            assert (ROOT / w).exists(), f"{where}: {w} is not in the repository"


def all_commands() -> list[tuple[str, str]]:
    return [(_rel(doc), line) for doc in RUN_DOCS for line in commands(doc)]


def test_the_pages_show_commands():
    docs = {doc for doc, _ in all_commands()}
    assert {"README.md", "docs/API.md", "docs/DEPLOY.md", "docs/PERFORMANCE.md"} <= docs, docs


@pytest.mark.parametrize("doc,line", all_commands())
def test_every_command_names_what_exists(doc, line):
    where = f"{doc}: {line}"
    targets, variables = _makefile()
    for words in _segments(line):
        name = words[0]
        if name == "make":
            for w in words[1:]:
                if "=" in w:
                    assert w.split("=")[0] in variables, f"{where}: the Makefile has no variable {w.split('=')[0]}"
                elif not w.startswith("-"):
                    assert w in targets, f"{where}: the Makefile has no target {w}"
        elif name in ("python", "python3", ".venv/bin/python") and "-m" in words:
            _check_python_m(words, where)
        elif name in ("bash", "source") or name.endswith(".sh"):
            script = words[1] if name in ("bash", "source") else name
            if "$" not in script:
                assert (ROOT / script).is_file(), f"{where}: no script {script}"
        _check_paths(words, where)


# --------------------------------------------------------------------------- Python blocks, compiled
def python_blocks() -> list[tuple[str, int, str]]:
    return [(_rel(doc), i, body) for doc in RUN_DOCS
            for i, body in enumerate(b for lang, b in FENCE.findall(doc.read_text()) if lang == "python")]


@pytest.mark.parametrize("doc,index,code", python_blocks(), ids=lambda v: v if isinstance(v, (str, int)) else "")
def test_every_python_block_compiles(doc, index, code):
    compile(code, f"{doc} (python block {index})", "exec")


# ------------------------------------------------------------------- against real servers
def _needs(code: str) -> str:
    """Which deployment a block calls: rerank, m3 (sparse / ColBERT outputs) or default."""
    if ".rerank(" in code or "/rerank" in code:
        return "rerank"
    if re.search(r"\b(sparse|colbert)=True", code):
        return "m3"
    return "default"


def server_blocks() -> list[tuple[str, int, str]]:
    return [b for b in python_blocks() if GRPC in b[2] or GATEWAY in b[2]]


def curl_calls() -> list[tuple[str, str]]:
    return [(doc, line) for doc, line in all_commands() if line.startswith("curl ") and GATEWAY.split("//")[1] in line]


@pytest.fixture(scope="module")
def deployment():
    """deployment(request, need, http) -> (gRPC url, gateway url or None): the session's server for
    `need` (default, m3 or rerank), started on first use, and with http a gateway in front of it."""
    from support.gateway import gateway_for
    gateways, stack = {}, contextlib.ExitStack()

    def get(request, need: str, http: bool):
        folder = None
        if need == "default":
            srv = request.getfixturevalue("server")
        elif need == "m3":
            folder, _, srv = request.getfixturevalue("m3_deployment")
        else:
            folder, srv = request.getfixturevalue("reranker_server")("tiny-bert-ce")
        if http and need not in gateways:
            extra = ["--model", str(folder)] if folder else None
            gateways[need] = stack.enter_context(gateway_for(srv.grpc_url, f"docs-{need}", extra_args=extra)).url
        return srv.grpc_url, gateways.get(need)
    with stack:
        yield get


@pytest.mark.server
@pytest.mark.parametrize("doc,index,code", server_blocks(), ids=lambda v: v if isinstance(v, (str, int)) else "")
def test_every_python_block_that_calls_a_server_runs(deployment, request, capsys, monkeypatch, doc, index, code):
    grpc_url, gateway_url = deployment(request, _needs(code), GATEWAY in code)
    if "huggingface_hub" in code:       # the suite's HF_HUB_OFFLINE=1 refuses this local URL too: lifted here
        from huggingface_hub import constants
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    expected = [m.group(1).strip() for m in re.finditer(r"^print\(.*\)\s+#\s*(.*)$", code, re.M)]
    run = code.replace(GRPC, grpc_url).replace(GATEWAY, gateway_url or GATEWAY)
    exec(compile(run, f"{doc} (python block {index})", "exec"), {"__name__": "__docs__"})
    printed = capsys.readouterr().out.strip().split("\n") if expected else []
    assert printed == expected, f"{doc} (python block {index}) printed {printed}, its comments say {expected}"


@pytest.mark.server
@pytest.mark.parametrize("doc,line", curl_calls())
def test_every_curl_call_to_the_gateway_answers(deployment, request, doc, line):
    _, gateway_url = deployment(request, _needs(line), True)
    command = line.replace(GATEWAY, gateway_url).replace(GATEWAY.split("//")[1], gateway_url.split("//")[1])
    p = subprocess.run(command + " -o /dev/stderr -w '%{http_code}'", shell=True, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0 and p.stdout == "200", (line, p.stdout, p.stderr[-1000:])
