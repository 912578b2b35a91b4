"""Following requests through the server after a run: Triton's trace (level TIMESTAMPS) read and
cut into segments per `embed` request, `rose`'s stage-clock marks joined to it, and the mean of
every segment for the median requests against the slowest 1% (rose_bench tail uses it).
Triton's trace timestamps and the stage clock's marks are both CLOCK_MONOTONIC nanoseconds.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

# the ensemble's request, in the order the segments are cut (consecutive names: one segment)
# (a decoupled step's COMPUTE_END is when execute() returned, its REQUEST_END when Triton released
# the request: neither is when it answered, which the stage clock's "sent" mark says)
TIMELINE = [("embed", "REQUEST_START"), ("tokenize_batched", "QUEUE_START"), ("tokenize_batched", "COMPUTE_START"),
            ("rose", "QUEUE_START"), ("rose", "COMPUTE_START"), ("rose", "COMPUTE_END"), ("embed", "REQUEST_END")]
SEGMENTS = ["ensemble_to_tokenize", "tokenize_queue", "tokenize_until_rose_queue", "rose_queue", "rose_execute",
            "rose_after_execute"]


def read_trace(path: Path) -> dict[int, dict]:
    """Triton's trace file(s) -> {trace id: {"model", "parent", "ts": {name: ns}}} (first of each name)."""
    traces: dict[int, dict] = {}
    files = sorted(path.parent.glob(path.name + "*"))
    for f in files:
        text = f.read_text().strip()
        if not text:
            continue
        for entry in _json_items(text):
            t = traces.setdefault(int(entry["id"]), {"model": None, "parent": None, "ts": {}})
            if "model_name" in entry:
                t["model"] = entry["model_name"]
                t["parent"] = int(entry.get("parent_id", 0) or 0) or None
            for stamp in entry.get("timestamps", []):
                t["ts"].setdefault(stamp["name"], int(stamp["ns"]))
    return traces


def _json_items(text: str) -> list:
    """The objects of a JSON array, or of as much of it as was written (a trace cut short)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        items, dec, i = [], json.JSONDecoder(), text.index("[") + 1
        while True:
            while i < len(text) and text[i] in " \n\r\t,":
                i += 1
            try:
                obj, i = dec.raw_decode(text, i)
            except json.JSONDecodeError:
                return items
            items.append(obj)


def ensemble_timelines(traces: dict[int, dict], ensemble: str = "embed") -> list[dict]:
    """One dict per complete ensemble request: {"total_us", "start_ns", segment: us, "rose": trace}."""
    children: dict[int, dict[str, dict]] = {}
    for t in traces.values():
        if t["parent"] is not None:
            children.setdefault(t["parent"], {})[t["model"]] = t
    out = []
    for tid, t in traces.items():
        if t["model"] != ensemble:
            continue
        steps = {ensemble: t, **children.get(tid, {})}
        try:
            stamps = [steps[m]["ts"][name] for m, name in TIMELINE]
        except KeyError:
            continue                                   # incomplete (the trace cut it at the end)
        row = {"start_ns": stamps[0], "end_ns": stamps[-1], "total_us": (stamps[-1] - stamps[0]) / 1e3,
               "rose": steps["rose"]}
        row.update({seg: (b - a) / 1e3 for seg, a, b in zip(SEGMENTS, stamps, stamps[1:])})
        out.append(row)
    return out


def read_marks_file(path: Path) -> list[list]:
    """One StageClock marks file: [[stage, ns], ...] per request."""
    return [json.loads(line)["marks"] for line in Path(path).read_text().splitlines() if line.strip()]


def read_marks(folder: Path, model: str) -> list[list]:
    """Every request's stage-clock marks of `model`'s instances: [[stage, ns], ...] per request."""
    return [m for f in sorted(folder.glob(f"{model}_*.marks.jsonl")) for m in read_marks_file(f)]


def add_stage_durations(row: dict, marks: list, name: str) -> None:
    """row["<name>:<stage>"] += the us from each mark to the next (a stage named twice adds up)."""
    for (_, t0), (stage, t1) in zip(marks, marks[1:]):
        row[f"{name}:{stage}"] = row.get(f"{name}:{stage}", 0.0) + (t1 - t0) / 1e3


def join_marks(rows: list[dict], marks: list[list], name: str) -> int:
    """Put each rose request's stage durations (us) into the row whose rose execute() holds its
    "received" mark, as "<name>:<stage>", and the time from its "sent" mark to the ensemble's end
    as "<name>:sent_to_ensemble_end"; returns how many rows got one."""
    starts = np.array([m[0][1] for m in marks], dtype=np.int64)
    order = np.argsort(starts)
    starts = starts[order]
    joined = 0
    for row in rows:
        ts = row["rose"]["ts"]
        i = int(np.searchsorted(starts, ts["COMPUTE_START"]))
        if i < len(starts) and starts[i] <= ts["COMPUTE_END"]:
            m = marks[order[i]]
            add_stage_durations(row, m, name)
            if m[-1][0] == "sent":
                row[f"{name}:sent_to_ensemble_end"] = (row["end_ns"] - m[-1][1]) / 1e3
            joined += 1
    return joined


def compare_bands(rows: list[dict], key: str = "total_us") -> dict:
    """Mean of every numeric field for rows at or below the median of `key` and for the slowest 1%."""
    if not rows:
        return {}
    totals = np.array([r[key] for r in rows])
    p50, p99 = np.percentile(totals, 50), np.percentile(totals, 99)
    bands = {"median_and_below": [r for r in rows if r[key] <= p50], "slowest_1pct": [r for r in rows if r[key] >= p99]}
    fields = [k for k in rows[0] if isinstance(rows[0][k], float)]
    fields += sorted({k for r in rows for k in r if ":" in k and k not in fields})
    out = {"n": {b: len(v) for b, v in bands.items()}, "p50_us": round(float(p50), 1), "p99_us": round(float(p99), 1),
           "p99_over_p50": round(float(p99 / p50), 3), "mean_us": {}}
    for f in fields:
        out["mean_us"][f] = {b: round(float(np.mean([r[f] for r in v if f in r])), 1) if any(f in r for r in v)
                             else None for b, v in bands.items()}
    return out


def batch_sizes(marks: list[list]) -> dict:
    """Requests per forward pass, from rose's marks (a batch's pieces share one "scheduled" time)."""
    at = [dict(m).get("scheduled") for m in marks]
    _, counts = np.unique(np.array([t for t in at if t is not None]), return_counts=True)
    if counts.size == 0:
        return {}
    return {"batches": int(counts.size), "mean_requests": round(float(counts.mean()), 2),
            "p50_requests": float(np.percentile(counts, 50)), "max_requests": int(counts.max()),
            "share_of_requests_in_batches_of_1": round(float((counts == 1).sum() / counts.sum()), 3)}


def marks_bands(marks: list[list], skip_batches: int = 0) -> dict:
    """rose's own time per request (first mark to last) from its marks alone, median and below
    against the slowest 1%, stage by stage; `skip_batches`: leave out the first batches (a warm-up)."""
    if skip_batches:
        formed = sorted({dict(m)["scheduled"] for m in marks if "scheduled" in dict(m)})
        cut = formed[min(skip_batches, len(formed) - 1)]
        marks = [m for m in marks if dict(m).get("scheduled", -1) >= cut]
    rows = []
    for m in marks:
        row = {"total_us": (m[-1][1] - m[0][1]) / 1e3}
        add_stage_durations(row, m, "rose")
        rows.append(row)
    return compare_bands(rows)


def main(argv=None) -> int:
    """python -m rose_bench.trace_join MARKS.jsonl [--skip-batches N]: marks_bands of one file."""
    import argparse
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("marks")
    ap.add_argument("--skip-batches", type=int, default=0)
    args = ap.parse_args(argv)
    print(json.dumps(marks_bands(read_marks_file(args.marks), args.skip_batches), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
