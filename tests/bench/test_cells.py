"""The cells guard (rose_bench cells): its comparison with a baseline (ratios, tolerances from the
measured noise, the exit code) on made-up results, and one short run against a real deployment on
the CPU (a tiny folder, two cells, two reps) whose JSON compares with itself. The numbers mean
nothing here; the GPU baselines are committed under benchmarks/results/cells."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rose_bench import cells

ROOT = Path(__file__).resolve().parents[2]


def result(values: dict[str, dict[str, list[float]]], model="bge-m3", scale="gpu") -> dict:
    r = {"model": model, "scale": scale, "git": {"commit": "abc"}, "date": "d",
         "cells": {name: {"metrics": metrics} for name, metrics in values.items()}}
    cells.summarize(r)
    return r


def test_a_cell_worse_beyond_its_noise_fails_and_one_within_it_does_not():
    base = result({"online-128": {"p50_ms": [1.60, 1.62]}, "openai-128-c16": {"req_per_s": [1758, 1700]},
                   "bulk-512": {"emb_per_s": [1650, 1646]}})
    now = result({"online-128": {"p50_ms": [1.64, 1.66]},           # +2.5%: within the 3% floor
                  "openai-128-c16": {"req_per_s": [434, 440]},      # -75%: worse
                  "bulk-512": {"emb_per_s": [1800, 1790]}})         # +9%: better
    rows, worse = cells.compare(now, base, min_noise=0.03)
    verdicts = {(r["cell"], r["metric"]): r["verdict"] for r in rows}
    assert worse and verdicts == {("online-128", "p50_ms"): "same", ("openai-128-c16", "req_per_s"): "WORSE",
                                  ("bulk-512", "emb_per_s"): "better"}
    assert "| openai-128-c16 | req_per_s (higher is better) |" in cells.table(rows)


def test_the_tolerance_is_the_larger_noise_of_the_two_runs():
    noisy_base = result({"embed-512-c16": {"p50_ms": [10.0, 14.0]}})        # 33% apart
    now = result({"embed-512-c16": {"p50_ms": [13.0, 13.2]}})               # +9% on the mean of 12
    rows, worse = cells.compare(now, noisy_base, min_noise=0.03)
    assert not worse and rows[0]["tolerance"] == pytest.approx(0.3333, abs=1e-3) and rows[0]["verdict"] == "same"
    quiet = result({"embed-512-c16": {"p50_ms": [12.0, 12.1]}})
    rows, worse = cells.compare(now, quiet, min_noise=0.03)
    assert worse and rows[0]["verdict"] == "WORSE"


def test_cells_missing_on_either_side_are_named_not_failed():
    rows, worse = cells.compare(result({"online-128": {"p50_ms": [1.0, 1.0]}}),
                                result({"scoring-5": {"p50_ms": [4.5, 4.6]}}), 0.03)
    assert not worse and {(r["cell"], r["verdict"]) for r in rows} == {("online-128", "new"), ("scoring-5", "not run")}


def test_the_scales_cells_fit_the_model_and_a_subset_is_chosen_by_prefix():
    gpu = [c.name for c in cells.cells_of("gpu", 8192)]
    assert gpu[:3] == ["online-128", "online-512", "online-4096"] and "openai-128-c64" in gpu and "beside-bulk" in gpu
    assert "tei-128-c16" in gpu
    assert "online-4096" not in [c.name for c in cells.cells_of("gpu", 512)]
    assert [c.name for c in cells.cells_of("gpu", 8192, ["openai", "bulk-512"])] == [
        "bulk-512", "openai-128-c1", "openai-128-c16", "openai-128-c64"]
    with pytest.raises(SystemExit, match="no cell named nope"):
        cells.cells_of("gpu", 8192, ["nope"])


def run_cells(*args, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rose_bench", "cells", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.server
def test_a_short_run_on_the_cpu_writes_its_json_and_compares_with_itself(tmp_path):
    """Two cells (gRPC, and TEI's /embed through the HTTP load) of a tiny folder, one deployment: the JSON holds both
    reps of each metric, the command and the commit; compared with itself every cell is `same`
    (exit 0), and with a baseline twice as fast the guard fails (exit 1) naming the cells."""
    r = run_cells("--model", "tiny-bert", "--cells", "online-16,tei", "--out", str(tmp_path),
                  "--workdir", str(tmp_path / "work"), "--warmup-s", "0.2", "--time-scale", "0.4")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    path = tmp_path / "cells_tiny-bert.json"
    got = json.loads(path.read_text())
    assert got["command"].startswith("python -m rose_bench cells") and got["git"]["commit"] and got["scale"] == "cpu"
    assert set(got["cells"]) == {"online-16", "tei-16-c4"}
    assert len(got["cells"]["tei-16-c4"]["metrics"]["req_per_s"]) == 2 and got["cells"]["online-16"]["value"]["p50_ms"] > 0
    same = run_cells("--compare", str(path), "--baseline", str(path))
    assert same.returncode == 0 and same.stdout.count("| same |") == 2, same.stdout + same.stderr
    # the run's values without its noise (a loaded host's reps may differ by half), and a baseline
    # twice as good: every cell is worse
    steady, fast = json.loads(path.read_text()), json.loads(path.read_text())
    for run, factor in ((steady, 1.0), (fast, 2.0)):
        for entry in run["cells"].values():
            entry["metrics"] = {m: [entry["value"][m] / factor if cells.BETTER[m] == "lower" else entry["value"][m] * factor] * 2
                                for m in entry["metrics"]}
        cells.summarize(run)
    (tmp_path / "steady.json").write_text(json.dumps(steady))
    (tmp_path / "fast.json").write_text(json.dumps(fast))
    worse = run_cells("--compare", str(tmp_path / "steady.json"), "--baseline", str(tmp_path / "fast.json"))
    assert worse.returncode == 1 and "online-16, tei-16-c4" in worse.stderr, worse.stdout + worse.stderr
