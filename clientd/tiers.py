"""clientd's tiers beyond the mapped CXL regions, and the worker that moves bytes between tiers.

* :class:`FileRegion` — the SSD tier: a file on a shared path (every clientd
  opens the same one, standing for a shared NVMe namespace or filesystem), read
  and written with ``os.preadv``/``os.pwrite`` — never mapped. It has the same
  identity header and self-describing extent layout (object header, key, value)
  as a CXL region, and the subset of :class:`cxlkv.transport.Region`'s methods
  that the read and put paths use, so those paths serve it unchanged.
* :func:`open_dram_tier` — the host-local DRAM tier: private memory of this
  daemon (a ``/dev/shm`` file unlinked as soon as it is mapped, so it lives
  exactly as long as the process), formatted like a region and mounted on the
  master as a DRAM segment owned by this clientd (``MountSegment``).
* :class:`TaskWorker` — runs the master's move tasks (docs/tiers.md): long-polls
  ``ExchangeTasks``, copies each object's extent from source to destination in a
  pool thread (verifying the object header and checksum of what it read, and
  reading the destination back), and reports the outcomes on the next
  ``ExchangeTasks``, which asks for the next batch too.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import time
import uuid
from concurrent.futures import Executor
from typing import Any, Sequence

import xxhash

from cxlkv.errors import CxlkvError, ErrorCode, InvalidArgument, NoSpace, OutOfRange, RegionError
from cxlkv.layout.objheader import object_mismatch
from cxlkv.transport import portable
from cxlkv.v1 import common_pb2, master_pb2

__all__ = ["FileRegion", "open_dram_tier", "TaskWorker", "dram_segment_name"]

log = logging.getLogger(__name__)

_xxh3 = xxhash.xxh3_64_intdigest
#: Long-poll wait of one ExchangeTasks call, in milliseconds.
FETCH_WAIT_MS = 1000
#: errnos of a full filesystem: answered NO_SPACE, never UNAVAILABLE.
_FULL_ERRNOS = frozenset((errno.ENOSPC, errno.EDQUOT))
#: Failed moves are logged at most once per this many seconds (the others counted in that line).
MOVE_LOG_INTERVAL_S = 5.0
#: Pause after a batch whose every move failed: doubles from the first value up to the second (s).
FAILED_BATCH_PAUSE_S = (0.2, 5.0)


def _writable(buf: Any, what: str) -> memoryview:
    view = memoryview(buf).cast("B")
    if view.readonly:
        raise CxlkvError(f"{what}: destination buffer is read-only")
    return view


class FileRegion:
    """A region stored in a file, accessed with positioned reads and writes (no mmap).

    Bounds are checked like the transport's: any access outside ``[0, size_bytes)``
    raises :class:`~cxlkv.errors.RegionError`. ``flush``/``invalidate`` are no-ops:
    the page cache is coherent between processes of one machine (a real shared
    filesystem across hosts would need O_DIRECT or its own coherence).

    Args:
        path: the file (must exist).
        fd: an open read-write descriptor of it.

    Thread-safety: positioned I/O needs no shared file offset; safe from copy threads.
    """

    def __init__(self, path: str, fd: int) -> None:
        self._path = path
        self._fd = fd
        self._size = os.fstat(fd).st_size
        #: Why the file may no longer be used (:meth:`retire`; "" while it is fine).
        self._retired = ""

    @classmethod
    def open(cls, path: str, size: int = 0, create: bool = False) -> "FileRegion":
        """Open (or with ``create``, create and size to ``size`` bytes, its blocks
        allocated in its filesystem) the file.

        Raises:
            RegionError: missing, unreadable, or of size 0; a file to create that
                does not fit its filesystem (nothing is left behind).
        """
        from cxlkv.transport.space import check_fits, reserve_file

        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        existed = os.path.exists(path)
        if create and size and (not existed or os.path.getsize(path) == 0):
            check_fits(path, size, "SSD tier")
        try:
            fd = os.open(path, flags, 0o660)
        except OSError as exc:
            raise RegionError(f"SSD tier {path}: {exc.strerror or exc}", path=path) from None
        try:
            if create and size and os.fstat(fd).st_size == 0:
                os.ftruncate(fd, size)
                reserve_file(path, "SSD tier")  # a file larger than its filesystem fails now
        except BaseException:
            os.close(fd)
            if not existed:
                os.unlink(path)
            raise
        r = cls(path, fd)
        if r._size == 0:
            os.close(fd)
            raise RegionError(f"SSD tier {path} is empty (create and format it first)", path=path)
        return r

    @property
    def path(self) -> str:
        return self._path

    @property
    def size_bytes(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return f"FileRegion({self._path!r}, {self._size} B)"

    def _check(self, op: str, offset: int, length: int) -> None:
        if self._fd < 0:
            raise RegionError(f"SSD tier {self._path} is closed", path=self._path)
        if self._retired:
            raise RegionError(self._retired, path=self._path)
        if offset < 0 or length < 0 or offset + length > self._size:
            raise RegionError(f"{op}: [{offset}, {offset + length}) is outside SSD tier {self._path} "
                              f"of {self._size} bytes", path=self._path)

    def read(self, offset: int, length: int, *, invalidate: bool = False) -> bytes:
        """``length`` bytes at ``offset`` (``invalidate``, as every flush/invalidate
        argument here, is accepted for the Region API and has nothing to do: the
        page cache is coherent)."""
        self._check("read", offset, length)
        out = bytearray(length)
        self._preadv_full(memoryview(out), offset)
        return bytes(out)

    def view(self, offset: int, length: int) -> memoryview:
        """A read-only copy of ``length`` bytes at ``offset`` (a file has no mapping to view)."""
        return memoryview(self.read(offset, length))

    def _preadv_full(self, dst: memoryview, offset: int) -> None:
        done = 0
        n = len(dst)
        while done < n:
            got = os.preadv(self._fd, [dst[done:]], offset + done)
            if got <= 0:
                raise RegionError(f"SSD tier {self._path}: short read at {offset + done}", path=self._path)
            done += got

    def _pwrite_full(self, src: memoryview, offset: int) -> None:
        done = 0
        n = len(src)
        while done < n:
            put = os.pwrite(self._fd, src[done:], offset + done)
            if put <= 0:
                raise RegionError(f"SSD tier {self._path}: short write at {offset + done}", path=self._path)
            done += put

    def copy_in(self, offset: int, src: Any, *, flush: bool = False) -> int:
        """Write ``src`` at ``offset``; returns bytes written.

        Raises:
            NoSpace: the file's filesystem is full (``ENOSPC``, ``EDQUOT``): possible
                despite the preallocation at start on filesystems that cannot
                reserve overwrites (copy-on-write, thin provisioning) or after holes
                were punched into the file.
            RegionError: outside the file, or another write error (errno set).
        """
        view = memoryview(src).cast("B")
        self._check("copy_in", offset, len(view))
        try:
            self._pwrite_full(view, offset)
        except OSError as exc:
            if exc.errno in _FULL_ERRNOS:
                raise NoSpace(f"SSD tier {self._path}: its filesystem is full ({errno.errorcode[exc.errno]}) "
                              f"writing {len(view)} bytes at {offset}", requested_bytes=len(view)) from None
            raise RegionError(f"SSD tier {self._path}: write failed: {exc.strerror or exc}",
                              path=self._path, errno=exc.errno or 0) from None
        return len(view)

    def copy_out(self, offset: int, dst: Any, *, invalidate: bool = False) -> int:
        """Read ``len(dst)`` bytes at ``offset`` into ``dst``; returns bytes read."""
        view = _writable(dst, "copy_out")
        self._check("copy_out", offset, len(view))
        try:
            self._preadv_full(view, offset)
        except OSError as exc:
            raise RegionError(f"SSD tier {self._path}: read failed: {exc.strerror or exc}",
                              path=self._path) from None
        return len(view)

    def copy_in_hashed(self, offset: int, src: Any, *, flush: bool = False) -> int:
        """:meth:`copy_in`, returning the xxh3_64 of ``src`` (as the transport's Region does)."""
        self.copy_in(offset, src)
        return _xxh3(memoryview(src).cast("B"))

    def copy_out_hashed(self, offset: int, dst: Any, *, invalidate: bool = False) -> int:
        """:meth:`copy_out`, returning the xxh3_64 of what ``dst`` received."""
        self.copy_out(offset, dst)
        return _xxh3(memoryview(dst).cast("B"))

    def copy_in_ranges(self, buf: Any, buf_offsets: Sequence[int], region_offsets: Sequence[int],
                       lengths: Sequence[int], *, flush: bool = False) -> int:
        """``copy_in`` of ``buf[b:b+n]`` to ``r`` for each range; returns bytes written."""
        view = memoryview(buf).cast("B")
        ranges = self._buffer_ranges("copy_in_ranges", len(view), buf_offsets, region_offsets, lengths)
        total = 0
        for b, r, n in ranges:
            total += self.copy_in(r, view[b:b + n])
        return total

    def copy_out_ranges(self, buf: Any, buf_offsets: Sequence[int], region_offsets: Sequence[int],
                        lengths: Sequence[int], *, invalidate: bool = False) -> int:
        """``copy_out`` of ``r`` into ``buf[b:b+n]`` for each range; returns bytes read."""
        view = _writable(buf, "copy_out_ranges")
        ranges = self._buffer_ranges("copy_out_ranges", len(view), buf_offsets, region_offsets, lengths)
        total = 0
        for b, r, n in ranges:
            total += self.copy_out(r, view[b:b + n])
        return total

    def _buffer_ranges(self, op: str, buf_bytes: int, buf_offsets: Sequence[int], region_offsets: Sequence[int],
                       lengths: Sequence[int]) -> list[tuple[int, int, int]]:
        """The ranges as int triples, every one checked on both sides before any byte moves.

        Raises:
            OutOfRange: a range outside the buffer; InvalidArgument: ragged arrays;
            RegionError: a range outside the file.
        """
        bo, ro, ln = ([int(x) for x in a] for a in (buf_offsets, region_offsets, lengths))
        if not len(bo) == len(ro) == len(ln):
            raise InvalidArgument(f"{op}: index arrays differ in length ({len(bo)}, {len(ro)}, {len(ln)})")
        for i, (b, r, n) in enumerate(zip(bo, ro, ln)):
            if b < 0 or n < 0 or b + n > buf_bytes:
                raise OutOfRange(f"{op}[{i}]: buffer range [{b}, {b} + {n}) outside a {buf_bytes}-byte buffer")
            self._check(f"{op}[{i}]", r, n)
        return list(zip(bo, ro, ln))

    # The batch calls of Region, through pread/pwrite (cxlkv.transport.portable).
    def copy_in_ranges_hashed(self, *args: Any, flush: bool = False) -> list[int]:
        """:meth:`copy_in_ranges` and the xxh3_64 of each source range."""
        return portable.copy_in_ranges_hashed(self, *args)

    def copy_out_ranges_hashed(self, *args: Any, invalidate: bool = False) -> list[int]:
        """:meth:`copy_out_ranges` and the xxh3_64 of each range read."""
        return portable.copy_out_ranges_hashed(self, *args)

    def write_headers(self, *args: Any, flush: bool = False) -> None:
        """``Region.write_headers`` (every span checked before any write)."""
        for i, (off, hb) in enumerate(zip(args[0], args[1])):
            self._check(f"write_headers[{i}]", int(off), int(hb))
        portable.write_headers(self, *args, flush=flush)

    def verify_headers(self, *args: Any, invalidate: bool = False) -> bytes:
        """``Region.verify_headers``: 1 per valid object, 0 per invalid one (every
        span checked first)."""
        for i, (off, hb) in enumerate(zip(args[0], args[1])):
            self._check(f"verify_headers[{i}]", int(off), int(hb))
        return portable.verify_headers(self, *args, invalidate=invalidate)

    def flush(self, offset: int = 0, length: int | None = None) -> None:
        """No-op (see the class docstring)."""

    def invalidate(self, offset: int = 0, length: int | None = None) -> None:
        """No-op (see the class docstring)."""

    def prefault(self, offset: int = 0, length: int | None = None) -> None:
        """No-op: a file has no mapping to fault in."""

    def retire(self) -> None:
        """The file shrank under this daemon (``RegionSet.check_files``): refuse every
        later read and write — a write would silently grow the file again, a read
        past the new end is short. The descriptor stays open (copies may still be
        running on it; closing it would let its number name another file)."""
        self._retired = (f"SSD tier {self._path} shrank under this daemon, which uses {self._size} bytes of it: "
                         f"restore or re-create the file and restart clientd")

    def close(self) -> None:
        """Close the descriptor (idempotent)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "FileRegion":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def dram_segment_name(name: str) -> str:
    """The DRAM tier's segment name of clientd ``name`` on this host in this process
    (unique: a restarted daemon mounts a new segment; the old one goes with its registration)."""
    host = socket.gethostname().split(".")[0][:20]
    return f"dram-{host}-{name[:20]}-{os.getpid()}"


def open_dram_tier(name: str, size_bytes: int, *, prefault: bool = False) -> Any:
    """Create this daemon's DRAM tier: private memory formatted as a region.

    Returns:
        A :class:`~cxlkv.clientd.regions.MappedRegion` (``local=True``): not
        reported at registration, mounted with ``MountSegment`` instead.

    Raises:
        RegionError: the memory cannot be created or mapped.
    """
    from cxlkv.clientd.regions import MappedRegion
    from cxlkv.layout.region import format_region, read_identity
    from cxlkv.transport import Region

    seg = dram_segment_name(name)
    path = f"/dev/shm/cxlkv-{seg}-{uuid.uuid4().hex[:8]}"
    region = Region.open(path, size=size_bytes, create=True)
    try:
        os.unlink(path)  # the mapping stays: memory private to this process, freed when it exits
        format_region(region, seg, index=False)  # host-local: read through the daemon only
        identity = read_identity(region)
        if prefault:
            region.prefault()
    except BaseException:
        region.close()
        raise
    log.info("DRAM tier %s: %d bytes of private memory", seg, size_bytes)
    return MappedRegion(seg, "(private memory)", region, identity, local=True)


class TaskWorker:
    """Runs the master's move tasks on this clientd (see the module docstring).

    Args:
        link: the master session (:class:`~cxlkv.clientd.master_link.MasterLink`).
        regions: the mapped regions and tiers.
        executor: thread pool for the copies.
        batch: most tasks fetched per call.
        flush_mode: write back / invalidate cache lines around copies (non-coherent CXL).

    Counters (``counters``): ``moves_done``, ``moves_failed``, ``move_bytes``,
    ``moves_no_space`` (destination filesystem full), ``moves_dropped`` (the
    object was removed or replaced during the copy: not a failure, not logged).

    A failed move is answered with its own code (``NO_SPACE`` for a full
    destination filesystem, ``CHECKSUM_MISMATCH``, else ``UNAVAILABLE``); failures
    are logged at most once per :data:`MOVE_LOG_INTERVAL_S` (that line counts the
    others), and after a batch whose every move failed the worker pauses before
    fetching again (:data:`FAILED_BATCH_PAUSE_S`, doubling), while the master stops
    giving moves into a tier that refused them (docs/tiers.md).
    """

    def __init__(self, link: Any, regions: Any, executor: Executor, *, batch: int = 64,
                 flush_mode: bool = False) -> None:
        self.link = link
        self.regions = regions
        self.executor = executor
        self.batch = batch
        self.flush_mode = flush_mode
        self.counters: dict[str, int] = {"moves_done": 0, "moves_failed": 0, "move_bytes": 0,
                                         "moves_no_space": 0, "moves_dropped": 0}
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._log_at = 0.0  # monotonic time of the last failure logged
        self._unlogged = 0  # failures since then
        self._pause_s = 0.0

    def start(self) -> None:
        """Start polling (on the running loop)."""
        if self.batch > 0:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="tier-tasks")

    async def close(self) -> None:
        """Stop polling; a batch being copied finishes first."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass

    async def _run(self) -> None:
        link = self.link
        loop = asyncio.get_running_loop()
        #: The batch just run and its outcomes, reported on the next exchange.
        ran: list[master_pb2.MoveTask] = []
        results: list[common_pb2.Status] = []
        while not self._closed:
            try:
                if not link.registered and not ran:
                    await asyncio.sleep(0.1)
                    continue
                report = [master_pb2.TaskResult(task_id=t.task_id, status=st) for t, st in zip(ran, results)]
                reported, outcomes = ran, results
                ran, results = [], []
                # Nothing of the last batch moved: report it alone and pause (do not spin on a failing tier).
                failing = bool(reported) and all(st.code for st in outcomes)
                resp = await link.call("ExchangeTasks", lambda: master_pb2.ExchangeTasksRequest(
                    client_id=link.client_id, epoch=link.epoch, results=report,
                    max_tasks=0 if failing else self.batch, wait_ms=0 if failing else FETCH_WAIT_MS),
                    timeout=FETCH_WAIT_MS / 1000 + link.cfg.master_timeout_s)
                if reported:
                    self._account(reported, outcomes, resp.results)
                if failing:
                    lo, hi = FAILED_BATCH_PAUSE_S
                    self._pause_s = min(hi, self._pause_s * 2) if self._pause_s else lo
                    await asyncio.sleep(self._pause_s)
                    continue
                if reported:
                    self._pause_s = 0.0
                if not resp.tasks:
                    continue
                tasks = list(resp.tasks)
                results = await loop.run_in_executor(self.executor, self.run_tasks, tasks, time.monotonic())
                ran = tasks
            except asyncio.CancelledError:
                raise
            except CxlkvError as exc:
                log.debug("tier tasks: %s", exc.message)
                await asyncio.sleep(0.2)
            except Exception:  # a bug: keep the daemon and the loop alive
                log.exception("tier task loop error")
                await asyncio.sleep(0.5)

    def run_tasks(self, tasks: Sequence[master_pb2.MoveTask], received_at: float) -> list[common_pb2.Status]:
        """Copy and verify each task's extent; one Status per task (runs in a pool thread)."""
        out: list[common_pb2.Status] = []
        for t in tasks:
            failed = self._move(t, received_at)
            if failed is None:
                self.counters["moves_done"] += 1
                self.counters["move_bytes"] += t.value_size_bytes
                out.append(common_pb2.Status())
                continue
            code, why = failed
            out.append(common_pb2.Status(code=int(code), message=why))
        return out

    def _account(self, tasks: Sequence[master_pb2.MoveTask], results: Sequence[common_pb2.Status],
                 answers: Sequence[common_pb2.Status]) -> None:
        """Count and log the failed moves once the master has said what they were:
        one whose object was removed or replaced meanwhile (answered NOT_FOUND: its
        source changed under the copy) is a dropped move, counted but not logged."""
        for i, (t, st) in enumerate(zip(tasks, results)):
            if not st.code:
                continue
            if i < len(answers) and answers[i].code == ErrorCode.NOT_FOUND:
                self.counters["moves_dropped"] += 1
                continue
            self.counters["moves_failed"] += 1
            if st.code == ErrorCode.NO_SPACE:
                self.counters["moves_no_space"] += 1
            self._log_failure(t, st.message)

    def _log_failure(self, t: master_pb2.MoveTask, why: str) -> None:
        """Log a failed move, at most once per :data:`MOVE_LOG_INTERVAL_S` (copy threads; a
        lost increment of the count only shortens a log line)."""
        now = time.monotonic()
        if now - self._log_at < MOVE_LOG_INTERVAL_S:
            self._unlogged += 1
            return
        more = f" ({self._unlogged} more failed moves not logged in the last {MOVE_LOG_INTERVAL_S:g} s)" \
            if self._unlogged else ""
        self._log_at, self._unlogged = now, 0
        log.warning("move of key %r (task %d) failed: %s%s", t.key[:64], t.task_id, why, more)

    def _move(self, t: master_pb2.MoveTask, received_at: float) -> tuple[int, str] | None:
        """Copy one extent; ``None`` on success, else ``(error code, why not)``."""
        why = self._copy(t, received_at)
        if why is None or isinstance(why, tuple):
            return why
        return (ErrorCode.CHECKSUM_MISMATCH if "checksum" in why or "differs" in why else ErrorCode.UNAVAILABLE,
                why)

    def _copy(self, t: master_pb2.MoveTask, received_at: float) -> str | tuple[int, str] | None:
        """Copy one extent; ``None`` on success, else why not (with the code of a typed error)."""
        src = self.regions.by_segment_id(t.source.segment_id)
        dst = self.regions.by_segment_id(t.destination.segment_id)
        if src is None or dst is None:
            return f"segment {t.source.segment_id if src is None else t.destination.segment_id} is not mapped here"
        hb = t.header_bytes
        n = hb + t.value_size_bytes
        if n > t.source.length_bytes or n > t.destination.length_bytes:
            return f"{n} bytes do not fit the extents (master bug)"
        try:
            if self.flush_mode:
                src.region.invalidate(t.source.offset_bytes, n)
            data = src.region.read(t.source.offset_bytes, n)
            why = check_extent(data, t)
            if why is not None:
                return f"source: {why}"
            if time.monotonic() > received_at + t.deadline_ms / 1000.0:
                return "deadline passed before the write (the task is given again)"
            off = t.destination.offset_bytes
            region = dst.region
            mv = memoryview(data)
            region.copy_in(off + hb, mv[hb:])  # the value first, the header last: a torn
            if self.flush_mode:                # copy never looks like an object
                region.flush(off + hb, n - hb)
            if hb:
                region.copy_in(off, mv[:hb])
                if self.flush_mode:
                    region.flush(off, hb)
            back = region.read(off, n)
        except CxlkvError as exc:
            return (int(exc.code), exc.message)
        if back != data:
            return "destination read back differs from what was written"
        return None


def check_extent(data: bytes, t: master_pb2.MoveTask) -> str | None:
    """Why ``data`` (an extent's header + value) is not ``t``'s object version (``None``: it is)."""
    hb = t.header_bytes
    value = memoryview(data)[hb:]
    got = _xxh3(value)
    if t.checksum and got != t.checksum:
        return "value does not match the committed checksum"
    if not hb:
        return None
    return object_mismatch(memoryview(data)[:hb], t.key.encode("utf-8"), t.version, t.value_size_bytes, hb, got)
