"""`rose_bench charts` draws the docs' pictures from what is committed: a results chart per model
shape (rose's cells from benchmarks/results/e2e, the peers' from rose_bench/published.py) and the
request path (the `embed` ensemble's steps from the model repository). The bars show the JSON's and
the published numbers, and the figure follows the repository it is drawn from."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rose_bench import headline, published, request_path

ROOT = Path(__file__).resolve().parents[2]
E2E = ROOT / "benchmarks" / "results" / "e2e"
PICTURES = ["request-path.png", "results-bge-m3.png", "results-pplx-embed.png"]


def _result(model: str) -> dict:
    return json.loads((E2E / f"{model}-h200.json").read_text())


def test_the_command_writes_every_picture_small(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "benchmarks")]))
    p = subprocess.run([sys.executable, "-m", "rose_bench", "charts", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=180, cwd=ROOT, env=env)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert sorted(f.name for f in tmp_path.iterdir()) == PICTURES
    for name in PICTURES:
        for f in (tmp_path / name, ROOT / "docs" / "images" / name):       # drawn now, and committed
            data = f.read_bytes()
            assert data[:8] == b"\x89PNG\r\n\x1a\n" and 10_000 < len(data) < 150_000, (f, len(data))


@pytest.mark.parametrize("model", ["bge-m3", "pplx-embed"])
def test_the_chart_data_are_the_committed_numbers(model):
    r = _result(model)
    rose = r["systems"]["rose"]
    cells = {c.label: c for c in headline.headline_cells(r)}
    assert list(cells) == [f"online 1 x {x}" for x in (128, 512, 4096)] + [f"scoring {x} x 512" for x in (5, 25, 50)] \
        + [f"bulk 4 x 100 x {x}" for x in (512, 1024, 4096)]
    pub, st = published.PUBLISHED[model], published.SENTENCE_TRANSFORMERS[model]
    for x in (128, 512, 4096):
        c = cells[f"online 1 x {x}"]
        assert c.rose == rose["perf_analyzer"]["online"][str(x)]["p50_ms"]
        assert c.peers == {"tulip": pub["online"][x]["tulip"][0], "vllm": pub["online"][x]["vllm"][0],
                           "sentence-transformers": st["online"][x]}
    for x in (5, 25, 50):
        c = cells[f"scoring {x} x 512"]
        assert c.rose == rose["workloads"]["scoring"][str(x)]["p50_ms"]
        assert c.peers["tulip"] == pub["scoring"][x]["tulip"][0] and c.peers["vllm"] == pub["scoring"][x]["vllm"][0]
        assert c.peers.get("sentence-transformers") == st.get("scoring", {}).get(x)
    for x in (512, 1024, 4096):
        c = cells[f"bulk 4 x 100 x {x}"]
        assert c.rose == rose["workloads"]["throughput"][str(x)]["emb_per_s"]
        assert c.peers == {"tulip": pub["throughput"][x]["tulip"], "vllm": pub["throughput"][x]["vllm"],
                           "sentence-transformers": st["throughput"][x]}


@pytest.mark.parametrize("model", ["bge-m3", "pplx-embed"])
def test_each_bar_is_the_peer_against_rose_from_those_numbers(tmp_path, model):
    """Read back from the drawn bars: peer ms / rose ms for latency, rose emb/s / peer emb/s for
    throughput, one bar per peer and cell that has both numbers."""
    r = _result(model)
    rose = r["systems"]["rose"]
    pub, st = published.PUBLISHED[model], published.SENTENCE_TRANSFORMERS[model]
    want = {}
    for x in (128, 512, 4096):
        mine = rose["perf_analyzer"]["online"][str(x)]["p50_ms"]
        want[(f"online 1 x {x}", "tulip")] = pub["online"][x]["tulip"][0] / mine
        want[(f"online 1 x {x}", "vllm")] = pub["online"][x]["vllm"][0] / mine
        want[(f"online 1 x {x}", "sentence-transformers")] = st["online"][x] / mine
    for x in (5, 25, 50):
        mine = rose["workloads"]["scoring"][str(x)]["p50_ms"]
        want[(f"scoring {x} x 512", "tulip")] = pub["scoring"][x]["tulip"][0] / mine
        want[(f"scoring {x} x 512", "vllm")] = pub["scoring"][x]["vllm"][0] / mine
        if x in st.get("scoring", {}):
            want[(f"scoring {x} x 512", "sentence-transformers")] = st["scoring"][x] / mine
    for x in (512, 1024, 4096):
        mine = rose["workloads"]["throughput"][str(x)]["emb_per_s"]
        for peer, theirs in (("tulip", pub["throughput"][x]["tulip"]), ("vllm", pub["throughput"][x]["vllm"]),
                             ("sentence-transformers", st["throughput"][x])):
            want[(f"bulk 4 x 100 x {x}", peer)] = mine / theirs
    plotted = headline.draw(r, tmp_path / "chart.png", name=f"{model}-h200.json")
    assert sorted(plotted) == sorted(want)
    assert all(plotted[k] == pytest.approx(v, rel=1e-9) for k, v in want.items()), (plotted, want)


def test_a_result_without_rose_cells_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no rose cell"):
        headline.draw({"model": "bge-m3", "systems": {"naive": {}}}, tmp_path / "x.png")


def test_the_request_path_follows_the_model_repository(tmp_path):
    steps = request_path.ensemble_steps()
    titles = request_path.draw(tmp_path / "path.png")
    assert steps[-1] == "rose" and all(s in titles for s in steps[:-1])
    assert titles.index("gRPC client") < titles.index("tritonserver") < titles.index(steps[0]) < titles.index("rose: scheduler")
    # an ensemble of other steps is drawn with those steps
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "model_repository" / "embed", repo / "embed", ignore=shutil.ignore_patterns("1"))
    cfg = repo / "embed" / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace('"tokenize_batched"', '"tokenize"'))
    titles = request_path.draw(tmp_path / "other.png", repo)
    assert "tokenize" in titles and "tokenize_batched" not in titles
    # a step whose files are not in the repository stops the drawing with their name
    cfg.write_text(cfg.read_text().replace('"tokenize"', '"no_such_step"'))
    with pytest.raises(FileNotFoundError, match="model_repository/no_such_step/config.pbtxt"):
        request_path.draw(tmp_path / "gone.png", repo)
    cfg.write_text(cfg.read_text().replace('model_name: "rose"', 'model_name: "other"'))
    with pytest.raises(ValueError, match="expected a last step `rose`"):
        request_path.ensemble_steps(repo)
