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
