#!/usr/bin/env bash
# One device call on nvidia-h200-x2 (2026-11-29, session 2): the one-server-two-instances layout of
# issue 8 after the per-thread CUDA device fix, the two-GPU engine test, then in parallel
# GPU 0: pplx-embed rose concurrency cells (issue 4) and naive pplx-embed throughput;
# GPU 1: the Qwen3 GPU suite and the qwen3 100x512 graph-replay number (issue 5).
# Run from the repository root with $OUT set:  bash benchmarks/gpu/remaining_x2.sh COMMIT
set -u
COMMIT=${1:-unknown}
source benchmarks/gpu/enter_bench.sh
timeout 120 python3 -m pytest tests/gpu/test_multi_gpu.py -q > $OUT/test_multi_gpu.log 2>&1; echo "test_multi_gpu rc=$?"
timeout 200 python3 -m rose_client.bench.multi_gpu --model bge-m3 --gpus 0,1 --layouts one-server \
  --out $OUT --budget-s 150 --keep-logs --git-commit $COMMIT > $OUT/multi_gpu_one_server.log 2>&1
echo "one-server rc=$?"
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 200 python3 -m pytest tests/gpu/test_qwen3_gpu.py -q > $OUT/test_qwen3_gpu.log 2>&1; echo "qwen3 tests rc=$?"
  timeout 150 python3 benchmarks/qwen3_bench.py --kernels flashinfer --out $OUT > $OUT/qwen3_bench.log 2>&1; echo "qwen3 bench rc=$?"
) &
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 200 python3 -m rose_client.bench --quick --model pplx-embed --systems rose --workloads concurrency \
    --no-perf-analyzer --no-charts --out $OUT/pplx-rose --workdir /tmp/b-rose --budget-s 150 --git-commit $COMMIT \
    > $OUT/pplx_rose_concurrency.log 2>&1; echo "pplx rose rc=$?"
  timeout 120 python3 -m rose_client.bench --quick --model pplx-embed --systems naive \
    --workloads throughput --no-perf-analyzer --no-charts --out $OUT/pplx-naive --workdir /tmp/b-naive \
    --budget-s 100 --git-commit $COMMIT > $OUT/pplx_naive_throughput.log 2>&1; echo "pplx naive rc=$?"
) &
wait
