#!/usr/bin/env bash
# The GPU suite from a precompiled folder, timed, as on a fresh GPU host:
#   source .gpu/enter.sh && bash benchmarks/gpu/gpu_suite.sh [PYTEST ARGS]       (default: tests/gpu)
# 1. precompile.sh: the two benchmark shapes' kernels (bge-m3 and pplx-embed random-weight folders;
#    Qwen3-Embedding shares pplx-embed's heads) into $PRE (default /tmp/rose-precompiled), side by
#    side: what a Docker builder stage or a node's first boot does once. Timed on its own.
# 2. The suite with every compile cache in $PRE ($PRE/cache_env.sh sourced;
#    ROSE_GPU_PRECOMPILED=$PRE for tests/gpu/test_precompile_gpu.py). Timed:
#    this is the number the suite's time goal is about.
# Logs under $OUT/gpu-suite/; a summary line per step; $OUT/gpu-suite/times.json.
set -u
source benchmarks/gpu/enter_bench.sh || { echo "gpu_suite: the GPU kit did not set up"; exit 1; }
OUT=${OUT:-/tmp/out}
PRE=${PRE:-/tmp/rose-precompiled}
L=$OUT/gpu-suite
mkdir -p "$L"
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader | tee "$L/gpu.txt"
OUT=$OUT PRE=$PRE bash benchmarks/gpu/precompile.sh
rc_pre=$?
pre_s=$(cat "$OUT/precompile/seconds")
source "$PRE/cache_env.sh"
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
json.dump({"precompile_s": $pre_s, "precompile_rc": $rc_pre, "suite_s": $suite_s, "suite_rc": $rc_suite,
           "pytest_args": "${*:-tests/gpu}", "gpu": open("$L/gpu.txt").read().strip(),
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}, open(sys.argv[1], "w"), indent=1)
EOF
exit $rc_suite
