"""Render the end-to-end results into the docs from the committed benchmark JSON.

    python -m rose_bench render-readme            # rewrites the lines between the markers of both pages
    python -m rose_bench render-readme --print    # prints README.md's section instead

Reads benchmarks/results/e2e/<model>-<gpu>.json (written by `python -m rose_bench e2e`) and the peers'
numbers (rose_bench/published.py), and writes two sections, each between `<!-- performance:begin -->`
and `<!-- performance:end -->` (nothing else on the page changes):
- README.md: one short table per model, rose beside Tulip, vLLM and sentence-transformers cell by
  cell (the cells of the charts in docs/images, rose_bench.headline, and the 1- and 16-client cells
  the peers published), under one line naming the GPU, the dates and the commits;
- docs/PERFORMANCE.md: one full table per model, every workload cell with the naive Triton
  deployment beside them, how each run was made, and the per-workload charts beside the JSON.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rose_bench import headline, published

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "e2e"
README, PERFORMANCE = ROOT / "README.md", ROOT / "docs" / "PERFORMANCE.md"
BEGIN, END = "<!-- performance:begin -->", "<!-- performance:end -->"
MODEL_ORDER = ("bge-m3", "pplx-embed")
WORKLOADS = (("online", "online, 1 x {x}"), ("scoring", "scoring, {x} x 512"),
             ("throughput", "throughput, 4 x 100 x {x}"), ("concurrency", "concurrency {x} (text)"))
# README's rows: (workload, label); the concurrency rows only where a peer published the cell
SHORT = (("online", "online 1 x {x}"), ("scoring", "scoring {x} x 512"), ("throughput", "bulk 4 x 100 x {x}"),
         ("concurrency", "concurrency {x}, 512-token texts"))


def load(results_dir: Path = RESULTS) -> list[dict]:
    """The committed results, BGE-M3 then pplx-embed then any other, each with its file's name."""
    files = {}
    for p in sorted(Path(results_dir).glob("*.json")):
        r = json.loads(p.read_text())
        files[r.get("model", p.stem)] = {**r, "_file": p.name}
    return [files[m] for m in MODEL_ORDER if m in files] + [r for m, r in files.items() if m not in MODEL_ORDER]


# ----------------------------------------------------------------------------------------- cells
def _ms(p50, p99=None, approx="") -> str:
    return f"{approx}{p50:.2f}" + (f" ({approx}{p99:.2f})" if p99 is not None else "")


def _lat(c):
    if not c:
        return "-"
    if "p50_ms" in c:
        return _ms(c["p50_ms"], c.get("p99_ms"))
    return "n/a" if ("error" in c or "skipped" in c) else "-"


def _rate(c, digits=1):
    return f"{c['emb_per_s']:.{digits}f}" if c and "emb_per_s" in c else ("n/a" if c else "-")


def _sent_ids(cell) -> bool:
    """A concurrency cell whose clients sent token ids instead of texts (see rose_bench.e2e)."""
    return bool(cell) and str(cell.get("input", "")).startswith("token ids")


def _pub(row, key, workload, digits=1):
    v = (row or {}).get(key)
    if v is None:
        return "-"
    if workload == "throughput":
        return f"{v:.{digits}f}"
    if v[0] is None:
        return "-"
    return _ms(v[0], v[1], "~" if workload in published.APPROXIMATE else "")


def _st(model, workload, x, digits=1):
    v = published.SENTENCE_TRANSFORMERS.get(model, {}).get(workload, {}).get(x)
    if v is None:
        return "-"
    return f"{v:.{digits}f}" if workload == "throughput" else f"{v:g}"


def _workloads(result: dict, system: str) -> dict:
    return ((result.get("systems") or {}).get(system) or {}).get("workloads") or {}


def rose_cell(result: dict, workload: str, x: int) -> tuple[dict, str] | None:
    """rose's cell as the charts take it (rose_bench.headline.rose_value): perf_analyzer's online
    cells where the run has them, else the bench's own client; with the cell's path in the JSON."""
    got = headline.rose_value(result, workload, x)
    if got is None:
        return None
    source = got[1]
    node = result
    for key in source.split(".")[:-1]:
        node = node[key]
    return node, source


# ----------------------------------------------------------------------------- README: short form
def short_rows(result: dict) -> list[tuple[str, int, str, dict, str]]:
    """(workload, x, label, rose's cell, its path in the JSON) for each README row, top to bottom."""
    pub = published.published(result.get("model", ""))
    rows = []
    for workload, label in SHORT:
        measured = {int(x) for x in _workloads(result, "rose").get(workload) or {}}
        xs = sorted(measured & set(pub.get(workload) or {})) if workload == "concurrency" else sorted(measured)
        for x in xs:
            got = rose_cell(result, workload, x)
            if got is not None:
                rows.append((workload, x, label.format(x=x), *got))
    return rows


def short_table(result: dict) -> str:
    model = result.get("model", "")
    pub = published.published(model)
    lines = ["| cell | rose | Tulip | vLLM | sentence-transformers |", "|---|---|---|---|---|"]
    for workload, x, label, cell, _ in short_rows(result):
        row = (pub.get(workload) or {}).get(x)
        ours = _rate(cell, 0) if workload == "throughput" else _lat(cell)
        lines.append(f"| {label} | {ours} | {_pub(row, 'tulip', workload, 0)} | {_pub(row, 'vllm', workload, 0)} | "
                     f"{_st(model, workload, x, 0)} |")
    return "\n".join(lines)


def _runs_shown(result: dict) -> list[dict]:
    cells = [headline.Cell(w, x, label, 0.0, source) for w, x, label, _, source in short_rows(result)]
    return headline.rose_runs(result, cells) if cells else (result.get("runs") or [result])


def _when(dates) -> str:
    dates = sorted(d for d in dates if d)
    return "?" if not dates else dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}"


def readme_section(results: list[dict]) -> str:
    out = ["## Performance", ""]
    if not results:
        return "\n".join(out + ["_No committed results yet._"]) + "\n"
    runs = [r for result in results for r in _runs_shown(result)]
    gpus = list(dict.fromkeys((r.get("host") or {}).get("gpu") or "CPU" for r in results))
    commits = ", ".join(f"`{c}`" for c in dict.fromkeys(((r.get("git") or {}).get("commit") or "?")[:7] for r in runs))
    out += [f"One {', '.join(gpus)}, {'float32' if gpus == ['CPU'] else 'bf16'}, random weights at each model's "
            "shape, the client on the same host. rose: "
            f"commit{'s' if ',' in commits else ''} {commits}, {_when((r.get('date') or '')[:10] for r in runs)} "
            "(online cells by perf_analyzer); Tulip and vLLM 0.22: their published numbers (~: read off a chart); "
            f"sentence-transformers: in process on the same folders, {published.SENTENCE_TRANSFORMERS_DATE}. "
            "Latency in ms, p50 (p99); bulk in embeddings/s. How each number was measured, the naive Triton "
            "baseline and the commands: [docs/PERFORMANCE.md](docs/PERFORMANCE.md).", ""]
    for r in results:
        title = published.MODEL_TITLES.get(r.get("model"), r.get("model_title") or r.get("model"))
        out += [f"### {title}", "", short_table(r), ""]
    return "\n".join(out).rstrip() + "\n"


# ----------------------------------------------------------------- docs/PERFORMANCE.md: full form
def full_table(result: dict) -> str:
    model = result.get("model", "")
    sysw = {s: (v.get("workloads") or {}) for s, v in result.get("systems", {}).items()}
    pub = result.get("published", {})
    lines = ["| workload | rose p50 (p99) | naive Triton p50 (p99) | Tulip p50 (p99) | vLLM p50 (p99) | "
             "sentence-transformers p50 |", "|---|---|---|---|---|---|"]
    for workload, label in WORKLOADS:
        xs = sorted({int(x) for w in sysw.values() for x in (w.get(workload) or {})} |
                    {int(x) for x in (pub.get(workload) or {}) if x.isdigit()})
        for x in xs:
            ours = (sysw.get("rose", {}).get(workload) or {}).get(str(x))
            naive = (sysw.get("naive", {}).get(workload) or {}).get(str(x))
            row = (pub.get(workload) or {}).get(str(x))
            if row:
                row = {k: (tuple(v) if isinstance(v, list) else v) for k, v in row.items()}
            if workload == "throughput":
                a, b = _rate(ours), _rate(naive)
            else:
                a, b = _lat(ours), _lat(naive)
                a, b = a + (" (ids)" if _sent_ids(ours) else ""), b + (" (ids)" if _sent_ids(naive) else "")
            lines.append(f"| {label.format(x=x)} | {a} | {b} | {_pub(row, 'tulip', workload)} | "
                         f"{_pub(row, 'vllm', workload)} | {_st(model, workload, x)} |")
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
    pa = ((result.get("systems", {}).get("rose") or {}).get("perf_analyzer") or {}).get("online") or {}
    pa_cells = [f"1 x {x}: {c['p50_ms']:.2f} ({c['p99_ms']:.2f})" for x, c in sorted(pa.items(), key=lambda i: int(i[0]))
                if c.get("p50_ms") and c.get("p99_ms")]
    if pa_cells:
        gates.append("rose's online cells by perf_analyzer (README's and the charts' numbers), p50 (p99) ms: "
                     + ", ".join(pa_cells))
    if len(result.get("runs") or []) > 1:
        gates.append(f"merged from {len(result['runs'])} runs with `python -m rose_bench merge` "
                     "(each run's command, commit and date are under `runs` in the JSON)")
    commits = list(dict.fromkeys((r.get("git") or {}).get("commit") or "?" for r in result.get("runs") or [result]))
    when = _when((r.get("date") or "")[:10] for r in result.get("runs") or [result])
    return (f"{host.get('gpu') or 'CPU'}, {result.get('mode')} mode, {when}, "
            f"commit{'s' if len(commits) > 1 else ''} {', '.join(f'`{c[:10]}`' for c in commits)}, "
            f"torch {host.get('torch', '?')}, transformers {host.get('transformers', '?')}. " + "; ".join(gates) + ".")


def performance_section(results: list[dict], results_dir: Path = RESULTS,
                        link_prefix: str = "../benchmarks/results/e2e/") -> str:
    out = ["## The four workloads, every cell", "",
           "One H200, bf16, random weights at the real shapes, pre-tokenized requests over gRPC streaming "
           "(concurrency: texts through the `embed` ensemble, tokenization included), the client on the same "
           "machine. `naive` is the deployment a Triton user writes first: a Python-backend model calling "
           "Hugging Face transformers (bf16, sdpa) on a padded batch "
           "([benchmarks/repositories/baseline](../benchmarks/repositories/baseline)), served by the same "
           "tritonserver and driven by the same client. Tulip and vLLM are the published numbers (same GPU "
           "model, other software; concurrency values read off a chart, approximate); sentence-transformers "
           f"ran in process on the same folders ({published.SENTENCE_TRANSFORMERS_DATE}; its record is not in "
           "the repository). Latencies in ms as p50 (p99); throughput in embeddings/s. Before timing, each "
           "server passes a gate: embeddings within 1 - cos <= 1e-3 of a float32 Hugging Face reference of "
           "the same weights.", ""]
    if not results:
        out.append("_No committed results yet._")
    for r in results:
        out += [f"### {r.get('model_title', r.get('model'))}", "",
                f"[benchmarks/results/e2e/{r['_file']}]({link_prefix}{r['_file']}): " + describe(r), "",
                full_table(r), ""]
        charts = [c for c in r.get("charts") or [] if (Path(results_dir) / c).exists()]
        if charts:
            out += [" ".join(f"![{c}]({link_prefix}{c})" for c in charts), ""]
    return "\n".join(out).rstrip() + "\n"


# ---------------------------------------------------------------------------------------- output
def render(page: Path, text: str) -> bool:
    """Replace the text between the markers of `page`; True when the page changed."""
    body = page.read_text()
    if BEGIN not in body or END not in body:
        raise SystemExit(f"{page}: the markers {BEGIN} / {END} are missing")
    head, rest = body.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{BEGIN}\n{text}{END}{tail}"
    if new != body:
        page.write_text(new)
        return True
    return False


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", default=str(RESULTS))
    p.add_argument("--readme", default=str(README))
    p.add_argument("--performance", default=str(PERFORMANCE), help="the page of the full tables")
    p.add_argument("--print", action="store_true", help="print README.md's section instead of writing the pages")
    args = p.parse_args(argv)
    results = load(Path(args.results))
    if args.print:
        print(readme_section(results))
        return 0
    for page, text in ((Path(args.readme), readme_section(results)),
                       (Path(args.performance), performance_section(results, Path(args.results)))):
        print(f"{page}: {'updated' if render(page, text) else 'unchanged'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
