#!/bin/bash
# On a GPU host (see benchmarks/gpu/README.md), from the repository root: attention sweep (its JSON
# is what rose_backend/engine/attention_table.json is made from), the engine GPU tests, engine benchmark.
#   bash benchmarks/gpu_all.sh          # SKIP_SWEEP=1, SWEEP_ARGS, TESTS, BENCH_ARGS and *_S limits: see below
# Logs and JSON under $OUT. The MiniLM real-weights test needs ROSE_GPU_MINILM_DIR (skipped here).
[ -f .gpu/enter.sh ] && source .gpu/enter.sh
set -o pipefail
export PYTHONPATH=.:benchmarks:$PYTHONPATH PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv > $OUT/env.txt 2>&1
date -u >> $OUT/env.txt; echo "exclude=$ROSE_ATTENTION_EXCLUDE" >> $OUT/env.txt
[ "${SKIP_SWEEP:-}" ] || timeout ${SWEEP_S:-170} python3 -m rose_bench attention-sweep --out $OUT/attention_sweep.json $SWEEP_ARGS 2>&1 | tee $OUT/sweep.log
ROSE_GPU_SKIP_MINILM=1 timeout ${TESTS_S:-200} python3 -m pytest ${TESTS:-tests/gpu/test_engine_gpu.py} -q -s -p no:cacheprovider 2>&1 | tee $OUT/gpu_tests.log
timeout ${BENCH_S:-150} python3 -m rose_bench engine --out $OUT/engine_bench.json ${BENCH_ARGS:---unfused} 2>&1 | tee $OUT/bench.log
