#!/usr/bin/env bash
# Precompile the two benchmark shapes' kernels into one folder, as a Docker builder stage or a node's
# first boot does once:
#   source .gpu/enter.sh && bash benchmarks/gpu/precompile.sh [SHAPES]      (default: bge-m3 pplx-embed)
# `python -m rose_backend.launch.precompile --all-backends` for each shape's random-weight folder (written to
# $ROSE_GPU_TMP/serve-SHAPE), side by side, into $PRE (default /tmp/rose-precompiled). Then writes
# $PRE/cache_env.sh, which, sourced, points every compile cache at $PRE (supervision.cache_env's
# variables and ROSE_CACHE_DIR), so that later servers and benches on this host compile nothing.
# Logs under $OUT/precompile/; prints the time and each log's last lines; exits non-zero on a failure.
set -u
source benchmarks/gpu/enter_bench.sh || { echo "precompile: the GPU kit did not set up"; exit 1; }
OUT=${OUT:-/tmp/out}
PRE=${PRE:-/tmp/rose-precompiled}
W=${ROSE_GPU_TMP:-/tmp/rose-gpu}
L=$OUT/precompile
mkdir -p "$L" "$W" "$PRE"
unset FLASHINFER_WORKSPACE_BASE TRITON_CACHE_DIR TORCHINDUCTOR_CACHE_DIR CUDA_CACHE_PATH FLASHINFER_CUDA_ARCH_LIST
t0=$(date +%s.%N)
pids=()
for SHAPE in ${@:-bge-m3 pplx-embed}; do
  ( timeout 120 python3 -c "from rose_testing.folders import make_folder; make_folder('$SHAPE', '$W/serve-$SHAPE', device='cuda')" &&
    timeout 400 python3 -m rose_backend.launch.precompile --model "$W/serve-$SHAPE" --out "$PRE" --all-backends --jobs 8 ) \
    > "$L/precompile-$SHAPE.log" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
t1=$(date +%s.%N)
echo "== precompile rc=$rc in $(python3 -c "print(round($t1 - $t0, 1))") s (${*:-bge-m3 pplx-embed}, side by side)"
python3 -c "print(round($t1 - $t0, 1))" > "$L/seconds"
tail -n 3 "$L"/precompile-*.log
python3 -c "
import shlex
from rose_backend.launch.supervision import cache_env
for k, v in cache_env({'ROSE_CACHE_DIR': '$PRE'}).items():
    print(f'export {k}={shlex.quote(v)}')
print('export ROSE_CACHE_DIR=$PRE')
" > "$PRE/cache_env.sh"
exit $rc
