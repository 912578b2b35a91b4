#!/usr/bin/env bash
# The lone query before and after a change, on one GPU host and in one call: `rose_bench host-path`
# (perf_analyzer at concurrency 1 and the stage clock) for an earlier tree and for this one, the two
# model shapes, the same random-weight folders.
#   bash benchmarks/gpu/lone_query.sh BASE_DIR BASE_COMMIT THIS_COMMIT [MODELS] [LENGTHS]
# BASE_DIR: the earlier tree (e.g. `git archive <commit> | tar -x -C .base`); results under $OUT/before
# and $OUT/after (host_path.json each).
set -euo pipefail
BASE=$1 BASE_COMMIT=$2 THIS_COMMIT=$3 MODELS=${4:-bge-m3,pplx-embed} LENGTHS=${5:-128,512}
source benchmarks/gpu/enter_bench.sh
OUT=${OUT:-/tmp/lone-query}
measure() {   # tree, label, commit
  (cd "$1" && export PYTHONPATH=$PWD:$PWD/ensemble:$PWD/client:$PWD/gateway:$PWD/benchmarks:${GPU_SITE:-} &&
   python3 -m rose_bench host-path --out "$OUT/$2" --work /tmp/rose-lone-query --models "$MODELS" \
     --lengths "$LENGTHS" --embed-words 128 --clients 0 --interval-ms 1500 --git-commit "$3")
}
measure "$BASE" before "$BASE_COMMIT"
measure . after "$THIS_COMMIT"
