"""Thin wrappers over the C transport, one per C function.

Every wrapper follows one sequence: validate in Python (buffers, argument
shapes) → call C (cffi releases the GIL for the call) → check the return code
→ raise a typed :mod:`cxlkv.errors` error. Bounds and ``offset + length``
overflow are checked in C; a negative or too-large Python integer is refused
by cffi's conversion to ``uint64_t`` and reported as :class:`OutOfRange`.

A region handle is the ``cxlkv_region_t *`` cdata returned by
:func:`cxlkv_map`. Most code should use :class:`cxlkv.transport.Region`
instead, which owns a handle and adds views and checksums.

Thread-safety: every function except :func:`cxlkv_unmap` / :func:`cxlkv_retire`
may run concurrently from many threads on one handle (copies to overlapping
extents race exactly like ``memcpy``). Unmapping while another thread uses the
handle is the caller's bug; :func:`cxlkv_retire` makes it memory-safe.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from itertools import chain as _chain
from typing import Any, NoReturn, Union

from cxlkv.errors import InvalidArgument, OutOfRange, RegionError
from cxlkv.layout.objheader import OBJECT_LAYOUT
from cxlkv.transport._transport import ffi, lib

__all__ = [
    "fresh_bytes",
    "ffi",
    "lib",
    "Handle",
    "BufferLike",
    "U64Array",
    "CACHE_LINE_BYTES",
    "PAGE_BYTES",
    "DAX_ALIGN_BYTES",
    "FLUSH_INSTRUCTION",
    "INVALIDATE_INSTRUCTION",
    "COPY_KERNEL",
    "cxlkv_stream_threshold_bytes",
    "cxlkv_set_stream_threshold_bytes",
    "cxlkv_nc_write_kernel",
    "cxlkv_set_nc_write_kernel",
    "cxlkv_nc_read_chunk_bytes",
    "cxlkv_copy_hash",
    "cxlkv_copy_hash_kernel",
    "cxlkv_set_copy_hash_kernel",
    "cxlkv_set_nc_read_chunk_bytes",
    "cxlkv_map",
    "cxlkv_unmap",
    "cxlkv_retire",
    "cxlkv_guard_install",
    "cxlkv_guard_add",
    "cxlkv_guard_remove",
    "cxlkv_guard_hits",
    "cxlkv_guard_total_hits",
    "cxlkv_copy_in",
    "cxlkv_copy_out",
    "cxlkv_copy_in_hashed",
    "cxlkv_copy_out_hashed",
    "cxlkv_copy_in_ranges",
    "cxlkv_copy_out_ranges",
    "cxlkv_copy_out_ranges_hashed",
    "cxlkv_copy_in_ranges_hashed",
    "cxlkv_copy_in_gather_hashed",
    "cxlkv_write_headers",
    "cxlkv_verify_headers",
    "cxlkv_flush",
    "cxlkv_invalidate",
    "cxlkv_fence",
    "cxlkv_prefault",
    "cxlkv_index_store",
    "OBJ_HEADER_BYTES",
    "OBJ_MAGIC_U64",
    "OBJ_FORMAT_VERSION",
    "OBJ_MAX_KEY_BYTES",
    "INDEX_HEADER_BYTES",
    "INDEX_FORMAT_VERSION",
    "INDEX_SLOT_BYTES",
    "INDEX_BUCKET_SLOTS",
    "INDEX_MAX_REGIONS",
    "INDEX_PUBLISH_OFFSET",
    "INDEX_OVERFLOW_OFFSET",
    "INDEX_SLOT_SPINS",
    "IX_FLAG_LIVE",
    "IX_FLAG_ELSEWHERE",
    "IX_HIT",
    "IX_MISS",
    "IX_ELSEWHERE",
    "IX_TOO_SMALL",
    "IX_UNSURE",
]

#: A ``cxlkv_region_t *`` cdata (cffi objects are untyped for mypy).
Handle = Any
#: Any object exporting the buffer protocol (bytes, bytearray, memoryview,
#: numpy array, mmap, ...); destinations must be writable.
BufferLike = Any
#: A sequence of non-negative ints, or a 1-D C-contiguous uint64 buffer
#: (numpy ``uint64`` array, ``array.array("Q")``), used without conversion.
U64Array = Union[Sequence[int], Any]

#: Cache-line size in bytes used by flush and invalidate (from CPUID / CTR_EL0).
CACHE_LINE_BYTES: int = int(lib.cxlkv_cache_line_bytes())
#: System page size in bytes.
PAGE_BYTES: int = int(lib.cxlkv_page_bytes())
#: Mapping alignment of device DAX in bytes (2 MiB).
DAX_ALIGN_BYTES: int = int(lib.CXLKV_DAX_ALIGN_BYTES)
#: Flush instruction chosen from CPUID at load: "clwb", "clflushopt",
#: "clflush", "dc cvac" (aarch64) or "none".
FLUSH_INSTRUCTION: str = ffi.string(lib.cxlkv_flush_instruction()).decode()
#: Invalidate instruction chosen at load: "clflushopt", "clflush", "dc civac" or "none".
INVALIDATE_INSTRUCTION: str = ffi.string(lib.cxlkv_invalidate_instruction()).decode()
#: Copy kernel for copies of >= 512 bytes chosen at load: "avx2" (x86-64
#: vector loops; non-temporal stores from the stream threshold on) or
#: "memmove" (glibc: CPUs without AVX2, other architectures).
COPY_KERNEL: str = ffi.string(lib.cxlkv_copy_kernel()).decode()

# The object header's layout (cxlkv_transport.h; cxlkv/layout/objheader.py documents the fields).
#: Bytes of the fixed object header (one cache line).
OBJ_HEADER_BYTES: int = int(lib.CXLKV_OBJ_HEADER_BYTES)
#: The object magic b"CXLKVOB1" as a little-endian u64.
OBJ_MAGIC_U64: int = int(lib.CXLKV_OBJ_MAGIC_U64)
#: Object header layout version.
OBJ_FORMAT_VERSION: int = int(lib.CXLKV_OBJ_FORMAT_VERSION)
#: Longest key an object header describes, in bytes.
OBJ_MAX_KEY_BYTES: int = int(lib.CXLKV_OBJ_MAX_KEY_BYTES)


def _check_object_layout() -> None:
    """The pure-Python object header (:mod:`cxlkv.layout.objheader`, which must work without
    this extension) and C's agree on every ``CXLKV_OBJ_*`` constant, or the
    transport does not load (a mismatch would make each side reject the other's
    objects)."""
    c_names = {name[len("CXLKV_OBJ_"):] for name in dir(lib) if name.startswith("CXLKV_OBJ_")}
    c_layout = {name: int(getattr(lib, "CXLKV_OBJ_" + name)) for name in c_names}
    if c_layout != OBJECT_LAYOUT:
        differ = sorted(n for n in c_names | set(OBJECT_LAYOUT) if c_layout.get(n) != OBJECT_LAYOUT.get(n))
        raise ImportError("cxlkv.transport: the object header layout of the C transport and of "
                          f"cxlkv.layout.objheader differ in {', '.join(differ)}: rebuild the extension (make install)")


_check_object_layout()

# The region index's layout and outcomes (cxlkv_transport.h; cxlkv/layout/index.py documents the format).
#: Bytes of the index header page.
INDEX_HEADER_BYTES: int = int(lib.CXLKV_INDEX_HEADER_BYTES)
#: Index layout version.
INDEX_FORMAT_VERSION: int = int(lib.CXLKV_INDEX_FORMAT_VERSION)
#: Bytes of one slot (one cache line).
INDEX_SLOT_BYTES: int = int(lib.CXLKV_INDEX_SLOT_BYTES)
#: Slots per bucket.
INDEX_BUCKET_SLOTS: int = int(lib.CXLKV_INDEX_BUCKET_SLOTS)
#: Region numbers an index can name.
INDEX_MAX_REGIONS: int = int(lib.CXLKV_INDEX_MAX_REGIONS)
#: Offset of the publish word in the header page (0: inactive, else the master's epoch).
INDEX_PUBLISH_OFFSET: int = int(lib.CXLKV_INDEX_PUBLISH_OFFSET)
#: Offset of the overflow count in the header page.
INDEX_OVERFLOW_OFFSET: int = int(lib.CXLKV_INDEX_OVERFLOW_OFFSET)
#: Reads of one slot before a reader gives up on it (UNSURE).
INDEX_SLOT_SPINS: int = int(lib.CXLKV_INDEX_SLOT_SPINS)
#: Slot flag: a committed object.
IX_FLAG_LIVE: int = int(lib.CXLKV_IX_FLAG_LIVE)
#: Slot flag: committed, not readable from a CXL region (the leased RPC path serves it).
IX_FLAG_ELSEWHERE: int = int(lib.CXLKV_IX_FLAG_ELSEWHERE)
#: Lookup outcome: value copied and verified (probe: object header verified).
IX_HIT: int = int(lib.CXLKV_IX_HIT)
#: Lookup outcome: definitely not committed.
IX_MISS: int = int(lib.CXLKV_IX_MISS)
#: Lookup outcome: committed, not readable here (flag, region not mapped, over max_value_bytes).
IX_ELSEWHERE: int = int(lib.CXLKV_IX_ELSEWHERE)
#: Lookup outcome: committed; the destination is smaller than the value.
IX_TOO_SMALL: int = int(lib.CXLKV_IX_TOO_SMALL)
#: Lookup outcome: cannot tell; use the leased RPC path.
IX_UNSURE: int = int(lib.CXLKV_IX_UNSURE)

# Cached attribute lookups for the per-call fast path.
_from_buffer = ffi.from_buffer
_new = ffi.new
_c_copy_in = lib.cxlkv_copy_in
_c_copy_out = lib.cxlkv_copy_out
_c_copy_in_hashed = lib.cxlkv_copy_in_hashed
_c_copy_out_hashed = lib.cxlkv_copy_out_hashed
_OK = lib.CXLKV_OK
_E_RANGE = lib.CXLKV_E_RANGE
_E_CLOSED = lib.CXLKV_E_CLOSED
_E_INVAL = lib.CXLKV_E_INVAL
_U64_FORMATS = frozenset({"Q", "L", "<Q", "<L", "=Q", "=L", "@Q", "@L"})


# -- error helpers -------------------------------------------------------------

def _buffer(obj: BufferLike, writable: bool, what: str) -> Any:
    """``ffi.from_buffer(obj)`` with the failure explained (cold path)."""
    try:
        return _from_buffer("char[]", obj, writable)
    except (TypeError, ValueError, BufferError):
        pass
    try:
        mv = memoryview(obj)
    except TypeError:
        raise InvalidArgument(
            f"{what} must be a bytes-like object (buffer protocol), got {type(obj).__name__}"
        ) from None
    with mv:
        if not mv.c_contiguous:
            raise InvalidArgument(f"{what} must be C-contiguous (got a strided {type(obj).__name__})")
        if writable and mv.readonly:
            raise InvalidArgument(
                f"{what} is read-only ({type(obj).__name__}); pass a writable buffer such as a bytearray"
            )
    raise InvalidArgument(f"{what} cannot be used as a buffer ({type(obj).__name__})")


def _int_array(values: U64Array, what: str, ctype: str, itemsize: int, formats: frozenset[str]) -> Any:
    """A ``ctype`` cdata (``"uint64_t[]"``, ``"uint32_t[]"``) over ``values``: zero-copy
    for a contiguous buffer of that item size, else a copy of the ints."""
    if not isinstance(values, (list, tuple)):
        try:
            mv = memoryview(values)  # type: ignore[arg-type]  # TypeError handled below
        except TypeError:
            values = list(values)
        else:
            with mv:
                if mv.ndim == 1 and mv.itemsize == itemsize and mv.format in formats and mv.c_contiguous:
                    return _from_buffer(ctype, values)
                values = mv.tolist()
    try:
        return _new(ctype, values)
    except OverflowError:
        raise OutOfRange(f"{what}: every value must be in [0, 2**{itemsize * 8})") from None
    except TypeError:
        raise InvalidArgument(f"{what} must be a sequence of ints") from None


def _u64_array(values: U64Array, what: str) -> Any:
    """A ``uint64_t[]`` cdata over ``values`` (zero-copy for uint64 buffers)."""
    return _int_array(values, what, "uint64_t[]", 8, _U64_FORMATS)


def _closed_error(r: Handle) -> RegionError:
    return RegionError("region is closed (use it inside `with Region.open(...)`, before close())")


def _raise_range(r: Handle, rc: int, op: str, offset: Any, length: Any) -> NoReturn:
    if rc == _E_CLOSED:
        raise _closed_error(r)
    if rc == _E_RANGE:
        raise OutOfRange(
            f"{op}: [{offset}, {offset} + {length}) is outside the region of {r.size_bytes} bytes"
        )
    raise InvalidArgument(f"{op}: invalid argument (status {rc})")


def _raise_overflow(op: str, offset: Any, length: Any) -> NoReturn:
    for name, value in (("offset", offset), ("length", length)):
        if isinstance(value, int) and value < 0:
            raise OutOfRange(f"{op}: {name} {value} is negative")
    raise OutOfRange(f"{op}: offset {offset} / length {length} must be in [0, 2**64)")


def _raise_many(r: Handle, rc: int, op: str, bad: int, n: int) -> NoReturn:
    if rc == _E_CLOSED:
        raise _closed_error(r)
    if rc == _E_RANGE:
        raise OutOfRange(
            f"{op}: extent #{bad} of {n} is outside the region ({r.size_bytes} bytes) "
            "or its buffer; nothing was copied"
        )
    raise InvalidArgument(f"{op}: invalid argument at extent #{bad} (status {rc})")


def cxlkv_stream_threshold_bytes() -> int:
    """Copies of at least this many bytes use non-temporal stores (bypassing the
    cache); 0 when streaming is off or unavailable. Default 16 MiB on x86-64."""
    return int(lib.cxlkv_stream_threshold_bytes())


def cxlkv_nc_write_kernel() -> str:
    """How non-coherent copies into a region write whole lines: ``"avx2-nt"``,
    ``"avx512-nt"``, ``"sse2-nt"`` (non-temporal stores), ``"movdir64b"``, or
    ``"cached"`` (cached copy, then every line written back). Chosen at load
    from CPUID (``cxlkv_nc_write_kernel`` in cxlkv_transport.h)."""
    return ffi.string(lib.cxlkv_nc_write_kernel()).decode()


def cxlkv_set_nc_write_kernel(name: str) -> None:
    """Use another non-coherent write kernel, process-wide (tests, benchmarks);
    set it before copies start.

    Raises:
        InvalidArgument: ``name`` unknown, or not supported by this CPU.
    """
    if lib.cxlkv_set_nc_write_kernel(name.encode()) != _OK:
        raise InvalidArgument(f"non-coherent write kernel {name!r} is unknown or not supported by this CPU "
                              "(avx512-nt, avx2-nt, sse2-nt, movdir64b, cached)")


def cxlkv_copy_hash(dst: BufferLike, src: BufferLike) -> int:
    """Copy all of ``src`` into the start of writable ``dst`` and return the xxh3_64
    (seed 0) of the bytes stored, in one pass (``cxlkv_copy_hash`` in
    cxlkv_transport.h); GIL released.

    Returns:
        ``xxhash.xxh3_64_intdigest`` of the bytes now in ``dst[:len(src)]``.

    Raises:
        InvalidArgument: a buffer is not contiguous, ``dst`` is read-only or shorter
            than ``src``, or the two overlap.
    """
    s = _buffer(src, False, "src")
    d = _buffer(dst, True, "dst")
    if len(d) < len(s):
        raise InvalidArgument(f"copy_hash: dst of {len(d)} B is shorter than src of {len(s)} B")
    out = ffi.new("uint64_t *")
    if lib.cxlkv_copy_hash(d, s, len(s), out) != _OK:
        raise InvalidArgument("copy_hash: source and destination overlap")
    return int(out[0])


def cxlkv_copy_hash_kernel() -> str:
    """The copy-while-hashing kernel in use: ``"avx512"``, ``"avx2"`` (x86-64, from
    CPUID) or ``"two-pass"`` (copy, then hash the destination while in cache)."""
    return ffi.string(lib.cxlkv_copy_hash_kernel()).decode()


def cxlkv_set_copy_hash_kernel(name: str) -> None:
    """Use another copy-while-hashing kernel, process-wide (tests, benchmarks).

    Raises:
        InvalidArgument: ``name`` unknown, or not supported by this CPU.
    """
    if lib.cxlkv_set_copy_hash_kernel(name.encode()) != _OK:
        raise InvalidArgument(f"copy-hash kernel {name!r} is unknown or not supported by this CPU "
                              "(avx512, avx2, two-pass)")


def cxlkv_nc_read_chunk_bytes() -> int:
    """The largest invalidate-and-copy chunk of a non-coherent copy out (default
    128 KiB; the first chunk of a range is at most 16 KiB, each next twice the
    one before); 0: the two-pass read (drop the whole range, fence, copy)."""
    return int(lib.cxlkv_nc_read_chunk_bytes())


def cxlkv_set_nc_read_chunk_bytes(size_bytes: int) -> None:
    """Set the invalidate-and-copy chunk in bytes, process-wide (0: two-pass;
    else rounded down to a multiple of 64, at least 256). Set it before copies start.

    Raises:
        InvalidArgument: ``size_bytes`` negative or over 2**64 - 1.
    """
    if not 0 <= size_bytes < 1 << 64:
        raise InvalidArgument(f"chunk must be in [0, 2**64) bytes, got {size_bytes}")
    lib.cxlkv_set_nc_read_chunk_bytes(size_bytes)


#: Event kinds recorded by :func:`nc_trace` (``CXLKV_NC_EV_*`` in cxlkv_transport.h).
NC_EVENT_KINDS: dict[int, str] = {
    int(lib.CXLKV_NC_EV_LOAD): "load", int(lib.CXLKV_NC_EV_STORE): "store",
    int(lib.CXLKV_NC_EV_STREAM): "stream", int(lib.CXLKV_NC_EV_WB): "wb",
    int(lib.CXLKV_NC_EV_DROP): "drop", int(lib.CXLKV_NC_EV_SFENCE): "sfence",
    int(lib.CXLKV_NC_EV_MFENCE): "mfence", int(lib.CXLKV_NC_EV_VLOAD): "vload",
}


def nc_trace(fn: Any, capacity: int = 1 << 16) -> tuple[Any, list[tuple[str, int, int]]]:
    """**Test-only**: run ``fn()`` with the non-coherent kernels' event trace on.

    Returns:
        ``(fn's result, events)``; each event ``(kind, start address, end address)``
        with kind one of :data:`NC_EVENT_KINDS`' values ("load", "store",
        "stream", "wb", "drop", "sfence", "mfence", "vload": a load of bytes the
        kernel hashes and checks against a checksum it read fresh before using
        them; fences have addresses 0).
        :class:`cxlkv.transport.emulate.KernelTrace` replays them.

    Raises:
        InvalidArgument: more than ``capacity`` events. Not thread-safe: no
            other thread may copy meanwhile.
    """
    buf = _new("uint64_t[]", 3 * capacity)
    lib.cxlkv_nc_trace_start(buf, capacity)
    try:
        result = fn()
    finally:
        n = int(lib.cxlkv_nc_trace_stop())
    if n > capacity:
        raise InvalidArgument(f"nc_trace: {n} events, room for {capacity}")
    kinds = NC_EVENT_KINDS
    return result, [(kinds[int(buf[3 * i])], int(buf[3 * i + 1]), int(buf[3 * i + 2])) for i in range(n)]


def cxlkv_set_stream_threshold_bytes(size_bytes: int) -> None:
    """Set the streaming-copy threshold in bytes, process-wide (0 disables it;
    values under 4096 become 4096). Set it before copies start.

    Raises:
        InvalidArgument: ``size_bytes`` negative or over 2**64 - 1.
    """
    if not 0 <= size_bytes < 1 << 64:
        raise InvalidArgument(f"stream threshold must be in [0, 2**64) bytes, got {size_bytes}")
    lib.cxlkv_set_stream_threshold_bytes(size_bytes)


# -- mapping -------------------------------------------------------------------

def cxlkv_map(path: str | os.PathLike[str], size_bytes: int = 0, create: bool = False) -> Handle:
    """Map a region MAP_SHARED read-write.

    Args:
        path: a DAX character device (``/dev/daxX.Y``) or a regular file.
        size_bytes: expected size in bytes; 0 takes the file's size (fstat) or the
            device's (``/sys/bus/dax/devices/daxX.Y/size``).
        create: create a missing file (mode 0660 minus umask) and size an empty one
            to ``size_bytes`` (which must then be > 0).

    Returns:
        A ``cxlkv_region_t *`` handle, mapped.

    Raises:
        InvalidArgument: ``create`` without a positive ``size_bytes``; a negative size.
        RegionError: (with ``path`` and ``errno``) missing path, no permission,
            not a regular file or DAX device, size 0, size mismatch, or mmap failure.
    """
    spath = os.fspath(path)
    if isinstance(size_bytes, bool) or not isinstance(size_bytes, int) or size_bytes < 0:
        raise InvalidArgument(f"region {spath}: size must be a non-negative int of bytes, got {size_bytes!r}")
    if create and size_bytes == 0:
        raise InvalidArgument(f"region {spath}: create=True needs a size > 0 bytes")
    if size_bytes >= 1 << 64:
        raise InvalidArgument(f"region {spath}: size {size_bytes} bytes does not fit in 64 bits")
    r = _new("cxlkv_region_t *")
    err = _new("int *")
    try:
        bpath = os.fsencode(spath)
    except (TypeError, ValueError) as e:
        raise InvalidArgument(f"region path {path!r} is not valid: {e}") from None
    if b"\0" in bpath:
        raise InvalidArgument(f"region path {spath!r} contains NUL")
    rc = lib.cxlkv_map(bpath, size_bytes, 1 if create else 0, r, err)
    if rc != _OK:
        _raise_map(rc, spath, size_bytes, create, int(err[0]), r)
    return r


def _raise_map(rc: int, path: str, want: int, create: bool, errno_: int, r: Handle) -> NoReturn:
    import errno as E

    why = os.strerror(errno_) if errno_ else ""
    if rc == lib.CXLKV_E_OPEN:
        if errno_ == E.ENOENT:
            hint = "" if create else (" (to make an emulation file: Region.open(..., create=True, size=N), "
                                      "or `cxlkv region format PATH --create --size N`)")
            msg = f"region {path} does not exist{hint}"
        elif errno_ in (E.EACCES, E.EPERM):
            msg = f"no permission to open region {path} read-write"
        elif errno_ == E.EISDIR:
            msg = f"region {path} is a directory, not a regular file or DAX device"
        else:
            msg = f"cannot open region {path}: {why}"
    elif rc == lib.CXLKV_E_STAT:
        msg = f"cannot stat region {path}: {why}"
    elif rc == lib.CXLKV_E_NOT_MAPPABLE:
        msg = f"region {path} is not a regular file or a DAX character device; it cannot be mapped"
    elif rc == lib.CXLKV_E_SIZE_ZERO:
        msg = (f"region {path} has size 0 bytes (give it a size: `cxlkv region format PATH --create --size N`, "
                   "or Region.open(..., create=True, size=N))")
    elif rc == lib.CXLKV_E_SIZE_MISMATCH:
        msg = f"region {path} is {int(r.size_bytes)} bytes, but {want} bytes were requested"
    elif rc == lib.CXLKV_E_TRUNCATE:
        msg = f"cannot size region {path} to {want} bytes: {why}"
    elif rc == lib.CXLKV_E_SYSFS:
        msg = f"cannot read the size of DAX device {path} from /sys/bus/dax: {why}"
    elif rc == lib.CXLKV_E_ALIGN:
        msg = (
            f"DAX device {path} size {int(r.size_bytes)} bytes is not a multiple of "
            f"its alignment {int(r.align_bytes)} bytes"
        )
    elif rc == lib.CXLKV_E_MMAP:
        msg = f"cannot map region {path} ({int(r.size_bytes)} bytes): {why}"
    elif rc == lib.CXLKV_E_TOO_LARGE:
        msg = f"region {path} ({int(r.size_bytes)} bytes) does not fit this address space"
    else:
        msg = f"cannot map region {path}: status {rc} {why}".rstrip()
    raise RegionError(msg, path=path, errno=errno_)


def cxlkv_unmap(r: Handle) -> None:
    """Unmap ``r`` (idempotent). Any view over it becomes invalid.

    Raises:
        RegionError: munmap failed (errno set).
    """
    err = _new("int *")
    rc = lib.cxlkv_unmap(r, err)
    if rc != _OK:
        raise RegionError(f"munmap failed: {os.strerror(err[0])}", errno=int(err[0]))


def cxlkv_retire(r: Handle) -> None:
    """Unmap ``r`` memory-safely: the range becomes private zero memory, so stale
    views read zeros instead of faulting (its address range stays reserved).

    Raises:
        RegionError: the replacement mapping failed (errno set).
    """
    err = _new("int *")
    rc = lib.cxlkv_retire(r, err)
    if rc != _OK:
        raise RegionError(f"retiring the mapping failed: {os.strerror(err[0])}", errno=int(err[0]))


# -- copies ----------------------------------------------------------------------

def cxlkv_copy_in(r: Handle, offset: int, src: BufferLike, nc: int = 0) -> int:
    """Copy all of ``src`` into the region at byte ``offset``; GIL released.

    ``nc`` 1: non-coherent write (the bytes are in memory, out of this CPU's
    caches, when it returns: streaming stores, partial lines written back, one
    SFENCE; ``CXLKV_NONCOHERENT`` in cxlkv_transport.h).

    Returns:
        The number of bytes copied (``len`` of ``src`` in bytes).

    Raises:
        OutOfRange: ``[offset, offset + nbytes)`` not inside the region, or offset negative.
        InvalidArgument: ``src`` is not a C-contiguous bytes-like object.
        RegionError: the region is closed.
    """
    try:
        buf = _from_buffer(src)
    except (TypeError, ValueError, BufferError):
        buf = _buffer(src, False, "src")
    n = len(buf)
    try:
        rc = _c_copy_in(r, offset, buf, n, nc)
    except OverflowError:
        _raise_overflow("copy_in", offset, n)
    except TypeError:
        raise InvalidArgument(f"copy_in: offset must be an int, got {type(offset).__name__}") from None
    if rc != _OK:
        _raise_range(r, rc, "copy_in", offset, n)
    return n


def cxlkv_copy_out(r: Handle, offset: int, dst: BufferLike, nc: int = 0) -> int:
    """Fill all of writable ``dst`` from the region at byte ``offset``; GIL released.

    ``nc`` 1: non-coherent read (no line this CPU cached before the call is
    read: each chunk's lines dropped, then a fence, before it is copied).

    Returns:
        The number of bytes copied (``len`` of ``dst`` in bytes).

    Raises:
        OutOfRange: ``[offset, offset + nbytes)`` not inside the region, or offset negative.
        InvalidArgument: ``dst`` is read-only, strided, or not a buffer.
        RegionError: the region is closed.
    """
    try:
        buf = _from_buffer("char[]", dst, True)  # positional: keywords cost ~0.5 µs
    except (TypeError, ValueError, BufferError):
        buf = _buffer(dst, True, "dst")
    n = len(buf)
    try:
        rc = _c_copy_out(r, offset, buf, n, nc)
    except OverflowError:
        _raise_overflow("copy_out", offset, n)
    except TypeError:
        raise InvalidArgument(f"copy_out: offset must be an int, got {type(offset).__name__}") from None
    if rc != _OK:
        _raise_range(r, rc, "copy_out", offset, n)
    return n



def _copy_hashed(c_fn: Any, r: Handle, offset: int, buf: Any, op: str, nc: int) -> int:
    """Run a fused copy+hash C function over the cdata buffer ``buf``; its xxh3_64."""
    n = len(buf)
    out = _new("uint64_t *")
    try:
        rc = c_fn(r, offset, buf, n, out, nc)
    except OverflowError:
        _raise_overflow(op, offset, n)
    except TypeError:
        raise InvalidArgument(f"{op}: offset must be an int, got {type(offset).__name__}") from None
    if rc != _OK:
        _raise_range(r, rc, op, offset, n)
    return int(out[0])


def cxlkv_copy_in_hashed(r: Handle, offset: int, src: BufferLike, nc: int = 0) -> int:
    """:func:`cxlkv_copy_in` and the xxh3_64 of the bytes copied, in one pass.

    Each 64-byte stripe is hashed from the register it was stored from
    (:func:`cxlkv_copy_hash`); from the stream threshold on, and for non-coherent
    copies, in 256 KiB chunks, each hashed while still in cache (see
    ``cxlkv_copy_in_hashed`` in cxlkv_transport.h); GIL released throughout.

    Returns:
        xxh3_64 (seed 0) of ``src`` as an unsigned 64-bit int, equal to
        ``xxhash.xxh3_64_intdigest(src)``.

    Raises:
        OutOfRange: ``[offset, offset + nbytes)`` not inside the region, or offset negative.
        InvalidArgument: ``src`` is not a C-contiguous bytes-like object, or it
            overlaps the destination range.
        RegionError: the region is closed.
    """
    try:
        buf = _from_buffer(src)
    except (TypeError, ValueError, BufferError):
        buf = _buffer(src, False, "src")
    return _copy_hashed(_c_copy_in_hashed, r, offset, buf, "copy_in_hashed", nc)


def cxlkv_copy_out_hashed(r: Handle, offset: int, dst: BufferLike, nc: int = 0) -> int:
    """:func:`cxlkv_copy_out` and the xxh3_64 of the bytes delivered (see
    ``cxlkv_copy_out_hashed`` in cxlkv_transport.h for which side is hashed), in
    one pass; GIL released.

    Returns:
        xxh3_64 (seed 0) of what ``dst`` now holds, as an unsigned 64-bit int.

    Raises:
        OutOfRange: ``[offset, offset + nbytes)`` not inside the region, or offset negative.
        InvalidArgument: ``dst`` is read-only, strided, not a buffer, or overlaps the source.
        RegionError: the region is closed.
    """
    try:
        buf = _from_buffer("char[]", dst, True)
    except (TypeError, ValueError, BufferError):
        buf = _buffer(dst, True, "dst")
    return _copy_hashed(_c_copy_out_hashed, r, offset, buf, "copy_out_hashed", nc)


def fresh_bytes(nbytes: int) -> tuple[bytes, Any]:
    """A new ``bytes`` object of ``nbytes`` and a writable buffer over its storage,
    for one C copy to fill before the object is handed to anyone.

    A get that must return ``bytes`` then copies the value once, into the object it
    returns, instead of into a scratch buffer and again into ``bytes(...)`` — what C
    code does with ``PyBytes_FromStringAndSize(NULL, n)``. The object is new (its
    reference is the caller's only one) and its hash is not taken yet, so writing it
    before it escapes is not observable; never pass the buffer anywhere else, and
    drop it once the copy is done.

    Args:
        nbytes: size in bytes, at least 2 (``bytes`` of 0 is a shared singleton).

    Returns:
        ``(value, buffer)``: ``value``'s bytes are undefined until the copy writes
        ``buffer`` (never return it from a copy that failed).

    Raises:
        InvalidArgument: ``nbytes`` under 2.
    """
    if nbytes < 2:
        raise InvalidArgument(f"fresh_bytes: {nbytes} B; use it for values of 2 bytes or more")
    value = _bytes_uninitialized(None, nbytes) if _bytes_uninitialized is not None else bytes(nbytes)
    return value, ffi.buffer(_from_buffer("char[]", value, False), nbytes)


def _uninitialized_bytes_maker() -> Any:
    """CPython's ``PyBytes_FromStringAndSize(NULL, n)``: a new ``bytes`` whose storage
    is not zeroed first (``bytes(n)`` zeroes it: a whole extra pass over a large value).
    ``None`` where the C API is not reachable (then ``bytes(n)``)."""
    try:
        import ctypes

        fn = ctypes.pythonapi.PyBytes_FromStringAndSize
    except (ImportError, AttributeError):
        return None
    fn.restype = ctypes.py_object
    fn.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
    return fn


_bytes_uninitialized = _uninitialized_bytes_maker()


def _ranges(
    r: Handle,
    buf: BufferLike,
    buf_offsets: U64Array,
    region_offsets: U64Array,
    lengths: U64Array,
    writable: bool,
    op: str,
    hashes: list[int] | None = None,
    nc: int = 0,
) -> None:
    try:
        cbuf = _from_buffer("char[]", buf, writable)
    except (TypeError, ValueError, BufferError):
        cbuf = _buffer(buf, writable, "buf")
    boffs = _u64_array(buf_offsets, "buf_offsets")
    roffs = _u64_array(region_offsets, "region_offsets")
    lens = _u64_array(lengths, "lengths")
    n = len(lens)
    if len(boffs) != n or len(roffs) != n:
        raise InvalidArgument(
            f"{op}: buf_offsets ({len(boffs)}), region_offsets ({len(roffs)}) and "
            f"lengths ({n}) must have the same length"
        )
    bad = _new("uint64_t *")
    if hashes is not None:
        out = _new("uint64_t[]", n)
        fn = lib.cxlkv_copy_out_ranges_hashed if writable else lib.cxlkv_copy_in_ranges_hashed
        rc = fn(r, cbuf, len(cbuf), n, boffs, roffs, lens, out, bad, nc)
        if rc == _E_INVAL:
            raise InvalidArgument(f"{op}: extent #{int(bad[0])} of {n}: its buffer range overlaps its "
                                  "region range (a hashed copy needs two separate sides); nothing was copied")
        if rc != _OK:
            _raise_many(r, rc, op, int(bad[0]), n)
        hashes.extend(out)
        return
    fn = lib.cxlkv_copy_out_ranges if writable else lib.cxlkv_copy_in_ranges
    rc = fn(r, cbuf, len(cbuf), n, boffs, roffs, lens, bad, nc)
    if rc != _OK:
        _raise_many(r, rc, op, int(bad[0]), n)


def cxlkv_copy_in_ranges(
    r: Handle, buf: BufferLike, buf_offsets: U64Array, region_offsets: U64Array, lengths: U64Array,
    nc: int = 0,
) -> None:
    """Copy ``buf[buf_offsets[i]:+lengths[i]]`` to ``region[region_offsets[i]:+lengths[i]]``
    for every i, in ONE C call (one shared buffer, many region extents).

    The three index arrays may be lists or 1-D uint64 buffers (used zero-copy).
    Both sides of every extent are bounds-checked before any byte moves.

    Raises:
        OutOfRange: an extent outside the region or ``buf`` (index named); negatives.
        InvalidArgument: arrays of different lengths; ``buf`` not a contiguous buffer.
        RegionError: the region is closed.
    """
    _ranges(r, buf, buf_offsets, region_offsets, lengths, False, "copy_in_ranges", None, nc)


def cxlkv_copy_out_ranges(
    r: Handle, buf: BufferLike, buf_offsets: U64Array, region_offsets: U64Array, lengths: U64Array,
    nc: int = 0,
) -> None:
    """Copy ``region[region_offsets[i]:+lengths[i]]`` to ``buf[buf_offsets[i]:+lengths[i]]``
    for every i, in ONE C call; ``buf`` must be writable.

    Raises:
        OutOfRange, InvalidArgument, RegionError: as :func:`cxlkv_copy_in_ranges`.
    """
    _ranges(r, buf, buf_offsets, region_offsets, lengths, True, "copy_out_ranges", None, nc)


def cxlkv_copy_out_ranges_hashed(
    r: Handle, buf: BufferLike, buf_offsets: U64Array, region_offsets: U64Array, lengths: U64Array,
    nc: int = 0,
) -> list[int]:
    """:func:`cxlkv_copy_out_ranges`, hashing each range as it lands.

    Returns:
        Per range, the xxh3_64 (seed 0) of the bytes delivered to ``buf``.

    Raises:
        OutOfRange, InvalidArgument, RegionError: as :func:`cxlkv_copy_in_ranges`.
    """
    hashes: list[int] = []
    _ranges(r, buf, buf_offsets, region_offsets, lengths, True, "copy_out_ranges_hashed", hashes, nc)
    return hashes


def cxlkv_copy_in_ranges_hashed(
    r: Handle, buf: BufferLike, buf_offsets: U64Array, region_offsets: U64Array, lengths: U64Array,
    nc: int = 0,
) -> list[int]:
    """:func:`cxlkv_copy_in_ranges`, hashing each source range as it is copied.

    Returns:
        Per range, the xxh3_64 (seed 0) of the bytes taken from ``buf``.

    Raises:
        OutOfRange, InvalidArgument, RegionError: as :func:`cxlkv_copy_in_ranges`.
    """
    hashes: list[int] = []
    _ranges(r, buf, buf_offsets, region_offsets, lengths, False, "copy_in_ranges_hashed", hashes, nc)
    return hashes


def cxlkv_copy_in_gather_hashed(
    r: Handle, srcs: Sequence[BufferLike], region_offsets: U64Array, lengths: U64Array, nc: int = 0,
) -> list[int]:
    """Copy each of ``srcs[i]`` (its first ``lengths[i]`` bytes) to
    ``region[region_offsets[i]:+lengths[i]]``, hashing it as it is copied, in ONE C
    call: a batch of values held in separate buffers. Every range is checked
    before any byte moves; GIL released.

    Returns:
        Per source, the xxh3_64 (seed 0) of the bytes copied.

    Raises:
        OutOfRange: a range outside the region (index named), or a length beyond
            its source; nothing was copied.
        InvalidArgument: arrays of different lengths, a source that is not a
            C-contiguous bytes-like object or overlaps its region range.
        RegionError: the region is closed.
    """
    roffs = _u64_array(region_offsets, "region_offsets")
    lens = _u64_array(lengths, "lengths")
    n = len(lens)
    if len(srcs) != n or len(roffs) != n:
        raise InvalidArgument(f"copy_in_gather_hashed: srcs ({len(srcs)}), region_offsets ({len(roffs)}) and "
                              f"lengths ({n}) must have the same length")
    bufs = []
    for i, src in enumerate(srcs):
        try:
            b = _from_buffer(src)
        except (TypeError, ValueError, BufferError):
            b = _buffer(src, False, f"srcs[{i}]")
        if len(b) < lens[i]:
            raise OutOfRange(f"copy_in_gather_hashed: source #{i} holds {len(b)} bytes, {int(lens[i])} asked; "
                             "nothing was copied")
        bufs.append(b)
    ptrs = _new("void *[]", bufs) if n else ffi.NULL
    out = _new("uint64_t[]", n)
    bad = _new("uint64_t *")
    rc = lib.cxlkv_copy_in_gather_hashed(r, n, ptrs, roffs, lens, out, bad, nc)
    del bufs  # the sources' buffers: held until here
    if rc == _E_INVAL and r.base != ffi.NULL:
        raise InvalidArgument(f"copy_in_gather_hashed: source #{int(bad[0])} of {n} overlaps its region range "
                              "(a hashed copy needs two separate sides); nothing was copied")
    if rc != _OK:
        _raise_many(r, rc, "copy_in_gather_hashed", int(bad[0]), n)
    return list(out)


def _keys_blob(keys: Any, op: str) -> bytes:
    """The concatenated keys as ``bytes`` (any bytes-like object is copied once)."""
    if isinstance(keys, bytes):
        return keys
    try:
        return bytes(memoryview(keys).cast("B"))
    except TypeError:
        raise InvalidArgument(f"{op}: keys must be bytes-like, got {type(keys).__name__}") from None


def _header_columns(op: str, columns: list[tuple[U64Array, str]]) -> tuple[Any, list[Any]]:
    """The seven columns of a header batch as ``uint64_t *`` into ONE C array
    (one allocation, not seven: the calls also serve batches of one key).

    Returns:
        ``(owner, pointers)``: keep ``owner`` referenced until the C call has
        returned (the pointers do not keep the array alive).

    Raises:
        InvalidArgument: columns of different lengths, or not ints.
        OutOfRange: a value outside [0, 2**64).
    """
    n = len(columns[0][0])
    for values, _ in columns:
        if len(values) != n:
            raise InvalidArgument(f"{op}: every array must have the same length")
    try:
        arr = _new("uint64_t[]", list(_chain.from_iterable([values for values, _ in columns])))
    except OverflowError:
        raise OutOfRange(f"{op}: every value must be in [0, 2**64)") from None
    except TypeError:
        raise InvalidArgument(f"{op}: every array must be a sequence of ints") from None
    return arr, [arr + k * n for k in range(len(columns))]


def cxlkv_write_headers(
    r: Handle,
    extent_offsets: U64Array,
    header_bytes: U64Array,
    keys: bytes,
    key_offsets: U64Array,
    key_lens: U64Array,
    versions: U64Array,
    value_lens: U64Array,
    value_hashes: U64Array,
    flush: bool,
) -> None:
    """Write N object headers with their keys in ONE C call (layout:
    :mod:`cxlkv.layout.objheader`; the same bytes as :func:`~cxlkv.layout.objheader.pack_header`
    followed by the key and zero padding to ``header_bytes[i]``).

    Raises:
        OutOfRange: a header span outside the region; nothing is written.
        InvalidArgument: arrays of different lengths, a key range outside ``keys``,
            a key of 0 or more than 4,096 bytes, or ``header_bytes[i]`` not
            ``64 + align64(key length)``; nothing is written.
        RegionError: the region is closed.
    """
    keys = _keys_blob(keys, "write_headers")
    owner, (ext, hb, koffs, klens, vers, vlens, vhashes) = _header_columns("write_headers", [
        (extent_offsets, "extent_offsets"), (header_bytes, "header_bytes"), (key_offsets, "key_offsets"),
        (key_lens, "key_lens"), (versions, "versions"), (value_lens, "value_lens"),
        (value_hashes, "value_hashes")])
    n = len(extent_offsets)
    bad = _new("uint64_t *")
    rc = lib.cxlkv_write_headers(r, n, ext, hb, keys, len(keys), koffs, klens, vers, vlens, vhashes,
                                 1 if flush else 0, bad)
    del owner  # the columns' memory: alive until here
    if rc != _OK:
        if rc == _E_RANGE:
            raise OutOfRange(f"write_headers: header #{int(bad[0])} of {n} is outside the region "
                             f"({r.size_bytes} bytes); nothing was written")
        if rc == _E_CLOSED:
            raise _closed_error(r)
        raise InvalidArgument(f"write_headers: header #{int(bad[0])} of {n}: bad key range, key length "
                              "or header_bytes; nothing was written")


def cxlkv_verify_headers(
    r: Handle,
    extent_offsets: U64Array,
    header_bytes: U64Array,
    keys: bytes,
    key_offsets: U64Array,
    key_lens: U64Array,
    versions: U64Array,
    value_lens: U64Array,
    value_hashes: U64Array,
    invalidate: bool,
) -> bytes:
    """Check N object headers in ONE C call (layout: :mod:`cxlkv.layout.objheader`).

    Object i's extent starts at ``extent_offsets[i]``; it must describe the key
    ``keys[key_offsets[i]:+key_lens[i]]`` at ``versions[i]`` with a
    ``value_lens[i]``-byte value whose xxh3_64 is ``value_hashes[i]``, with
    ``header_bytes[i]`` bytes before the value. ``invalidate`` invalidates the
    header lines first (non-coherent mode).

    Returns:
        N bytes: 1 where the object is valid, 0 where it is not (find out why
        with :func:`cxlkv.layout.objheader.object_mismatch`).

    Raises:
        OutOfRange: a header span outside the region (index named); nothing checked.
        InvalidArgument: arrays of different lengths, a key range outside ``keys``.
        RegionError: the region is closed.
    """
    keys = _keys_blob(keys, "verify_headers")
    owner, (ext, hb, koffs, klens, vers, vlens, vhashes) = _header_columns("verify_headers", [
        (extent_offsets, "extent_offsets"), (header_bytes, "header_bytes"), (key_offsets, "key_offsets"),
        (key_lens, "key_lens"), (versions, "versions"), (value_lens, "value_lens"),
        (value_hashes, "value_hashes")])
    n = len(extent_offsets)
    ok = _new("uint8_t[]", n)
    bad = _new("uint64_t *")
    rc = lib.cxlkv_verify_headers(r, n, ext, hb, keys, len(keys), koffs, klens, vers, vlens, vhashes,
                                  1 if invalidate else 0, ok, bad)
    del owner  # the columns' memory: alive until here
    if rc != _OK:
        if rc == _E_RANGE:
            raise OutOfRange(f"verify_headers: header #{int(bad[0])} of {n} is outside the region "
                             f"({r.size_bytes} bytes); nothing was checked")
        _raise_many(r, rc, "verify_headers", int(bad[0]), n)
    return bytes(ffi.buffer(ok, n)) if n else b""


# -- cache maintenance -------------------------------------------------------------

def cxlkv_flush(r: Handle, offset: int, length: int) -> None:
    """Write back the cache lines of ``[offset, offset + length)`` bytes, then SFENCE.

    Raises:
        OutOfRange: the range is not inside the region.
        RegionError: the region is closed.
    """
    try:
        rc = lib.cxlkv_flush(r, offset, length)
    except OverflowError:
        _raise_overflow("flush", offset, length)
    if rc != _OK:
        _raise_range(r, rc, "flush", offset, length)


def cxlkv_invalidate(r: Handle, offset: int, length: int) -> None:
    """Drop (after writing back) the cache lines of ``[offset, offset + length)``, then MFENCE.

    Raises:
        OutOfRange: the range is not inside the region.
        RegionError: the region is closed.
    """
    try:
        rc = lib.cxlkv_invalidate(r, offset, length)
    except OverflowError:
        _raise_overflow("invalidate", offset, length)
    if rc != _OK:
        _raise_range(r, rc, "invalidate", offset, length)


def cxlkv_fence() -> None:
    """A full memory fence (MFENCE; DMB ISH on aarch64)."""
    lib.cxlkv_fence()


def cxlkv_prefault(r: Handle, offset: int, length: int) -> None:
    """Fault in the pages of ``[offset, offset + length)`` for writing; bytes unchanged.

    Raises:
        OutOfRange: the range is not inside the region.
        RegionError: the kernel could not supply the pages (e.g. /dev/shm full), or closed.
    """
    err = _new("int *")
    try:
        rc = lib.cxlkv_prefault(r, offset, length, err)
    except OverflowError:
        _raise_overflow("prefault", offset, length)
    if rc == lib.CXLKV_E_PREFAULT:
        raise RegionError(f"prefault of {length} bytes at {offset} failed: {os.strerror(err[0])}", errno=int(err[0]))
    if rc != _OK:
        _raise_range(r, rc, "prefault", offset, length)


# -- region index ------------------------------------------------------------------

_U32_FORMATS = frozenset({"I", "<I", "=I", "@I"})


def _u32_array(values: U64Array, what: str) -> Any:
    """A ``uint32_t[]`` cdata over ``values`` (zero-copy for uint32 buffers)."""
    return _int_array(values, what, "uint32_t[]", 4, _U32_FORMATS)


def cxlkv_index_store(
    r: Handle,
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
    flush: bool,
) -> None:
    """Publish N index slots in ONE C call, each under its seqlock (layout:
    cxlkv_transport.h, :mod:`cxlkv.layout.index`): slot ``slot_nos[i]`` of the
    ``nslots``-slot table at ``table_offset`` describes ``key_hashes[i]``'s
    object at ``extent_offsets[i]`` (``value_lens[i]`` bytes, ``versions[i]``,
    value checksum ``value_hashes[i]``, ``header_bytes[i]`` header bytes) with
    ``meta[i] = flags | region_no << 16 | tier << 24``; a tombstone is all zeros.
    With ``flush`` every slot line is written back; the call ends with a fence.

    The u64 columns take lists, tuples or 1-D uint64 buffers, ``header_bytes``
    and ``meta`` lists, tuples or 1-D uint32 buffers (used zero-copy).

    Raises:
        OutOfRange: the table outside the region, a slot number >= ``nslots``
            (index named), or a value too large for its field; nothing is written.
        InvalidArgument: columns of different lengths, a table offset not a
            multiple of 64, a non-int value.
        RegionError: the region is closed.
    """
    t = type(slot_nos)
    if (t is list or t is tuple) and t is type(key_hashes) is type(extent_offsets) is type(value_lens) \
            is type(versions) is type(value_hashes) is type(header_bytes) is type(meta):
        # the master's calls (lists or tuples of a few slots): two allocations, not
        # eight, and no per-column loops on the path of every commit
        n = len(slot_nos)
        if not (n == len(key_hashes) == len(extent_offsets) == len(value_lens) == len(versions)
                == len(value_hashes) == len(header_bytes) == len(meta)):
            raise InvalidArgument("index_store: every column must have the same length")
        try:
            p = _new("uint64_t[]", slot_nos + key_hashes + extent_offsets + value_lens + versions + value_hashes)
            q = _new("uint32_t[]", header_bytes + meta)
        except OverflowError:
            raise OutOfRange("index_store: a value does not fit its field (u64; header_bytes and meta u32)") from None
        except TypeError:
            raise InvalidArgument("index_store: every column must be a sequence of ints") from None
        c64 = (p, p + n, p + 2 * n, p + 3 * n, p + 4 * n, p + 5 * n)
        c32 = (q, q + n)  # p and q (locals) keep the memory alive
    else:
        cols64 = (slot_nos, key_hashes, extent_offsets, value_lens, versions, value_hashes)
        arrs64 = [_u64_array(c, w) for c, w in zip(cols64, (
            "slot_nos", "key_hashes", "extent_offsets", "value_lens", "versions", "value_hashes"))]
        arrs32 = [_u32_array(header_bytes, "header_bytes"), _u32_array(meta, "meta")]
        n = len(arrs64[0])
        if any(len(a) != n for a in arrs64) or any(len(a) != n for a in arrs32):
            raise InvalidArgument("index_store: every column must have the same length")
        c64, c32 = arrs64, arrs32  # type: ignore[assignment]
    bad = _new("uint64_t *")
    try:
        rc = lib.cxlkv_index_store(r, table_offset, nslots, n, c64[0], c64[1], c64[2], c64[3], c64[4],
                                   c64[5], c32[0], c32[1], 1 if flush else 0, bad)
    except OverflowError:
        _raise_overflow("index_store", table_offset, nslots)
    except TypeError:
        raise InvalidArgument("index_store: table_offset and nslots must be ints") from None
    if rc != _OK:
        if rc == _E_CLOSED:
            raise _closed_error(r)
        if rc == _E_RANGE:
            if n and int(bad[0]) < n and int(c64[0][int(bad[0])]) >= nslots:
                raise OutOfRange(f"index_store: slot #{int(bad[0])} of {n} is number "
                                 f"{int(c64[0][int(bad[0])])}, the table has {nslots}; nothing was written")
            raise OutOfRange(f"index_store: a table of {nslots} slots at {table_offset} is outside the "
                             f"region ({r.size_bytes} bytes); nothing was written")
        raise InvalidArgument(f"index_store: the table offset {table_offset} must be a multiple of "
                              f"{INDEX_SLOT_BYTES} bytes (status {rc})")


# -- SIGBUS guard (a mapped file that shrinks) -------------------------------------

def cxlkv_guard_install() -> None:
    """Install the process's SIGBUS guard (idempotent): a fault past the end of a
    registered mapping's file becomes zero memory instead of killing the process.

    Raises:
        RegionError: sigaction failed (errno set).
    """
    err = _new("int *")
    if lib.cxlkv_guard_install(err) != _OK:
        raise RegionError(f"installing the SIGBUS guard failed: {os.strerror(err[0])}", errno=int(err[0]))


_guard_lock = threading.Lock()  # the C table's writers must be serialised


def cxlkv_guard_add(r: Handle) -> bool:
    """Register ``r``'s mapping with the guard; False when the table (256) is full.
    Thread-safe."""
    if r.base == ffi.NULL:
        return False
    with _guard_lock:
        return lib.cxlkv_guard_add(r.base, r.size_bytes) == _OK


def cxlkv_guard_remove(r: Handle) -> None:
    """Forget ``r``'s mapping (call before unmapping it). Thread-safe."""
    if r.base != ffi.NULL:
        with _guard_lock:
            lib.cxlkv_guard_remove(r.base)


def guard_add_memory(mem: Any) -> int:
    """Register the mapping under the writable buffer ``mem`` (e.g. an ``mmap`` of a
    file another process can truncate) with the guard; returns its base address
    (for :func:`guard_remove_memory` / :func:`guard_hits_memory`), 0 when the table
    is full or ``mem`` is empty. Thread-safe."""
    if len(mem) == 0:
        return 0
    base = ffi.from_buffer("char[]", mem, require_writable=True)
    with _guard_lock:
        ok = lib.cxlkv_guard_add(base, len(mem)) == _OK
    return int(ffi.cast("uintptr_t", base)) if ok else 0


def guard_remove_memory(address: int) -> None:
    """Forget a mapping :func:`guard_add_memory` registered (call before unmapping it)."""
    if address:
        with _guard_lock:
            lib.cxlkv_guard_remove(ffi.cast("void *", address))


def guard_hits_memory(address: int) -> int:
    """Faults absorbed in the mapping :func:`guard_add_memory` registered at ``address``."""
    return int(lib.cxlkv_guard_hits(ffi.cast("void *", address))) if address else 0


def cxlkv_guard_hits(r: Handle) -> int:
    """Faults absorbed in ``r``'s mapping since it was registered (0 if not registered)."""
    return int(lib.cxlkv_guard_hits(r.base)) if r.base != ffi.NULL else 0


def cxlkv_guard_total_hits() -> int:
    """Faults absorbed in every registered mapping of this process, ever."""
    return int(lib.cxlkv_guard_total_hits())
