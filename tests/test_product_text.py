"""The product's text says what is: the README, docs/ and the shipped code (rose_backend, the
gateway, the client, the tokenize stage, the model repository) hold no phrase that tells history.
What changed and when is the git log's; a measurement's command, commit and date stay in its one
provenance line on a results page (benchmarks/RESULTS-*.md)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PLACES = ["README.md", "docs", "rose_backend", "gateway", "client", "ensemble", "model_repository"]
SUFFIXES = {".md", ".py", ".pbtxt"}
HISTORY = re.compile(r"\bused to\b|\bpreviously\b|since commit|\bbefore this\b|until now"
                     r"|\bthe seed\b|\bseed's|as it was before|sandbox agent|issue #\d", re.IGNORECASE)


def _texts():
    for place in PLACES:
        path = ROOT / place
        for f in [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES):
            yield f, f.read_text(errors="replace")


def test_no_history_phrases_in_the_product_text():
    found = [f"{f.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}"
             for f, text in _texts() for m in HISTORY.finditer(text)]
    assert not found, found


# The shipped code's text (comments, docstrings, string literals, config.pbtxt comments, the client's
# README) says what the code does, not what a run measured: no GPU model, no path to a results page
# or a result file, no timing, rate, speed-up or percentage. A number that is a fact of the product
# (a default, a protocol constant) is written from the constant that holds it, or allowed here by name.
CODE_PLACES = ["rose_backend", "gateway", "client", "ensemble", "model_repository"]
MEASURED = re.compile(
    r"\b(?:H100|H200|GH200|A100|B200|L40S?)\b"                      # a GPU a run was on
    r"|benchmarks/|RESULTS-|--modelled-device"                       # a results page, file or bench-only option
    r"|\d(?:[\d,.]*\d)? ?(?:ms|us|µs|ns)\b"                          # a duration
    r"|\d(?:[\d,.]*\d)? ?(?:[KMGT]i?B|emb|req|seq|tokens)/s\b"         # a rate
    r"|\d(?:\.\d+)?(?:-\d(?:\.\d+)?)?x (?:faster|slower)\b|\btimes (?:faster|slower)\b"   # a speed-up
    r"|(?<![\w.])\d+(?:\.\d+)?%")                                    # a share of a run
# (file, text) pairs whose number is a fact of the product: keep this short
ALLOWED: set[tuple[str, str]] = set()


def _code_texts(path: Path):
    """(line, text) of each comment and string literal of a .py file, each comment of a .pbtxt, each
    line of a .md."""
    import io
    import tokenize
    text = path.read_text(errors="replace")
    if path.suffix == ".py":
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type in (tokenize.COMMENT, tokenize.STRING):
                yield tok.start[0], tok.string
    elif path.suffix == ".pbtxt":
        for i, line in enumerate(text.splitlines(), 1):
            if "#" in line:
                yield i, line[line.index("#"):]
    else:
        yield from enumerate(text.splitlines(), 1)


def _measured(path: Path) -> list[tuple[int, str]]:
    return [(line + text.count("\n", 0, m.start()), m.group(0))
            for line, text in _code_texts(path) for m in MEASURED.finditer(text)]


def test_no_measurements_in_the_code_text():
    files = [f for place in CODE_PLACES for f in sorted((ROOT / place).rglob("*"))
             if f.suffix in SUFFIXES and ".venv" not in f.parts]
    found = [(str(f.relative_to(ROOT)), line, hit) for f in files for line, hit in _measured(f)]
    bad = [f"{f}:{line}: {hit!r}" for f, line, hit in found if (f, hit) not in ALLOWED]
    assert not bad, "measured numbers, GPU names or benchmarks/ paths in product text (they belong on " \
                    f"benchmarks/RESULTS-*.md): {bad}"
    stale = ALLOWED - {(f, hit) for f, _, hit in found}
    assert not stale, f"allowed entries no longer found: {sorted(stale)}"


def test_the_measurement_check_finds_what_it_is_for(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text('"""On the H200 the kernel took 5.1 us (benchmarks/RESULTS-engine.md), 1.3-1.8x faster,\n'
                      '94.6% of its rate, 800 MB/s."""\n'
                      'x = f"{y}: 100 ms"   # about 20 times faster than json.dumps\n'
                      'ok = f"within drain_timeout_s + 5 s; {HOLD_S * 1e3:g} ms; {share:.1%}"  # bulk_batch_ms\n')
    assert [hit for _, hit in _measured(sample)] == [
        "H200", "5.1 us", "benchmarks/", "RESULTS-", "1.3-1.8x faster", "94.6%", "800 MB/s", "100 ms",
        "times faster"]
