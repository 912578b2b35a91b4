#!/usr/bin/env bash
# Cold start from precompiled kernels on a fresh H200, both benchmark shapes in one device command:
#   run(command="source .gpu/enter.sh && bash benchmarks/gpu/cold_start.sh COMMIT", carry=[".gpu"])
# For bge-m3 and pplx-embed (random-weight folders at the real shapes, made on the GPU as
# rose_bench readiness --shape makes them):
#   (a) python -m rose_backend.launch.precompile --model <folder> --out /tmp/rose-precompiled, timed;
#   (b) with the machine's own caches empty (~/.cache, ~/.triton and ~/.nv moved aside, put back on
#       exit) and ROSE_CACHE_DIR=/tmp/rose-precompiled, one server launch: launch -> READY, then the
#       first request of each shape against its steady p50 (python -m rose_bench readiness --cache-dir:
#       the folder is never emptied). Shapes in rose_bench readiness's SEQSxTOTAL-TOKENS notation: 1x64,
#       1x512, 8x4096 (8 x 512) and 100x51200 (100 x 512, the scoring / throughput request).
# Results under $OUT/readiness/: <shape>-h200.json (model, cache, precompiled, ready_s,
# first_request_ms, steady_p50_ms, commit, date) and <shape>-precompile.json (what was built, how
# long each part took); the logs in $OUT/readiness-logs.tar.xz (few files: the device returns a few).
# Baseline without precompiling (known, not re-run): READY after 127 s (bge-m3), 144 s (pplx-embed).
set -u
COMMIT=${1:-unknown}
SHAPES=${SHAPES:-bge-m3 pplx-embed}
source benchmarks/gpu/enter_bench.sh || { echo "cold_start: the GPU kit did not set up"; exit 1; }
[ -d /tmp/stub-site/numpy ] || { echo "cold_start: no stub numpy (.gpu/stub-numpy.tar.xz: benchmarks/gpu/add_stub_numpy.sh)"; exit 1; }
PRE=/tmp/rose-precompiled
W=/tmp/rose-cold-start
R=$OUT/readiness
L=$W/logs
rm -rf "$PRE" "$W"                  # the precompile starts from nothing, as on a fresh machine
mkdir -p "$R" "$L"
# every compile cache follows ROSE_CACHE_DIR (rose_backend/launch/supervision.py cache_env)
unset ROSE_CACHE_DIR FLASHINFER_WORKSPACE_BASE TRITON_CACHE_DIR TORCHINDUCTOR_CACHE_DIR CUDA_CACHE_PATH \
  FLASHINFER_CUDA_ARCH_LIST XDG_CACHE_HOME
STASH=$(mktemp -d /tmp/cold-start-home.XXXX)
for d in .cache .triton .nv; do [ -e "$HOME/$d" ] && mv "$HOME/$d" "$STASH/"; done
restore() { for d in .cache .triton .nv; do [ -e "$STASH/$d" ] && rm -rf "${HOME:?}/$d" && mv "$STASH/$d" "$HOME/"; done; }
trap restore EXIT
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
t_all=$(date +%s)
for SHAPE in $SHAPES; do
  timeout 120 python3 -c "from rose_testing.folders import make_folder; make_folder('$SHAPE', '$W/$SHAPE', device='cuda')" \
    > "$L/$SHAPE-folder.log" 2>&1 || { echo "$SHAPE: the model folder was not made"; tail -5 "$L/$SHAPE-folder.log"; continue; }
  t0=$(date +%s.%N)
  timeout 300 python3 -m rose_backend.launch.precompile --model "$W/$SHAPE" --out $PRE > "$L/$SHAPE-precompile.log" 2>&1
  rc=$?
  echo "== $SHAPE: precompile rc=$rc in $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s"
  tail -12 "$L/$SHAPE-precompile.log"
  cp $PRE/precompile.json "$R/$SHAPE-precompile.json" 2>/dev/null
  [ $rc = 0 ] || continue
  echo "   files under ~/.cache before the launch: $(find "$HOME/.cache" -type f 2>/dev/null | wc -l)"
  timeout 240 python3 -m rose_bench readiness --shape "$SHAPE" --device cuda --workdir $W --cache-dir $PRE \
    --launches cold --shapes 1x64,1x512,8x4096,100x51200 --steady 20 --git-commit "$COMMIT" \
    --out "$R/$SHAPE-h200.json" > "$L/$SHAPE-readiness.log" 2>&1
  echo "   readiness rc=$?"
  tail -6 "$L/$SHAPE-readiness.log"
  cp $W/server-0-cold.log "$L/$SHAPE-server.log" 2>/dev/null
done
echo "cold_start: $(( $(date +%s) - t_all )) s in all; compile cache: $(du -sh $PRE | cut -f1)"
tar -C "$W" -cf - logs | xz -T0 > "$OUT/readiness-logs.tar.xz"
ps -ef | grep -E '[t]ritonserver|[t]riton_python_backend_stub' | head -3
