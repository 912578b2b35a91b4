#!/usr/bin/env bash
# The HTTP gateway's bench on a GPU host (benchmarks/RESULTS-http.md): p50 overhead over direct gRPC
# at one 128-token text, and 64 concurrent clients beside direct gRPC. Where the host reaches no
# package registry, the gateway's wheels (Python 3.12) go in .whl/ first, on a machine that does:
#   pip download -d .whl --only-binary=:all: --python-version 3.12 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 starlette==0.47.3 uvicorn==0.35.0 httptools==0.6.4 uvloop==0.21.0 \
#     orjson==3.11.3 prometheus_client==0.22.1 httpx==0.28.1
# Then, from the repository root with $OUT set (.whl/ copied along):
#   bash benchmarks/gpu/gateway.sh COMMIT
set -u
COMMIT=${1:-unknown}
source benchmarks/gpu/enter_bench.sh
[ -d .whl ] && PIP_FROM="--no-index --find-links .whl"
python3 -m pip install -q ${PIP_FROM:-} starlette==0.47.3 uvicorn==0.35.0 httptools==0.6.4 \
  uvloop==0.21.0 orjson==3.11.3 prometheus_client==0.22.1 httpx==0.28.1
export PYTHONPATH=$PWD/gateway:$PYTHONPATH
timeout 500 python3 -m rose_bench gateway --git-commit "$COMMIT" --out $OUT/gateway_bench.json \
  > $OUT/gateway_bench.log 2>&1; echo "rc=$?"
cat $OUT/gateway_bench.log
