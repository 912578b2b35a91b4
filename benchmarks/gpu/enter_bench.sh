# Sourced from the repository root by the GPU scripts beside it (see README.md here):
#   source benchmarks/gpu/enter_bench.sh
# It sources the GPU kit's .gpu/enter.sh where one exists (hosts that reach no package registry get
# their tools as that folder); elsewhere the tools are already installed and on PATH. Then: a numpy<2
# for the Triton Python stub where the kit packed one (see add_stub_numpy.sh; rose_bench e2e leaves
# it out of the naive server's environment), and the project on PYTHONPATH.
[ -f .gpu/enter.sh ] && source .gpu/enter.sh
# tritonclient.grpc imports python-rapidjson; where the kit left out its wheel (to keep the kit
# small), the standard json module stands in (loads / dumps are all it uses here)
if [ -n "${GPU_SITE:-}" ] && ! python3 -c "import rapidjson" 2>/dev/null; then
  echo "from json import *" > "$GPU_SITE/rapidjson.py"
fi
if [ -f .gpu/stub-numpy.tar.xz ]; then
  mkdir -p /tmp/stub-site && xz -dc .gpu/stub-numpy.tar.xz | tar -xf - -C /tmp/stub-site
  export ROSE_STUB_SITE=/tmp/stub-site
fi
# the gateway's wheels where they were carried in .whl/, downloaded (Python 3.12) on a machine with a registry:
#   pip download -d .whl --only-binary=:all: --python-version 3.12 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 starlette==0.47.3 uvicorn==0.35.0 httptools==0.6.4 uvloop==0.21.0 \
#     orjson==3.11.3 prometheus_client==0.22.1
if [ -d .whl ] && ! python3 -c "import starlette, uvicorn, httptools, orjson, prometheus_client" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps .whl/*.whl
fi
export PYTHONPATH=$PWD:$PWD/ensemble:$PWD/client:$PWD/gateway:$PWD/benchmarks:${PYTHONPATH:-}
