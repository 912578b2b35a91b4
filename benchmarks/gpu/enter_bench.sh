# Sourced (from the repository root, on the device) by the device scripts beside it: the GPU kit,
# a numpy<2 for the Triton Python stub (see add_stub_numpy.sh; rose_bench e2e leaves it out of the
# naive server's environment), and the project on PYTHONPATH.
#   source benchmarks/gpu/enter_bench.sh
source .gpu/enter.sh
# tritonclient.grpc imports python-rapidjson; where the kit lacks its wheel (left out to keep the
# device copy under 64 MiB), the standard json module stands in (loads / dumps are all it uses here)
python3 -c "import rapidjson" 2>/dev/null || echo "from json import *" > "$GPU_SITE/rapidjson.py"
mkdir -p /tmp/stub-site && xz -dc .gpu/stub-numpy.tar.xz | tar -xf - -C /tmp/stub-site
export ROSE_STUB_SITE=/tmp/stub-site
export PYTHONPATH=$PWD:$PWD/ensemble:$PWD/client:$PWD/benchmarks:${PYTHONPATH:-}
