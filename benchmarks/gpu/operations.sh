#!/usr/bin/env bash
# Readiness, soak and forced out-of-memory on one GPU (benchmarks/RESULTS-operations.md), in phases
# that each run under 10 minutes:
#   bash benchmarks/gpu/operations.sh readiness bge-m3      # launch -> READY, first request vs p50
#   bash benchmarks/gpu/operations.sh readiness pplx-embed
#   bash benchmarks/gpu/operations.sh soak pplx-embed [MINUTES]   # default 8 (fits when the cache is warm)
#   bash benchmarks/gpu/operations.sh oom pplx-embed        # forced out-of-memory: split and retry
# From the repository root with $OUT set, on a host set up as in benchmarks/gpu/README.md; the compile cache /tmp/rose-cache/<shape> is shared by
# the phases (the readiness phase's cold launch fills it, so the soak starts warm).
set -u
PHASE=$1; SHAPE=${2:-pplx-embed}; MINUTES=${3:-8}
source benchmarks/gpu/enter_bench.sh
export ROSE_CACHE_DIR=/tmp/rose-cache/$SHAPE
W=/tmp/rose-ops/$SHAPE
case $PHASE in
  readiness)
    timeout 590 python3 -m rose_bench readiness --shape $SHAPE --device cuda --workdir $W \
      --shapes 1x64,1x512,8x4096,32x16384 --variants default,none --steady 30 \
      --out $OUT/readiness_h200_$SHAPE.json > $OUT/readiness_$SHAPE.log 2>&1; echo "readiness rc=$?"
    mkdir -p $ROSE_CACHE_DIR && cp -r $W/cache-0/. $ROSE_CACHE_DIR/ 2>/dev/null
    tail -25 $OUT/readiness_$SHAPE.log ;;
  soak)
    timeout 595 python3 -m rose_bench soak --shape $SHAPE --minutes $MINUTES --clients 24 --workdir $W \
      --out $OUT/soak_h200_$SHAPE.json > $OUT/soak_$SHAPE.log 2>&1; echo "soak rc=$?"
    tail -20 $OUT/soak_$SHAPE.log ;;
  oom)
    timeout 590 python3 -m rose_bench soak --shape $SHAPE --oom-only --workdir $W \
      --out $OUT/oom_h200_$SHAPE.json > $OUT/oom_$SHAPE.log 2>&1; echo "oom rc=$?"
    grep -h "out of memory\|capped" $W/server-oom.log | head -5; tail -5 $OUT/oom_$SHAPE.log ;;
esac
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
ps -ef | grep -E '[t]ritonserver|[t]riton_python_backend_stub' | head; ls /dev/shm | grep rose_ | head
