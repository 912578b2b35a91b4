#!/usr/bin/env bash
# The naive baseline's concurrency cells for both models, on token ids (its TEXT input is unreadable
# under the H200's numpy 2; see RESULTS.md). Run from the repository root with $OUT set:
#   bash benchmarks/gpu/naive_concurrency.sh COMMIT
set -u
COMMIT=${1:-unknown}
source benchmarks/gpu/enter_bench.sh
for model in bge-m3 pplx-embed; do
  timeout 200 python3 -m rose_client.bench --quick --model $model --systems naive --workloads concurrency \
    --no-perf-analyzer --no-charts --out /tmp/res/$model --workdir /tmp/b-$model --budget-s 150 --git-commit $COMMIT \
    > $OUT/naive_concurrency_$model.log 2>&1; echo "$model rc=$?"
  grep "\[bench" $OUT/naive_concurrency_$model.log | tail -6
done
tar -C /tmp/res -cf $OUT/results.tar .
