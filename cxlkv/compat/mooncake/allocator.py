"""``MooncakeHostMemAllocator``: an engine's host KV pool in memory cxlkv's daemon shares.

SGLang allocates its host KV pool with ``mooncake.store.MooncakeHostMemAllocator``
whenever the Mooncake backend is on (and requires it for standalone storage);
Mooncake serves it from shared memory its standalone client maps, so transfers
between the pool and the store are zero-copy. Here each ``alloc`` is a
:class:`cxlkv.client._shared.SharedHostMemory`: a ``/dev/shm`` file mapped by
the engine and registered, on first use, with the clientd of every store of the
process. ``batch_put_from`` / ``batch_get_into`` (and the other address calls)
on pool memory then pass ``(buffer id, offset)``: the daemon copies once between
the pool and the CXL region, and the SDK stages nothing — one memcpy per value
fewer than for memory from the engine's own allocator
(``cxlkv.Client.staged_bytes`` counts the bytes that still are staged;
docs/compat-mooncake.md shows the difference measured).
"""

from __future__ import annotations

import logging
import threading

from cxlkv.client._shared import SharedHostMemory
from cxlkv.compat.mooncake.errors import ErrorCode
from cxlkv.errors import CxlkvError

__all__ = ["MooncakeHostMemAllocator"]

logger = logging.getLogger("cxlkv.compat.mooncake")
_lock = threading.Lock()
#: address -> memory, for every allocator of the process (Mooncake's is a process singleton).
_allocs: dict[int, SharedHostMemory] = {}


class MooncakeHostMemAllocator:
    """Mooncake's host-memory allocator (``alloc(size) -> address``, ``free(address) -> int``).

    Instances share one process-wide table, as Mooncake's share one ``ShmHelper``:
    memory from one instance may be freed through another. The memory needs no
    store to exist; it is registered with a daemon the first time a store's call
    names an address inside it.

    Thread-safety: any thread may call any method.
    """

    def alloc(self, size: int) -> int:
        """``size`` bytes of shared host memory (zero-filled).

        Returns:
            The address of the first byte, or 0 when ``size`` is not an int > 0 or
            ``/dev/shm`` cannot hold it (the reason is logged), as Mooncake returns
            a null pointer.
        """
        try:
            mem = SharedHostMemory(size)
        except CxlkvError as exc:
            logger.error("MooncakeHostMemAllocator.alloc(%r): %s", size, exc)
            return 0
        with _lock:
            _allocs[mem.address] = mem
        return mem.address

    def free(self, ptr: int) -> int:
        """Release memory from :meth:`alloc` (unregistered from every daemon, unmapped).

        Returns:
            0, or ``INVALID_PARAMS`` (-600) when ``ptr`` was not allocated here.
        """
        with _lock:
            mem = _allocs.pop(ptr, None) if isinstance(ptr, int) else None
        if mem is None:
            return int(ErrorCode.INVALID_PARAMS)
        mem.close()
        return 0

    @staticmethod
    def allocated() -> int:
        """Blocks allocated and not freed, in this process (a cxlkv extension)."""
        with _lock:
            return len(_allocs)
