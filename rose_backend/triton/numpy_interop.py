"""A start-up check that the Python backend hands numpy arrays over intact.

Triton 2.51's Python backend (pybind11 2.10) misreads numpy 2 arrays: the shape survives but every
element reads as the first, and numpy outputs arrive empty. That would turn every request into
silently wrong embeddings, so each model refuses to start instead, saying what to do.

Reading arrays back is checked here; sending them is not (that needs a response). In one stub
(numpy 2.4.6, a CPU host) the read check passed and every answer still went out empty, so numpy 2
itself is refused too, unless $ROSE_ALLOW_NUMPY2=1 says the Python backend was built for it.
"""
from __future__ import annotations

import numpy as np

from rose_backend import env_vars


def check_numpy_interop(pb_utils, model: str) -> None:
    if int(np.__version__.split(".")[0]) >= 2 and not env_vars.ROSE_ALLOW_NUMPY2.flag():
        raise pb_utils.TritonModelException(
            f"{model}: numpy {np.__version__} in the Python backend's stub. Triton 2.51's Python backend "
            "sends numpy 2 output arrays empty: install numpy 1.26 into a folder of its own (pip install "
            "--target DIR numpy==1.26.4) and start the server with ROSE_STUB_SITE=DIR, or set "
            "ROSE_ALLOW_NUMPY2=1 with a Python backend built for numpy 2.")
    probe = np.arange(1, 6, dtype=np.int32)
    seen = pb_utils.Tensor("probe", probe).as_numpy()
    text = np.array([b"ab", b"cde"], dtype=np.object_)
    seen_text = pb_utils.Tensor("probe_text", text).as_numpy()
    if seen.tolist() != probe.tolist() or [bytes(x) for x in seen_text.reshape(-1)] != [b"ab", b"cde"]:
        raise pb_utils.TritonModelException(
            f"{model}: the Python backend passes numpy arrays incorrectly (sent {probe.tolist()}, read "
            f"{seen.tolist()}) with numpy {np.__version__}. Triton 2.51's Python backend needs numpy<2: "
            "install numpy 1.26 into a folder of its own (pip install --target DIR numpy==1.26.4) and start "
            "the server with ROSE_STUB_SITE=DIR, or use a Triton build whose Python backend supports numpy 2.")

