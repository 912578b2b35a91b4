#!/usr/bin/env bash
# The query lane on one GPU host, from a bare host to the committed lanes results, in steps that each
# fit one command of at most 10 minutes (the compiled kernels stay in $PRE between steps):
#   source .gpu/enter.sh && bash benchmarks/gpu/query_lane.sh overlap COMMIT [MODELS] [VARIANTS]
#   source .gpu/enter.sh && bash benchmarks/gpu/query_lane.sh lanes COMMIT MODEL [VARIANTS]
# overlap: precompiles both shapes' kernels if $PRE has none (benchmarks/gpu/precompile.sh), then
#   `rose_bench query-overlap`: a 1 x 128 query on the query lane's engine beside 32 x 512 bulk
#   batches, engine level, per variant of what the bulk batches run (default below: the defaults;
#   flashinfer's norm and SiLU-and-mul kernels without programmatic dependent launch; torch varlen;
#   fa2 for fa3; the main engine on a green context of 120 of the H200's 132 SMs), with a profiler
#   trace of each model's default. -> $OUT/overlap/query_overlap.json, $OUT/overlap/trace-*.json
# lanes: `rose_bench lanes` (servers through the launcher; 1 x 128 queries at 50/s beside 4 clients
#   pushing 100 x 512; READY per variant; default below: one stream, the defaults (the query lane),
#   the query lane with the main engine on 120 SMs) -> $OUT/lanes-MODEL/lanes.json
set -u
MODE=$1 COMMIT=$2
shift 2
source benchmarks/gpu/enter_bench.sh || { echo "query_lane: the GPU kit did not set up"; exit 1; }
OUT=${OUT:-/tmp/out}
PRE=${PRE:-/tmp/rose-precompiled}
[ -f "$PRE/cache_env.sh" ] || PRE=$PRE bash benchmarks/gpu/precompile.sh || exit 1
source "$PRE/cache_env.sh"
case $MODE in
  overlap)
    python3 -m rose_bench query-overlap --out "$OUT/overlap" --models "${1:-pplx-embed,bge-m3}" --seconds 4 --timeout 150 \
      --trace pplx-embed/default,bge-m3/default \
      --variants "${2:-default:;no-pdl:engine.flashinfer_pdl=off;varlen:engine.attention=torch_varlen;fa2:env.ROSE_ATTENTION_EXCLUDE=flashinfer_fa3;sms120:env.ROSE_MAIN_ENGINE_SMS=120}" \
      --git-commit "$COMMIT" ;;
  lanes)
    python3 -m rose_bench lanes --model "$1" --seconds 8 --warmup-s 3 --out "$OUT/lanes-$1" --work /tmp/rose-lanes \
      --variants "${2:-one-stream:rose.interactive_stream=off;defaults:;sms120:env.ROSE_MAIN_ENGINE_SMS=120}" \
      --git-commit "$COMMIT" ;;
  *) echo "query_lane: MODE is overlap or lanes, got $MODE"; exit 2 ;;
esac
