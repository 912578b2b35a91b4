#!/usr/bin/env bash
# NVIDIA perf_analyzer against a running server, gRPC streaming (`rose` and `embed` are decoupled).
#   benchmarks/perf_analyzer.sh [GRPC_URL] [INPUT_JSON] [extra perf_analyzer args...]
# The model follows the input file: token ids (INPUT_IDS) go to `rose`, texts (TEXT) to `embed`
# (benchmarks/inputs/embed_1x128w.json: one 128-word text); $MODEL_NAME overrides it.
#   benchmarks/perf_analyzer.sh 127.0.0.1:8001 --concurrency-range 1:8   ($API_KEY: the deployment's, if it has one)
# Defaults: 127.0.0.1:8001 and benchmarks/inputs/rose_1x128.json (one 128-token sequence). The first
# argument that starts with "-" and everything after it go to perf_analyzer as they are.
# perf_analyzer ships in the tritonclient==2.51.0 wheel; it links libb64.so.0d and libcudart.so.12,
# which the nvidia-pytriton wheel carries under other names: they are linked into a private folder.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
URL=127.0.0.1:8001
INPUT=$HERE/inputs/rose_1x128.json
if [ $# -gt 0 ] && [[ $1 != -* ]]; then URL=$1; shift; fi
if [ $# -gt 0 ] && [[ $1 != -* ]]; then INPUT=$1; shift; fi
[ -f "$INPUT" ] || { echo "perf_analyzer.sh: input data file $INPUT not found" >&2; exit 2; }
PY=${PY:-$HERE/../.venv/bin/python}
PA=$(command -v perf_analyzer || echo "$(dirname "$PY")/perf_analyzer")
# (grep reads all of ldd's output: with -q it may exit first, and under pipefail ldd's SIGPIPE then
# made the test read "nothing missing" at random)
if ldd "$PA" | grep "not found" >/dev/null; then
  LIBS=$("$PY" -c "import importlib.util,pathlib;print(pathlib.Path(importlib.util.find_spec('pytriton').submodule_search_locations[0]).parent/'nvidia_pytriton.libs')")
  # each link is made under a temporary name and renamed over the old one, so that another run at
  # the same time (another checkout's tests) never finds it missing
  PALIB=${XDG_CACHE_HOME:-$HOME/.cache}/rose/palib; mkdir -p "$PALIB"
  ln -sf "$LIBS"/libb64-*.so.0d "$PALIB/.b64.$$" && mv -f "$PALIB/.b64.$$" "$PALIB/libb64.so.0d"
  ln -sf "$LIBS"/libcudart-*.so.12* "$PALIB/.cudart.$$" && mv -f "$PALIB/.cudart.$$" "$PALIB/libcudart.so.12"
  export LD_LIBRARY_PATH="$PALIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
SHAPES=$("$PY" -c "import json,sys;d=json.load(open(sys.argv[1]))['data'][0];print(' '.join(f'--shape {k}:{v[\"shape\"][0]}' for k,v in d.items()))" "$INPUT")
MODEL_NAME=${MODEL_NAME:-$("$PY" -c "import json,sys;d=json.load(open(sys.argv[1]))['data'][0];print('embed' if 'TEXT' in d else 'rose')" "$INPUT")}
# the deployment's API key, from the environment, if it has one (perf_analyzer reads the model's
# metadata and config, which Triton serves to whoever may infer)
KEYS=()
[ -n "${API_KEY:-}" ] && KEYS+=(-H "triton-grpc-protocol-api-key:$API_KEY")
exec "$PA" -m "$MODEL_NAME" -i grpc --streaming -u "$URL" --input-data "$INPUT" $SHAPES ${KEYS[@]+"${KEYS[@]}"} \
  --measurement-interval 5000 --percentile=99 --stability-percentage=50 -r 30 "$@"
