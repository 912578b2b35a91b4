"""The pictures, drawn from committed JSON and the repository itself.

    python -m rose_bench charts                    # docs/images/: results-<model>.png per committed e2e result
                                                   # (rose_bench.headline) and request-path.png (rose_bench.request_path)
    python -m rose_bench charts --out DIR          # the same into DIR
    python -m rose_bench charts RUN.json [--out DIR]   # one run's charts, one PNG per workload: this project, the
                                                   # naive Triton baseline, the published vLLM and Tulip numbers, the goal
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SYSTEMS = (("rose", "rose (this project)", "#c0392b"), ("naive", "naive Triton + HF", "#7f8c8d"))
PUBLISHED = (("vllm", "vLLM 0.22 (published)", "#2980b9"), ("tulip", "Tulip (published)", "#27ae60"))
TITLES = {"online": "online: batch 1, sequential (p50, whisker p99)",
          "scoring": "scoring: batches of 512-token sequences, sequential (p50, whisker p99)",
          "throughput": "throughput: batches of 100, 4 client processes",
          "concurrency": "concurrency: 512-token texts through tokenization"}
XLABEL = {"online": "sequence length (tokens)", "scoring": "sequences per request (512 tokens each)",
          "throughput": "sequence length (tokens)", "concurrency": "concurrent clients"}


def _cell(result: dict, system: str, workload: str, x: str):
    return ((result.get("systems", {}).get(system) or {}).get("workloads", {}).get(workload) or {}).get(x)


def chart(result: dict, workload: str, path: Path) -> Path | None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = sorted({int(x) for s, _, _ in SYSTEMS
                 for x in ((result.get("systems", {}).get(s) or {}).get("workloads", {}).get(workload) or {})})
    pub = result.get("published", {}).get(workload, {})
    if not xs:
        return None
    model = result.get("model_title", result.get("model", ""))
    fig, ax = plt.subplots(figsize=(8, 4.6), dpi=110)
    if workload == "concurrency":
        for key, label, color in SYSTEMS:
            pts = [(x, _cell(result, key, workload, str(x))) for x in xs]
            pts = [(x, c) for x, c in pts if c and "p50_ms" in c]
            if pts:
                ax.plot([x for x, _ in pts], [c["p50_ms"] for _, c in pts], "o-", color=color, label=f"{label} p50")
                ax.plot([x for x, _ in pts], [c["p99_ms"] for _, c in pts], "o--", color=color, alpha=0.6,
                        label=f"{label} p99")
        for key, label, color in PUBLISHED:
            pts = [(int(x), row[key]) for x, row in pub.items() if x.isdigit() and row.get(key)]
            if pts:
                ax.plot([x for x, _ in pts], [v[0] for _, v in pts], "s:", color=color, label=f"{label} p50 (approx.)")
        goal = [(int(x), row["goal"][0]) for x, row in pub.items() if x.isdigit() and row.get("goal", [None])[0]]
        if goal:
            ax.plot([x for x, _ in goal], [v for _, v in goal], "k*", markersize=12, label="goal p50")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_ylabel("latency (ms)")
    else:
        series = [(k, lab, c, "measured") for k, lab, c in SYSTEMS] + [(k, lab, c, "published") for k, lab, c in PUBLISHED]
        width = 0.8 / len(series)
        for i, (key, label, color, kind) in enumerate(series):
            vals, errs = [], []
            for x in xs:
                if kind == "measured":
                    c = _cell(result, key, workload, str(x)) or {}
                    v = c.get("emb_per_s") if workload == "throughput" else c.get("p50_ms")
                    e = None if workload == "throughput" else c.get("p99_ms")
                else:
                    row = (pub.get(str(x)) or {}).get(key)
                    v = row if workload == "throughput" else (row[0] if row else None)
                    e = None if workload == "throughput" or not row else row[1]
                vals.append(v if v is not None else 0.0)
                errs.append(max(0.0, e - v) if (e is not None and v is not None) else 0.0)
            pos = [j + (i - (len(series) - 1) / 2) * width for j in range(len(xs))]
            bars = ax.bar(pos, vals, width, color=color, label=label,
                          yerr=None if workload == "throughput" else [[0] * len(errs), errs], capsize=2,
                          alpha=1.0 if kind == "measured" else 0.75)
            for b, v in zip(bars, vals):
                if v:
                    ax.annotate(f"{v:.0f}" if workload == "throughput" else f"{v:.2f}",
                                (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom",
                                fontsize=6, rotation=90 if len(series) * len(xs) > 12 else 0)
        for j, x in enumerate(xs):
            g = (pub.get(str(x)) or {}).get("goal")
            g = g if workload == "throughput" else (g[0] if g else None)
            if g:
                ax.hlines(g, j - 0.45, j + 0.45, colors="k", linestyles="--", linewidth=1,
                          label="goal" if j == 0 else None)
        ax.set_xticks(range(len(xs)), [str(x) for x in xs])
        ax.set_ylabel("embeddings / s (higher is better)" if workload == "throughput" else "latency, ms (lower is better)")
        if workload != "throughput":
            ax.set_yscale("log")
    ax.set_xlabel(XLABEL[workload])
    gpu = (result.get("host") or {}).get("gpu") or "CPU"
    ax.set_title(f"{model}: {TITLES[workload]}\n{gpu}, {result.get('mode', '')} mode, {result.get('date', '')[:10]}",
                 fontsize=9)
    ax.legend(fontsize=7, loc="best")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def charts(result: dict, out_dir: Path, prefix: str | None = None) -> list[Path]:
    """One PNG per workload, named <prefix><workload>.png (default prefix: bench_<model>_)."""
    out = []
    prefix = f"bench_{result['model']}_" if prefix is None else prefix
    for workload in TITLES:
        p = chart(result, workload, Path(out_dir) / f"{prefix}{workload}.png")
        if p:
            out.append(p)
    return out


ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "e2e"
IMAGES = ROOT / "docs" / "images"


def docs_images(out: Path = IMAGES, results: Path = RESULTS) -> list[Path]:
    """results-<model>.png for each committed e2e result (<model>-<gpu>.json), and request-path.png."""
    from rose_bench import headline, request_path
    written = []
    for j in sorted(results.glob("*.json")):
        result = json.loads(j.read_text())
        headline.draw(result, out / f"results-{result['model']}.png", name=j.name)
        written.append(out / f"results-{result['model']}.png")
    request_path.draw(out / "request-path.png")
    return written + [out / "request-path.png"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m rose_bench charts", description=__doc__.split("\n\n")[0])
    p.add_argument("json", nargs="*", help="runs whose per-workload charts to draw (none: the docs' pictures)")
    p.add_argument("--out", default=None, help="folder for the PNGs (default: docs/images/, or beside each run's JSON)")
    p.add_argument("--results", default=str(RESULTS), help="the committed e2e results the docs' charts are drawn from")
    args = p.parse_args(argv)
    if not args.json:
        for path in docs_images(Path(args.out) if args.out else IMAGES, Path(args.results)):
            print(path)
        return 0
    for j in args.json:
        for path in charts(json.loads(Path(j).read_text()), Path(args.out) if args.out else Path(j).parent):
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
