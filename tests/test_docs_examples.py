"""What the documentation tells a user to type works: every literal example key (API_KEY=...,
ADMIN_KEY=..., api_key="...") in the README files and docs/ is one the launcher accepts."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from rose_client.auth import check_key

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
        *sorted(p for p in ROOT.glob("*/README.md") if not p.parent.name.startswith("."))]
# a literal value: not a placeholder (...), a shell expansion ($...) or a path
EXAMPLE = re.compile(r"""\b(API_KEY|ADMIN_KEY)=([^\s`'"$.<]\S*)""")


def examples() -> list[tuple[str, str, str]]:
    found = []
    for doc in DOCS:
        for name, value in EXAMPLE.findall(doc.read_text()):
            if name == "API_KEY" and value.startswith(("FILE", "_FILE")):
                continue
            found.append((doc.relative_to(ROOT).as_posix(), name, value.rstrip(",;)")))
    return found


def test_the_docs_show_at_least_one_example_key():
    assert any(doc == "README.md" for doc, _, _ in examples()), examples()


@pytest.mark.parametrize("doc,name,value", examples())
def test_every_example_key_is_accepted(doc, name, value):
    assert check_key(value, name) == value, f"{doc}: {name}={value} is refused by the launcher"
