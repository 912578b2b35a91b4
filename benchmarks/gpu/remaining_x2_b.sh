#!/usr/bin/env bash
# Second device call on nvidia-h200-x2 (2026-11-29, session 2): the two-GPU engine test (fixed to
# use a random BGE-M3-shaped folder: the GPU machine has no default-model package), then in parallel
# GPU 0: every pplx-embed rose concurrency cell (issue 4; flashinfer JIT-compiles for ~2 minutes
# in a fresh machine first), GPU 1: naive pplx-embed throughput. JSON results come back as one tar.
#   bash benchmarks/gpu/remaining_x2_b.sh COMMIT
set -u
COMMIT=${1:-unknown}
source benchmarks/gpu/enter_bench.sh
timeout 150 python3 -m pytest tests/gpu/test_multi_gpu.py -q > $OUT/test_multi_gpu.log 2>&1; echo "test_multi_gpu rc=$?"
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 330 python3 -m rose_client.bench --quick --model pplx-embed --systems rose --workloads concurrency \
    --no-perf-analyzer --no-charts --out /tmp/res/pplx-rose --workdir /tmp/b-rose --budget-s 300 --git-commit $COMMIT \
    > $OUT/pplx_rose_concurrency.log 2>&1; echo "pplx rose rc=$?"
) &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 200 python3 -m rose_client.bench --quick --model pplx-embed --systems naive \
    --workloads throughput --no-perf-analyzer --no-charts --out /tmp/res/pplx-naive --workdir /tmp/b-naive \
    --budget-s 180 --git-commit $COMMIT > $OUT/pplx_naive_throughput.log 2>&1; echo "pplx naive rc=$?"
) &
wait
tar -C /tmp/res -cf $OUT/results.tar .
