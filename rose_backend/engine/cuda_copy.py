"""Asynchronous copies between pinned host buffers and the device, and a stream wait, as single CUDA
driver calls (libcuda through ctypes): the lone path's three transfers (engine.py, run_lone).

A torch copy_ between a pinned tensor and a device tensor also records an event for the host
allocator and goes through the dispatcher, host time that a lone request waits for. Here each is
one driver call on raw pointers that the caller keeps (the buffers live as long as the engine).

    copies = DriverCopies()                       # CUDA hosts only
    copies.to_device(dst_ptr, src_ptr, nbytes, stream)
    copies.to_host(dst_ptr, src_ptr, nbytes, stream)
    copies.wait(stream)                           # the stream's work so far is done
"""
from __future__ import annotations

import ctypes
import ctypes.util


class DriverCopies:
    def __init__(self):
        lib = ctypes.CDLL(ctypes.util.find_library("cuda") or "libcuda.so.1")
        self._htod = lib.cuMemcpyHtoDAsync_v2
        self._dtoh = lib.cuMemcpyDtoHAsync_v2
        self._sync = lib.cuStreamSynchronize
        self._error = lib.cuGetErrorString
        for f, args in ((self._htod, (ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)),
                        (self._dtoh, (ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p)),
                        (self._sync, (ctypes.c_void_p,))):
            f.argtypes, f.restype = args, ctypes.c_int
        self._error.argtypes, self._error.restype = (ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)), ctypes.c_int

    def to_device(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        self._check(self._htod(dst, src, nbytes, stream), "cuMemcpyHtoDAsync")

    def to_host(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        self._check(self._dtoh(dst, src, nbytes, stream), "cuMemcpyDtoHAsync")

    def wait(self, stream: int) -> None:
        self._check(self._sync(stream), "cuStreamSynchronize")

    def _check(self, code: int, call: str) -> None:
        if code:
            text = ctypes.c_char_p()
            self._error(code, ctypes.byref(text))
            raise RuntimeError(f"{call} failed: CUDA error {code} ({(text.value or b'?').decode()})")
