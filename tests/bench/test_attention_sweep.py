"""rose_bench attention-sweep --add-from, on the CPU: another run's backends join the table's cells
(the engine then chooses among all of them), its new shapes are added, best and margin follow, and
the backends both runs measured give the ratio that says whether the two runs agree."""
import json

from rose_backend.engine.backend_table import BackendTable
from rose_bench import attention_sweep


def _cell(seqs, tokens, **us):
    return {"seqs": seqs, "tokens": tokens, "us": us, "best": min(us, key=us.get), "margin": None}


def test_add_from_merges_another_runs_backends(tmp_path):
    table = {"shapes": {"h16kv16d64": [_cell(1, 128, torch_varlen=10.0, flashinfer_fa3=8.0),
                                       _cell(1, 512, torch_varlen=20.0, flashinfer_fa3=12.0)]},
             "names": {"h16kv16d64": "bge-m3"}}
    run = {"date": "2026-12-01", "names": {"h16kv16d64": "bge-m3", "h12kv12d32": "minilm"},
           "shapes": {"h16kv16d64": [_cell(1, 128, torch_varlen=10.2, flash_attn4=6.0),
                                     _cell(1, 512, torch_varlen=19.6, flash_attn4=14.0),
                                     _cell(4, 512, torch_varlen=9.0, flash_attn4=7.0)],     # no such cell in the table
                      "h12kv12d32": [_cell(1, 128, torch_varlen=7.0, flash_attn4=5.0)]}}
    p, r = tmp_path / "table.json", tmp_path / "run.json"
    p.write_text(json.dumps(table))
    r.write_text(json.dumps(run))
    assert attention_sweep.main(["--add-from", str(r), "--table", str(p)]) == 0
    merged = json.loads(p.read_text())
    a, b = merged["shapes"]["h16kv16d64"]
    assert a["us"] == {"torch_varlen": 10.0, "flashinfer_fa3": 8.0, "flash_attn4": 6.0}    # the table's own kept
    assert (a["best"], a["margin"]) == ("flash_attn4", round(8.0 / 6.0, 3))
    assert (b["best"], b["margin"]) == ("flashinfer_fa3", round(14.0 / 12.0, 3))
    assert len(merged["shapes"]["h16kv16d64"]) == 2                 # a cell only the run has is not added
    assert merged["shapes"]["h12kv12d32"] == run["shapes"]["h12kv12d32"] and merged["names"]["h12kv12d32"] == "minilm"
    (added,) = merged["added"]
    assert added["median_ratio_of_shared_backends"] == {"h16kv16d64": round((10.2 / 10 + 19.6 / 20) / 2, 3)}
    t = BackendTable(merged)
    assert t.choose("h16kv16d64", 1, 128, ["torch_varlen", "flashinfer_fa3", "flash_attn4"]) == "flash_attn4"
    assert t.choose("h16kv16d64", 1, 128, ["torch_varlen", "flashinfer_fa3"]) == "flashinfer_fa3"   # FA4 absent here
