"""The benchmark package (benchmarks/rose_bench) on this CPU machine: a tiny random BERT folder,
both our repository and the naive baseline through real tritonservers, the gate, the JSON schema,
the charts and the README renderer. The numbers mean nothing here; the H200 runs are committed."""
import ast
import importlib.util
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _naive_module():
    spec = importlib.util.spec_from_file_location(
        "naive_model", ROOT / "benchmarks" / "repositories" / "baseline" / "naive" / "1" / "model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("shape", ["tiny-bert", "tiny-qwen3"])
def test_naive_baseline_matches_the_float32_reference(tmp_path, shape):
    """Padded batches (bidirectional mask for the decoder), ids and texts, against the reference."""
    from rose_testing import folders
    from rose_testing.compare import cos_dist
    from rose_testing.reference import Reference
    folder = folders.make_folder(shape, tmp_path / shape)
    ref = Reference(folder)
    naive = _naive_module().NaiveEmbedder(folder)
    rng = np.random.default_rng(3)
    seqs = [folders.random_ids(rng, 1000, n) for n in (7, 64, 1, 33)]
    want = ref.embed(seqs)
    got = naive.embed_ids(np.concatenate(seqs), np.array([len(s) for s in seqs], dtype=np.int32))
    assert cos_dist(got, want).max() < 1e-5
    texts = naive.embed_texts([folders.ids_to_text(s) for s in seqs])
    assert cos_dist(texts, want).max() < 1e-5
    # the tokenizer maps one word to one token: "w12 w34" -> [12, 34]
    assert naive.tokenizer("w12 w34 w999")["input_ids"] == [12, 34, 999]


def test_every_benchmark_is_a_subcommand():
    """No benchmark script beside the package: each is a `python -m rose_bench` subcommand, whose
    module takes main(argv)."""
    from rose_bench.__main__ import SUBCOMMANDS
    assert not sorted(p.name for p in (ROOT / "benchmarks").glob("*.py"))
    for name, module in SUBCOMMANDS.items():
        tree = ast.parse((ROOT / "benchmarks" / "rose_bench" / f"{module}.py").read_text())
        mains = [f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "main"]
        assert mains and mains[0].args.args, (name, module)


def test_the_benchmarks_are_their_own_distribution_not_the_products():
    """rose_bench is installed from benchmarks/pyproject.toml (make test does), never packed into the
    product's wheel (the root pyproject.toml) or its image (docker/Dockerfile)."""
    product = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "rose_bench" not in product["tool"]["setuptools"]["packages"]
    assert "rose_bench" not in product["tool"]["setuptools"]["package-dir"]
    assert "bench" not in product["project"]["optional-dependencies"]
    bench = tomllib.loads((ROOT / "benchmarks" / "pyproject.toml").read_text())
    assert bench["project"]["name"] == "rose-bench" and bench["tool"]["setuptools"]["packages"] == ["rose_bench"]
    copies = [line for line in (ROOT / "docker" / "Dockerfile").read_text().splitlines() if line.startswith(("COPY", "ADD"))]
    assert copies and not [line for line in copies if "benchmarks" in line], copies
    assert "pip install -q -e ./benchmarks" in (ROOT / "Makefile").read_text()


def test_perf_analyzer_input_data(tmp_path):
    from rose_bench.perf import write_input_data
    data = json.loads(write_input_data(tmp_path / "x.json", vocab=500, length=40, variants=3).read_text())["data"]
    assert len(data) == 3
    for d in data:
        ids = d["INPUT_IDS"]["content"]
        assert d["INPUT_IDS"]["shape"] == [40] and len(ids) == 40 and min(ids) >= 4 and max(ids) < 500
        assert d["SEQ_LENS"] == {"content": [40], "shape": [1]}


@pytest.mark.server
def test_bench_tiny_end_to_end(tmp_path):
    """`rose_bench e2e --tiny` of both systems, one tritonserver each in turn: every workload's cells
    measured, the gate passed, the charts drawn, and the docs' sections rendered from the JSON."""
    out, work = tmp_path / "out", tmp_path / "work"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "ensemble"), str(ROOT / "client"), str(ROOT / "benchmarks")]))
    p = subprocess.run([sys.executable, "-m", "rose_bench", "e2e", "--model", "tiny-bert", "--tiny", "--systems", "rose,naive",
                        "--no-perf-analyzer", "--out", str(out), "--workdir", str(work), "--git-commit", "test"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r = json.loads((out / "bench_tiny-bert.json").read_text())
    assert r["schema"] == "rose-bench/1" and r["mode"] == "tiny" and r["model"] == "tiny-bert"
    assert r["git"]["commit"] == "test" and r["date"] and "command" in r and "host" in r
    assert list(r["systems"]) == ["rose", "naive"]
    for system, s in r["systems"].items():
        assert "error" not in s
        assert s["gate"]["passed"] and s["gate"]["max_cos_dist"] <= 1e-3
        assert s["startup"]["ready_s"] > 0 and s["startup"]["first_response_s"] >= s["startup"]["ready_s"]
        w = s["workloads"]
        for workload, key in (("online", "p50_ms"), ("scoring", "p50_ms"), ("throughput", "emb_per_s"),
                              ("concurrency", "p99_ms")):
            assert w[workload], workload
            for x, cell in w[workload].items():
                assert cell.get(key, 0) > 0, (system, workload, x, cell)
    assert sorted(r["charts"]) == sorted(f"bench_tiny-bert_{w}.png" for w in
                                         ("online", "scoring", "throughput", "concurrency"))
    assert all((out / c).stat().st_size > 1000 for c in r["charts"])
    # the docs' sections render from that JSON (README's short table, PERFORMANCE.md's full one with
    # the charts), between the markers only
    from rose_bench import render_readme as render
    results = render.load(out)
    for name, text, row in (("README.md", render.readme_section(results), "| online 1 x 16 |"),
                            ("PERFORMANCE.md", render.performance_section(results, out), "| online, 1 x 16 |")):
        page = tmp_path / name
        page.write_text(f"# x\n\nbefore\n{render.BEGIN}\nSTALE\n{render.END}\nafter\n")
        assert render.render(page, text)
        body = page.read_text()
        assert body.startswith("# x\n\nbefore\n") and body.endswith(f"{render.END}\nafter\n") and "STALE" not in body
        assert row in body, body
    assert "bench_tiny-bert_online.png" in (tmp_path / "PERFORMANCE.md").read_text()


@pytest.mark.server
def test_multi_gpu_bench_cpu_smoke(tmp_path):
    """The several-server layouts of `rose_bench multi-gpu` on the CPU: two real tritonservers,
    raw streams split over both and EmbeddingClient balancing chunks over both, both servers answer
    the same embeddings, and the JSON holds every cell."""
    out, work = tmp_path / "out", tmp_path / "work"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "ensemble"), str(ROOT / "client"), str(ROOT / "benchmarks")]))
    p = subprocess.run([sys.executable, "-m", "rose_bench", "multi-gpu", "--model", "tiny-bert", "--cpu-smoke",
                        "--gpus", "0,1", "--layouts", "per-gpu-servers", "--procs", "2", "--clients", "2", "--out", str(out), "--workdir", str(work),
                        "--git-commit", "test"], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r = json.loads((out / "multi_gpu_tiny-bert.json").read_text())
    assert r["schema"] == "rose-multi-gpu/1" and r["git"]["commit"] == "test" and r["date"] and r["command"]
    assert set(r["layouts"]) == {"per-gpu-servers"}        # one-gpu is the same path with one server
    assert r["layouts"]["per-gpu-servers"]["servers"] == 2
    for name, layout in r["layouts"].items():
        assert "error" not in layout, (name, layout)
        assert layout["check_max_cos_dist"] <= 1e-3
        assert set(layout["cells"]) == {"throughput/16/procs2/stream", "throughput/16/procs2/client",
                                        "concurrency/2/client"}
        for key, cell in layout["cells"].items():
            assert cell.get("emb_per_s", cell.get("p99_ms", 0)) > 0, (name, key, cell)
    # three one-sequence chunks spread over two servers: each server took at least one
    assert all(n >= 1 for n in r["layouts"]["per-gpu-servers"]["check_spread"].values())
    assert "per-gpu-servers" in p.stdout and "throughput/16/procs2/client" in p.stdout


def test_tail_bench_follows_each_request_through_the_server(tmp_path):
    """rose_bench tail through a real tritonserver (tiny shape, 3 clients): the variant's settings
    reach the server, Triton's trace is read and cut into segments, rose's stage clock is joined
    to it, and the slowest 1% are set against the median."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "ensemble"), str(ROOT / "client"), str(ROOT / "benchmarks")]))
    p = subprocess.run([sys.executable, "-m", "rose_bench", "tail", "--models", "tiny-xlm-roberta", "--words", "30",
                        "--clients", "3", "--interval-ms", "300", "--warmup-ms", "600", "--out", str(tmp_path / "out"),
                        "--work", str(tmp_path / "work"), "--git-commit", "test",
                        "--variants", "two:rose.response_threads=2,tokenize.count=1,tokenize_batched.count=1"],
                       capture_output=True, text=True, env=env, timeout=400, cwd=ROOT / "benchmarks")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r = json.loads((tmp_path / "out" / "tail.json").read_text())
    assert r["git"]["commit"] == "test" and r["date"] and r["command"] and r["clients"] == 3
    run = r["runs"]["tiny-xlm-roberta/two"]
    assert "error" not in run and run["server_exit_code"] == 0, run
    repo = tmp_path / "work" / "repo-tiny-xlm-roberta-two"
    from rose_backend.triton.model_settings import read_model_config
    assert read_model_config(repo / "rose" / "config.pbtxt").parameters["response_threads"].string_value == "2"
    for model in ("tokenize", "tokenize_batched"):             # (one instance each: the server stops sooner)
        assert [g.count for g in read_model_config(repo / model / "config.pbtxt").instance_group] == [1], model
    assert run["client"]["n"] > 20 and run["client"]["p50_ms"] > 0 and run["warmup"]["rose"]["batches"] > 0
    assert run["traced_requests"] >= run["client"]["n"]            # every measured request, none of the warm-up's
    assert run["rose_marks_joined"] >= 0.9 * run["traced_requests"]
    side = run["server_side"]
    assert side["p99_us"] >= side["p50_us"] > 0 and side["n"]["slowest_1pct"] >= 1
    means = side["mean_us"]
    for key in ("tokenize_queue", "rose_execute", "rose_after_execute", "rose:validated", "rose:result_on_host", "rose:sent"):
        assert means[key]["median_and_below"] is not None, key
    # the segments of a request add up to its time in the server
    parts = sum(means[k]["median_and_below"] for k in ("ensemble_to_tokenize", "tokenize_queue", "tokenize_until_rose_queue",
                                                       "rose_queue", "rose_execute", "rose_after_execute"))
    assert abs(parts - means["total_us"]["median_and_below"]) < 1.0
    assert "== tiny-xlm-roberta/two" in p.stdout


def test_a_trace_cut_short_is_read_up_to_its_last_whole_entry(tmp_path):
    from rose_bench.trace_join import read_trace
    whole = [{"id": 1, "model_name": "embed", "model_version": 1}, {"id": 1, "timestamps": [{"name": "REQUEST_START", "ns": 5}]},
             {"id": 2, "model_name": "rose", "parent_id": 1}]
    text = json.dumps(whole)
    (tmp_path / "trace.json").write_text(text[:text.rindex("{") + 8])            # the last entry cut in the middle
    traces = read_trace(tmp_path / "trace.json")
    assert traces == {1: {"model": "embed", "parent": None, "ts": {"REQUEST_START": 5}}}
