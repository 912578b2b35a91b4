"""rose_bench families on the CPU: tiny folders of three families, rose's engine and sentence-transformers
on the same texts; the JSON holds both rates and the two outputs agree (the numbers mean nothing here;
the GPU run is what the results pages show)."""
import json

from rose_bench import families


def test_the_tool_measures_both_and_checks_they_agree(tmp_path):
    assert families.main(["--shapes", "tiny-mpnet,tiny-distilbert", "--batch", "4", "--length", "24", "--reps", "1",
                          "--out", str(tmp_path), "--workdir", str(tmp_path / "work")]) == 0
    got = json.loads((tmp_path / "families.json").read_text())
    assert got["git"]["commit"] and set(got["shapes"]) == {"tiny-mpnet", "tiny-distilbert"}
    for r in got["shapes"].values():
        assert r["rose_emb_per_s"] > 0 and r["sentence_transformers_emb_per_s"] > 0 and r["max_cos_dist"] < 1e-5, r
