#!/usr/bin/env bash
# The GPU suite from a precompiled folder, timed, as on a fresh GPU host:
#   source .gpu/enter.sh && bash benchmarks/gpu/gpu_suite.sh [PYTEST ARGS]       (default: tests/gpu)
# 1. `python -m rose_backend.precompile --all-backends` for the two benchmark shapes (bge-m3 and
#    pplx-embed random-weight folders; Qwen3-Embedding shares pplx-embed's heads) into $PRE
#    (default /tmp/rose-precompiled), side by side: what a Docker builder stage or a node's first
#    boot does once. Timed on its own.
# 2. The suite with every compile cache in $PRE (ROSE_CACHE_DIR and supervision.cache_env's
#    variables exported; ROSE_GPU_PRECOMPILED=$PRE for tests/gpu/test_precompile_gpu.py). Timed:
#    this is the number the suite's time goal is about.
# Logs under $OUT/gpu-suite/; a summary line per step; $OUT/gpu-suite/times.json.
set -u
source benchmarks/gpu/enter_bench.sh || { echo "gpu_suite: the GPU kit did not set up"; exit 1; }
OUT=${OUT:-/tmp/out}
PRE=${PRE:-/tmp/rose-precompiled}
W=${ROSE_GPU_TMP:-/tmp/rose-gpu}
L=$OUT/gpu-suite
mkdir -p "$L" "$W"
unset FLASHINFER_WORKSPACE_BASE TRITON_CACHE_DIR TORCHINDUCTOR_CACHE_DIR CUDA_CACHE_PATH FLASHINFER_CUDA_ARCH_LIST
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader | tee "$L/gpu.txt"
t0=$(date +%s.%N)
pids=()
for SHAPE in bge-m3 pplx-embed; do
  ( timeout 120 python3 -c "from rose_testing.folders import make_folder; make_folder('$SHAPE', '$W/serve-$SHAPE', device='cuda')" &&
    timeout 400 python3 -m rose_backend.precompile --model "$W/serve-$SHAPE" --out "$PRE" --all-backends --jobs 8 ) \
    > "$L/precompile-$SHAPE.log" 2>&1 &
  pids+=($!)
done
rc_pre=0
for p in "${pids[@]}"; do wait "$p" || rc_pre=$?; done
t1=$(date +%s.%N)
echo "== precompile rc=$rc_pre in $(python3 -c "print(round($t1 - $t0, 1))") s (both shapes side by side)"
tail -n 3 "$L"/precompile-*.log
eval "$(python3 -c "
import shlex
from rose_backend.launch.supervision import cache_env
for k, v in cache_env({'ROSE_CACHE_DIR': '$PRE'}).items():
    print(f'export {k}={shlex.quote(v)}')
")"
export ROSE_GPU_PRECOMPILED=$PRE ROSE_GPU_SKIP_MINILM=${ROSE_GPU_SKIP_MINILM:-1}
t2=$(date +%s.%N)
timeout ${SUITE_S:-420} python3 -m pytest "${@:-tests/gpu}" -q -p no:cacheprovider -rs --durations=12 \
  > "$L/suite.log" 2>&1
rc_suite=$?
t3=$(date +%s.%N)
suite_s=$(python3 -c "print(round($t3 - $t2, 1))")
echo "== suite rc=$rc_suite in $suite_s s"
grep -E "passed|failed|error|SKIPPED|flashinfer precompile" "$L/suite.log" | tail -12
sed -n '/slowest/,/^$/p' "$L/suite.log" | head -16
python3 - "$L/times.json" <<EOF
import json, subprocess, sys
from datetime import datetime, timezone
json.dump({"precompile_s": round($t1 - $t0, 1), "precompile_rc": $rc_pre, "suite_s": $suite_s, "suite_rc": $rc_suite,
           "pytest_args": "${*:-tests/gpu}", "gpu": open("$L/gpu.txt").read().strip(),
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}, open(sys.argv[1], "w"), indent=1)
EOF
exit $rc_suite
