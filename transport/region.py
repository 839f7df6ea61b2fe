"""The :class:`Region`: one mapped CXL region (DAX device or emulation file).

A region is mapped ``MAP_SHARED`` read-write, so every process mapping the same
device or file sees the same bytes (one file in ``/dev/shm`` mapped by several
processes stands for one CXL region mapped by several hosts). Offsets are
absolute byte offsets from the region's start; every copy is bounds-checked in
C and runs with the GIL released.

Thread-safety: all methods except :meth:`Region.close` may be called from many
threads at once (copies of overlapping extents race like ``memcpy``). Do not
call :meth:`Region.close` while another thread is still using the region.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import xxhash

from cxlkv.errors import InvalidArgument, OutOfRange, RegionError
from cxlkv.transport import bindings as _b
from cxlkv.transport.bindings import BufferLike, U64Array, ffi

__all__ = ["Region", "checksum_buffer", "CHECKSUM_ALGORITHM", "install_sigbus_guard"]

#: The hash behind :meth:`Region.checksum` and :func:`checksum_buffer`
#: (xxHash XXH3, 64-bit, seed 0).
CHECKSUM_ALGORITHM = "xxh3_64"

_xxh3 = xxhash.xxh3_64_intdigest
_copy_in = _b.cxlkv_copy_in
_copy_out = _b.cxlkv_copy_out
_copy_in_hashed = _b.cxlkv_copy_in_hashed
_copy_out_hashed = _b.cxlkv_copy_out_hashed


def checksum_buffer(buf: BufferLike) -> int:
    """xxh3_64 (seed 0) of a bytes-like object's bytes, as an unsigned 64-bit int.

    Equal to :meth:`Region.checksum` over the same bytes. The xxhash library
    releases the GIL while hashing large inputs.

    Raises:
        InvalidArgument: ``buf`` is not a C-contiguous bytes-like object.
    """
    try:
        return _xxh3(buf)
    except (TypeError, BufferError, ValueError):
        raise InvalidArgument(
            f"checksum_buffer needs a C-contiguous bytes-like object, got {type(buf).__name__}"
        ) from None


def install_sigbus_guard() -> None:
    """Make this process survive a region file that shrinks under its mapping.

    Accessing a mapped file past its (new) end raises SIGBUS, which kills the
    process. After this call such a fault inside any :class:`Region`'s mapping
    is absorbed: the pages from the fault to the end of the mapping become
    private zero memory, the access completes (a read sees zeros, which fail
    verification; a write is lost), and :attr:`Region.guard_hits` grows so the
    owner can retire the region and answer errors. Faults anywhere else keep
    their previous handler (by default: the process dies). Idempotent; clientd
    installs it at start.

    Raises:
        RegionError: sigaction failed.
    """
    _b.cxlkv_guard_install()


def _check_new_file(path: str, size: int) -> None:
    """Refuse early (nothing created) a file to create that its filesystem cannot hold."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError:
        return  # the map call names the problem
    if st is None or (st.st_size == 0 and not os.path.isdir(path)):
        from cxlkv.transport.space import check_fits

        check_fits(path, size)


class Region:
    """One mapped region: bounds-checked copies, cache maintenance, views, checksums.

    Create with :meth:`Region.open`; use as a context manager or call
    :meth:`close`. Offsets and lengths are bytes.
    """

    __slots__ = ("_r", "_path", "_base", "_size", "_exported", "__weakref__")

    def __init__(self, handle: Any, path: str) -> None:
        """Wrap an already mapped ``cxlkv_region_t *`` (use :meth:`open` instead)."""
        self._r = handle
        self._path = path
        self._base = ffi.cast("char *", handle.base)
        self._size = int(handle.size_bytes)
        self._exported = False
        _b.cxlkv_guard_add(handle)  # covered once the process installs the SIGBUS guard

    # -- lifecycle -------------------------------------------------------------
    @classmethod
    def open(
        cls, path: str | os.PathLike[str], size: int | None = None, create: bool = False,
        emulate_noncoherent: bool | None = None,
    ) -> Region:
        """Map a region read-write, ``MAP_SHARED``.

        Args:
            path: a DAX character device (``/dev/daxX.Y``; size read from
                ``/sys/bus/dax/devices/daxX.Y/size``, mapped 2 MiB-aligned) or a
                regular file (size from the file).
            size: expected size in bytes, or ``None`` to take the actual size.
                When given, a file or device of another size is refused.
            create: create a missing emulation file and size an empty one to
                ``size`` bytes (``size`` required, > 0), its blocks allocated in
                its filesystem (:func:`cxlkv.transport.space.reserve_file`): one
                that does not fit is refused and removed. An existing non-empty
                file is never resized.
            emulate_noncoherent: **test-only**: return a
                :class:`~cxlkv.transport.emulate.NoncoherentRegion`, which models this
                process's private CPU cache over the mapping (writes invisible to
                other processes until flushed, stale reads until invalidated).
                ``None``: on when the environment variable
                ``CXLKV_TRANSPORT_EMULATE_NONCOHERENT`` is ``1``.

        Returns:
            The mapped region.

        Raises:
            RegionError: (``.path``, ``.errno`` set) the path does not exist, no
                permission, it is a directory or a non-DAX device (``/dev/null``),
                its size is 0, its size differs from ``size`` (both named), mmap
                failed, or a file to create does not fit its filesystem.
            InvalidArgument: ``create=True`` without a positive ``size``; a negative size.
        """
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size <= 0):
            raise InvalidArgument(f"region {os.fspath(path)}: size must be a positive int of bytes, got {size!r}")
        if create and size:
            _check_new_file(os.fspath(path), size)
        handle = _b.cxlkv_map(path, size or 0, create)
        if handle.created:
            try:  # a file larger than its filesystem fails now, not with SIGBUS later
                from cxlkv.transport.space import reserve_file

                reserve_file(os.fspath(path))
            except BaseException:
                _b.cxlkv_unmap(handle)
                try:
                    os.unlink(path)  # created (sized from empty) here: take it back
                except OSError:
                    pass
                raise
        if emulate_noncoherent is None:
            emulate_noncoherent = os.environ.get("CXLKV_TRANSPORT_EMULATE_NONCOHERENT", "") == "1"
        if emulate_noncoherent and cls is Region:
            from cxlkv.transport.emulate import NoncoherentRegion

            try:
                return NoncoherentRegion(handle, os.fspath(path))
            except BaseException:
                _b.cxlkv_unmap(handle)
                raise
        return cls(handle, os.fspath(path))

    def close(self) -> None:
        """Unmap the region (idempotent).

        If a :meth:`view` was ever handed out, the address range is replaced by
        private zero memory instead of being released, so a stale view reads
        zeros rather than crashing the process. Not safe while other threads are
        still copying through this region.

        Raises:
            RegionError: the kernel refused to unmap (errno set).
        """
        if self._r is None or self._r.base == ffi.NULL:
            return
        _b.cxlkv_guard_remove(self._r)
        if self._exported:
            _b.cxlkv_retire(self._r)
        else:
            _b.cxlkv_unmap(self._r)
        self._base = ffi.NULL

    def __enter__(self) -> Region:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown or a failed munmap: nothing to report to
            pass

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self._size} bytes"
        return f"<Region {self._path} {state}{' dax' if self.is_dax else ''}>"

    def retire(self) -> None:
        """Replace the mapping by private zero memory now (idempotent), even while
        other threads copy through it: they read zeros or write into memory nobody
        else sees; later calls raise :class:`~cxlkv.errors.RegionError` (closed).
        For a file that shrank under the mapping (:attr:`guard_hits`).

        Raises:
            RegionError: the replacement mapping failed (errno set).
        """
        if self._r is None or self._r.base == ffi.NULL:
            return
        _b.cxlkv_guard_remove(self._r)
        _b.cxlkv_retire(self._r)
        self._base = ffi.NULL

    @property
    def guard_hits(self) -> int:
        """Accesses past the end of the file that the SIGBUS guard turned into zero
        memory (:func:`install_sigbus_guard`); nonzero means the file shrank."""
        return _b.cxlkv_guard_hits(self._r) if not self.closed else 0

    # -- properties --------------------------------------------------------------
    @property
    def path(self) -> str:
        """The device or file path given to :meth:`open`."""
        return self._path

    @property
    def size_bytes(self) -> int:
        """Mapped size in bytes (kept after close, for messages)."""
        return self._size

    @property
    def is_dax(self) -> bool:
        """True for a DAX character device, False for a regular file."""
        return bool(self._r.is_dax)

    @property
    def created(self) -> bool:
        """True when :meth:`open` created or sized the file."""
        return bool(self._r.created)

    @property
    def align_bytes(self) -> int:
        """Mapping alignment in bytes: the page size, or the DAX alignment (2 MiB)."""
        return int(self._r.align_bytes)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._r.base == ffi.NULL

    # -- copies --------------------------------------------------------------------
    def copy_in(self, offset: int, src: BufferLike, *, flush: bool = False) -> int:
        """Copy all bytes of ``src`` into the region at ``offset``; GIL released.

        Args:
            offset: region byte offset.
            src: any C-contiguous bytes-like object (bytes, bytearray,
                memoryview, numpy array, mmap).
            flush: non-coherent mode: when the call returns the bytes are in
                memory, none left in this CPU's caches -- what ``copy_in`` then
                :meth:`flush` gives, in one pass: whole lines are written with
                non-temporal stores, the partial lines at either end written
                back, then one SFENCE (docs/transport.md, "Non-coherent copies").

        Returns:
            Bytes copied (``src``'s size in bytes).

        Raises:
            OutOfRange: ``[offset, offset + nbytes)`` not inside the region (checked
                in C, overflow included), or ``offset`` negative.
            InvalidArgument: ``src`` is not a C-contiguous buffer.
            RegionError: the region is closed.
        """
        return _copy_in(self._r, offset, src, 1 if flush else 0)

    def copy_out(self, offset: int, dst: BufferLike, *, invalidate: bool = False) -> int:
        """Fill all of ``dst`` from the region at ``offset``; GIL released.

        Args:
            offset: region byte offset.
            dst: a writable C-contiguous buffer (bytearray, memoryview, numpy array, mmap).
            invalidate: non-coherent mode: no line this CPU cached before the
                call is read -- what :meth:`invalidate` then ``copy_out`` gives,
                in one pass: the extent is read in chunks, each chunk's lines
                dropped (CLFLUSHOPT) and fenced (MFENCE) before its loads, the
                next chunk dropped while this one is copied (docs/transport.md).

        Returns:
            Bytes copied (``dst``'s size in bytes).

        Raises:
            OutOfRange: the extent is not inside the region, or ``offset`` negative.
            InvalidArgument: ``dst`` is read-only (e.g. bytes) or not C-contiguous.
            RegionError: the region is closed.
        """
        return _copy_out(self._r, offset, dst, 1 if invalidate else 0)

    def copy_in_hashed(self, offset: int, src: BufferLike, *, flush: bool = False) -> int:
        """Copy all of ``src`` into the region at ``offset`` and return its xxh3_64,
        in one pass (256 KiB chunks hashed while in cache); GIL released.
        ``flush``: as :meth:`copy_in`.

        Returns:
            ``xxhash.xxh3_64_intdigest(src)`` (unsigned 64-bit).

        Raises:
            OutOfRange: the extent is not inside the region, or ``offset`` negative.
            InvalidArgument: ``src`` is not a C-contiguous buffer or overlaps the extent.
            RegionError: the region is closed.
        """
        return _copy_in_hashed(self._r, offset, src, 1 if flush else 0)

    def copy_out_hashed(self, offset: int, dst: BufferLike, *, invalidate: bool = False) -> int:
        """Fill all of ``dst`` from the region at ``offset`` and return the xxh3_64
        of what ``dst`` received, in one pass; GIL released. ``invalidate``: as
        :meth:`copy_out` (chunks hashed right after their copy).

        Below the stream threshold the hash is taken from ``dst`` after each
        chunk's copy; from it on (non-temporal stores leave ``dst`` out of
        cache) from the chunk of the region just loaded -- the same bytes for a
        reader that holds a lease and, in flush mode, invalidated the range
        first (see ``copy_hashed`` in transport/c/copies.c).

        Returns:
            xxh3_64 of ``dst``'s new bytes (unsigned 64-bit).

        Raises:
            OutOfRange: the extent is not inside the region, or ``offset`` negative.
            InvalidArgument: ``dst`` is read-only, strided, or overlaps the extent.
            RegionError: the region is closed.
        """
        return _copy_out_hashed(self._r, offset, dst, 1 if invalidate else 0)

    def read(self, offset: int, length: int, *, invalidate: bool = False) -> bytes:
        """Return ``length`` bytes at ``offset`` as a new ``bytes`` (for small reads).
        ``invalidate``: as :meth:`copy_out`.

        Raises:
            OutOfRange: the extent is not inside the region, or a negative argument.
            RegionError: the region is closed.
        """
        if length < 0:
            raise OutOfRange(f"read: length {length} is negative")
        out = bytearray(length)
        _copy_out(self._r, offset, out, 1 if invalidate else 0)
        return bytes(out)

    def copy_in_ranges(
        self, buf: BufferLike, buf_offsets: U64Array, region_offsets: U64Array, lengths: U64Array,
        *, flush: bool = False,
    ) -> None:
        """Copy ``buf[buf_offsets[i] : +lengths[i]]`` to ``region[region_offsets[i] : +lengths[i]]``
        for all i in ONE C call: one shared buffer, many region extents.

        Index arrays are lists of ints or 1-D uint64 buffers (numpy ``uint64``
        arrays and ``array('Q')`` are passed to C without conversion). Both
        sides of every extent are checked before any byte moves. ``flush``: as
        :meth:`copy_in`, one SFENCE for the call.

        Raises:
            OutOfRange: an extent outside the region or ``buf`` (index named), or negative.
            InvalidArgument: the arrays differ in length, or ``buf`` is not a contiguous buffer.
            RegionError: the region is closed.
        """
        _b.cxlkv_copy_in_ranges(self._r, buf, buf_offsets, region_offsets, lengths, 1 if flush else 0)

    def copy_out_ranges(
        self, buf: BufferLike, buf_offsets: U64Array, region_offsets: U64Array, lengths: U64Array,
        *, invalidate: bool = False,
    ) -> None:
        """Copy ``region[region_offsets[i] : +lengths[i]]`` to ``buf[buf_offsets[i] : +lengths[i]]``
        for all i in ONE C call; ``buf`` must be writable. ``invalidate``: as
        :meth:`copy_out`, pipelined across the ranges.

        Raises:
            OutOfRange, InvalidArgument, RegionError: as :meth:`copy_in_ranges`.
        """
        _b.cxlkv_copy_out_ranges(self._r, buf, buf_offsets, region_offsets, lengths, 1 if invalidate else 0)

    def copy_out_ranges_hashed(
        self, buf: BufferLike, buf_offsets: U64Array, region_offsets: U64Array, lengths: U64Array,
        *, invalidate: bool = False,
    ) -> list[int]:
        """:meth:`copy_out_ranges`, hashing each range as it lands (from cache).

        Returns:
            Per range, the xxh3_64 (seed 0) of the bytes delivered to ``buf``.

        Raises:
            OutOfRange, InvalidArgument, RegionError: as :meth:`copy_in_ranges`.
        """
        return _b.cxlkv_copy_out_ranges_hashed(self._r, buf, buf_offsets, region_offsets, lengths, 1 if invalidate else 0)

    def copy_in_ranges_hashed(
        self, buf: BufferLike, buf_offsets: U64Array, region_offsets: U64Array, lengths: U64Array,
        *, flush: bool = False,
    ) -> list[int]:
        """:meth:`copy_in_ranges`, hashing each source range as it is copied (from cache).

        Returns:
            Per range, the xxh3_64 (seed 0) of the bytes taken from ``buf``.

        Raises:
            OutOfRange, InvalidArgument, RegionError: as :meth:`copy_in_ranges`.
        """
        return _b.cxlkv_copy_in_ranges_hashed(self._r, buf, buf_offsets, region_offsets, lengths, 1 if flush else 0)

    def copy_in_gather_hashed(self, srcs: Sequence[BufferLike], region_offsets: U64Array, lengths: U64Array,
                              *, flush: bool = False) -> list[int]:
        """Copy ``srcs[i][:lengths[i]]`` to ``region[region_offsets[i]:+lengths[i]]`` for
        all i in ONE C call, hashing each source as it is copied (from cache): many
        separate buffers, many region extents. ``flush``: as :meth:`copy_in`, one
        SFENCE for the call.

        Returns:
            Per source, the xxh3_64 (seed 0) of the bytes copied.

        Raises:
            OutOfRange: a range outside the region, or longer than its source;
                nothing is copied.
            InvalidArgument: ragged arrays, a source that is not a C-contiguous
                buffer or overlaps its range; nothing is copied.
            RegionError: the region is closed.
        """
        return _b.cxlkv_copy_in_gather_hashed(self._r, srcs, region_offsets, lengths, 1 if flush else 0)

    def write_headers(
        self,
        extent_offsets: U64Array,
        header_bytes: U64Array,
        keys: bytes,
        key_offsets: U64Array,
        key_lens: U64Array,
        versions: U64Array,
        value_lens: U64Array,
        value_hashes: U64Array,
        *,
        flush: bool = False,
    ) -> None:
        """Write N object headers, each followed by its key and zero padding, in ONE
        C call: object i's extent starts at ``extent_offsets[i]`` and its value
        ``header_bytes[i]`` bytes in; the header describes the key
        ``keys[key_offsets[i]:+key_lens[i]]`` (UTF-8) at ``versions[i]`` with a
        ``value_lens[i]``-byte value whose xxh3_64 is ``value_hashes[i]`` — the
        bytes of :func:`cxlkv.layout.objheader.pack_header` + key + padding.

        Args:
            flush: write each span back to memory (non-coherent mode).

        Raises:
            OutOfRange: a span outside the region; nothing is written.
            InvalidArgument: ragged arrays, a bad key range or length, or
                ``header_bytes[i]`` not ``64 + align64(key length)``; nothing is written.
            RegionError: the region is closed.
        """
        _b.cxlkv_write_headers(self._r, extent_offsets, header_bytes, keys, key_offsets, key_lens,
                               versions, value_lens, value_hashes, flush)

    def verify_headers(
        self,
        extent_offsets: U64Array,
        header_bytes: U64Array,
        keys: bytes,
        key_offsets: U64Array,
        key_lens: U64Array,
        versions: U64Array,
        value_lens: U64Array,
        value_hashes: U64Array,
        *,
        invalidate: bool = False,
    ) -> bytes:
        """Check N object headers in ONE C call: object i (extent at
        ``extent_offsets[i]``, value ``header_bytes[i]`` bytes in) must describe the
        key ``keys[key_offsets[i]:+key_lens[i]]`` (UTF-8) at ``versions[i]`` with a
        ``value_lens[i]``-byte value whose xxh3_64 is ``value_hashes[i]`` — the
        checks of :func:`cxlkv.layout.objheader.object_mismatch`, without the reason.

        Args:
            invalidate: invalidate the header lines first (non-coherent mode).

        Returns:
            N bytes: 1 where the object is valid, 0 where not.

        Raises:
            OutOfRange: a header span outside the region; nothing is checked.
            InvalidArgument: arrays of different lengths; a key range outside ``keys``.
            RegionError: the region is closed.
        """
        return _b.cxlkv_verify_headers(self._r, extent_offsets, header_bytes, keys, key_offsets, key_lens,
                                       versions, value_lens, value_hashes, invalidate)

    def index_store(
        self,
        table_offset: int,
        nslots: int,
        slot_nos: U64Array,
        key_hashes: U64Array,
        extent_offsets: U64Array,
        value_lens: U64Array,
        versions: U64Array,
        value_hashes: U64Array,
        header_bytes: U64Array,
        meta: U64Array,
        flush: bool = False,
    ) -> None:
        """Publish N slots of the region index in ONE C call (the master's write;
        layout: :mod:`cxlkv.layout.index`): slot ``slot_nos[i]`` of the ``nslots``-slot
        table at byte ``table_offset`` gets the object's key hash, extent offset,
        value length in bytes, version, value checksum, header bytes and
        ``meta[i] = flags | region_no << 16 | tier << 24``, each under its seqlock
        (seq odd, fields, checksum, seq even); a tombstone is all zeros. Ends with
        a fence, so the slots are visible in order when it returns.

        Args:
            flush: write each slot line back to memory (non-coherent mode).

        Raises:
            OutOfRange: the table outside the region, a slot number >= ``nslots``,
                a value too large for its field; nothing is written.
            InvalidArgument: ragged columns, ``table_offset`` not a multiple of 64.
            RegionError: the region is closed.
        """
        _b.cxlkv_index_store(self._r, table_offset, nslots, slot_nos, key_hashes, extent_offsets, value_lens,
                             versions, value_hashes, header_bytes, meta, flush)

    # -- cache maintenance -----------------------------------------------------------
    def _span(self, offset: int, length: int | None) -> tuple[int, int]:
        return offset, (self._size - offset if length is None else length)

    def flush(self, offset: int = 0, length: int | None = None) -> None:
        """Write the cache lines of ``[offset, offset + length)`` back to memory, then SFENCE.

        Uses the instruction in :data:`cxlkv.transport.FLUSH_INSTRUCTION` (CLWB,
        else CLFLUSHOPT, else CLFLUSH; chosen from CPUID). Writers in the
        non-coherent mode flush before publishing. ``length=None`` means to the end.

        Raises:
            OutOfRange: the range is not inside the region.
            RegionError: the region is closed.
        """
        offset, length = self._span(offset, length)
        _b.cxlkv_flush(self._r, offset, length)

    def invalidate(self, offset: int = 0, length: int | None = None) -> None:
        """Drop the cache lines of ``[offset, offset + length)`` (writing dirty ones back
        first), then MFENCE, so the next read comes from memory.

        Readers in the non-coherent mode invalidate before copying out.

        Raises:
            OutOfRange: the range is not inside the region.
            RegionError: the region is closed.
        """
        offset, length = self._span(offset, length)
        _b.cxlkv_invalidate(self._r, offset, length)

    @staticmethod
    def fence() -> None:
        """A full memory fence (MFENCE; DMB ISH on aarch64)."""
        _b.cxlkv_fence()

    def prefault(self, offset: int = 0, length: int | None = None) -> None:
        """Fault in the pages of ``[offset, offset + length)`` for writing, bytes unchanged.

        Run once at start so the data path pays no first-touch page faults
        (a ``/dev/shm`` file faults per 4 KiB page). ``length=None``: to the end.

        Raises:
            OutOfRange: the range is not inside the region.
            RegionError: the memory could not be supplied (e.g. /dev/shm full), or closed.
        """
        offset, length = self._span(offset, length)
        _b.cxlkv_prefault(self._r, offset, length)

    # -- zero-copy access --------------------------------------------------------------
    def _check(self, op: str, offset: int, length: int) -> None:
        if self._base == ffi.NULL:
            raise RegionError(f"region {self._path} is closed", path=self._path)
        if offset < 0 or length < 0 or offset > self._size or length > self._size - offset:
            raise OutOfRange(
                f"{op}: [{offset}, {offset} + {length}) is outside region {self._path} "
                f"({self._size} bytes)"
            )

    def view(self, offset: int, length: int) -> memoryview:
        """A writable zero-copy ``memoryview`` (format ``"B"``) of ``length`` bytes at ``offset``.

        Writes through the view land in the region. The view must not outlive
        the region; if it does, it reads zeros after :meth:`close` (never a crash).

        Raises:
            OutOfRange: the range is not inside the region, or negative.
            RegionError: the region is closed.
        """
        self._check("view", offset, length)
        self._exported = True
        return memoryview(ffi.buffer(self._base + offset, length))

    def checksum(self, offset: int, length: int) -> int:
        """xxh3_64 (seed 0) of region bytes ``[offset, offset + length)`` as an unsigned
        64-bit int, hashed in place (no copy into Python).

        Equals :func:`checksum_buffer` of the same bytes.

        Raises:
            OutOfRange: the range is not inside the region, or negative.
            RegionError: the region is closed.
        """
        self._check("checksum", offset, length)
        return _xxh3(ffi.buffer(self._base + offset, length))
