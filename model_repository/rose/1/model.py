"""Triton entry point of `rose`; the logic lives in rose_backend.triton.rose_model."""
import os
import site
import sys

# The Python backend stub starts its interpreter isolated from PYTHONPATH, so the paths the
# launcher exports (this project, its virtual environment) are added here, ahead of the rest.
_known = set(sys.path)
for _p in reversed([p for p in os.environ.get("ROSE_PYTHONPATH", "").split(os.pathsep) if p and p not in _known]):
    _before = list(sys.path)
    site.addsitedir(_p)                                 # also runs the folder's .pth files
    sys.path[:] = [p for p in sys.path if p not in _before] + _before

from rose_backend.triton.rose_model import RoseModel as TritonPythonModel  # noqa: E402,F401
