"""Regenerate README.md's Performance section from the committed benchmark JSON.

    python -m rose_bench render-readme            # rewrites the lines between the markers
    python -m rose_bench render-readme --print    # prints the section instead

Reads benchmarks/results/e2e/<model>-<gpu>.json (written by `python -m rose_bench e2e`), renders one
table per model (this project, the naive Triton baseline, the published vLLM / Tulip numbers, the
goal, and whether the goal is met) and links the charts beside the JSON. Only the text between
`<!-- performance:begin -->` and `<!-- performance:end -->` changes.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "e2e"
BEGIN, END = "<!-- performance:begin -->", "<!-- performance:end -->"
MODEL_ORDER = ("bge-m3", "pplx-embed")
WORKLOADS = (("online", "online, 1 x {x}"), ("scoring", "scoring, {x} x 512"),
             ("throughput", "throughput, 4 x 100 x {x}"), ("concurrency", "concurrency {x} (text)"))


def _lat(c):
    if not c:
        return "-"
    if "p50_ms" in c:
        return f"{c['p50_ms']:.2f} ({c['p99_ms']:.2f})"
    return "n/a" if ("error" in c or "skipped" in c) else "-"


def _sent_ids(cell) -> bool:
    """A concurrency cell whose clients sent token ids instead of texts (see rose_bench.e2e)."""
    return bool(cell) and str(cell.get("input", "")).startswith("token ids")


def _pub(row, key, workload):
    v = (row or {}).get(key)
    if v is None:
        return "-"
    if workload == "throughput":
        return f"{v:.1f}"
    if v[0] is None:
        return "-"
    approx = "~" if workload == "concurrency" else ""
    return f"{approx}{v[0]:.2f}" + (f" ({approx}{v[1]:.2f})" if v[1] is not None else "")


def _goal(row, workload):
    g = (row or {}).get("goal")
    if g is None:
        return "-", None
    if workload == "throughput":
        return f">= {g:.0f}", g
    if g[0] is None:
        return "-", None
    return f"<= {g[0]:g}" + (f", p99 <= {g[1]:g}" if g[1] else ""), g


def met(cell, goal, workload) -> str:
    if goal is None or not cell:
        return ""
    if workload == "throughput":
        return "" if "emb_per_s" not in cell else ("yes" if cell["emb_per_s"] >= goal else "**no**")
    if "p50_ms" not in cell:
        return ""
    ok = cell["p50_ms"] <= goal[0] and (goal[1] is None or cell["p99_ms"] <= goal[1])
    return "yes" if ok else "**no**"


def table(result: dict) -> str:
    sysw = {s: (v.get("workloads") or {}) for s, v in result.get("systems", {}).items()}
    pub = result.get("published", {})
    lines = ["| workload | rose p50 (p99) | naive Triton p50 (p99) | vLLM p50 (p99) | Tulip p50 (p99) | goal | goal met |",
             "|---|---|---|---|---|---|---|"]
    for workload, label in WORKLOADS:
        xs = sorted({int(x) for w in sysw.values() for x in (w.get(workload) or {})} |
                    {int(x) for x in (pub.get(workload) or {}) if x.isdigit()})
        for x in xs:
            ours = (sysw.get("rose", {}).get(workload) or {}).get(str(x))
            naive = (sysw.get("naive", {}).get(workload) or {}).get(str(x))
            row = (pub.get(workload) or {}).get(str(x))
            if workload == "throughput":
                fmt = lambda c: f"{c['emb_per_s']:.1f}" if c and "emb_per_s" in c else ("n/a" if c else "-")  # noqa: E731
                a, b = fmt(ours), fmt(naive)
            else:
                a, b = _lat(ours), _lat(naive)
                a, b = a + (" (ids)" if _sent_ids(ours) else ""), b + (" (ids)" if _sent_ids(naive) else "")
            g_text, g = _goal(row, workload)
            lines.append(f"| {label.format(x=x)} | {a} | {b} | {_pub(row, 'vllm', workload)} | "
                         f"{_pub(row, 'tulip', workload)} | {g_text} | {met(ours, g, workload)} |")
    return "\n".join(lines)


def describe(result: dict) -> str:
    host = result.get("host") or {}
    gates = []
    for s, v in result.get("systems", {}).items():
        g = v.get("gate") or {}
        st = v.get("startup") or {}
        gates.append(f"{s}: gate {'passed' if g.get('passed') else 'FAILED'}, max 1 - cos "
                     f"{g.get('max_cos_dist', float('nan')):.1e}; ready {st.get('ready_s', '?')} s, first response "
                     f"{st.get('first_response_s', '?')} s after launch"
                     + (f" ({v['text_skipped']}: no text cells" + (
                         "; its concurrency cells, marked (ids), send token ids, so they leave tokenization out)"
                         if any(map(_sent_ids, ((v.get("workloads") or {}).get("concurrency") or {}).values()))
                         else ")")
                        if v.get("text_skipped") else ""))
    if len(result.get("runs") or []) > 1:
        gates.append(f"merged from {len(result['runs'])} runs with `python -m rose_bench merge` "
                     "(each run's command, commit and date are under `runs` in the JSON)")
    commits = list(dict.fromkeys((r.get("git") or {}).get("commit") or "?" for r in result.get("runs") or [result]))
    dates = sorted((r.get("date") or "")[:10] for r in result.get("runs") or [result])
    when = dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}"
    return (f"{host.get('gpu') or 'CPU'}, {result.get('mode')} mode, {when}, "
            f"commit{'s' if len(commits) > 1 else ''} {', '.join(f'`{c[:10]}`' for c in commits)}, torch {host.get('torch', '?')}, transformers {host.get('transformers', '?')}. "
            + "; ".join(gates) + ".")


def section(results_dir: Path = RESULTS, link_prefix: str = "benchmarks/results/e2e/") -> str:
    files = {json.loads(p.read_text()).get("model", p.stem): p for p in sorted(results_dir.glob("*.json"))}
    order = [m for m in MODEL_ORDER if m in files] + [m for m in files if m not in MODEL_ORDER]
    out = ["## Performance", "",
           "One H200, bf16, random weights at the real shapes, pre-tokenized requests over gRPC streaming "
           "(concurrency: texts through the `embed` ensemble, tokenization included), the client on the same "
           "machine. `naive` is the deployment a Triton user writes first: a Python-backend model calling "
           "Hugging Face transformers (bf16, sdpa) on a padded batch "
           "([benchmarks/repositories/baseline](benchmarks/repositories/baseline)), served by the same "
           "tritonserver and driven by the same client. vLLM and Tulip rows are the published numbers "
           "(same GPU model, other software; concurrency values read off a chart, approximate). Latencies in "
           "ms as p50 (p99); throughput in embeddings/s. Before timing, each server passes a gate "
           "(stated per model below): embeddings within 1 - cos <= 1e-3 of a float32 Hugging Face reference "
           "of the same weights.", "",
           "Reproduce: `python -m rose_bench e2e --model bge-m3 --quick --out OUT` (and `--model pplx-embed`), "
           "`python -m rose_bench merge --replace R R OUT/bench_bge-m3.json` with R = benchmarks/results/e2e/bge-m3-h200.json, then "
           "`python -m rose_bench render-readme`. Analysis: [benchmarks/RESULTS-e2e.md](benchmarks/RESULTS-e2e.md).", ""]
    if not order:
        out.append("_No committed results yet._")
    for m in order:
        r = json.loads(files[m].read_text())
        out += [f"### {r.get('model_title', m)}", "", describe(r), "", table(r), ""]
        charts = r.get("charts") or []
        if charts:
            out.append(" ".join(f"![{c}]({link_prefix}{c})" for c in charts if (results_dir / c).exists()))
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def render(readme: Path, text: str) -> bool:
    body = readme.read_text()
    if BEGIN not in body or END not in body:
        raise SystemExit(f"{readme}: the markers {BEGIN} / {END} are missing")
    head, rest = body.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{BEGIN}\n{text}{END}{tail}"
    if new != body:
        readme.write_text(new)
        return True
    return False


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", default=str(RESULTS))
    p.add_argument("--readme", default=str(ROOT / "README.md"))
    p.add_argument("--print", action="store_true", help="print the section instead of writing README.md")
    args = p.parse_args(argv)
    text = section(Path(args.results))
    if args.print:
        print(text)
    else:
        print(f"{args.readme}: {'updated' if render(Path(args.readme), text) else 'unchanged'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
