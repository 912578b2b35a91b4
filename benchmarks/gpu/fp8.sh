#!/usr/bin/env bash
# dtype=fp8 on the GPU, after precompile.sh on the same host:
#   source .gpu/enter.sh && bash benchmarks/gpu/fp8.sh COMMIT [test,accuracy,engine,e2e]
# test      tests/gpu/test_fp8_gpu.py
# accuracy  rose_bench fp8-accuracy: all-MiniLM-L6-v2's real weights ($MINILM, default
#           /tmp/stage/minilm) and the two benchmark shapes' random folders over 10,000 sentences
# engine    rose_bench engine --fp8-min-tokens 1 per shape: each configuration's device time, bf16
#           beside FP8 (the data fp8_min_tokens is chosen from)
# e2e       rose_bench e2e --quick, rose only, online and bulk workloads, bf16 then dtype=fp8
#           (model bge-m3-fp8 / pplx-embed-fp8), per shape
# Results under $OUT/fp8/ (JSON), logs beside them; a summary line per step. ATTENTION=torch_varlen
# (the default here) runs one attention backend in every engine and server: nothing to JIT-compile on
# a fresh host, and the bf16 / fp8 comparison is about the projections; ATTENTION=auto: the engine's choice.
set -u
source benchmarks/gpu/enter_bench.sh || { echo "fp8: the GPU kit did not set up"; exit 1; }
COMMIT=${1:?usage: fp8.sh COMMIT [accuracy,engine,e2e]}
STEPS=${2:-test,accuracy,engine,e2e}
OUT=${OUT:-/tmp/out}
PRE=${PRE:-/tmp/rose-precompiled}
R=$OUT/fp8
ATTENTION=${ATTENTION:-torch_varlen}
att=(); eatt=(); [ "$ATTENTION" != auto ] && att=(--attention "$ATTENTION") && eatt=(--rose-param "attention=$ATTENTION")
mkdir -p "$R"
[ -f "$PRE/cache_env.sh" ] && source "$PRE/cache_env.sh" || echo "fp8: no $PRE/cache_env.sh: kernels compile as they are first used"
step() { case ",$STEPS," in *",$1,"*) return 0;; *) return 1;; esac; }
if step test; then
  t0=$(date +%s)
  timeout 240 python3 -m pytest tests/gpu/test_fp8_gpu.py -q -p no:cacheprovider > "$R/test.log" 2>&1
  echo "== tests/gpu/test_fp8_gpu.py rc=$? in $(( $(date +%s) - t0 )) s"; tail -n 15 "$R/test.log"
fi
if step accuracy; then
  t0=$(date +%s)
  timeout 300 python3 -m rose_bench fp8-accuracy --minilm "${MINILM:-/tmp/stage/minilm}" --git-commit "$COMMIT" \
    "${att[@]}" --out "$R/fp8-accuracy-h200.json" > "$R/accuracy.log" 2>&1
  echo "== accuracy rc=$? in $(( $(date +%s) - t0 )) s"; tail -n 6 "$R/accuracy.log"
fi
if step engine; then
  for SHAPE in bge-m3 pplx-embed; do
    t0=$(date +%s)
    timeout 240 python3 -m rose_bench engine --shape "$SHAPE" --fp8-min-tokens 1 --skip-memory "${att[@]}" \
      --out "$R/engine-$SHAPE-h200.json" > "$R/engine-$SHAPE.log" 2>&1
    echo "== engine $SHAPE rc=$? in $(( $(date +%s) - t0 )) s"
    python3 - "$R/engine-$SHAPE-h200.json" <<'PY' || tail -n 5 "$R/engine-$SHAPE.log"
import json, sys
d = json.load(open(sys.argv[1]))
for a, b in zip(d["configs"], d["fp8_configs"]):
    print(f"{a['config']:>8}: graph bf16 {a['device_ms_graph']:.3f} ms, fp8 {b['device_ms_graph']:.3f} ms "
          f"({a['device_ms_graph'] / b['device_ms_graph']:.2f}x); fp8 1-cos vs unpadded eager {b['one_minus_cos_vs_unpadded_eager']}")
PY
  done
fi
if step e2e; then
  for SHAPE in ${SHAPES:-bge-m3 pplx-embed}; do
    for V in bf16 fp8; do
      extra=(); [ "$V" = fp8 ] && extra=(--label "$SHAPE-fp8" --rose-param dtype=fp8)
      t0=$(date +%s)
      timeout 280 python3 -m rose_bench e2e --quick --model "$SHAPE" --systems rose --workloads online,throughput \
        --no-charts --no-perf-analyzer --git-commit "$COMMIT" --out "$R/e2e" --workdir "/tmp/rose-bench-$SHAPE" \
        "${eatt[@]}" "${extra[@]}" > "$R/e2e-$SHAPE-$V.log" 2>&1
      echo "== e2e $SHAPE $V rc=$? in $(( $(date +%s) - t0 )) s"
      grep -E "gate|: online|: throughput|ERROR|Error" "$R/e2e-$SHAPE-$V.log" | tail -n 6
    done
  done
fi
