"""Host memory shareable with any clientd: the SDK side of zero-copy host pools.

An engine allocates its host KV pool before it opens a store (SGLang's
``MooncakeHostTensorAllocator`` does), so the pool cannot come from a client's
:class:`~cxlkv.client._pool.BufferPool`. :class:`SharedHostMemory` is memory in
a ``/dev/shm`` file of its own, mapped ``MAP_SHARED``, that every
:class:`cxlkv.Client` of the process recognises: the first time a call names an
address inside it, the client registers the file with its daemon
(RegisterBuffer) and from then on passes ``(buffer id, offset)`` — the daemon
copies between that memory and the CXL region, and nothing is staged.

Registering needs a file path the daemon can open, named by the buffer
convention (``cxlkv-buf-<pid>-<12 hex>``, exactly one link). While allocated,
the file is *parked* under ``cxlkv-host-<pid>-<12 hex>`` (a name the daemon
refuses, so it is never registered by mistake); a registration renames it to the
buffer name, registers, and renames it back. A process killed while holding such
memory leaves its parked files behind; the next :class:`SharedHostMemory` of any
process removes the files of processes that are gone.
"""

from __future__ import annotations

import glob
import mmap
import os
import re
import threading
import uuid
import weakref
from typing import Any, Callable

import numpy as np

from cxlkv.client._memory import address_of
from cxlkv.errors import InvalidArgument, NoSpace

__all__ = ["SharedHostMemory", "find_shared", "live_shared"]

SHM_DIR = "/dev/shm"
_PARKED = re.compile(r"cxlkv-host-(\d+)-[0-9a-f]{12}")
_PAGE = mmap.PAGESIZE

_lock = threading.Lock()
#: base address -> live memory, for :func:`find_shared`.
_live: dict[int, "SharedHostMemory"] = {}


def _sweep_orphans() -> None:
    """Remove parked files of processes that no longer run (killed while holding memory)."""
    for path in glob.glob(os.path.join(SHM_DIR, "cxlkv-host-*")):
        m = _PARKED.fullmatch(os.path.basename(path))
        if m is None:
            continue
        pid = int(m.group(1))
        if pid == os.getpid() or os.path.exists(f"/proc/{pid}"):
            continue
        try:
            os.unlink(path)
        except OSError:
            pass


class SharedHostMemory:
    """``size_bytes`` of host memory in a shared file, zero-copy for every client of this process.

    Args:
        size_bytes: bytes (> 0; rounded up to whole pages).
        mode: permission bits of the file (0o600; 0o660 lets a daemon of another
            uid in the owner's group open it, as ``Client(share_with_group=True)``).

    Attributes:
        address: address of the first byte.
        size_bytes: the size asked for.
        array: the memory as a 1-D uint8 numpy array (no copy).

    Raises:
        InvalidArgument: ``size_bytes`` <= 0.
        NoSpace: /dev/shm cannot hold it.

    Thread-safety: registration and :meth:`close` are locked; the memory itself is
    the caller's to synchronise.
    """

    def __init__(self, size_bytes: int, *, mode: int = 0o600) -> None:
        if isinstance(size_bytes, bool) or not isinstance(size_bytes, int) or size_bytes <= 0:
            raise InvalidArgument(f"size_bytes must be an int > 0, got {size_bytes!r}")
        _sweep_orphans()
        self.size_bytes = size_bytes
        self._mapped = (size_bytes + _PAGE - 1) // _PAGE * _PAGE
        self._tag = uuid.uuid4().hex[:12]
        self._parked = os.path.join(SHM_DIR, f"cxlkv-host-{os.getpid()}-{self._tag}")
        self._lock = threading.Lock()
        self._pools: "weakref.WeakSet[Any]" = weakref.WeakSet()
        try:
            fd = os.open(self._parked, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
        except OSError as exc:
            raise NoSpace(f"cannot create shared host memory {self._parked}: {exc.strerror}") from None
        try:
            os.fchmod(fd, mode)
            os.ftruncate(fd, self._mapped)
            self.mm = mmap.mmap(fd, self._mapped, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as exc:
            os.close(fd)
            os.unlink(self._parked)
            raise NoSpace(f"cannot size or map {size_bytes} bytes of shared host memory: {exc.strerror}") from None
        os.close(fd)
        self.array = np.frombuffer(self.mm, dtype=np.uint8)
        self.address = address_of(self.array)
        self._closed = False
        with _lock:
            _live[self.address] = self

    @property
    def mapped_bytes(self) -> int:
        """Bytes mapped (``size_bytes`` rounded up to pages): what a daemon registers."""
        return self._mapped

    def register_with(self, register: Callable[[str, int, int], int], mode: int | None = None) -> int:
        """Register the memory with a daemon through ``register(path, size_bytes, pid) -> buffer_id``.

        The parked file is renamed to a buffer name for the call and back after it.

        Raises:
            InvalidArgument: the memory is closed.
            CxlkvError: the daemon refused it.
        """
        with self._lock:
            if self._closed:
                raise InvalidArgument("shared host memory is freed")
            path = os.path.join(SHM_DIR, f"cxlkv-buf-{os.getpid()}-{self._tag}")
            if mode is not None:
                os.chmod(self._parked, mode)
            os.rename(self._parked, path)
            try:
                return register(path, self._mapped, os.getpid())
            finally:
                os.rename(path, self._parked)

    def adopted_by(self, pool: Any) -> None:
        """Note that ``pool`` registered this memory (it is told by :meth:`close`)."""
        self._pools.add(pool)

    def close(self) -> None:
        """Unregister the memory from every daemon it was registered with and unmap it.

        Idempotent. Views of :attr:`array` taken before must not be used afterwards
        (the mapping is released once the last of them is gone).
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pools = list(self._pools)
        with _lock:
            _live.pop(self.address, None)
        for pool in pools:
            pool.forget_shared(self)
        try:
            os.unlink(self._parked)
        except FileNotFoundError:
            pass
        self.array = np.empty(0, dtype=np.uint8)
        try:
            self.mm.close()
        except BufferError:  # a caller still holds a view; unmapped when it is collected
            pass

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        return f"<SharedHostMemory {self.size_bytes} bytes at {self.address:#x}{' (freed)' if self._closed else ''}>"


def find_shared(addr: int, nbytes: int) -> SharedHostMemory | None:
    """The live :class:`SharedHostMemory` holding ``[addr, addr + nbytes)``, or ``None``."""
    if not _live:
        return None
    with _lock:
        for base, mem in _live.items():
            if base <= addr and addr + nbytes <= base + mem.mapped_bytes:
                return mem
    return None


def live_shared() -> int:
    """How many :class:`SharedHostMemory` are allocated in this process."""
    return len(_live)
