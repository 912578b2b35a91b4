#!/usr/bin/env bash
# Triton 2.51's Python backend (the nvidia-pytriton 0.7.0 build in the GPU kit) is compiled with
# pybind11 2.10, which misreads numpy 2 arrays (every element reads as the first; outputs come back
# empty: python_backend#384). Where the GPU host's Python has numpy 2.x, the stub needs a numpy 1.26 of
# its own. This packs one (cp312; tests, headers, distutils and f2py stripped, 7.96 MB) into the kit:  bash benchmarks/gpu/add_stub_numpy.sh [.gpu]
# (benchmarks/gpu/enter_bench.sh unpacks it). By hand, on the GPU host:  mkdir -p /tmp/stub-site && xz -dc .gpu/stub-numpy.tar.xz | tar -xf - -C /tmp/stub-site \
#                 && export ROSE_STUB_SITE=/tmp/stub-site      # the launcher then gives it to the stub
set -euo pipefail
DEST=${1:-.gpu}
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 "numpy==1.26.4" -d "$TMP" 2>&1 | grep -v '^WARNING: Location' || true
mkdir "$TMP/site" && (cd "$TMP/site" && unzip -q "$TMP"/numpy-1.26.4-*.whl \
  && find numpy -name tests -type d -prune -exec rm -rf {} + && find numpy \( -name '*.pyi' -o -name '*.pxd' \
     -o -name '*.h' -o -name '*.c' -o -name '*.a' \) -delete \
  && rm -rf numpy/distutils numpy/f2py numpy/_pyinstaller numpy/doc numpy/array_api numpy/core/include \
     numpy/core/lib numpy/random/_examples numpy/random/lib \
  && tar -cf - numpy numpy.libs numpy-1.26.4.dist-info | xz -T0 -9e > "$OLDPWD/$DEST/stub-numpy.tar.xz")
ls -la "$DEST/stub-numpy.tar.xz"
