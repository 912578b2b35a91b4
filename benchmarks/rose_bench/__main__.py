"""python -m rose_bench SUBCOMMAND [ARGS...]: see rose_bench's docstring for the subcommands."""
from __future__ import annotations

import importlib
import sys

import rose_bench

# subcommand -> module of rose_bench whose main(argv) runs it (imported only when chosen: the
# GPU benchmarks need torch and CUDA, merge and render-readme need neither)
SUBCOMMANDS = {
    "e2e": "e2e", "multi-gpu": "multi_gpu", "engine": "engine_bench",
    "attention-sweep": "attention_sweep", "merge": "merge", "render-readme": "render_readme",
    "charts": "charts", "perf-inputs": "perf", "forward-profile": "forward_profile",
    "host-path": "host_path", "tail": "tail",
    "lanes": "lanes", "http": "http", "tokenize": "tokenize_stage",
    "readiness": "readiness", "soak": "soak", "retrieval": "retrieval",
    "rerank": "rerank", "fp8-accuracy": "fp8_accuracy",
    "stub-recovery": "stub_recovery", "query-overlap": "query_overlap", "cells": "cells", "families": "families",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(rose_bench.__doc__)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"unknown subcommand {name!r}; one of: {', '.join(SUBCOMMANDS)}", file=sys.stderr)
        return 2
    # each subcommand records its own command line (sys.argv[1:]) and names itself in --help
    sys.argv = [f"python -m rose_bench {name}", *rest]
    return importlib.import_module(f"rose_bench.{SUBCOMMANDS[name]}").main(rest) or 0


if __name__ == "__main__":
    sys.exit(main())
