"""The SDK's managed pool of shared buffers.

A *segment* is one ``/dev/shm`` file the SDK creates, maps, registers with the
daemon (RegisterBuffer) and unlinks at once — so no file is left behind even if
the process is killed; the memory lives while a mapping does. The pool carves
segments into ranges:

* :meth:`BufferPool.alloc` / :meth:`free` for staging (values that do not live in
  shared memory are copied through a staging range) and for
  :meth:`cxlkv.Client.buffer`;
* :meth:`BufferPool.locate` recognises an address range inside a segment, so a
  value already in pool memory travels as ``(buffer_id, offset)`` — zero-copy.
  It also recognises :class:`~cxlkv.client._shared.SharedHostMemory` (an
  engine's host pool): the first range found there registers that memory with
  the daemon as an *external* segment (never carved, never unmapped by the pool).

The first segment holds ``pool_bytes``; an allocation that does not fit gets a
new segment (at least ``pool_bytes``, or exactly the request for one larger than
that, released again when freed).
"""

from __future__ import annotations

import bisect
import logging
import mmap
import os
import threading
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from cxlkv.client._memory import address_of
from cxlkv.client._shared import SharedHostMemory, find_shared
from cxlkv.errors import CxlkvError, InvalidArgument, NoSpace

__all__ = ["PoolBuffer", "BufferPool", "SHM_DIR"]

SHM_DIR = "/dev/shm"
_SMALL_ALIGN = 64          # cache line
_LARGE_ALIGN = 4096        # page, for ranges of at least _LARGE_FROM bytes
_LARGE_FROM = 64 << 10
log = logging.getLogger("cxlkv.client")


def _round_up(n: int, a: int) -> int:
    return (n + a - 1) & ~(a - 1)


@dataclass(eq=False)
class PoolBuffer:
    """One registered shared-memory mapping.

    Attributes:
        buffer_id: the daemon's id for it.
        size_bytes: mapped size.
        array: the whole mapping as a uint8 array.
        base: address of its first byte.
        dedicated: created for one large allocation; unregistered when it is freed.
        external: :class:`SharedHostMemory` registered by :meth:`BufferPool.locate`:
            no ranges are carved from it and the pool never unmaps it.
    """

    buffer_id: int
    size_bytes: int
    mm: mmap.mmap = field(repr=False)
    array: np.ndarray = field(repr=False)
    base: int
    dedicated: bool = False
    external: bool = False
    # free ranges: parallel sorted lists of offsets and lengths
    free_offsets: list[int] = field(default_factory=list)
    free_lengths: list[int] = field(default_factory=list)
    used: dict[int, int] = field(default_factory=dict)

    def alloc(self, n: int) -> int | None:
        """First-fit allocation of ``n`` bytes (aligned); the offset or ``None``."""
        align = _LARGE_ALIGN if n >= _LARGE_FROM else _SMALL_ALIGN
        size = _round_up(max(n, 1), _SMALL_ALIGN)
        for k, (off, length) in enumerate(zip(self.free_offsets, self.free_lengths)):
            start = _round_up(off, align)
            pad = start - off
            if length - pad < size:
                continue
            # split: [off, start) stays free, [start, start+size) used, rest free
            del self.free_offsets[k], self.free_lengths[k]
            if pad:
                self._insert_free(off, pad)
            rest = length - pad - size
            if rest:
                self._insert_free(start + size, rest)
            self.used[start] = size
            return start
        return None

    def free(self, offset: int) -> None:
        """Return a range; adjacent free ranges merge."""
        size = self.used.pop(offset)
        self._insert_free(offset, size)

    def _insert_free(self, off: int, length: int) -> None:
        k = bisect.bisect_left(self.free_offsets, off)
        # merge with the next range
        if k < len(self.free_offsets) and off + length == self.free_offsets[k]:
            length += self.free_lengths[k]
            del self.free_offsets[k], self.free_lengths[k]
        # merge with the previous range
        if k > 0 and self.free_offsets[k - 1] + self.free_lengths[k - 1] == off:
            self.free_lengths[k - 1] += length
            return
        self.free_offsets.insert(k, off)
        self.free_lengths.insert(k, length)

    @property
    def idle(self) -> bool:
        """Nothing allocated."""
        return not self.used


class BufferPool:
    """Shared-memory segments registered with one daemon, carved into ranges.

    Args:
        register: ``register(path, size_bytes, pid) -> buffer_id`` (a RegisterBuffer call).
        unregister: ``unregister(buffer_id)`` (an UnregisterBuffer call; errors ignored).
        pool_bytes: size of the first and of every further regular segment.
        share_with_group: create files group-readable/writable (a daemon running
            under another uid must be able to open them).

    Thread-safety: all methods may be called from any thread (one lock).
    """

    def __init__(
        self,
        register: Callable[[str, int, int], int],
        unregister: Callable[[int], None],
        pool_bytes: int,
        *,
        share_with_group: bool = False,
    ) -> None:
        if pool_bytes <= 0:
            raise InvalidArgument(f"buffer_pool_bytes must be > 0, got {pool_bytes}")
        self._register = register
        self._unregister = unregister
        self.pool_bytes = _round_up(pool_bytes, _LARGE_ALIGN)
        self._mode = 0o660 if share_with_group else 0o600
        self._segments: list[PoolBuffer] = []
        # Never held across a call to the daemon (registering a segment may
        # reconnect, and a reconnection revalidates the segments).
        self._lock = threading.Lock()
        # Ranges released by garbage collection (free_later): a finalizer may run in
        # any thread at any allocation, also inside this pool's own methods, so it
        # only queues here; the next alloc/free/revalidate applies them.
        self._pending: deque[tuple[PoolBuffer, int]] = deque()
        self._closed = False
        # One registration of a SharedHostMemory at a time (a daemon call: not under _lock).
        self._adopt_lock = threading.Lock()
        self._refused: set[int] = set()  # SharedHostMemory the daemon refused (staged instead)
        #: Bytes copied through staging ranges by the client's calls (counted by
        #: ``_Staged``; a statistic: increments are not locked).
        self.staged_bytes = 0

    # -- segments -----------------------------------------------------------
    def _new_segment(self, size: int, dedicated: bool) -> PoolBuffer:
        path = os.path.join(SHM_DIR, f"cxlkv-buf-{os.getpid()}-{uuid.uuid4().hex[:12]}")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, self._mode)
        except OSError as exc:
            raise NoSpace(f"cannot create shared buffer {path}: {exc.strerror}") from None
        try:
            os.fchmod(fd, self._mode)
            try:
                os.ftruncate(fd, size)
                mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                               prot=mmap.PROT_READ | mmap.PROT_WRITE)
            except OSError as exc:
                raise NoSpace(f"cannot size or map a {size}-byte shared buffer in {SHM_DIR}: {exc.strerror}") from None
            try:
                buffer_id = self._register(path, size, os.getpid())
            except BaseException:
                mm.close()
                raise
        finally:
            os.close(fd)
            try:
                os.unlink(path)  # the mappings keep the memory; nothing is left on disk
            except FileNotFoundError:
                pass
        arr = np.frombuffer(mm, dtype=np.uint8)
        seg = PoolBuffer(buffer_id, size, mm, arr, address_of(arr), dedicated)
        seg.free_offsets.append(0)
        seg.free_lengths.append(size)
        return seg

    # -- ranges -------------------------------------------------------------
    def alloc(self, nbytes: int) -> tuple[PoolBuffer, int]:
        """Reserve ``nbytes`` of shared memory.

        Returns:
            (segment, offset); release with :meth:`free`.

        Raises:
            NoSpace: /dev/shm cannot hold a new segment.
            CxlkvError: the daemon refused to register it.
        """
        with self._lock:
            release = self._apply_pending()
            if self._closed:
                raise InvalidArgument("the client's buffer pool is closed")
            found = self._fit(nbytes)
        self._release_all(release)
        if found is not None:
            return found
        dedicated = nbytes > self.pool_bytes
        size = _round_up(max(nbytes, 1), _LARGE_ALIGN) if dedicated else self.pool_bytes
        seg = self._new_segment(size, dedicated)  # a daemon call: outside the lock
        with self._lock:
            added = not self._closed
            if added:
                self._segments.append(seg)
                off = seg.alloc(nbytes)
        if not added:
            self._release_segment(seg)
            raise InvalidArgument("the client's buffer pool is closed")
        assert off is not None
        return seg, off

    def _fit(self, nbytes: int) -> tuple[PoolBuffer, int] | None:
        """A range in an existing shared segment (under the lock), or ``None``."""
        for seg in self._segments:
            if not seg.dedicated:
                off = seg.alloc(nbytes)
                if off is not None:
                    return seg, off
        return None

    def free(self, seg: PoolBuffer, offset: int) -> None:
        """Release a range from :meth:`alloc`; a dedicated segment goes back to the daemon.

        A no-op once the pool is closed (views may outlive their client), and for a
        segment already dropped (:meth:`revalidate`).
        """
        with self._lock:
            release = self._apply_pending()
            if self._free_locked(seg, offset):
                release.append(seg)
        self._release_all(release)

    def free_later(self, seg: PoolBuffer, offset: int) -> None:
        """:meth:`free` for a finalizer (garbage collection may run it anywhere):
        only queued, applied by the next alloc/free."""
        self._pending.append((seg, offset))

    def _free_locked(self, seg: PoolBuffer, offset: int) -> bool:
        """Free under the lock; whether ``seg`` is now to be released (dedicated, idle)."""
        if self._closed or seg not in self._segments:
            return False
        seg.free(offset)
        if not (seg.dedicated and seg.idle):
            return False
        self._segments.remove(seg)
        return True

    def _apply_pending(self) -> list[PoolBuffer]:
        """Apply the queued frees (under the lock); the segments to release after it."""
        release: list[PoolBuffer] = []
        pending = self._pending
        while pending:
            seg, offset = pending.popleft()
            if self._free_locked(seg, offset):
                release.append(seg)
        return release

    def _release_all(self, segs: list[PoolBuffer]) -> None:
        for seg in segs:
            self._release_segment(seg)

    def _release_segment(self, seg: PoolBuffer) -> None:
        try:
            self._unregister(seg.buffer_id)
        except Exception:  # daemon gone: its reaper drops the buffer when we exit
            pass
        if seg.external:  # the SharedHostMemory's mapping: its owner unmaps it
            return
        seg.array = np.empty(0, dtype=np.uint8)
        try:
            seg.mm.close()
        except BufferError:  # a user still holds a view; the GC unmaps it later
            pass

    def revalidate(self, registered: Callable[[list[int]], list[bool]]) -> int:
        """Drop the segments the daemon no longer knows (it restarted).

        Args:
            registered: ``registered(buffer_ids) -> [bool]``, one per id (a
                BufferStatus call).

        Returns:
            How many segments were dropped. They only leave the pool: a range in
            use by a call in another thread, or a view from
            :meth:`cxlkv.Client.buffer` taken before, keeps its memory (unmapped
            when the last reference goes), but it is no longer shared with the
            daemon — values there travel through a new segment (staged) instead of
            zero-copy. Later allocations get new segments, registered with the
            daemon now running.
        """
        segs = self.segments
        if not segs:
            return 0
        known = registered([s.buffer_id for s in segs])
        stale = {id(s) for s, ok in zip(segs, known) if not ok}
        if stale:
            with self._lock:
                self._segments = [s for s in self._segments if id(s) not in stale]
        return len(stale)

    def locate(self, addr: int, nbytes: int) -> tuple[int, int] | None:
        """``(buffer_id, offset)`` if ``[addr, addr + nbytes)`` lies in one segment, else ``None``."""
        for seg in self._segments:  # list reads are atomic; segments are few
            off = addr - seg.base
            if 0 <= off and off + nbytes <= seg.size_bytes:
                return seg.buffer_id, off
        mem = find_shared(addr, nbytes)
        if mem is not None:
            adopted = self._adopt(mem)
            if adopted is not None:
                return adopted.buffer_id, addr - adopted.base
        return None

    def _adopt(self, mem: SharedHostMemory) -> PoolBuffer | None:
        """Register ``mem`` with the daemon as an external segment (once); ``None`` if refused."""
        with self._adopt_lock:
            for seg in self._segments:
                if seg.external and seg.base == mem.address:
                    return seg
            if self._closed or mem.address in self._refused:
                return None
            try:
                buffer_id = mem.register_with(self._register, self._mode)
            except (CxlkvError, OSError) as exc:
                self._refused.add(mem.address)
                log.warning("shared host memory %r not registered with the daemon (%s): its values are staged",
                            mem, exc)
                return None
            seg = PoolBuffer(buffer_id, mem.mapped_bytes, mem.mm, mem.array, mem.address, external=True)
            with self._lock:
                added = not self._closed
                if added:
                    self._segments.append(seg)
            if not added:
                self._release_segment(seg)
                return None
            mem.adopted_by(self)
            return seg

    def forget_shared(self, mem: SharedHostMemory) -> None:
        """Unregister ``mem`` (it is being freed): later ranges there are no longer zero-copy."""
        with self._adopt_lock:
            with self._lock:
                gone = [s for s in self._segments if s.external and s.base == mem.address]
                self._segments = [s for s in self._segments if s not in gone]
            self._refused.discard(mem.address)
        for seg in gone:
            self._release_segment(seg)

    @property
    def segments(self) -> list[PoolBuffer]:
        """The live segments (a copy)."""
        with self._lock:
            return list(self._segments)

    def close(self) -> None:
        """Unregister and unmap every segment (memory views into them read garbage-free
        until collected; do not use them afterwards)."""
        with self._lock:
            segs, self._segments = self._segments, []
            self._closed = True
        for seg in segs:
            self._release_segment(seg)
