"""The headline chart of one model shape: cell by cell, how many times as fast as each peer rose is.

rose's numbers come from a committed e2e result (benchmarks/results/e2e/<model>-<gpu>.json), the
peers' from published.py (Tulip and vLLM as published, sentence-transformers measured in process).
A ratio reads the same whatever the cell's unit: peer ms / rose ms for latency, rose emb/s / peer
emb/s for throughput; right of 1, rose is the faster.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rose_bench import published

# peer key -> (legend, colour), in the order of the bars within a cell
PEERS = {"tulip": ("Tulip (published)", "#27ae60"),
         "vllm": ("vLLM 0.22 (published)", "#2980b9"),
         "sentence-transformers": ("sentence-transformers (in process)", "#8e44ad")}
# (workload, its cells, a cell's label), top to bottom
CELLS = (("online", (128, 512, 4096), "online 1 x {x}"),
         ("scoring", (5, 25, 50), "scoring {x} x 512"),
         ("throughput", (512, 1024, 4096), "bulk 4 x 100 x {x}"))


@dataclass(frozen=True)
class Cell:
    """One workload cell: rose's value, where it sits in the result JSON, and each peer's value."""
    workload: str
    x: int
    label: str
    rose: float
    source: str                                         # dotted path of rose's value in the JSON
    peers: dict[str, float] = field(default_factory=dict)

    @property
    def unit(self) -> str:
        return "emb/s" if self.workload == "throughput" else "ms"

    def times_as_fast(self, peer: str) -> float:
        """How many times as fast as `peer` rose is in this cell (> 1: rose is the faster)."""
        theirs = self.peers[peer]
        return self.rose / theirs if self.workload == "throughput" else theirs / self.rose


def rose_value(result: dict, workload: str, x: int) -> tuple[float, str] | None:
    """rose's number for one cell and its path in the JSON: online p50 from perf_analyzer (the
    reference client of those cells) where the run has it, else from the bench's own client;
    scoring p50; throughput in embeddings/s. None where the run has no such cell."""
    rose = (result.get("systems") or {}).get("rose") or {}
    if workload == "online":
        pa = ((rose.get("perf_analyzer") or {}).get("online") or {}).get(str(x)) or {}
        if pa.get("p50_ms"):
            return float(pa["p50_ms"]), f"systems.rose.perf_analyzer.online.{x}.p50_ms"
    key = "emb_per_s" if workload == "throughput" else "p50_ms"
    cell = ((rose.get("workloads") or {}).get(workload) or {}).get(str(x)) or {}
    return (float(cell[key]), f"systems.rose.workloads.{workload}.{x}.{key}") if cell.get(key) else None


def peer_values(model: str, workload: str, x: int) -> dict[str, float]:
    """Each peer's number for one cell (p50 ms, or emb/s for throughput); a peer without one is absent."""
    row = published.PUBLISHED.get(model, {}).get(workload, {}).get(x) or {}
    out = {}
    for peer in ("tulip", "vllm"):
        v = row.get(peer)
        v = v if workload == "throughput" or v is None else v[0]
        if v:
            out[peer] = float(v)
    st = published.SENTENCE_TRANSFORMERS.get(model, {}).get(workload, {}).get(x)
    if st:
        out["sentence-transformers"] = float(st)
    return out


def headline_cells(result: dict) -> list[Cell]:
    """The cells the chart shows, top to bottom: each that the result measured for rose."""
    cells = []
    for workload, xs, label in CELLS:
        for x in xs:
            got = rose_value(result, workload, x)
            if got is not None:
                cells.append(Cell(workload, x, label.format(x=x), got[0], got[1], peer_values(result["model"], workload, x)))
    return cells


def rose_runs(result: dict, cells: list[Cell]) -> list[dict]:
    """The runs (command, commit, date) rose's shown cells come from: the run that replaced a cell
    (the merged file's `replaced`), else every run of the file."""
    runs = result.get("runs") or [result]
    replaced = result.get("replaced") or {}
    keys = ["rose/" + "/".join(c.source.split(".")[2:-1]) for c in cells]
    if not all(k in replaced for k in keys):
        return runs
    commits = {replaced[k] for k in keys}
    return [r for r in runs if ((r.get("git") or {}).get("commit") or "")[:len(next(iter(commits)))] in commits] or runs


def provenance(result: dict, cells: list[Cell], name: str) -> str:
    """Two lines: where rose's numbers come from (file, commits, dates) and the peers'."""
    runs = rose_runs(result, cells)
    commits = ", ".join(dict.fromkeys(((r.get("git") or {}).get("commit") or "?")[:7] for r in runs))
    dates = sorted({(r.get("date") or "?")[:10] for r in runs})
    when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    return (f"rose: benchmarks/results/e2e/{name}, commit {commits}, {when}; online cells: perf_analyzer p50, "
            "the others the bench's client (p50, emb/s).\nTulip and vLLM 0.22: published numbers (same GPU model, "
            f"other software). sentence-transformers: in process on the same folders, {published.SENTENCE_TRANSFORMERS_DATE}.")


def draw(result: dict, path: Path, name: str = "") -> dict[tuple[str, str], float]:
    """Draw the chart of one result into `path` (PNG). Returns what each bar shows, read back from
    the drawn bars: (cell label, peer) -> times as fast."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    cells = headline_cells(result)
    if not cells:
        raise ValueError(f"{name or result.get('model')}: the result holds no rose cell to chart")
    gpu = (result.get("host") or {}).get("gpu") or "CPU"
    fig, ax = plt.subplots(figsize=(9, 0.55 * len(cells) + 2.1), dpi=100)
    height = 0.8 / len(PEERS)
    bars, ratios = {}, []
    for i, cell in enumerate(cells):
        centre = len(cells) - 1 - i
        for j, (peer, (legend, colour)) in enumerate(PEERS.items()):
            if peer not in cell.peers:
                continue
            r = cell.times_as_fast(peer)
            ratios.append(r)
            y = centre + (len(PEERS) - 1) / 2 * height - j * height
            (bar,) = ax.barh(y, r - 1, left=1, height=0.9 * height, color=colour,
                             label=legend if not any(p == peer for _, p in bars) else None)
            bars[(cell.label, peer)] = bar
            ax.annotate(f"{r:.2f}x", (r, y), xytext=(3 if r >= 1 else -3, 0), textcoords="offset points",
                        ha="left" if r >= 1 else "right", va="center", fontsize=7)
        if i and cell.workload != cells[i - 1].workload:
            ax.axhline(centre + 0.5, color="0.8", linewidth=0.8)
    ax.axvline(1, color="k", linewidth=1)
    lo, hi = min(min(ratios), 1) / 1.5, max(max(ratios), 1) * 1.6
    ax.set_xscale("log")
    ax.set_xlim(lo, hi)
    ticks = [t for t in (0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 20, 50) if lo <= t <= hi]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.set_yticks(range(len(cells)))
    ax.set_yticklabels([f"{c.label}\nrose {c.rose:.0f} {c.unit}" if c.unit == "emb/s" else f"{c.label}\nrose {c.rose:.2f} ms"
                        for c in reversed(cells)], fontsize=8)
    ax.set_ylim(-0.6, len(cells) - 0.4)
    ax.set_xlabel("times as fast as the peer: peer ms / rose ms, rose emb/s / peer emb/s (right of 1: rose is faster)",
                  fontsize=8)
    title = published.MODEL_TITLES.get(result["model"], result.get("model_title") or result["model"])
    ax.set_title(f"{title} shape, one {gpu}: rose against each peer, cell by cell", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right", framealpha=0.9)
    fig.text(0.01, 0.01, provenance(result, cells, name or f"{result['model']}.json"), fontsize=6.5, color="0.35")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)
    return {key: bar.get_x() + bar.get_width() for key, bar in bars.items()}
