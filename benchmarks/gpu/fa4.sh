#!/usr/bin/env bash
# FlashAttention 4 (the flash-attn-4 package, CuTe DSL kernels) on a CUDA host, measured like the other
# attention backends:
#   bash benchmarks/gpu/fa4.sh [install,test,suite,sweep,engine]
# install  the wheels in $FA4_WHEELS (default .whl-fa4) into /tmp/fa4-site, where pip cannot reach a
#          registry (elsewhere: pip install flash-attn-4 nvidia-cutlass-dsl[cu13]). A wheel too large for one
#          transfer may come as NAME.whl.part-* pieces, here or in /tmp/fa4-parts (joined in name order).
# test     tests/gpu/test_engine_gpu.py (every backend against float32, eager and graph-planned, then the
#          BGE-M3-shaped engine with FA4 forced: the other CUDA backends excluded) and
#          tests/gpu/test_qwen3_gpu.py (each backend through eager, capture and replay)
# suite    the whole GPU suite (gpu_suite.sh: precompile, then tests/gpu, servers included) with FA4
#          forced: the other CUDA backends excluded everywhere, the servers' engines too. Needs the GPU
#          kit (or Triton and flashinfer installed) beside the FA4 wheels.
# sweep    rose_bench attention-sweep: FA4 beside the backends present, every cell captured in a CUDA
#          graph; the table goes to $OUT/fa4/, not over rose_backend/engine/attention_table.json
# engine   rose_bench engine per shape (bge-m3, pplx-embed), flash_attn4 then torch_varlen: graph times
#          of the whole forward
# Results and logs under $OUT/fa4/; a summary line per step. Downloading the wheels (a machine with PyPI):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
#     --platform manylinux_2_24_x86_64 -d .whl-fa4 flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 \
#     nvidia-cutlass-dsl-libs-base==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 \
#     quack-kernels==0.6.5 apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5
# (cuda-bindings, einops, protobuf and typing-extensions are the host's own here.)
set -u
STEPS=${1:-install,test,sweep,engine}
OUT=${OUT:-/tmp/out}
R=$OUT/fa4
WHEELS=${FA4_WHEELS:-.whl-fa4}
SITE=/tmp/fa4-site
mkdir -p "$R"
step() { case ",$STEPS," in *",$1,"*) return 0;; *) return 1;; esac; }
[ -f benchmarks/gpu/enter_bench.sh ] && source benchmarks/gpu/enter_bench.sh
if step install; then
  t0=$(date +%s)
  mkdir -p /tmp/fa4-parts
  for part in "$WHEELS"/*.whl.part-*; do [ -e "$part" ] && cp "$part" /tmp/fa4-parts/; done
  for first in /tmp/fa4-parts/*.whl.part-aa; do
    [ -e "$first" ] || continue
    whl=${first%.part-aa}
    cat "$whl".part-* > "$WHEELS/$(basename "$whl")"
  done
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl \
    > "$R/install.log" 2>&1
  echo "== install rc=$? in $(( $(date +%s) - t0 )) s"; tail -n 3 "$R/install.log"
fi
# --target does not run the cutlass package's .pth (it puts dsl_packages on sys.path): done here
export PYTHONPATH=$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages:${PYTHONPATH:-}
t0=$(date +%s)
python3 -c "import flash_attn.cute, cutlass; print('flash_attn.cute', flash_attn.cute.__version__, 'cutlass', cutlass.__version__)" \
  2>&1 | tail -n 3
echo "== import in $(( $(date +%s) - t0 )) s"
OTHERS=torch_varlen,flashinfer,flashinfer_fa3
if step test; then
  t0=$(date +%s)
  timeout 420 env ROSE_GPU_PRECOMPILE=0 python3 -m pytest -q -p no:cacheprovider -rA \
    tests/gpu/test_engine_gpu.py::test_backends_match_reference tests/gpu/test_qwen3_gpu.py > "$R/test.log" 2>&1
  echo "== backends and qwen3 tests rc=$? in $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|PASSED|FAILED|Error" "$R/test.log" | tail -n 12
  t0=$(date +%s)
  timeout 300 env ROSE_GPU_PRECOMPILE=0 ROSE_ATTENTION_EXCLUDE=$OTHERS ROSE_GPU_BATCHES=${ROSE_GPU_BATCHES:-300} \
    python3 -m pytest -q -p no:cacheprovider -rA tests/gpu/test_engine_gpu.py::test_bge_m3_shape_random > "$R/test-forced.log" 2>&1
  echo "== BGE-M3 engine with FA4 forced rc=$? in $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|Error|1 - cos|worst" "$R/test-forced.log" | tail -n 6
fi
if step suite; then
  t0=$(date +%s)
  ROSE_ATTENTION_EXCLUDE=$OTHERS OUT=$R bash benchmarks/gpu/gpu_suite.sh > "$R/suite-forced.log" 2>&1
  echo "== GPU suite with FA4 forced rc=$? in $(( $(date +%s) - t0 )) s"; tail -n 30 "$R/suite-forced.log"
fi
if step sweep; then
  t0=$(date +%s)
  timeout 420 python3 -m rose_bench attention-sweep --out "$R/attention-sweep-h200.json" --table "$R/attention-table.json" \
    > "$R/sweep.log" 2>&1
  echo "== sweep rc=$? in $(( $(date +%s) - t0 )) s"; grep -E "first use|->|errors" "$R/sweep.log" | tail -n 80
fi
if step engine; then
  for SHAPE in bge-m3 pplx-embed; do
    for ATT in flash_attn4 torch_varlen; do
      t0=$(date +%s)
      timeout 240 python3 -m rose_bench engine --shape "$SHAPE" --skip-memory --attention "$ATT" \
        --out "$R/engine-$SHAPE-$ATT-h200.json" > "$R/engine-$SHAPE-$ATT.log" 2>&1
      echo "== engine $SHAPE $ATT rc=$? in $(( $(date +%s) - t0 )) s"; grep -E "graph|kernels per layer" "$R/engine-$SHAPE-$ATT.log" | head -n 8
    done
  done
fi
