#!/usr/bin/env bash
# The HTTP gateway's bench on the H200 (issue 18): p50 overhead over direct gRPC at one 128-token text,
# and 64 concurrent clients beside direct gRPC. The device reaches no registry, so the gateway's
# wheels (Python 3.12) go in .whl/ first, on the CPU machine:
#   pip download -d .whl --only-binary=:all: --python-version 3.12 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 starlette==0.47.3 uvicorn==0.35.0 httptools==0.6.4 uvloop==0.21.0 \
#     orjson==3.11.3 prometheus_client==0.22.1 httpx==0.28.1
# Then, from the repository root with $OUT set (carry .whl):
#   bash benchmarks/gpu/gateway_bench.sh COMMIT
set -u
COMMIT=${1:-unknown}
source benchmarks/gpu/enter_bench.sh
python3 -m pip install -q --no-index --find-links .whl starlette==0.47.3 uvicorn==0.35.0 httptools==0.6.4 \
  uvloop==0.21.0 orjson==3.11.3 prometheus_client==0.22.1 httpx==0.28.1
export PYTHONPATH=$PWD/gateway:$PYTHONPATH
timeout 500 python3 benchmarks/gateway_bench.py --git-commit "$COMMIT" --out $OUT/gateway_bench.json \
  > $OUT/gateway_bench.log 2>&1; echo "rc=$?"
cat $OUT/gateway_bench.log
