#!/usr/bin/env bash
# Is the p99 tail of the concurrency workload lazy graph capture? BGE-M3 shape, rose only, the
# concurrency workload in full mode (2000 requests a cell), once as deployed (graphs captured
# lazily, on a configuration's second sight) and once with every configuration that 1..16
# 512-word texts (514 tokens each) can form captured at start-up (rose parameter precapture).
#   bash benchmarks/gpu/concurrency_precapture.sh COMMIT      (from the repository root, $OUT set)
set -u
COMMIT=${1:-unknown}
source benchmarks/gpu/enter_bench.sh
KEYS=1:576,2:1280,4:1792,4:2304,8:2816,8:3328,8:3840,8:4352,16:4864,16:5376,16:5888,16:6400,16:6912,16:7424,16:7936,16:8448
for run in lazy precaptured; do
  extra=(); [ $run = precaptured ] && extra=(--rose-param "precapture=$KEYS")
  timeout 200 python3 -m rose_client.bench --mode full --model bge-m3 --systems rose --workloads concurrency \
    --no-perf-analyzer --no-charts --out /tmp/res/$run --workdir /tmp/b-$run --budget-s 180 --git-commit $COMMIT \
    "${extra[@]}" > $OUT/concurrency_$run.log 2>&1; echo "$run rc=$?"
  grep "\[bench" $OUT/concurrency_$run.log | tail -6
done
tar -C /tmp/res -cf $OUT/results.tar .
