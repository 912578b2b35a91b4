"""LazyTensor contract on the CPU: ready() never blocks, synchronize() returns float32 rows."""
import numpy as np
import torch

from rose_backend.engine.lazy_tensor import LazyTensor


def test_cpu_handle_is_ready_and_returns_rows():
    src = torch.arange(12, dtype=torch.float32).view(4, 3)
    lt = LazyTensor.launch(src, rows=2)
    assert lt.ready()
    out = lt.synchronize()
    assert out.dtype == np.float32 and out.shape == (2, 3)
    np.testing.assert_array_equal(out, src[:2].numpy())


def test_synchronize_returns_a_copy_and_is_repeatable():
    src = torch.ones(2, 2)
    lt = LazyTensor.launch(src)
    a = lt.synchronize()
    a[:] = 7
    src.fill_(5)                      # the source changing after launch does not leak in
    np.testing.assert_array_equal(lt.synchronize(), np.ones((2, 2), np.float32))


def test_bf16_source_comes_back_float32():
    lt = LazyTensor.launch(torch.ones(3, 2, dtype=torch.bfloat16))
    assert lt.synchronize().dtype == np.float32


def test_detach_keeps_rows():
    host = torch.zeros(4, 2)
    lt = LazyTensor(host, None, 2)
    host[:2] = 3
    lt.detach()
    assert lt.ready() and lt.done
    np.testing.assert_array_equal(lt.synchronize(), np.full((2, 2), 3, np.float32))
