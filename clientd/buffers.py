"""Shared buffers: application memory the daemon maps for zero-copy puts and gets.

An SDK creates a file under ``/dev/shm``, sizes it, maps it, and names it in
RegisterBuffer (path, size, pid). The daemon checks the file and maps it
``MAP_SHARED``; the SDK then unlinks the file, so nothing is left behind even if
either process crashes (the memory lives as long as one mapping does). A buffer
is dropped on UnregisterBuffer or once its owning process has exited (checked
periodically with the process start time, so a recycled pid is not mistaken
for the owner).

Why a ``/dev/shm`` file rather than a memfd passed over ``SCM_RIGHTS``: gRPC
cannot carry file descriptors, and the API must be the same on both framings
and in every language; a path is a plain string field. docs/clientd.md has the
full discussion.

Every access names ``(buffer_id, offset_bytes, length_bytes)`` and is checked
here before any byte moves: unknown ids → :class:`UnknownBuffer`, ranges outside
the buffer → :class:`OutOfRange`. Buffers in use by a copy are reference-counted,
so an UnregisterBuffer during a copy unmaps only when the copy is done.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import re
import secrets
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from cxlkv.errors import CxlkvError, InvalidArgument, OutOfRange, UnknownBuffer
from cxlkv.transport.bindings import (
    cxlkv_guard_total_hits, guard_add_memory, guard_hits_memory, guard_remove_memory,
)
from cxlkv.runtime.procs import process_start_time

__all__ = ["SHM_DIR", "BUFFER_NAME", "SharedBuffer", "BufferRegistry", "process_start_time"]

log = logging.getLogger(__name__)

#: The only directory shared buffers may live in.
SHM_DIR = Path("/dev/shm")
#: Name prefix of the SDK's shared buffer files: ``cxlkv-buf-<pid>-<random>``.
ORPHAN_PREFIX = "cxlkv-buf-"
#: The only file names RegisterBuffer accepts: ``cxlkv-buf-<pid>-<12 hex digits>``,
#: where ``<pid>`` is the registering process (cxlkv.client._pool names its files so).
BUFFER_NAME = re.compile(r"cxlkv-buf-([1-9][0-9]{0,9})-[0-9a-f]{12}")


def process_uid(pid: int) -> int | None:
    """The uid owning ``pid`` (the owner of ``/proc/<pid>``), or ``None`` if it is gone."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


@dataclass(eq=False)
class SharedBuffer:
    """One mapped shared buffer.

    Attributes:
        buffer_id: the id handed to the application (random, not guessable).
        path: the file it was registered from (it is usually unlinked since).
        size_bytes: mapped length.
        pid: owning process (> 0; the buffer is dropped once it exits).
        pid_start_time: the owner's start time (clock ticks), to detect pid reuse.
        view: writable memoryview over the whole mapping.
    """

    buffer_id: int
    path: str
    size_bytes: int
    pid: int
    pid_start_time: int | None
    view: memoryview
    _mm: mmap.mmap | None = field(repr=False, default=None)
    _refs: int = 0
    _dead: bool = False
    #: Base address of the mapping in the SIGBUS guard (0: not guarded). The owner
    #: can truncate the file under the daemon's mapping; the guard turns the
    #: accesses past its new end into zero memory instead of a SIGBUS death.
    _guard_base: int = 0
    #: The guard absorbed a fault here: the file shrank; every later use is refused.
    _shrunk: bool = False

    def shrunk_error(self) -> OutOfRange:
        return OutOfRange(f"buffer {self.buffer_id}: its file ({self.path}) shrank under the daemon's mapping "
                          f"(truncated by its owner); unregister it and register a new buffer")

    def check_range(self, offset_bytes: int, length_bytes: int) -> None:
        """Check that ``[offset, offset + length)`` lies inside the buffer.

        Raises:
            OutOfRange: it does not (the message gives the buffer size).
        """
        if offset_bytes < 0 or length_bytes < 0 or offset_bytes > self.size_bytes \
                or length_bytes > self.size_bytes - offset_bytes:
            raise OutOfRange(
                f"range [{offset_bytes}, {offset_bytes}+{length_bytes}) is outside buffer "
                f"{self.buffer_id} of {self.size_bytes} bytes"
            )

    def _unmap(self) -> None:
        guard_remove_memory(self._guard_base)
        self._guard_base = 0
        self.view.release()
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:  # a stray export; the mapping goes with the object
                log.warning("buffer %d still exported at unmap; left to the GC", self.buffer_id)
            self._mm = None


class BufferRegistry:
    """The registered shared buffers of one daemon.

    Args:
        max_buffers: most buffers registered at once (a runaway client cannot
            exhaust the daemon's address space or file descriptors).
        shm_dir: the directory buffers must live in (tests may point elsewhere).

    Thread-safety: every method may be called from any thread (one lock); copies
    hold a reference (:meth:`acquire` / :meth:`release`) while they run in the
    copy thread pool.
    """

    def __init__(self, *, max_buffers: int = 4096, shm_dir: Path = SHM_DIR) -> None:
        self._buffers: dict[int, SharedBuffer] = {}
        self._lock = threading.Lock()
        self._max_buffers = max_buffers
        self._shm_dir = Path(os.path.realpath(shm_dir))
        self._uid = os.geteuid()
        #: ``(st_dev, st_ino)`` of files this daemon maps or writes itself (regions,
        #: the SSD tier file): never accepted as a buffer.
        self._protected: frozenset[tuple[int, int]] = frozenset()
        #: The SIGBUS guard's total when the buffers were last checked for faults.
        self._guard_seen = cxlkv_guard_total_hits()

    def protect(self, file_ids: Iterable[tuple[int, int]]) -> None:
        """Refuse the files ``(st_dev, st_ino)`` as buffers from now on (the daemon's
        regions and tier files)."""
        self._protected = self._protected | frozenset(file_ids)

    # -- registration -------------------------------------------------------
    def register(self, path: str, size_bytes: int, pid: int, *,
                 peer_pid: int | None = None, peer_uid: int | None = None) -> SharedBuffer:
        """Map the shared-memory file ``path`` of ``size_bytes`` bytes owned by ``pid``.

        The rules (docs/clientd.md, "Shared buffers"): ``path`` is
        ``<shm dir>/cxlkv-buf-<pid>-<12 hex digits>``, a regular file (not a
        symbolic link: opened with ``O_NOFOLLOW``), not a file this daemon maps
        itself (:meth:`protect`), owned by the caller's uid, exactly
        ``size_bytes`` long; ``pid`` is the caller's running process.

        Args:
            path: absolute path of the buffer file.
            size_bytes: the file's size; must match exactly and be > 0.
            pid: the registering (owning) process, > 0; the buffer is dropped once it exits.
            peer_pid: the caller's pid from the socket (``SO_PEERCRED``), when known;
                ``pid`` must equal it.
            peer_uid: the caller's uid from the socket, when known; the file must be
                owned by it. Unknown (the gRPC socket): the file must be owned by
                the uid running ``pid``.

        Returns:
            The new buffer (its id is what the application passes in later calls).

        Raises:
            InvalidArgument: pid <= 0, not the caller's or not running; bad path
                (not absolute, outside the shm dir, not named by the buffer
                convention, a symbolic link, not a regular file, missing, not
                accessible); one of the daemon's own region files; owned by another
                uid; size mismatch or 0; or too many buffers.
        """
        if not isinstance(path, str) or not path or "\x00" in path:
            raise InvalidArgument("buffer path must be a non-empty string without NUL")
        if not os.path.isabs(path):
            raise InvalidArgument(f"buffer path {path!r} must be absolute")
        if size_bytes <= 0:
            raise InvalidArgument(f"buffer size must be > 0 bytes, got {size_bytes}")
        if pid <= 0:
            raise InvalidArgument(f"buffer owner pid must be the caller's pid (> 0), got {pid}")
        if peer_pid is not None and pid != peer_pid:
            raise InvalidArgument(f"buffer owner pid {pid} is not the caller's pid {peer_pid}")
        parent = Path(os.path.realpath(os.path.dirname(path)))
        if parent != self._shm_dir:
            raise InvalidArgument(f"buffer path {path!r} must name a file directly under {self._shm_dir}")
        m = BUFFER_NAME.fullmatch(os.path.basename(path))
        if m is None:
            raise InvalidArgument(
                f"buffer file name {os.path.basename(path)!r} is not cxlkv-buf-<pid>-<12 hex digits>")
        if int(m.group(1)) != pid:
            raise InvalidArgument(f"buffer file {path} is not named after the owner pid {pid}")
        start_time = process_start_time(pid)
        if start_time is None:
            raise InvalidArgument(f"buffer owner pid {pid} is not running")
        owner_uid = peer_uid if peer_uid is not None else process_uid(pid)
        if owner_uid is None:
            raise InvalidArgument(f"buffer owner pid {pid} is not running")
        with self._lock:
            if len(self._buffers) >= self._max_buffers:
                raise InvalidArgument(f"too many shared buffers registered (limit {self._max_buffers})")
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            raise InvalidArgument(f"buffer file {path} does not exist") from None
        except PermissionError:
            raise InvalidArgument(f"buffer file {path}: permission denied (the daemon needs read and write)") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise InvalidArgument(f"buffer file {path} is a symbolic link") from None
            raise InvalidArgument(f"buffer file {path}: {exc.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise InvalidArgument(f"buffer file {path} is not a regular file")
            if (st.st_dev, st.st_ino) in self._protected:
                raise InvalidArgument(f"buffer file {path} is one of this daemon's region files")
            if st.st_nlink != 1:
                raise InvalidArgument(f"buffer file {path} has {st.st_nlink} links (a buffer file has exactly one)")
            if st.st_uid != owner_uid:
                raise InvalidArgument(
                    f"buffer file {path} is owned by uid {st.st_uid}, not by the caller's uid {owner_uid}"
                )
            if st.st_size != size_bytes:
                raise InvalidArgument(
                    f"buffer file {path} is {st.st_size} bytes, RegisterBuffer said {size_bytes}"
                )
            try:
                mm = mmap.mmap(fd, size_bytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
            except (OSError, ValueError, OverflowError) as exc:
                raise InvalidArgument(f"cannot map buffer file {path}: {exc}") from None
        finally:
            os.close(fd)
        with self._lock:
            if len(self._buffers) >= self._max_buffers:
                mm.close()
                raise InvalidArgument(f"too many shared buffers registered (limit {self._max_buffers})")
            buffer_id = secrets.randbits(63) or 1
            while buffer_id in self._buffers:
                buffer_id = secrets.randbits(63) or 1
            buf = SharedBuffer(buffer_id, path, size_bytes, pid, start_time, memoryview(mm), mm)
            buf._guard_base = guard_add_memory(mm)
            if not buf._guard_base:
                buf._unmap()
                raise InvalidArgument("too many mappings in the SIGBUS guard to map another buffer")
            self._buffers[buffer_id] = buf
        log.debug("registered buffer %d: %s (%d bytes, pid %d)", buffer_id, path, size_bytes, pid)
        return buf

    def unregister(self, buffer_id: int) -> None:
        """Drop a buffer; it is unmapped once no copy uses it.

        Raises:
            UnknownBuffer: never registered or already dropped.
        """
        with self._lock:
            buf = self._buffers.pop(buffer_id, None)
            if buf is None:
                raise UnknownBuffer(f"unknown buffer id {buffer_id}")
            buf._dead = True
            unmap = buf._refs == 0
        if unmap:
            buf._unmap()
        log.debug("unregistered buffer %d", buffer_id)

    def registered(self, buffer_ids: Iterable[int]) -> list[bool]:
        """Whether each id is a registered buffer, in order."""
        with self._lock:
            known = self._buffers
            return [bid in known for bid in buffer_ids]

    # -- use ----------------------------------------------------------------
    def acquire(self, buffer_id: int, offset_bytes: int, length_bytes: int) -> SharedBuffer:
        """Look up a buffer, check a range of it and hold it mapped for a copy.

        Every successful call must be paired with :meth:`release`.

        Raises:
            UnknownBuffer: the id is not registered.
            OutOfRange: the range is not inside the buffer.
        """
        with self._lock:
            self._check_faults()
            buf = self._buffers.get(buffer_id)
            if buf is None:
                raise UnknownBuffer(f"unknown buffer id {buffer_id} (never registered, or unregistered)")
            if buf._shrunk:
                raise buf.shrunk_error()
            buf.check_range(offset_bytes, length_bytes)
            buf._refs += 1
            return buf

    def _check_faults(self) -> None:
        """Mark the buffers whose file shrank (the guard absorbed a fault in their
        mapping) once the guard's total moved; one load when nothing happened.
        Call with the lock held."""
        total = cxlkv_guard_total_hits()
        if total == self._guard_seen:
            return
        self._guard_seen = total
        for buf in self._buffers.values():
            if not buf._shrunk and guard_hits_memory(buf._guard_base):
                buf._shrunk = True
                log.warning("buffer %d (pid %d): its file shrank under the daemon's mapping; refused from now on",
                            buf.buffer_id, buf.pid)

    def acquire_many(self, ranges: list[tuple[int, int, int]]) -> list[SharedBuffer | CxlkvError]:
        """:meth:`acquire` for many ``(buffer_id, offset, length)`` ranges under one lock.

        Returns:
            Per range, the held buffer (release each with :meth:`release`) or the
            :class:`UnknownBuffer` / :class:`OutOfRange` error for that range.
        """
        out: list[SharedBuffer | CxlkvError] = []
        append = out.append
        with self._lock:
            self._check_faults()
            get = self._buffers.get
            for buffer_id, offset, length in ranges:
                buf = get(buffer_id)
                if buf is None:
                    append(UnknownBuffer(f"unknown buffer id {buffer_id} (never registered, or unregistered)"))
                    continue
                if buf._shrunk:
                    append(buf.shrunk_error())
                    continue
                size = buf.size_bytes
                if offset > size or length > size - offset:
                    append(OutOfRange(
                        f"range [{offset}, {offset}+{length}) is outside buffer {buffer_id} of {size} bytes"))
                    continue
                buf._refs += 1
                append(buf)
        return out

    def release_many(self, bufs: list[SharedBuffer]) -> None:
        """:meth:`release` each of ``bufs`` (one lock)."""
        unmap: list[SharedBuffer] = []
        with self._lock:
            for buf in bufs:
                buf._refs -= 1
                if buf._dead and buf._refs == 0:
                    unmap.append(buf)
        for buf in unmap:
            buf._unmap()

    def release(self, buf: SharedBuffer) -> None:
        """End one :meth:`acquire`; unmaps a buffer unregistered meanwhile."""
        with self._lock:
            buf._refs -= 1
            unmap = buf._dead and buf._refs == 0
        if unmap:
            buf._unmap()

    # -- housekeeping -------------------------------------------------------
    def reap_dead_owners(self) -> list[int]:
        """Drop every buffer whose owning process has exited.

        Returns:
            The ids dropped.
        """
        with self._lock:
            owned = [(b.buffer_id, b.pid, b.pid_start_time) for b in self._buffers.values()]
        gone: list[int] = []
        starts: dict[int, int | None] = {}
        for buffer_id, pid, start in owned:
            if pid not in starts:
                starts[pid] = process_start_time(pid)
            if starts[pid] != start:
                gone.append(buffer_id)
        for buffer_id in gone:
            try:
                self.unregister(buffer_id)
            except UnknownBuffer:
                continue
            log.info("dropped buffer %d: its owner process has exited", buffer_id)
        return gone

    def reap_orphan_files(self) -> list[str]:
        """Delete SDK buffer files (``cxlkv-buf-<pid>-*`` in the shm directory) whose
        creating process has exited.

        The SDK unlinks its file as soon as this daemon has mapped it; a process
        killed between creating and registering a buffer (a one-RPC window) leaves
        the file behind. Only files owned by this daemon's uid and named after a
        pid that is no longer running are removed.

        Returns:
            The paths removed.
        """
        removed: list[str] = []
        try:
            entries = list(os.scandir(self._shm_dir))
        except OSError:
            return removed
        for entry in entries:
            name = entry.name
            if not name.startswith(ORPHAN_PREFIX):
                continue
            pid_text = name[len(ORPHAN_PREFIX):].split("-", 1)[0]
            if not pid_text.isdigit() or process_start_time(int(pid_text)) is not None:
                continue
            try:
                if entry.stat(follow_symlinks=False).st_uid != self._uid or not entry.is_file(follow_symlinks=False):
                    continue
                os.unlink(entry.path)
            except OSError:
                continue
            removed.append(entry.path)
            log.info("removed %s: a shared buffer file left by exited process %s", entry.path, pid_text)
        return removed

    def stats(self) -> tuple[int, int]:
        """(buffers registered, bytes mapped)."""
        with self._lock:
            return len(self._buffers), sum(b.size_bytes for b in self._buffers.values())

    def close(self) -> None:
        """Drop every buffer (daemon shutdown)."""
        with self._lock:
            ids = list(self._buffers)
        for buffer_id in ids:
            try:
                self.unregister(buffer_id)
            except UnknownBuffer:
                continue

    def __len__(self) -> int:
        with self._lock:
            return len(self._buffers)


def source_shrank(src: object) -> bool:
    """Whether ``src`` (a put's source) is a shared buffer's mapping in which the
    SIGBUS guard absorbed a fault: its file shrank, so the bytes read past the new
    end were zeros, not the owner's value."""
    if not isinstance(src, memoryview) or not isinstance(src.obj, mmap.mmap) or src.nbytes == 0:
        return False
    from cxlkv.transport._transport import ffi

    base = int(ffi.cast("uintptr_t", ffi.from_buffer("char[]", src)))
    return guard_hits_memory(base) > 0
