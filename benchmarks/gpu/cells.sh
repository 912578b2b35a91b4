#!/usr/bin/env bash
# The cells guard on one GPU host, one shape per command (the kernels compiled once into $PRE):
#   source .gpu/enter.sh && bash benchmarks/gpu/cells.sh guard MODEL COMMIT [ARGS...]
#   source .gpu/enter.sh && bash benchmarks/gpu/cells.sh ab MODEL COMMIT "NAME:SETTINGS;NAME:SETTINGS" [ARGS...]
# guard: `rose_bench cells --model MODEL` (every cell, two reps) -> $OUT/cells/cells_MODEL.json, compared
#   with benchmarks/results/cells/MODEL-h200.json where that exists (exit 1: a cell worse beyond its noise).
# ab: one deployment per variant (rose_bench tail's syntax, e.g. "lane-off:rose.interactive_stream=off"),
#   each running the cells ARGS names (e.g. --cells openai,embed-512), in the order given
#   -> $OUT/cells/cells_MODEL-NAME.json, each compared with the first variant's.
# Precompiles both benchmark shapes first where $PRE holds no kernels (benchmarks/gpu/precompile.sh).
set -u
MODE=$1 MODEL=$2 COMMIT=$3
shift 3
source benchmarks/gpu/enter_bench.sh || { echo "cells: the GPU kit did not set up"; exit 1; }
OUT=${OUT:-/tmp/out}
PRE=${PRE:-/tmp/rose-precompiled}
[ -f "$PRE/cache_env.sh" ] || PRE=$PRE bash benchmarks/gpu/precompile.sh "$MODEL" || exit 1
source "$PRE/cache_env.sh"
BASE=benchmarks/results/cells/$MODEL-h200.json
case $MODE in
  guard)
    python3 -m rose_bench cells --model "$MODEL" --out "$OUT/cells" --workdir /tmp/rose-cells --git-commit "$COMMIT" \
      $([ -f "$BASE" ] && echo --baseline "$BASE") "$@" ;;
  ab)
    VARIANTS=$1
    shift
    first=""
    IFS=';' read -ra list <<<"$VARIANTS"
    for v in "${list[@]}"; do
      name=${v%%:*}
      python3 -m rose_bench cells --model "$MODEL" --out "$OUT/cells" --workdir /tmp/rose-cells --git-commit "$COMMIT" \
        --variant "$v" --label "$MODEL-$name" \
        $([ -n "$first" ] && echo --baseline "$OUT/cells/cells_$MODEL-$first.json") "$@"
      [ -z "$first" ] && first=$name
    done ;;
  *) echo "cells: MODE is guard or ab, got $MODE"; exit 2 ;;
esac
