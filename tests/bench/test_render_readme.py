"""`rose_bench render-readme` writes README.md's results tables and docs/PERFORMANCE.md's from the
committed e2e JSON and published.py: the pages hold what the command writes now, and README's cells
are the charts' numbers (rose_bench.headline) beside the peers', with no goal column."""
import json
import re
from pathlib import Path

import pytest

from rose_bench import headline, published
from rose_bench import render_readme as render

ROOT = Path(__file__).resolve().parents[2]
E2E = ROOT / "benchmarks" / "results" / "e2e"


def _between_markers(page: Path) -> str:
    body = page.read_text()
    return body.split(render.BEGIN, 1)[1].split(render.END, 1)[0].lstrip("\n")


def test_the_pages_hold_what_the_command_writes_from_the_committed_json():
    results = render.load(E2E)
    assert [r["model"] for r in results] == ["bge-m3", "pplx-embed"]
    assert _between_markers(ROOT / "README.md") == render.readme_section(results)
    assert _between_markers(ROOT / "docs" / "PERFORMANCE.md") == render.performance_section(results, E2E)


def _rows(section: str, title: str) -> dict[str, list[str]]:
    table = section.split(f"### {title}\n", 1)[1].strip().split("\n\n", 1)[0]
    lines = table.strip().split("\n")
    return {cells[0]: cells[1:] for cells in ([c.strip() for c in line.strip("|").split("|")] for line in lines[2:])}


@pytest.mark.parametrize("model", ["bge-m3", "pplx-embed"])
def test_readme_cells_are_the_charts_numbers_beside_the_peers(model):
    result = json.loads((E2E / f"{model}-h200.json").read_text())
    section = render.readme_section(render.load(E2E))
    assert "goal" not in section.lower()
    head = section.split("\n\n", 2)[1]
    assert "NVIDIA H200" in head and "`cfd9d8a`" in head and "2026-12-04" in head and "docs/PERFORMANCE.md" in head
    rows = _rows(section, published.MODEL_TITLES[model])
    pub, st = published.PUBLISHED[model], published.SENTENCE_TRANSFORMERS[model]
    for cell in headline.headline_cells(result):
        label = {"online": f"online 1 x {cell.x}", "scoring": f"scoring {cell.x} x 512",
                 "throughput": f"bulk 4 x 100 x {cell.x}"}[cell.workload]
        rose, tulip, vllm, sentence_transformers = rows.pop(label)
        row = pub[cell.workload][cell.x]
        if cell.workload == "throughput":
            assert [float(v) for v in (rose, tulip, vllm)] == [round(cell.rose), round(row["tulip"]), round(row["vllm"])]
            assert float(sentence_transformers) == round(st["throughput"][cell.x])
        else:
            assert float(rose.split()[0]) == pytest.approx(cell.rose, abs=0.005)
            assert float(tulip.split()[0]) == row["tulip"][0] and float(vllm.split()[0]) == row["vllm"][0]
            want = st.get(cell.workload, {}).get(cell.x)
            assert sentence_transformers == ("-" if want is None else f"{want:g}")
    # every chart cell was a row; what is left are the cells whose peers published a concurrency number
    for x in sorted(pub["concurrency"]):
        rose, tulip, vllm, sentence_transformers = rows.pop(f"concurrency {x}, 512-token texts")
        mine = result["systems"]["rose"]["workloads"]["concurrency"][str(x)]
        assert rose == f"{mine['p50_ms']:.2f} ({mine['p99_ms']:.2f})"
        assert re.fullmatch(r"~[\d.]+ \(~[\d.]+\)", tulip) and float(tulip[1:].split()[0]) == pub["concurrency"][x]["tulip"][0]
        assert sentence_transformers == "-"
    assert not rows, rows
