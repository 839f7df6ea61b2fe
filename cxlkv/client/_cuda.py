"""CUDA tensors to and from the mapped region, without a bounce buffer.

CXL memory (and the ``/dev/shm`` file that emulates it) is host-physical memory:
once the region's mapping is registered with CUDA (``cudaHostRegister``), the
GPU's copy engines DMA straight into and out of it. Used by direct mode
(:mod:`cxlkv.client._direct`) for ``torch`` CUDA tensors:

* **Registration**: lazily, once per process and region, on the first CUDA copy
  touching it. The whole mapping is registered in one call; if the driver
  refuses (some limit a single registration), it is registered in chunks of
  :data:`REGISTER_CHUNK_BYTES` and copies are split at chunk boundaries. If
  registration fails altogether (e.g. a device-DAX mapping without struct pages)
  copies still work, unregistered (the driver stages them; several times slower).
* **Copies**: ``cudaMemcpyAsync`` (ctypes on the ``libcudart`` that torch
  loaded) on a stream the SDK owns, or ``Tensor.copy_(non_blocking=True)`` on
  that stream when libcudart cannot be loaded (``CXLKV_CUDA_COPY=torch`` forces
  it). The SDK synchronises the stream before it ends the put or the lease.
* **Checksums**: a put's value is hashed (xxh3_64) from the region as each chunk's
  DMA completes (the GPU copies chunk k+1 while the CPU hashes chunk k); a read
  hashes the region range on the CPU while the GPU copies it out (both read the
  same leased bytes).
* **Coherence** (``flush`` mode): a put flushes the GPU-written range after the
  DMA completed (stream synchronised) and a store fence — on x86 inbound PCIe
  writes may sit in the last-level cache (DDIO) and must be written back before
  another host reads the CXL memory. A read invalidates the range before the DMA
  (device reads snoop CPU caches and would see stale lines).

Non-contiguous tensors are refused (``InvalidArgument``: call ``.contiguous()``).
torch is optional: nothing here imports it until a CUDA tensor is seen.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import logging
import os
import threading
from typing import Any

import xxhash

from cxlkv.errors import CxlkvError, InvalidArgument

__all__ = ["is_cuda_tensor", "CudaSource", "CudaTarget", "CudaCopier", "cuda_available", "REGISTER_CHUNK_BYTES",
           "host_copy", "read_through_host"]

log = logging.getLogger(__name__)

#: Registration chunk when one registration of the whole mapping is refused, bytes.
REGISTER_CHUNK_BYTES = 1 << 30
#: A put's DMA is cut into pieces of about this size so hashing overlaps it, bytes.
PIPELINE_CHUNK_BYTES = 4 << 20

_H2D, _D2H = 1, 2  # cudaMemcpyKind


def is_cuda_tensor(obj: Any) -> bool:
    """Whether ``obj`` is a torch tensor on a CUDA device (torch is not imported)."""
    if type(obj).__module__.split(".", 1)[0] != "torch":
        return False
    dev = getattr(obj, "device", None)
    return getattr(dev, "type", None) == "cuda"


def cuda_available() -> bool:
    """Whether torch is installed and sees a CUDA device."""
    try:
        import torch
    except ImportError:
        return False
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # a broken driver install
        return False


def _tensor_nbytes(t: Any) -> int:
    return int(t.numel()) * int(t.element_size())


def _check_contiguous(t: Any, what: str) -> None:
    if not t.is_contiguous():
        raise InvalidArgument(f"{what} CUDA tensor is not contiguous; pass tensor.contiguous() "
                              "(direct CUDA copies move one contiguous range)")


class CudaSource:
    """A CUDA tensor to put: its bytes move GPU → region by DMA."""

    __slots__ = ("tensor", "nbytes", "copier")

    def __init__(self, tensor: Any, copier: "CudaCopier") -> None:
        _check_contiguous(tensor, "source")
        self.tensor = tensor
        self.nbytes = _tensor_nbytes(tensor)
        self.copier = copier

    def copy_in(self, region: Any, offset: int, checksum: int | None) -> int:
        """DMA into ``region`` at ``offset`` (synchronised, and fenced before the
        caller's flush); the xxh3_64 of the bytes written (``checksum`` when the
        value was hashed already: another replica)."""
        got = self.copier.to_region(region, offset, self.tensor, self.nbytes, hash_=checksum is None)
        region.fence()  # the DMA completed (stream synchronised); order it before the flush
        return got if checksum is None else checksum


class CudaTarget:
    """A CUDA tensor to read into: bytes move region → GPU by DMA."""

    __slots__ = ("tensor", "nbytes", "copier")

    def __init__(self, tensor: Any, copier: "CudaCopier") -> None:
        _check_contiguous(tensor, "destination")
        self.tensor = tensor
        self.nbytes = _tensor_nbytes(tensor)
        self.copier = copier

    def copy_out(self, region: Any, offset: int, size: int) -> int:
        """DMA ``size`` bytes from ``region`` at ``offset`` into the tensor's start; the
        xxh3_64 of the region bytes (hashed on the CPU while the GPU copies)."""
        return self.copier.from_region(region, offset, self.tensor, size)


def host_copy(t: Any) -> Any:
    """The ``CUDA_HOST`` path of a put (:mod:`cxlkv.client._paths`): a CUDA
    tensor's bytes in host memory, as a 1-D uint8 numpy array.

    Raises:
        InvalidArgument: the tensor is not contiguous.
    """
    import torch

    if not t.is_contiguous():
        raise InvalidArgument("source CUDA tensor is not contiguous; pass tensor.contiguous()")
    return t.detach().reshape(-1).view(torch.uint8).cpu().numpy()


def read_through_host(target: CudaTarget, read_into: Any) -> int:
    """The ``CUDA_HOST`` path of a read: ``read_into(array)`` fills a pinned host
    buffer of the tensor's size (through the daemon), which is then copied to the
    tensor's start; the value's size in bytes."""
    import torch

    host = torch.empty(target.nbytes, dtype=torch.uint8, pin_memory=True)
    n = read_into(host.numpy())
    target.tensor.reshape(-1).view(torch.uint8)[:n].copy_(host[:n])
    return n


def _loaded_cudart() -> list[str]:
    """Paths of the libcudart mapped into this process (after torch initialised CUDA)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libcudart" in line and "/" in line}
    except OSError:
        return []
    return sorted(paths)


class _Cudart:
    """The few runtime calls made through ctypes (the libcudart torch loaded)."""

    def __init__(self) -> None:
        lib = None
        names = _loaded_cudart()  # the runtime torch already loaded comes first
        names += ["libcudart.so.13", "libcudart.so.12", "libcudart.so"]
        try:
            import torch

            base = os.path.dirname(torch.__file__)
            names += glob.glob(os.path.join(base, "lib", "libcudart*.so*"))
            names += glob.glob(os.path.join(os.path.dirname(base), "nvidia", "cuda_runtime", "lib", "libcudart.so*"))
        except ImportError:
            pass
        found = ctypes.util.find_library("cudart")
        if found:
            names.append(found)
        errors = []
        for n in names:
            try:
                lib = ctypes.CDLL(n)
                break
            except OSError as exc:
                errors.append(str(exc))
        if lib is None:
            raise OSError("libcudart not found: " + "; ".join(errors[-3:]))
        self.lib = lib
        lib.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
        lib.cudaHostRegister.restype = ctypes.c_int
        lib.cudaHostUnregister.argtypes = [ctypes.c_void_p]
        lib.cudaHostUnregister.restype = ctypes.c_int
        lib.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                        ctypes.c_void_p]
        lib.cudaMemcpyAsync.restype = ctypes.c_int
        lib.cudaGetErrorString.argtypes = [ctypes.c_int]
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        lib.cudaGetLastError.restype = ctypes.c_int

    def check(self, rc: int, what: str) -> None:
        if rc:
            self.lib.cudaGetLastError()  # clear the sticky-free error state
            raise CxlkvError(f"{what}: CUDA error {rc} ({self.lib.cudaGetErrorString(rc).decode(errors='replace')})")


class CudaCopier:
    """Registration and copies for one process (shared by a Client's threads).

    Args:
        register: register region mappings with CUDA (``False``: measure the
            unregistered path; copies are staged by the driver).
        mode: ``"cudart"`` (ctypes ``cudaMemcpyAsync``), ``"torch"``
            (``Tensor.copy_``), or ``None``: ``$CXLKV_CUDA_COPY``, else cudart when
            it loads.

    Raises:
        InvalidArgument: torch or CUDA is not available.
    """

    def __init__(self, *, register: bool = True, mode: str | None = None) -> None:
        if not cuda_available():
            raise InvalidArgument("CUDA tensors need torch with a CUDA device; none is available here")
        import torch

        self.torch = torch
        self.register = register
        self._lock = threading.Lock()
        self._registered: dict[int, list[tuple[int, int]]] = {}  # id(region) -> [(start, end)] offsets
        self._streams: dict[int, Any] = {}
        mode = mode or os.environ.get("CXLKV_CUDA_COPY") or "cudart"
        self.rt: _Cudart | None = None
        torch.cuda.init()  # loads the CUDA runtime torch uses: ctypes then binds that same library
        if mode == "cudart":
            try:
                self.rt = _Cudart()
            except OSError as exc:
                log.info("cudaMemcpyAsync through torch (libcudart not loadable: %s)", exc)
        self.mode = "cudart" if self.rt is not None else "torch"

    # ------------------------------------------------------------ plumbing
    def stream(self, device: Any) -> Any:
        """The SDK's stream on ``device`` (one per device and process)."""
        idx = device.index if device.index is not None else self.torch.cuda.current_device()
        s = self._streams.get(idx)
        if s is None:
            with self._lock:
                s = self._streams.get(idx)
                if s is None:
                    s = self.torch.cuda.Stream(device=idx)
                    self._streams[idx] = s
        return s

    @staticmethod
    def _base(region: Any) -> int:
        """Address of the region mapping's first byte in this process."""
        from cxlkv.transport.bindings import ffi

        return int(ffi.cast("uintptr_t", region._base))

    def release(self, region: Any) -> None:
        """Unregister ``region`` from CUDA (before it is unmapped); idempotent."""
        with self._lock:
            ranges = self._registered.pop(id(region), None)
        if not ranges:
            return
        base = self._base(region)
        for s, _ in ranges:
            try:
                if self.rt is not None:
                    self.rt.lib.cudaHostUnregister(base + s)
                else:
                    self.torch.cuda.cudart().cudaHostUnregister(base + s)
            except Exception:  # the process is shutting down; the mapping goes anyway
                pass

    def ensure_registered(self, region: Any) -> list[tuple[int, int]]:
        """Register ``region``'s mapping with CUDA once; the registered offset ranges
        (empty: unregistered — copies still work, staged by the driver)."""
        key = id(region)
        got = self._registered.get(key)
        if got is not None:
            return got
        with self._lock:
            got = self._registered.get(key)
            if got is not None:
                return got
            ranges: list[tuple[int, int]] = []
            if self.register:
                ranges = self._register(region)
            self._registered[key] = ranges
            return ranges

    def _register(self, region: Any) -> list[tuple[int, int]]:
        base = self._base(region)
        size = region.size_bytes
        reg = self._host_register
        if reg(base, size):
            log.info("registered region %s (%d bytes) with CUDA", region.path, size)
            return [(0, size)]
        ranges = []
        for off in range(0, size, REGISTER_CHUNK_BYTES):
            n = min(REGISTER_CHUNK_BYTES, size - off)
            if not reg(base + off, n):
                log.warning("cudaHostRegister of %s failed at offset %d; the rest of the region is "
                            "copied unregistered (slower)", region.path, off)
                break
            ranges.append((off, off + n))
        log.info("registered region %s with CUDA in %d chunk(s)", region.path, len(ranges))
        return ranges

    def _host_register(self, ptr: int, size: int) -> bool:
        if self.rt is not None:
            rc = self.rt.lib.cudaHostRegister(ptr, size, 0)
            if rc:
                self.rt.lib.cudaGetLastError()
            return rc == 0
        try:
            rc = self.torch.cuda.cudart().cudaHostRegister(ptr, size, 0)
        except Exception:
            return False
        return int(rc) == 0

    def _pieces(self, region: Any, offset: int, n: int, chunk: int) -> list[tuple[int, int]]:
        """``[offset, offset + n)`` cut at registration-chunk boundaries and into
        pieces of at most ``chunk`` bytes, as ``(offset, length)``."""
        ranges = self.ensure_registered(region)
        cuts = {offset, offset + n}
        for s, e in ranges:
            if offset < s < offset + n:
                cuts.add(s)
            if offset < e < offset + n:
                cuts.add(e)
        bounds = sorted(cuts)
        out = []
        for a, b in zip(bounds, bounds[1:]):
            for o in range(a, b, chunk):
                out.append((o, min(chunk, b - o)))
        return out

    def _memcpy(self, dst: int, src: int, n: int, kind: int, stream: Any, *, tensor: Any, t_off: int,
                region: Any, r_off: int) -> None:
        if self.rt is not None:
            self.rt.check(self.rt.lib.cudaMemcpyAsync(dst, src, n, kind, stream.cuda_stream), "cudaMemcpyAsync")
            return
        torch = self.torch
        flat = tensor.reshape(-1).view(torch.uint8)[t_off:t_off + n]
        host = torch.frombuffer(region.view(r_off, n), dtype=torch.uint8)
        with torch.cuda.stream(stream):
            if kind == _D2H:
                host.copy_(flat, non_blocking=True)
            else:
                flat.copy_(host, non_blocking=True)

    # --------------------------------------------------------------- copies
    def to_region(self, region: Any, offset: int, tensor: Any, n: int, *, hash_: bool) -> int:
        """DMA ``n`` bytes of ``tensor`` into ``region`` at ``offset``; synchronised on
        return. Returns the xxh3_64 of the bytes written (0 when ``hash_`` is false)."""
        if n == 0:
            return xxhash.xxh3_64_intdigest(b"") if hash_ else 0
        torch = self.torch
        stream = self.stream(tensor.device)
        stream.wait_stream(torch.cuda.current_stream(tensor.device))  # the producer's work first
        base = self._base(region)
        src = int(tensor.data_ptr())
        h = xxhash.xxh3_64() if hash_ else None
        events = []
        for off, ln in self._pieces(region, offset, n, PIPELINE_CHUNK_BYTES):
            t_off = off - offset
            self._memcpy(base + off, src + t_off, ln, _D2H, stream, tensor=tensor, t_off=t_off,
                         region=region, r_off=off)
            ev = torch.cuda.Event()
            ev.record(stream)
            events.append((ev, off, ln))
        tensor.record_stream(stream)
        for ev, off, ln in events:
            ev.synchronize()
            if h is not None:
                h.update(region.view(off, ln))
        stream.synchronize()
        return h.intdigest() if h is not None else 0

    def from_region(self, region: Any, offset: int, tensor: Any, n: int) -> int:
        """DMA ``n`` bytes from ``region`` at ``offset`` into the start of ``tensor``,
        hashing the region bytes on the CPU meanwhile; synchronised on return.
        Returns their xxh3_64."""
        if n == 0:
            return xxhash.xxh3_64_intdigest(b"")
        torch = self.torch
        stream = self.stream(tensor.device)
        stream.wait_stream(torch.cuda.current_stream(tensor.device))  # earlier users of the tensor first
        base = self._base(region)
        dst = int(tensor.data_ptr())
        for off, ln in self._pieces(region, offset, n, 1 << 62):
            t_off = off - offset
            self._memcpy(dst + t_off, base + off, ln, _H2D, stream, tensor=tensor, t_off=t_off,
                         region=region, r_off=off)
        tensor.record_stream(stream)
        digest = xxhash.xxh3_64_intdigest(region.view(offset, n))  # GIL released; DMA runs meanwhile
        stream.synchronize()
        return digest

    def close(self) -> None:
        """Synchronise the SDK's streams (registrations end with the mapping)."""
        for s in list(self._streams.values()):
            try:
                s.synchronize()
            except Exception:
                pass
