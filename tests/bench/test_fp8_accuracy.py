"""rose_bench fp8-accuracy on the CPU: the corpus (10,000 distinct English sentences of the text Python
and its packages ship, in a fixed order) and one run of the tool on a tiny random folder, whose JSON
holds what the H200 run reports. The numbers mean nothing here; benchmarks/results/fp8-accuracy holds
the H200's."""
import json
import re

import numpy as np

from rose_bench import fp8_accuracy


def test_the_corpus_is_ten_thousand_distinct_sentences_in_a_fixed_order():
    a = fp8_accuracy.corpus(10_000)
    assert len(a) == len(set(a)) == 10_000
    assert a[:50] == fp8_accuracy.corpus(50)                # one order: a shorter corpus is its head
    assert all(40 <= len(s) <= 300 and s[0].isupper() and not re.search(r"[{}\[\]<>=_`|\\]", s) for s in a)


def test_a_run_reports_both_paths_against_float32(tmp_path):
    out = tmp_path / "fp8.json"
    rc = fp8_accuracy.main(["--minilm", "none", "--shapes", "tiny-qwen3", "--sentences", "60", "--device", "cpu",
                            "--projections", "all", "--projections", "o_proj+down_proj",
                            "--workdir", str(tmp_path / "w"), "--out", str(out)])
    assert rc == 0                                          # no MiniLM row: nothing to gate
    d = json.loads(out.read_text())
    assert d["bench"] == "fp8-accuracy" and d["corpus"]["sentences"] == 60 and d["git"]
    row, some = d["models"]
    assert (row["projections"], some["projections"]) == ("all", "o_proj+down_proj")
    # half the projections on the FP8 path: less of e4m3's rounding than all of them, more than none
    assert row["bf16_vs_fp32"]["mean"] < some["fp8_vs_fp32"]["mean"] < row["fp8_vs_fp32"]["mean"]
    assert row["sentences"] == 60 and row["tokens"] > 60
    for key in ("bf16_vs_fp32", "fp8_vs_fp32", "fp8_vs_bf16"):
        assert 0 <= row[key]["mean"] <= row[key]["p99"] <= row[key]["max"] < 0.05 and np.isfinite(row[key]["max"])
    assert row["fp8_vs_fp32"]["mean"] > row["bf16_vs_fp32"]["mean"]      # the FP8 path ran (e4m3 is coarser)
    assert all(0 <= row[k] <= 1 for k in ("top10_fp8_vs_bf16", "top10_bf16_vs_fp32", "top10_fp8_vs_fp32"))
