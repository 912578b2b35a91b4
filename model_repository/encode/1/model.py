"""Triton entry point of `encode`; the logic lives in rose_ensemble.triton_encode."""
import os
import sys

# The stub ignores PYTHONPATH: the launcher's paths, appended to import the helper that puts them
# first (rose_backend/triton/stub_path.py); numpy only after it.
sys.path += os.environ.get("ROSE_PYTHONPATH", "").split(os.pathsep)
from rose_backend.triton.stub_path import launcher_paths_first  # noqa: E402
launcher_paths_first()

from rose_ensemble.triton_encode import EncodeModel as TritonPythonModel  # noqa: E402,F401
