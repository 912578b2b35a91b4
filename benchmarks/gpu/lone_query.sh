#!/usr/bin/env bash
# The lone query, one tree or setting against another, on one GPU host in one call: `rose_bench
# host-path` (perf_analyzer at concurrency 1 and the stage clock) per variant, in the order given (a
# variant named twice runs twice: the spread between its runs is the host's noise), on the same
# random-weight folders.
#   bash benchmarks/gpu/lone_query.sh MODELS LENGTHS LABEL=TREE[:KEY=VALUE,...] ...
#   e.g. bash benchmarks/gpu/lone_query.sh bge-m3 128,512 before=.base exec=. sched=.:lone_answered_by=scheduler
# TREE: this checkout (.) or an earlier one (`git archive <commit> | tar -x -C .base`); KEY=VALUE: `rose`
# parameters. Results: $OUT/<label>[-<n>]/host_path.json; $COMMITS (LABEL=commit,...) is recorded in each;
# $CONCURRENCY (default 1): the perf_analyzer concurrencies of the `rose` runs, e.g. 1,2.
set -euo pipefail
MODELS=$1 LENGTHS=$2
shift 2
source benchmarks/gpu/enter_bench.sh
OUT=${OUT:-/tmp/lone-query}
declare -A seen
for variant in "$@"; do
  label=${variant%%=*} rest=${variant#*=}
  tree=${rest%%:*} params=""
  [[ $rest == *:* ]] && params=${rest#*:}
  n=$(( ${seen[$label]:-0} + 1 )); seen[$label]=$n
  dir=$label; [ "$n" -gt 1 ] && dir=$label-$n
  commit=$(tr ',' '\n' <<<"${COMMITS:-}" | sed -n "s/^$label=//p")
  args=()
  for kv in ${params//,/ }; do args+=(--rose-param "$kv"); done
  (cd "$tree" && export PYTHONPATH=$PWD:$PWD/ensemble:$PWD/client:$PWD/gateway:$PWD/benchmarks:${GPU_SITE:-} &&
   python3 -m rose_bench host-path --out "$OUT/$dir" --work /tmp/rose-lone-query --models "$MODELS" \
     --lengths "$LENGTHS" --concurrency "${CONCURRENCY:-1}" --embed-words 128 --clients 0 --interval-ms 1500 \
     --git-commit "${commit:-unknown}" \
     ${args[@]+"${args[@]}"})
done
