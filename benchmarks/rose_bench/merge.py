"""Merge the systems of several bench JSON files of one model into one file (and redraw its charts).

    python -m rose_bench merge [--replace] OUT.json RUN_A.json RUN_B.json ...

A later file's system replaces an earlier one's where the earlier one failed or is missing (used when
one run measured `rose` and a later run, with a fix, measured `naive`). Where both passed,
a later file's cells fill the earlier one's missing, skipped or failed cells (a later run that ran
only the workloads an earlier one did not reach); with --replace, a later file's measured cells replace
the earlier ones too (cells measured again after a change). The merged file keeps every run's command,
date and git commit under "runs", and which run each replaced cell came from under "replaced".
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def _measured(cell) -> bool:
    return isinstance(cell, dict) and any(k in cell for k in ("emb_per_s", "p50_ms"))


def fill_cells(old: dict, new: dict, replace: bool = False) -> list[str]:
    """Copy `new`'s measured cells into `old` where `old` has none for that cell (or any, with
    `replace`); return the cells replaced."""
    replaced = []
    for section in ("workloads", "perf_analyzer"):
        for workload, cells in (new.get(section) or {}).items():
            into = old.setdefault(section, {}).setdefault(workload, {})
            for x, cell in cells.items():
                if _measured(cell) and (replace or not _measured(into.get(x))):
                    if _measured(into.get(x)):
                        replaced.append(f"{section}/{workload}/{x}")
                    into[x] = cell
    return replaced


def merge(paths: list[Path], replace: bool = False) -> dict:
    runs = [json.loads(p.read_text()) for p in paths]
    out = dict(runs[0])
    out["systems"] = {}
    out["runs"] = [run for r in runs for run in (r.get("runs") or [  # a merged input keeps its own runs
        {"command": r["command"], "date": r["date"], "git": r["git"], "systems": sorted(r["systems"])}])]
    for r in runs:
        if r["model"] != out["model"]:
            raise SystemExit(f"cannot merge {r['model']} into {out['model']}")
        for name, system in r["systems"].items():
            old = out["systems"].get(name)
            if old is None or old.get("error") or not (old.get("gate") or {}).get("passed"):
                out["systems"][name] = system
            elif (system.get("gate") or {}).get("passed") and not system.get("error"):
                for cell in fill_cells(old, system, replace):
                    out.setdefault("replaced", {})[f"{name}/{cell}"] = (r.get("git") or {}).get("commit")
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    replace = "--replace" in argv
    argv = [a for a in argv if a != "--replace"]
    if len(argv) < 3:
        print(__doc__)
        return 2
    result = merge([Path(p) for p in argv[1:]], replace)
    out = Path(argv[0])
    out.write_text(json.dumps(result, indent=1))
    try:
        from rose_bench import charts
        result["charts"] = [p.name for p in charts.charts(result, out.parent, prefix=f"{out.stem}-")]
        out.write_text(json.dumps(result, indent=1))
    except ImportError as e:  # matplotlib missing: the JSON is still written
        print(f"charts not drawn: {e}", file=sys.stderr)
    print(f"wrote {out} with systems {sorted(result['systems'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
