"""Turning user memory (bytes, bytearray, memoryview, numpy, CPU torch) into byte arrays.

Every value the SDK moves is seen as a 1-D ``uint8`` numpy array over the
caller's memory — zero-copy whenever the memory is C-contiguous — so its
address can be compared with the registered shared buffers and its bytes
copied with one ``memmove``.
"""

from __future__ import annotations

from typing import Any

import cffi
import numpy as np

from cxlkv.errors import InvalidArgument

__all__ = ["src_array", "dst_array", "address_of", "nbytes_of"]


_ffi = cffi.FFI()
_cast = _ffi.cast
_from_buffer = _ffi.from_buffer


def _is_torch(obj: Any) -> bool:
    return type(obj).__module__.split(".", 1)[0] == "torch"


def _torch_array(t: Any, *, writable: bool) -> np.ndarray:
    """A CPU tensor's bytes as a uint8 array (zero-copy when contiguous)."""
    if t.device.type != "cpu":
        raise InvalidArgument(
            f"only CPU tensors can be read or written directly; got a tensor on {t.device} "
            "(copy it to the CPU, or into client.buffer() memory, first)"
        )
    import torch

    t = t.detach()
    if not t.is_contiguous():
        if writable:
            raise InvalidArgument("destination tensor must be contiguous")
        t = t.contiguous()
    # view(uint8) also covers dtypes numpy lacks (bfloat16, float8).
    return t.reshape(-1).view(torch.uint8).numpy()


def _as_array(obj: Any, *, writable: bool) -> np.ndarray:
    if isinstance(obj, np.ndarray):
        a = obj
    elif isinstance(obj, (memoryview, bytes, bytearray)):
        try:
            a = np.frombuffer(obj, dtype=np.uint8)
        except (TypeError, ValueError, BufferError):
            a = np.asarray(obj)  # a multi-dimensional or non-byte memoryview
    elif _is_torch(obj):
        a = _torch_array(obj, writable=writable)
    else:
        try:
            a = np.frombuffer(obj, dtype=np.uint8)
        except (TypeError, ValueError, BufferError):
            try:
                a = np.asarray(memoryview(obj))
            except TypeError:
                raise InvalidArgument(
                    f"expected bytes, bytearray, memoryview, a numpy array or a CPU torch tensor, "
                    f"got {type(obj).__name__}"
                ) from None
    if a.dtype != np.uint8 or a.ndim != 1:
        if not a.flags.c_contiguous:
            if writable:
                raise InvalidArgument("destination must be C-contiguous memory")
            a = np.ascontiguousarray(a)
        a = a.reshape(-1).view(np.uint8)
    elif not a.flags.c_contiguous:
        if writable:
            raise InvalidArgument("destination must be C-contiguous memory")
        a = np.ascontiguousarray(a)
    return a


def src_array(obj: Any) -> np.ndarray:
    """The bytes of ``obj`` as a 1-D uint8 array (a copy only if not C-contiguous).

    Raises:
        InvalidArgument: not a bytes-like object, array or CPU tensor.
    """
    return _as_array(obj, writable=False)


def dst_array(obj: Any) -> np.ndarray:
    """The writable bytes of ``obj`` as a 1-D uint8 array over the same memory.

    Raises:
        InvalidArgument: read-only (e.g. ``bytes``), not C-contiguous, or not a
            bytes-like object, array or CPU tensor.
    """
    a = _as_array(obj, writable=True)
    if not a.flags.writeable:
        raise InvalidArgument(f"destination {type(obj).__name__} is read-only (use bytearray, numpy, client.buffer())")
    return a


def address_of(a: np.ndarray) -> int:
    """Address of the first byte of a 1-D uint8 array (or any contiguous buffer).

    Through cffi: 0.5 µs, against 1.9 µs for ``a.__array_interface__`` (which
    builds a dict per call) — paid per item of every batch call.
    """
    return int(_cast("uintptr_t", _from_buffer(a)))


def nbytes_of(obj: Any) -> int:
    """Size of a bytes-like object in bytes, without converting it.

    Raises:
        InvalidArgument: not a bytes-like object, array or CPU tensor.
    """
    if isinstance(obj, (bytes, bytearray)):
        return len(obj)
    if isinstance(obj, memoryview):
        return obj.nbytes
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if _is_torch(obj):
        return obj.numel() * obj.element_size()
    try:
        return memoryview(obj).nbytes
    except TypeError:
        raise InvalidArgument(
            f"expected bytes, bytearray, memoryview, a numpy array or a CPU torch tensor, got {type(obj).__name__}"
        ) from None
