"""Where the host time of a request goes: timestamps at named stages, summarised per stage.

    clock = StageClock.from_env("rose")     # None unless $ROSE_STAGE_TIMES names a folder
    clock.mark(request, "received")         # first mark of a request
    clock.mark(request, "validated")        # ... each later mark closes the stage named by it
    clock.finish(request)                   # the request's stage durations join the samples
    clock.finish(request, "colbert")        # ... kept apart, as "colbert:<stage>" (one kind of request)
    clock.write()                           # <folder>/rose_<pid>.json: {stage: {"n", "p50_us", "p99_us", "mean_us"}}
                                            # and <folder>/rose_<pid>.marks.jsonl: each request's own marks,
                                            # {"group", "marks": [[stage, ns], ...]} a line (the last `keep_marks`)

A stage's duration is the time from the previous mark of the same request to its own mark, so the
stages of a request add up to its whole host path. Marks cost one perf_counter_ns() and a list
append; with the clock off (the default) the serving code skips them entirely. The marks are
CLOCK_MONOTONIC nanoseconds, the clock of Triton's trace timestamps, so a request's marks line up
with other processes' (rose_bench tail joins them to find where slow requests spend their time).
"""
from __future__ import annotations

import json
import os
import threading
import time
from collections import defaultdict, deque
from pathlib import Path

import numpy as np

from rose_backend import env_vars


class StageClock:
    def __init__(self, path: str | Path | None = None, keep: int = 200_000, keep_marks: int = 100_000):
        self.path = Path(path) if path else None
        self.samples: dict[str, deque[int]] = defaultdict(lambda: deque(maxlen=keep))
        self.requests: deque[tuple[str, list]] = deque(maxlen=keep_marks)   # (group, marks) per request
        self.order: list[str] = []                  # stage names in first-seen order
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls, name: str) -> "StageClock | None":
        folder = env_vars.ROSE_STAGE_TIMES.get()
        return cls(Path(folder) / f"{name}_{os.getpid()}.json") if folder else None

    @staticmethod
    def mark(holder, stage: str, at: int | None = None) -> None:
        """Record that `holder` (any object with a `marks` list attribute) reached `stage`."""
        holder.marks.append((stage, time.perf_counter_ns() if at is None else at))

    def mark_all(self, holders, marks) -> None:
        """Each of `holders` reached each (stage, ns) of `marks`, in order."""
        for stage, at in marks:
            for h in holders:
                h.marks.append((stage, at))

    def finish(self, holder, group: str = "") -> None:
        marks = holder.marks
        prefix = f"{group}:" if group else ""
        with self._lock:
            for (_, t0), (stage, t1) in zip(marks, marks[1:]):
                self._add(prefix + stage, t1 - t0)
            if len(marks) > 1:
                self._add(prefix + "total", marks[-1][1] - marks[0][1])
            self.requests.append((group, marks))
        holder.marks = []

    def _add(self, stage: str, ns: int) -> None:
        if stage not in self.samples:
            self.order.append(stage)
        self.samples[stage].append(ns)

    def summary(self) -> dict:
        with self._lock:
            out = {}
            for stage in self.order:
                a = np.fromiter(self.samples[stage], dtype=np.float64) / 1e3
                out[stage] = {"n": int(a.size), "p50_us": round(float(np.percentile(a, 50)), 1),
                              "p99_us": round(float(np.percentile(a, 99)), 1), "mean_us": round(float(a.mean()), 1)}
            return out

    def write(self) -> None:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(self.summary(), indent=1))
            with self._lock:
                lines = [json.dumps({"group": g, "marks": m}, separators=(",", ":")) for g, m in self.requests]
            self.path.with_suffix(".marks.jsonl").write_text("".join(line + "\n" for line in lines))
