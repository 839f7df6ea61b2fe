"""Raw memory for Mooncake's pointer-based calls: address views and buffer handles.

Mooncake's zero-copy calls take integer addresses of memory the caller owns
(``put_from(key, buffer_ptr, size)``). :func:`view_at` turns ``(address, size)``
into a writable buffer-protocol view of that memory — a ``ctypes`` array created
with ``from_address``, no copy — which the cxlkv SDK accepts wherever it takes a
bytes-like value. The SDK then recognises by address whether the memory lies in
one of its registered shared buffers (zero-copy: the daemon copies between it and
the CXL region) or not (staged: one extra memcpy through the shared pool).

:class:`BufferHandle` is what ``get_buffer`` returns: memory holding a value,
with Mooncake's ``ptr()`` / ``size()`` / ``len()`` and the buffer protocol
(``numpy.array(handle, copy=False)``, ``memoryview(handle)``,
``torch.frombuffer(handle, …)``), on every supported Python version.

:class:`RangeRegistry` records ``register_buffer`` ranges.

Device memory (CUDA) is never wrapped as a host view: :func:`view_at` refuses
it, and :func:`buffer_at` / :func:`part_at` return a CUDA tensor over it, which
the SDK moves by DMA (:mod:`cxlkv.compat.mooncake.devices`).
"""

from __future__ import annotations

import ctypes
import functools
import threading
from typing import Any

from cxlkv.compat.mooncake.devices import HOST, DeviceUnsupported, classify, device_tensor
from cxlkv.errors import InvalidArgument

__all__ = ["view_at", "buffer_at", "part_at", "gather_part", "scatter_part", "BufferHandle", "make_handle",
           "RangeRegistry"]

#: Largest address on a 64-bit machine, plus one.
_ADDRESS_LIMIT = 1 << 64


def _check_range(ptr: Any, size: Any) -> tuple[int, int]:
    if isinstance(ptr, bool) or not isinstance(ptr, int):
        raise InvalidArgument(f"buffer_ptr must be an int address, got {type(ptr).__name__}")
    if isinstance(size, bool) or not isinstance(size, int):
        raise InvalidArgument(f"size must be an int, got {type(size).__name__}")
    if size < 0:
        raise InvalidArgument(f"size must be >= 0, got {size}")
    if ptr <= 0 or ptr + size > _ADDRESS_LIMIT:
        raise InvalidArgument(f"buffer_ptr {ptr:#x} (size {size}) is not a valid address range")
    return ptr, size


def view_at(ptr: int, size: int) -> ctypes.Array:
    """A writable view of ``size`` bytes at address ``ptr`` (no copy).

    The memory must stay valid and owned by the caller for as long as the view
    is used — exactly Mooncake's contract for its pointer arguments. A wrong
    address is not detectable and crashes the process, as it does in Mooncake.

    Args:
        ptr: address of the first byte (> 0).
        size: length in bytes (>= 0).

    Returns:
        A ``ctypes`` ``c_ubyte`` array over the memory (buffer protocol, writable).

    Raises:
        InvalidArgument: ``ptr`` is not a positive int, or ``size`` is negative.
    """
    ptr, size = _check_range(ptr, size)
    if size and classify(ptr) != HOST:
        _refuse(DeviceUnsupported(f"address {ptr:#x} is CUDA device memory; this call reads or writes its "
                                  "bytes on the CPU and needs host memory"))
    return (ctypes.c_ubyte * size).from_address(ptr)


def _refuse(exc: DeviceUnsupported) -> None:
    import logging

    logging.getLogger("cxlkv.compat.mooncake").error("%s", exc)
    raise exc


def buffer_at(ptr: int, size: int) -> Any:
    """What the SDK should move for ``size`` bytes at ``ptr``: a host view (:func:`view_at`),
    or, for CUDA device memory, a uint8 CUDA tensor over it (no copy; moved by DMA).

    Raises:
        InvalidArgument: a bad range (see :func:`view_at`).
        DeviceUnsupported: device memory this process cannot move (no torch with CUDA),
            or CUDA is loaded but cannot be asked what the address is.
    """
    ptr, size = _check_range(ptr, size)
    device = classify(ptr) if size else HOST
    if device == HOST:
        return (ctypes.c_ubyte * size).from_address(ptr)
    try:
        return device_tensor(ptr, size, device)
    except DeviceUnsupported as exc:
        _refuse(exc)
        raise


def part_at(ptr: int, size: int) -> Any:
    """:func:`buffer_at` for one part of a multi-buffer value: a byte ``memoryview`` of host
    memory, or a CUDA tensor."""
    b = buffer_at(ptr, size)
    return memoryview(b).cast("B") if isinstance(b, ctypes.Array) else b


def gather_part(dst: memoryview, part: Any) -> None:
    """Copy ``part`` (from :func:`part_at`) into the host bytes ``dst`` (same length)."""
    if isinstance(part, memoryview):
        dst[:] = part
    elif len(dst):
        import torch

        torch.frombuffer(dst, dtype=torch.uint8).copy_(part)  # device -> host by DMA


def scatter_part(part: Any, src: memoryview) -> None:
    """Copy the host bytes ``src`` into the start of ``part`` (from :func:`part_at`)."""
    n = len(src)
    if isinstance(part, memoryview):
        part[:n] = src
    elif n:
        import torch

        part[:n].copy_(torch.frombuffer(src, dtype=torch.uint8))  # host -> device by DMA


class BufferHandle:
    """Memory holding one value, as Mooncake's ``get_buffer`` returns it.

    Instances are ``ctypes`` arrays (so they export the buffer protocol on any
    Python version) that also derive from this class; ``isinstance(h,
    BufferHandle)`` holds. The memory stays valid while the handle (or any view of
    it) is referenced.
    """

    __slots__ = ()

    def ptr(self) -> int:
        """Address of the first byte."""
        return ctypes.addressof(self)  # type: ignore[arg-type]

    def size(self) -> int:
        """Size in bytes."""
        return ctypes.sizeof(self)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"<BufferHandle {self.size()} bytes at {self.ptr():#x}>"


@functools.lru_cache(maxsize=512)
def _handle_type(size: int) -> Any:
    return type("BufferHandle", (BufferHandle, ctypes.c_ubyte * size), {"__slots__": ()})


def make_handle(memory: Any) -> BufferHandle:
    """A :class:`BufferHandle` over ``memory`` (no copy when it is writable).

    Args:
        memory: a C-contiguous bytes-like object. Writable memory (a
            ``memoryview`` of shared memory, a ``bytearray``) is shared and kept
            alive by the handle; read-only memory (``bytes``) is copied once.

    Returns:
        The handle.
    """
    mv = memoryview(memory).cast("B")
    cls = _handle_type(mv.nbytes)
    if mv.readonly:
        return cls.from_buffer_copy(mv)
    return cls.from_buffer(mv)


class RangeRegistry:
    """Address ranges registered with ``register_buffer`` (thread-safe).

    Registration does not change where bytes go — the SDK decides that by
    address — but it is kept so that ``unregister_buffer`` answers as Mooncake
    does and overlapping registrations are refused.
    """

    def __init__(self) -> None:
        self._ranges: dict[int, int] = {}
        self._lock = threading.Lock()

    def add(self, ptr: Any, size: Any) -> None:
        """Register ``[ptr, ptr + size)``; registering the same range again is a no-op.

        Raises:
            InvalidArgument: a bad range, a zero size, or an overlap with another range.
        """
        ptr, size = _check_range(ptr, size)
        if size == 0:
            raise InvalidArgument("cannot register an empty buffer")
        with self._lock:
            if self._ranges.get(ptr) == size:
                return
            for start, length in self._ranges.items():
                if start < ptr + size and ptr < start + length:
                    raise InvalidArgument(
                        f"buffer {ptr:#x}+{size} overlaps the registered buffer {start:#x}+{length}")
            self._ranges[ptr] = size

    def remove(self, ptr: Any) -> None:
        """Unregister the range starting at ``ptr``.

        Raises:
            InvalidArgument: no range starts at ``ptr``.
        """
        if isinstance(ptr, bool) or not isinstance(ptr, int):
            raise InvalidArgument(f"buffer_ptr must be an int address, got {type(ptr).__name__}")
        with self._lock:
            if self._ranges.pop(ptr, None) is None:
                raise InvalidArgument(f"no buffer is registered at {ptr!r}")

    def clear(self) -> None:
        """Forget every range."""
        with self._lock:
            self._ranges.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._ranges)
