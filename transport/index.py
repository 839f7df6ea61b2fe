"""Readers of the region index: find a key and copy its value in one C call, no RPC.

The master publishes every committed object into the **index** in the shared
region (layout: :mod:`cxlkv.layout.index`, ``cxlkv_transport.h``); a process that maps
the region answers a get with memory operations alone. :class:`IndexReader`
wraps one index::

    reader = IndexReader(region, header_offset, table_offset, buckets, [region], invalidate=False)
    r = reader.get(b"key", buf)          # IndexResult(outcome, tier, value_len_bytes, version, retries)
    if r.outcome == IX_HIT:
        value = memoryview(buf)[:r.value_len_bytes]

Each lookup reads the slot under its seqlock, checks the extent's object header
and the xxh3_64 of the bytes delivered against the slot, redoes a copy that
does not verify once, and otherwise answers without guessing:

* :data:`IX_HIT` -- ``dst[:value_len_bytes]`` holds one committed version's value;
* :data:`IX_MISS` -- the key is definitely not committed;
* :data:`IX_ELSEWHERE` -- committed, not readable here (an SSD/DRAM-only
  object, a region this process did not map, a value over ``max_value_bytes``);
* :data:`IX_TOO_SMALL` -- committed, ``dst`` is under ``value_len_bytes``;
* :data:`IX_UNSURE` -- no master publishes, the index overflowed, a slot never
  read stable, or the copy failed verification twice.

ELSEWHERE and UNSURE send the caller to the leased RPC path; no outcome is ever
wrong bytes. The reader takes no lock and no lease, in C with the GIL released.

Regions that are not a plain mapped :class:`~cxlkv.transport.Region` (the
test-only :class:`~cxlkv.transport.emulate.NoncoherentRegion`, which models a
private cache) are read by the pure-Python reference reader
(:func:`cxlkv.transport.portable.index_lookup`), chosen automatically.

Thread-safety: one reader may be used from any number of threads at once; the
regions it names must stay open while it is used (a closed data region reads as
ELSEWHERE, a closed table region raises :class:`RegionError`).
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Sequence
from itertools import accumulate
from typing import Any, NamedTuple

import numpy as np
import xxhash

from cxlkv.errors import InvalidArgument, OutOfRange, RegionError
from cxlkv.transport import bindings as _b
from cxlkv.transport import portable
from cxlkv.transport.bindings import (
    INDEX_BUCKET_SLOTS,
    INDEX_FORMAT_VERSION,
    INDEX_HEADER_BYTES,
    INDEX_MAX_REGIONS,
    INDEX_OVERFLOW_OFFSET,
    INDEX_PUBLISH_OFFSET,
    INDEX_SLOT_BYTES,
    IX_ELSEWHERE,
    IX_FLAG_ELSEWHERE,
    IX_FLAG_LIVE,
    IX_HIT,
    IX_MISS,
    IX_TOO_SMALL,
    IX_UNSURE,
    OBJ_MAX_KEY_BYTES,
    BufferLike,
    U64Array,
    ffi,
    lib,
)
from cxlkv.transport.region import Region

__all__ = [
    "IndexReader",
    "PortableIndexReader",
    "IndexResult",
    "IndexHeaderInfo",
    "read_index_header",
    "forget_buffers",
    "OUTCOME_NAMES",
    "IX_HIT",
    "IX_MISS",
    "IX_ELSEWHERE",
    "IX_TOO_SMALL",
    "IX_UNSURE",
    "IX_FLAG_LIVE",
    "IX_FLAG_ELSEWHERE",
]

#: Outcome → its name, for logs and metrics labels.
OUTCOME_NAMES = {IX_HIT: "hit", IX_MISS: "miss", IX_ELSEWHERE: "elsewhere", IX_TOO_SMALL: "too_small",
                 IX_UNSURE: "unsure"}

_MAGIC = b"CXLKVIX1"
_HDR = struct.Struct("<8sIIQQQ")  # magic, version, bucket slots, buckets, table offset, checksum
_PUB = struct.Struct("<QQ")
_RES = struct.Struct("=IIQQQII")  # cxlkv_ix_result_t
_xxh3 = xxhash.xxh3_64_intdigest
_from_buffer = ffi.from_buffer
_new = ffi.new
_tuple_new = tuple.__new__
_c_get = lib.cxlkv_index_get
_unpack = ffi.unpack
#: Size of a thread's scratch buffer for :meth:`IndexReader.get_small`, in bytes.
SMALL_BYTES = 64 << 10
_c_probe = lib.cxlkv_index_probe
_E_CLOSED = lib.CXLKV_E_CLOSED
_E_RANGE = lib.CXLKV_E_RANGE
# Per thread: [its cxlkv_ix_result_t * (reused by every call), the last numpy
# destination it read into, that array's cdata]. ffi.from_buffer costs ~0.8 µs
# on a numpy array (0.3 µs on a bytearray); the cdata of the last array is
# reused while the caller passes the same array. Only numpy arrays: a cached
# cdata holds a buffer export, which would make a bytearray or mmap refuse to
# resize or close and a memoryview refuse release().
_tls = threading.local()
_ndarray = np.ndarray


class IndexResult(NamedTuple):
    """One lookup's answer.

    Attributes:
        outcome: ``IX_HIT``, ``IX_MISS``, ``IX_ELSEWHERE``, ``IX_TOO_SMALL`` or ``IX_UNSURE``.
        tier: the replica's ``cxlkv.v1.Tier`` (HIT, ELSEWHERE, TOO_SMALL; else 0).
        value_len_bytes: the value's length in bytes (HIT, ELSEWHERE, TOO_SMALL; else 0).
        version: the committed version (HIT, ELSEWHERE, TOO_SMALL; else 0).
        retries: 1 when the first copy did not verify and the lookup was redone.
    """

    outcome: int
    tier: int
    value_len_bytes: int
    version: int
    retries: int = 0


class IndexHeaderInfo(NamedTuple):
    """The reader-relevant fields of an index header page (:func:`read_index_header`)."""

    buckets: int
    table_offset_bytes: int
    publish_epoch: int
    overflow: int


def read_index_header(region: Any, header_offset: int, *, invalidate: bool = False) -> IndexHeaderInfo:
    """Read and check the index header page at ``header_offset`` (magic, format
    version, bucket size, checksum of the static part).

    Raises:
        RegionError: no index there, a corrupt header or another format version.
        OutOfRange: the page is not inside the region.
    """
    if invalidate:
        region.invalidate(header_offset, INDEX_HEADER_BYTES)
    page = region.read(header_offset, 80)
    magic, version, bslots, buckets, table, checksum = _HDR.unpack_from(page, 0)
    path = getattr(region, "path", "?")
    if magic != _MAGIC:
        raise RegionError(f"region {path} has no index at offset {header_offset}", path=path)
    if checksum != _xxh3(page[:32]):
        raise RegionError(f"region {path}: the index header at {header_offset} is corrupt (checksum)", path=path)
    if version != INDEX_FORMAT_VERSION or bslots != INDEX_BUCKET_SLOTS:
        raise RegionError(f"region {path}: index format {version} with {bslots}-slot buckets; this cxlkv "
                          f"reads format {INDEX_FORMAT_VERSION} with {INDEX_BUCKET_SLOTS}", path=path)
    publish, overflow = _PUB.unpack_from(page, INDEX_PUBLISH_OFFSET)
    return IndexHeaderInfo(buckets, table, publish, overflow)


def _plain(region: Any) -> bool:
    return type(region) is Region


def _thread_state() -> list[Any]:
    st = _tls.st = [_new("cxlkv_ix_result_t *"), None, None]
    return st


def forget_buffers() -> None:
    """Drop the calling thread's cached reference to the last numpy array it read into
    (:meth:`IndexReader.get` keeps it, exported, to skip ``ffi.from_buffer`` when the
    same array comes again)."""
    st = getattr(_tls, "st", None)
    if st is not None:
        st[1] = st[2] = None


def _results(out: Any, done: int) -> list[IndexResult]:
    return [_tuple_new(IndexResult, (o, t, vl, v, r))
            for o, t, vl, v, _e, _n, r in _RES.iter_unpack(ffi.buffer(out, done * _RES.size))] if done else []


def _keys(keys: Sequence[bytes], op: str) -> tuple[bytes, Any, Any, int]:
    """The keys as one blob and ``uint64_t[]`` offsets and lengths."""
    try:
        blob = b"".join(keys)
        lens = [len(k) for k in keys]
    except TypeError:
        raise InvalidArgument(f"{op}: keys must be a sequence of bytes (UTF-8 keys)") from None
    n = len(lens)
    offs = list(accumulate(lens, initial=0))
    offs.pop()
    return blob, _new("uint64_t[]", offs), _new("uint64_t[]", lens), n


class IndexReader:
    """Lock-free reads of one region index (see the module docstring).

    Args:
        table_region: the region holding the index header page and slots.
        header_offset: absolute offset of the index header page (64-aligned).
        table_offset: absolute offset of slot 0 (64-aligned).
        buckets: number of buckets (a power of two).
        regions: region number → mapped region (``None``: not mapped here), at
            most 32; region 0 is usually ``table_region``.
        invalidate: drop the cache lines of every index and extent range before
            reading it (non-coherent sharing, ``coherence = "flush"``).
        verify_first: with ``invalidate``, a value's first copy goes through the
            cache (its slot and header lines are still dropped); only when the
            copied bytes do not hash to the slot's checksum (a stale line) are
            its lines dropped and the value copied again. Same result, without
            the drops' cost on the common path (docs/transport.md, "Reads that
            verify first"). ``False``: every line dropped on the first copy.
        max_value_bytes: a get of a value longer than this answers ELSEWHERE
            (the leased path protects long copies; a probe still answers HIT);
            0 = no limit.
        portable: force the pure-Python reference reader (tests); by default it
            is used when a region is not a plain mapped :class:`Region`.

    Raises:
        InvalidArgument: buckets not a power of two, misaligned offsets, more
            than 32 regions, a negative ``max_value_bytes``.
        OutOfRange: the header page or the slot table outside ``table_region``.
        RegionError: ``table_region`` is closed.
    """

    __slots__ = ("_ix", "_keep", "table_region", "header_offset", "table_offset", "buckets", "regions",
                 "invalidate", "verify_first", "max_value_bytes", "__weakref__")

    def __new__(cls, table_region: Any, header_offset: int, table_offset: int, buckets: int,
                regions: Sequence[Any], *, invalidate: bool = False, verify_first: bool = True,
                max_value_bytes: int = 0, portable: bool = False) -> IndexReader:
        if cls is IndexReader and (portable or not _plain(table_region)
                                   or not all(r is None or _plain(r) for r in regions)):
            cls = PortableIndexReader
        return object.__new__(cls)

    def __init__(self, table_region: Any, header_offset: int, table_offset: int, buckets: int,
                 regions: Sequence[Any], *, invalidate: bool = False, verify_first: bool = True,
                 max_value_bytes: int = 0, portable: bool = False) -> None:
        regions = tuple(regions)
        if not isinstance(buckets, int) or buckets < 1 or buckets & (buckets - 1):
            raise InvalidArgument(f"index: buckets must be a power of two, got {buckets!r}")
        if header_offset % INDEX_SLOT_BYTES or table_offset % INDEX_SLOT_BYTES:
            raise InvalidArgument(f"index: header offset {header_offset} and table offset {table_offset} "
                                  f"must be multiples of {INDEX_SLOT_BYTES} bytes")
        if len(regions) > INDEX_MAX_REGIONS:
            raise InvalidArgument(f"index: at most {INDEX_MAX_REGIONS} regions, got {len(regions)}")
        if not isinstance(max_value_bytes, int) or max_value_bytes < 0:
            raise InvalidArgument(f"index: max_value_bytes must be a non-negative int, got {max_value_bytes!r}")
        if table_region.closed:
            raise RegionError(f"index: region {table_region.path} is closed", path=table_region.path)
        size = table_region.size_bytes
        table_bytes = buckets * INDEX_BUCKET_SLOTS * INDEX_SLOT_BYTES
        if (header_offset < 0 or table_offset < 0 or header_offset + INDEX_HEADER_BYTES > size
                or table_offset + table_bytes > size):
            raise OutOfRange(f"index: a header page at {header_offset} and {buckets} buckets at {table_offset} "
                             f"do not fit region {table_region.path} ({size} bytes)")
        self.table_region = table_region
        self.header_offset = header_offset
        self.table_offset = table_offset
        self.buckets = buckets
        self.regions = regions
        self.invalidate = bool(invalidate)
        self.verify_first = bool(verify_first)
        self.max_value_bytes = max_value_bytes
        self._setup()

    def _setup(self) -> None:
        ix = _new("cxlkv_index_t *")
        ix.table_region = self.table_region._r
        ix.header_offset = self.header_offset
        ix.table_offset = self.table_offset
        ix.buckets = self.buckets
        for i, r in enumerate(self.regions):
            if r is not None:
                ix.regions[i] = r._r
        ix.max_value_bytes = self.max_value_bytes
        ix.invalidate = 1 if self.invalidate else 0
        ix.verify_first = 1 if self.verify_first else 0
        self._ix = ix
        self._keep = self.regions  # the handles ix points to live as long as their Regions

    @classmethod
    def from_header(cls, table_region: Any, header_offset: int, regions: Sequence[Any], **kwargs: Any) -> IndexReader:
        """A reader of the index whose header page is at ``header_offset`` (buckets and
        table offset read from it; see :func:`read_index_header`). Keywords as the class.

        Raises:
            RegionError: no valid index header there; as the class otherwise.
        """
        info = read_index_header(table_region, header_offset, invalidate=bool(kwargs.get("invalidate")))
        return cls(table_region, header_offset, info.table_offset_bytes, info.buckets, regions, **kwargs)

    @property
    def is_portable(self) -> bool:
        """True when lookups run in the pure-Python reference reader."""
        return False

    def __repr__(self) -> str:
        return (f"<{type(self).__name__} {self.table_region.path}@{self.header_offset} {self.buckets} buckets"
                f"{(' invalidate, verify first' if self.verify_first else ' invalidate') if self.invalidate else ''}>")

    # -- errors (cold) -----------------------------------------------------------
    def _raise(self, rc: int, op: str, key: Any = None) -> None:
        if rc == _E_CLOSED:
            raise RegionError(f"{op}: index region {self.table_region.path} is closed", path=self.table_region.path)
        if rc == _E_RANGE:
            raise OutOfRange(f"{op}: the index is outside region {self.table_region.path}")
        if key is not None and not isinstance(key, bytes):
            raise InvalidArgument(f"{op}: a key is its UTF-8 bytes, got {type(key).__name__}")
        if key is not None and not 1 <= len(key) <= OBJ_MAX_KEY_BYTES:
            raise InvalidArgument(f"{op}: a key is 1 to {OBJ_MAX_KEY_BYTES} bytes, got {len(key)}")
        raise InvalidArgument(f"{op}: invalid argument (a bad key, or a destination overlapping the value; "
                              f"status {rc})")

    # -- lookups ---------------------------------------------------------------------
    def get(self, key_utf8: bytes, dst: BufferLike) -> IndexResult:
        """Look ``key_utf8`` up and, when committed in a mapped region, copy its value to
        the start of ``dst`` and verify it; GIL released.

        Args:
            key_utf8: the key's UTF-8 bytes (1..OBJ_MAX_KEY_BYTES).
            dst: a writable C-contiguous buffer; on HIT its first
                ``value_len_bytes`` bytes are the value (the rest is untouched).
                On other outcomes it may have been written. The last numpy
                array a thread passed stays referenced by that thread (see
                :func:`forget_buffers`).

        Returns:
            The :class:`IndexResult`.

        Raises:
            InvalidArgument: a bad key, a read-only or strided ``dst``, a ``dst``
                overlapping the value in the region.
            RegionError: the index's region is closed.
        """
        try:
            st = _tls.st
        except AttributeError:
            st = _thread_state()
        res = st[0]
        if dst is st[1]:
            d = st[2]
        else:
            try:
                d = _from_buffer("char[]", dst, True)
            except (TypeError, ValueError, BufferError):
                d = _b._buffer(dst, True, "dst")
            if type(dst) is _ndarray:
                st[1] = dst
                st[2] = d
        try:
            rc = _c_get(self._ix, key_utf8, len(key_utf8), d, len(d), res)
        except TypeError:
            rc = -1
        if rc:
            self._raise(rc, "index get", key_utf8)
        return _tuple_new(IndexResult, (res.outcome, res.tier, res.value_len, res.version, res.retries))

    def get_small(self, key_utf8: bytes) -> tuple[int, int, int, bytes | None, int]:
        """:meth:`get` into this thread's own scratch buffer of :data:`SMALL_BYTES`,
        the value returned as new ``bytes``: the single-key ``get`` of small values,
        without a destination or a result object to build.

        Returns:
            ``(outcome, value_len_bytes, retries, value, version)``: ``value`` is the
            value's bytes on HIT, else ``None`` (TOO_SMALL: the value is larger than
            :data:`SMALL_BYTES`; use :meth:`get` with a destination that fits);
            ``version`` as in :class:`IndexResult`.

        Raises:
            InvalidArgument: a bad key.
            RegionError: the index's region is closed.
        """
        try:
            res, d = _tls.small
        except AttributeError:
            res, d = _tls.small = (_new("cxlkv_ix_result_t *"), _new("char[]", SMALL_BYTES))
        try:
            rc = _c_get(self._ix, key_utf8, len(key_utf8), d, SMALL_BYTES, res)
        except TypeError:
            rc = -1
        if rc:
            self._raise(rc, "index get", key_utf8)
        n = res.value_len
        if res.outcome == IX_HIT:
            return IX_HIT, n, res.retries, _unpack(d, n), res.version
        return res.outcome, n, res.retries, None, res.version

    def probe(self, key_utf8: bytes) -> IndexResult:
        """Whether ``key_utf8`` is committed: HIT (slot and object header agree),
        ELSEWHERE (committed, not readable here), MISS, UNSURE; no value is read.

        Raises:
            InvalidArgument: a bad key.
            RegionError: the index's region is closed.
        """
        try:
            res = _tls.st[0]
        except AttributeError:
            res = _thread_state()[0]
        try:
            rc = _c_probe(self._ix, key_utf8, len(key_utf8), res)
        except TypeError:
            rc = -1
        if rc:
            self._raise(rc, "index probe", key_utf8)
        return _tuple_new(IndexResult, (res.outcome, res.tier, res.value_len, res.version, res.retries))

    def get_many(self, keys: Sequence[bytes], dsts: Sequence[BufferLike], prefix: bool = False) -> list[IndexResult]:
        """:meth:`get` of ``keys[i]`` into ``dsts[i]`` for every i, in ONE C call.

        Args:
            prefix: stop after the first key that is not a HIT (the longest
                cached prefix of a block sequence).

        Returns:
            One result per key answered: all of them, or with ``prefix`` up to
            and including the first non-HIT.

        Raises:
            InvalidArgument: ``keys`` and ``dsts`` differ in length, a bad key
                (index named), a bad or overlapping destination.
            RegionError: the index's region is closed.
        """
        blob, koffs, klens, n = _keys(keys, "index get_many")
        if len(dsts) != n:
            raise InvalidArgument(f"index get_many: {n} keys for {len(dsts)} destinations")
        cbufs = []
        for i, d in enumerate(dsts):
            try:
                cbufs.append(_from_buffer("char[]", d, True))
            except (TypeError, ValueError, BufferError):
                cbufs.append(_b._buffer(d, True, f"dsts[{i}]"))
        ptrs = _new("void *[]", cbufs)
        dlens = _new("uint64_t[]", [len(b) for b in cbufs])
        out = _new("cxlkv_ix_result_t[]", n)
        done = _new("uint64_t *")
        rc = lib.cxlkv_index_get_many(self._ix, n, blob, len(blob), koffs, klens, ptrs, dlens,
                                      1 if prefix else 0, out, done)
        if rc:
            self._raise_batch(rc, "index get_many", keys, int(done[0]))
        return _results(out, int(done[0]))

    def get_ranges(self, keys: Sequence[bytes], buf: BufferLike, buf_offsets: U64Array, dst_bytes: U64Array,
                   prefix: bool = False) -> list[IndexResult]:
        """:meth:`get_many` into one buffer: key i's destination is
        ``buf[buf_offsets[i] : +dst_bytes[i]]`` (offsets and sizes in bytes; lists
        or 1-D uint64 buffers, used zero-copy).

        Raises:
            OutOfRange: a destination range outside ``buf`` (index named); nothing is read.
            InvalidArgument: arrays of different lengths, a bad key, ``buf`` not a
                writable contiguous buffer, a range overlapping its value.
            RegionError: the index's region is closed.
        """
        blob, koffs, klens, n = _keys(keys, "index get_ranges")
        try:
            cbuf = _from_buffer("char[]", buf, True)
        except (TypeError, ValueError, BufferError):
            cbuf = _b._buffer(buf, True, "buf")
        boffs = _b._u64_array(buf_offsets, "buf_offsets")
        dlens = _b._u64_array(dst_bytes, "dst_bytes")
        if len(boffs) != n or len(dlens) != n:
            raise InvalidArgument(f"index get_ranges: {n} keys, {len(boffs)} buf_offsets, {len(dlens)} dst_bytes")
        out = _new("cxlkv_ix_result_t[]", n)
        done = _new("uint64_t *")
        bad = _new("uint64_t *")
        rc = lib.cxlkv_index_get_ranges(self._ix, n, blob, len(blob), koffs, klens, cbuf, len(cbuf), boffs, dlens,
                                        1 if prefix else 0, out, done, bad)
        if rc == _E_RANGE and n:
            i = int(bad[0])
            raise OutOfRange(f"index get_ranges: destination #{i} of {n} [{int(boffs[i])}, +{int(dlens[i])}) is "
                             f"outside the {len(cbuf)}-byte buffer; nothing was read")
        if rc:
            self._raise_batch(rc, "index get_ranges", keys, int(done[0]))
        return _results(out, int(done[0]))

    def probe_many(self, keys: Sequence[bytes], prefix: bool = False) -> list[IndexResult]:
        """:meth:`probe` of every key in ONE C call; ``prefix`` as :meth:`get_many`.

        Raises:
            InvalidArgument: a bad key (index named).
            RegionError: the index's region is closed.
        """
        blob, koffs, klens, n = _keys(keys, "index probe_many")
        out = _new("cxlkv_ix_result_t[]", n)
        done = _new("uint64_t *")
        rc = lib.cxlkv_index_probe_many(self._ix, n, blob, len(blob), koffs, klens, 1 if prefix else 0, out, done)
        if rc:
            self._raise_batch(rc, "index probe_many", keys, int(done[0]))
        return _results(out, int(done[0]))

    def _raise_batch(self, rc: int, op: str, keys: Sequence[bytes], i: int) -> None:
        if rc == _E_CLOSED or rc == _E_RANGE:
            self._raise(rc, op)
        key = keys[i] if i < len(keys) else b""
        if not 1 <= len(key) <= OBJ_MAX_KEY_BYTES:
            raise InvalidArgument(f"{op}: key #{i} of {len(keys)} is {len(key)} bytes; a key is 1 to {OBJ_MAX_KEY_BYTES}")
        raise InvalidArgument(f"{op}: item #{i} of {len(keys)}: a bad destination, or one overlapping its value "
                              f"(status {rc})")


class PortableIndexReader(IndexReader):
    """:class:`IndexReader` through the regions' own ``read``/``copy_out``/
    ``invalidate`` (the reference reader, :func:`cxlkv.transport.portable.index_lookup`):
    for region-like objects that are not a plain mapping. Same API, outcomes and errors."""

    __slots__ = ("_view",)

    def _setup(self) -> None:
        self._view = portable.IndexView(self.table_region, self.header_offset, self.table_offset, self.buckets,
                                        self.regions, self.max_value_bytes, self.invalidate,
                                        self.verify_first)

    @property
    def is_portable(self) -> bool:
        """True: lookups run in the pure-Python reference reader."""
        return True

    def _lookup(self, key: bytes, dst: Any, probe: bool) -> IndexResult:
        if not isinstance(key, bytes):
            raise InvalidArgument(f"index lookup: a key is its UTF-8 bytes, got {type(key).__name__}")
        if self.table_region.closed:
            raise RegionError(f"index: region {self.table_region.path} is closed", path=self.table_region.path)
        return IndexResult(*portable.index_lookup(self._view, key, dst, probe))

    def get(self, key_utf8: bytes, dst: BufferLike) -> IndexResult:
        return self._lookup(key_utf8, dst, False)

    def probe(self, key_utf8: bytes) -> IndexResult:
        return self._lookup(key_utf8, None, True)

    def get_small(self, key_utf8: bytes) -> tuple[int, int, int, bytes | None, int]:
        buf = bytearray(SMALL_BYTES)
        r = self._lookup(key_utf8, buf, False)
        value = bytes(buf[:r.value_len_bytes]) if r.outcome == IX_HIT else None
        return r.outcome, r.value_len_bytes, r.retries, value, r.version

    def _batch(self, keys: Sequence[bytes], dsts: Sequence[Any] | None, prefix: bool) -> list[IndexResult]:
        for i, k in enumerate(keys):
            if not isinstance(k, bytes) or not 1 <= len(k) <= OBJ_MAX_KEY_BYTES:
                raise InvalidArgument(f"index lookup: key #{i} of {len(keys)} is not 1 to {OBJ_MAX_KEY_BYTES} bytes")
        out = []
        for i, k in enumerate(keys):
            r = self._lookup(k, None if dsts is None else dsts[i], dsts is None)
            out.append(r)
            if prefix and r.outcome != IX_HIT:
                break
        return out

    def get_many(self, keys: Sequence[bytes], dsts: Sequence[BufferLike], prefix: bool = False) -> list[IndexResult]:
        if len(dsts) != len(keys):
            raise InvalidArgument(f"index get_many: {len(keys)} keys for {len(dsts)} destinations")
        return self._batch(keys, list(dsts), prefix)

    def get_ranges(self, keys: Sequence[bytes], buf: BufferLike, buf_offsets: U64Array, dst_bytes: U64Array,
                   prefix: bool = False) -> list[IndexResult]:
        try:
            view = memoryview(buf).cast("B")
        except TypeError:
            raise InvalidArgument(f"buf must be a bytes-like object, got {type(buf).__name__}") from None
        boffs, dlens = ([int(x) for x in a] for a in (buf_offsets, dst_bytes))
        if len(boffs) != len(keys) or len(dlens) != len(keys):
            raise InvalidArgument(f"index get_ranges: {len(keys)} keys, {len(boffs)} buf_offsets, "
                                  f"{len(dlens)} dst_bytes")
        for i, (o, n) in enumerate(zip(boffs, dlens)):
            if o < 0 or n < 0 or o + n > view.nbytes:
                raise OutOfRange(f"index get_ranges: destination #{i} of {len(keys)} [{o}, +{n}) is outside the "
                                 f"{view.nbytes}-byte buffer; nothing was read")
        return self._batch(keys, [view[o:o + n] for o, n in zip(boffs, dlens)], prefix)

    def probe_many(self, keys: Sequence[bytes], prefix: bool = False) -> list[IndexResult]:
        return self._batch(keys, None, prefix)
