"""The start-up check of the numpy the Python backend's stub runs: arrays read back garbled, or
numpy 2 (whose outputs Triton 2.51 sends empty), refuse the model with what to do."""
import types

import numpy as np
import pytest

from rose_backend.triton import numpy_interop


class ModelError(Exception):
    pass


def fake_pb_utils(garble: bool = False):
    class Tensor:
        def __init__(self, name, array):
            self.array = array

        def as_numpy(self):
            return np.full_like(self.array, self.array.reshape(-1)[0]) if garble else self.array

    return types.SimpleNamespace(Tensor=Tensor, TritonModelException=ModelError)


def test_numpy_1_with_arrays_read_intact_passes(monkeypatch):
    monkeypatch.setattr(numpy_interop.np, "__version__", "1.26.4")
    numpy_interop.check_numpy_interop(fake_pb_utils(), "rose")


def test_garbled_arrays_refuse_the_model(monkeypatch):
    monkeypatch.setattr(numpy_interop.np, "__version__", "1.26.4")
    with pytest.raises(ModelError, match=r"rose: the Python backend passes numpy arrays incorrectly \(sent \[1, 2, 3, 4, 5\], read \[1, 1, 1, 1, 1\]"):
        numpy_interop.check_numpy_interop(fake_pb_utils(garble=True), "rose")


def test_numpy_2_is_refused_even_when_arrays_read_intact_unless_allowed(monkeypatch):
    monkeypatch.setattr(numpy_interop.np, "__version__", "2.4.6")
    monkeypatch.delenv("ROSE_ALLOW_NUMPY2", raising=False)
    with pytest.raises(ModelError, match="tokenize: numpy 2.4.6 .* sends numpy 2 output arrays empty.*ROSE_STUB_SITE.*ROSE_ALLOW_NUMPY2=1"):
        numpy_interop.check_numpy_interop(fake_pb_utils(), "tokenize")
    monkeypatch.setenv("ROSE_ALLOW_NUMPY2", "1")
    numpy_interop.check_numpy_interop(fake_pb_utils(), "tokenize")
