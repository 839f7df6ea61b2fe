"""Device pointers handed to the shim: recognised, moved by DMA, or refused — never read as host memory.

vLLM registers its KV-cache tensors (CUDA memory) and passes their device
addresses to ``batch_put_from_multi_buffers`` and friends. Mooncake's RDMA path
reads them in place; cxlkv's shim used to wrap every address in a host
``ctypes`` view, which on a GPU deployment would crash the process. Before any
address is wrapped, :func:`classify` asks CUDA what it is:

* **Is CUDA in this process at all?** A device address can only exist once the
  CUDA driver (``libcuda.so.1``) is loaded; ``dlopen(..., RTLD_NOLOAD)`` tells,
  without loading anything, in about a microsecond. No driver: every address is
  host memory (the CPU-only case costs nothing more).
* **What is this address?** ``cudaPointerGetAttributes`` (CUDA runtime API,
  through the ``libcudart`` the process loaded, found as the SDK's CUDA path
  finds it; ``cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_MEMORY_TYPE)`` of the
  driver API when no runtime can be loaded). ``cudaMemoryTypeDevice`` is device
  memory; unregistered, pinned-host and managed memory are host-accessible.
  When CUDA is loaded but neither query works, an address outside cxlkv's own
  shared memory is refused: it cannot be told apart, and guessing "host" could
  crash the process.

Device memory then travels through the SDK's CUDA path: the address is wrapped,
without a copy, as a ``torch`` uint8 CUDA tensor (``__cuda_array_interface__``)
and handed to :class:`cxlkv.Client`, which moves it by DMA
(``cudaMemcpyAsync``) straight between the GPU and the CXL region in direct
mode, or through a host copy when the daemon does the copy. Without torch (or
with a device index torch cannot see) the call is refused with
``INVALID_PARAMS`` and the reason logged.

:func:`set_classifier` replaces the CUDA query (tests use it to drive the
device path on machines without a GPU; it is not meant for production use).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import threading
from typing import Any, Callable

from cxlkv.errors import InvalidArgument

__all__ = ["HOST", "classify", "cuda_loaded", "device_tensor", "set_classifier", "DeviceUnsupported"]

logger = logging.getLogger("cxlkv.compat.mooncake")

#: :func:`classify` answer for host-accessible memory.
HOST = -1
_RTLD_NOLOAD = getattr(os, "RTLD_NOLOAD", 4)
#: cudaMemoryType (CUDA runtime API, driver_types.h).
_CUDA_MEMORY_TYPE_DEVICE = 2
#: CUmemorytype (CUDA driver API, cuda.h) and CU_POINTER_ATTRIBUTE_MEMORY_TYPE / _DEVICE_ORDINAL.
_CU_MEMORYTYPE_DEVICE = 2
_CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2
_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9


class DeviceUnsupported(InvalidArgument):
    """A device address the shim cannot move (no torch with CUDA here), or an address
    it cannot classify; the call answers ``INVALID_PARAMS`` (-600)."""


class _CudaQuery:
    """``cudaPointerGetAttributes`` / ``cuPointerGetAttribute`` through ctypes, loaded lazily."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rt: Any = None
        self._drv: Any = None
        self._tried = False

    def _load(self) -> None:
        with self._lock:
            if self._tried:
                return
            self._tried = True
            try:
                from cxlkv.client._cuda import _Cudart

                rt = _Cudart().lib
                rt.cudaPointerGetAttributes.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
                rt.cudaPointerGetAttributes.restype = ctypes.c_int
                self._rt = rt
            except (OSError, AttributeError) as exc:
                logger.info("cudaPointerGetAttributes unavailable (%s); using the driver API", exc)
            try:
                drv = ctypes.CDLL("libcuda.so.1", mode=_RTLD_NOLOAD)
                drv.cuPointerGetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64]
                drv.cuPointerGetAttribute.restype = ctypes.c_int
                self._drv = drv
            except (OSError, AttributeError):
                pass

    def classify(self, ptr: int) -> int:
        self._load()
        if self._rt is not None:
            # struct cudaPointerAttributes { cudaMemoryType type; int device; void *devicePointer;
            # void *hostPointer; ... }: read the first two ints of a generously sized buffer.
            attrs = (ctypes.c_int * 16)()
            rc = self._rt.cudaPointerGetAttributes(ctypes.addressof(attrs), ctypes.c_void_p(ptr))
            if rc == 0:
                return int(attrs[1]) if attrs[0] == _CUDA_MEMORY_TYPE_DEVICE else HOST
            self._rt.cudaGetLastError()  # an unknown host address on old runtimes: clear, then ask the driver
        if self._drv is not None:
            kind = ctypes.c_uint(0)
            rc = self._drv.cuPointerGetAttribute(ctypes.addressof(kind), _CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr)
            if rc != 0:
                return HOST  # CUDA_ERROR_INVALID_VALUE: memory CUDA does not know, i.e. plain host memory
            if kind.value != _CU_MEMORYTYPE_DEVICE:
                return HOST
            dev = ctypes.c_int(0)
            self._drv.cuPointerGetAttribute(ctypes.addressof(dev), _CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr)
            return int(dev.value)
        raise DeviceUnsupported(
            f"address {ptr:#x}: CUDA is loaded in this process but neither cudaPointerGetAttributes nor "
            "cuPointerGetAttribute can be called, so device memory cannot be told from host memory; refused")


_QUERY = _CudaQuery()
_classifier: Callable[[int], int] | None = None


def cuda_loaded() -> bool:
    """Whether the CUDA driver is loaded in this process (only then can device memory exist)."""
    try:
        ctypes.CDLL("libcuda.so.1", mode=_RTLD_NOLOAD)
    except OSError:
        return False
    return True


def set_classifier(fn: Callable[[int], int] | None) -> None:
    """Replace the CUDA query: ``fn(address) -> device index`` or :data:`HOST` (``None``: CUDA's).

    For tests of the device path on machines without a GPU.
    """
    global _classifier
    _classifier = fn


def classify(ptr: int) -> int:
    """The CUDA device holding address ``ptr``, or :data:`HOST` for host-accessible memory.

    Raises:
        DeviceUnsupported: CUDA is loaded but cannot be asked.
    """
    if _classifier is not None:
        return _classifier(ptr)
    if not cuda_loaded():
        return HOST
    return _QUERY.classify(ptr)


class _DeviceArray:
    """``__cuda_array_interface__`` (version 3) over ``size`` bytes at device address ``ptr``."""

    def __init__(self, ptr: int, size: int) -> None:
        self.__cuda_array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 3, "strides": None}


def device_tensor(ptr: int, size: int, device: int) -> Any:
    """A torch uint8 CUDA tensor over ``size`` bytes at device address ``ptr`` (no copy).

    Raises:
        DeviceUnsupported: torch with CUDA is not available, or cannot see ``device``.
    """
    try:
        import torch
    except ImportError:
        raise DeviceUnsupported(
            f"address {ptr:#x} is CUDA device memory (device {device}); moving it needs torch with CUDA, "
            "which is not installed here") from None
    try:
        ok = torch.cuda.is_available() and device < torch.cuda.device_count()
    except Exception:  # a broken driver install
        ok = False
    if not ok:
        raise DeviceUnsupported(
            f"address {ptr:#x} is CUDA device memory (device {device}), which torch cannot reach here; refused")
    return torch.as_tensor(_DeviceArray(ptr, size), device=f"cuda:{device}")
