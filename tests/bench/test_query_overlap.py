"""`rose_bench query-overlap` on the CPU: both engines built as `rose` builds them (the query lane's
on the main engine's weights), the three phases measured, one process per variant with its
environment, a variant that fails recorded as its cell's error and one naming an unknown setting
refused before anything runs. The numbers mean nothing on the CPU (a step computes before it returns)."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_query_overlap_measures_each_variant_in_a_process_of_its_own(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(ROOT / p) for p in ("", "ensemble", "client", "benchmarks")))
    p = subprocess.run([sys.executable, "-m", "rose_bench", "query-overlap", "--models", "tiny-qwen3", "--out", str(out),
                        "--variants", "default:;no-backend:env.ROSE_ATTENTION_EXCLUDE=sdpa_loop",
                        "--queries", "10", "--seconds", "0.5", "--period-ms", "5", "--folders", str(tmp_path / "folders"),
                        "--git-commit", "test"], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r = json.loads((out / "query_overlap.json").read_text())
    assert r["git"]["commit"] == "test" and r["date"] and "query-overlap" in r["command"]
    cell = r["cells"]["tiny-qwen3/default"]
    assert cell["backends"] == {"bulk": "sdpa_loop", "query": "sdpa_loop"}
    assert cell["queries_alone"]["n"] == 10 and cell["queries_alone"]["p50_ms"] > 0
    assert cell["bulk_alone"]["bulk_seqs_per_s"] > 0 and cell["bulk_alone"]["query"] == {"n": 0}
    assert cell["both"]["query"]["n"] >= 1 and cell["both"]["bulk_seqs_per_s"] > 0
    # the variant's environment reaches its process: with its only CPU backend excluded, nothing runs
    assert "no attention backend can run here" in r["cells"]["tiny-qwen3/no-backend"]["error"]
    assert "| tiny-qwen3 | default | sdpa_loop / sdpa_loop |" in p.stdout


def test_a_variant_it_cannot_run_is_refused_before_anything_runs(tmp_path, capsys):
    import pytest
    from rose_bench.query_overlap import main
    with pytest.raises(SystemExit) as e:
        main(["--out", str(tmp_path / "out"), "--variants", "default:;typo:engine.atention=x,rose.count=2"])
    assert e.value.code == 2
    assert "variant 'typo': unknown setting(s) ['atention', 'rose.count']" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "out"), "--variants", "pdl:engine.flashinfer_pdl=sometimes"])
    assert "engine.flashinfer_pdl is one of default, on, off, got 'sometimes'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_trace_summary_says_how_much_of_the_query_kernels_time_shared_the_gpu_with_bulk():
    from rose_bench.query_overlap import trace_summary

    def kernel(stream, ts, dur):
        return {"cat": "kernel", "ts": ts, "dur": dur, "args": {"stream": stream}}
    bulk = [kernel(7, 0, 100), kernel(7, 100, 100), kernel(7, 250, 100)]
    # one query kernel wholly beside a bulk kernel, one in the gap between two, one half beside
    query = [kernel(20, 10, 10), kernel(20, 210, 30), kernel(20, 340, 20)]
    s = trace_summary({"traceEvents": bulk + query + [{"cat": "cpu_op", "ts": 0, "dur": 5}]})
    assert s["bulk_kernels"] == 3 and s["bulk_kernel_mean_us"] == 100.0
    assert s["query_kernels"] == 3 and s["query_kernel_mean_us"] == 20.0
    assert s["query_time_beside_bulk"] == round((10 + 0 + 10) / 60, 3)
    assert s["query_kernels_started_beside_bulk"] == round(2 / 3, 3)
    assert trace_summary({"traceEvents": bulk}) == {"streams": 1}
