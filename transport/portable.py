"""Pure-Python forms of the transport's batch calls, over any region-like object.

:class:`~cxlkv.transport.Region` does these in one C call each. Objects with the
same method surface that are not a plain mapping — the SSD tier's file
(:class:`cxlkv.clientd.tiers.FileRegion`, pread/pwrite) and the test-only
non-coherent emulation (:class:`cxlkv.transport.emulate.NoncoherentRegion`,
which models a private cache) — implement them with these, through their own
``copy_in``/``copy_out``/``read``/``flush``/``invalidate``, so every reader and
writer agrees on the bytes (:mod:`cxlkv.layout.objheader` defines them).
"""

from __future__ import annotations

import struct
import time
from typing import Any, Literal, NamedTuple, Sequence

import xxhash

from cxlkv.errors import InvalidArgument, OutOfRange
from cxlkv.layout.objheader import MAX_KEY_BYTES, OBJECT_HEADER_BYTES, header_bytes_for, object_mismatch, pack_header

__all__ = ["copy_in_ranges_hashed", "copy_out_ranges_hashed", "write_headers", "verify_headers",
           "pack_slot", "unpack_slot", "index_store", "IndexView", "index_lookup"]

_xxh3 = xxhash.xxh3_64_intdigest


def _ints(*columns: Any) -> list[list[int]]:
    """The columns as lists of ints, as the C calls take them: each an unsigned
    64-bit value, all of one length.

    Raises:
        OutOfRange: a value outside [0, 2**64).
        InvalidArgument: columns of different lengths, or not ints.
    """
    try:
        cols = [[int(x) for x in c] for c in columns]
    except (TypeError, ValueError):
        raise InvalidArgument("every array must be a sequence of ints") from None
    if len({len(c) for c in cols}) > 1:
        raise InvalidArgument("every array must have the same length")
    if any(x < 0 or x >> 64 for c in cols for x in c):
        raise OutOfRange("every value must be in [0, 2**64)")
    return cols


def _keys(keys: Any) -> bytes:
    try:
        return keys if isinstance(keys, bytes) else bytes(memoryview(keys).cast("B"))
    except TypeError:
        raise InvalidArgument(f"keys must be bytes-like, got {type(keys).__name__}") from None


def copy_in_ranges_hashed(region: Any, buf: Any, buf_offsets: Sequence[int], region_offsets: Sequence[int],
                          lengths: Sequence[int], *, flush: bool = False) -> list[int]:
    """``region.copy_in_ranges`` (``flush`` passed on) and the xxh3_64 of each source range."""
    bo, ro, ln = _ints(buf_offsets, region_offsets, lengths)
    region.copy_in_ranges(buf, bo, ro, ln, flush=flush)
    view = memoryview(buf).cast("B")
    return [_xxh3(view[b:b + n]) for b, n in zip(bo, ln)]


def copy_out_ranges_hashed(region: Any, buf: Any, buf_offsets: Sequence[int], region_offsets: Sequence[int],
                           lengths: Sequence[int], *, invalidate: bool = False) -> list[int]:
    """``region.copy_out_ranges`` (``invalidate`` passed on) and the xxh3_64 of each range delivered."""
    bo, ro, ln = _ints(buf_offsets, region_offsets, lengths)
    region.copy_out_ranges(buf, bo, ro, ln, invalidate=invalidate)
    view = memoryview(buf).cast("B")
    return [_xxh3(view[b:b + n]) for b, n in zip(bo, ln)]


def write_headers(region: Any, extent_offsets: Sequence[int], header_bytes: Sequence[int], keys: bytes,
                  key_offsets: Sequence[int], key_lens: Sequence[int], versions: Sequence[int],
                  value_lens: Sequence[int], value_hashes: Sequence[int], *, flush: bool = False) -> None:
    """``Region.write_headers`` through ``region.copy_in`` (and ``flush``); every
    item is checked before anything is written.

    Raises:
        InvalidArgument: ragged arrays, a bad key range or length, a wrong ``header_bytes``.
        OutOfRange / RegionError: as ``region.copy_in``.
    """
    keys = _keys(keys)
    cols = _ints(extent_offsets, header_bytes, key_offsets, key_lens, versions, value_lens, value_hashes)
    heads = []
    for i, (off, hb, ko, kl, ver, vlen, vhash) in enumerate(zip(*cols)):
        if not 1 <= kl <= MAX_KEY_BYTES or ko + kl > len(keys) or hb != header_bytes_for(kl):
            raise InvalidArgument(f"write_headers: header #{i}: bad key range, key length or header_bytes; "
                                  "nothing was written")
        key = bytes(keys[ko:ko + kl])
        heads.append((off, pack_header(key, ver, vlen, vhash) + key + bytes(hb - OBJECT_HEADER_BYTES - kl)))
    for off, head in heads:
        region.copy_in(off, head)
        if flush:
            region.flush(off, len(head))


def verify_headers(region: Any, extent_offsets: Sequence[int], header_bytes: Sequence[int], keys: bytes,
                   key_offsets: Sequence[int], key_lens: Sequence[int], versions: Sequence[int],
                   value_lens: Sequence[int], value_hashes: Sequence[int], *, invalidate: bool = False) -> bytes:
    """``Region.verify_headers`` through ``region.read`` (after ``invalidate``):
    1 per valid object, 0 per invalid one.

    Raises:
        OutOfRange: a ``header_bytes`` under one header.
        InvalidArgument: ragged arrays.
        RegionError: as ``region.read``.
    """
    keys = _keys(keys)
    cols = _ints(extent_offsets, header_bytes, key_offsets, key_lens, versions, value_lens, value_hashes)
    for i, (hb, ko, kl) in enumerate(zip(cols[1], cols[2], cols[3])):
        if hb < OBJECT_HEADER_BYTES:
            raise OutOfRange(f"verify_headers: header #{i}: header_bytes {hb} is under one header")
        if ko + kl > len(keys):
            raise InvalidArgument(f"verify_headers: header #{i}: key range outside the keys; nothing was checked")
    out = bytearray()
    for off, hb, ko, kl, ver, vlen, vhash in zip(*cols):
        if invalidate:
            region.invalidate(off, hb)
        key = bytes(keys[ko:ko + kl])
        ok = kl <= hb - OBJECT_HEADER_BYTES and object_mismatch(region.read(off, hb), key, ver, vlen, hb, vhash) is None
        out.append(1 if ok else 0)
    return bytes(out)


# -- region index (layout: cxlkv_transport.h, cxlkv/layout/index.py) ---------------------
# The reference forms of cxlkv_index_store and cxlkv_index_get / _probe, through
# a region's read/copy_in/copy_out/flush/invalidate. Constants are the C ones
# (bindings), written out here too: this module must import without compiled
# code's help only where it can, and the values are the format's.

_SLOT = struct.Struct("<QQQQQQIIQ")  # seq, key hash, extent, value len, version, value hash, hb, meta, checksum
_SEQ = struct.Struct("<Q")
_PUB = struct.Struct("<QQ")
_SLOT_BYTES = 64
_BUCKET_SLOTS = 8
_BUCKET_BYTES = _SLOT_BYTES * _BUCKET_SLOTS
_MAX_REGIONS = 32
_PUBLISH_AT = 64
_SPINS = 64
_LIVE, _ELSEWHERE = 1, 2
_HIT, _MISS, _ELSEWHERE_OUT, _TOO_SMALL, _UNSURE = 0, 1, 2, 3, 4


def pack_slot(seq: int, key_hash: int, extent_offset: int, value_len: int, version: int, value_hash: int,
              header_bytes: int, meta: int) -> bytes:
    """The 64 bytes of an index slot, its checksum over bytes [0, 56) with ``seq`` in place.

    ``meta`` is ``flags | region_no << 16 | tier << 24`` (bytes 52..55).

    Raises:
        struct.error: a value does not fit its field.
    """
    fields = _SLOT.pack(seq, key_hash, extent_offset, value_len, version, value_hash, header_bytes, meta, 0)[:56]
    return fields + _SEQ.pack(_xxh3(fields))


def unpack_slot(raw: bytes) -> tuple[int, int, int, int, int, int, int, int] | None:
    """``(seq, key_hash, extent_offset, value_len, version, value_hash, header_bytes,
    meta)`` of a stable slot (even seq, checksum right), else ``None`` (also for an
    all-zero never-written slot: test ``raw == bytes(64)`` for that)."""
    f = _SLOT.unpack_from(raw, 0)
    if f[0] & 1 or f[8] != _xxh3(raw[:56]):
        return None
    return f[:8]


def index_store(region: Any, table_offset: int, nslots: int, slot_nos: Sequence[int], key_hashes: Sequence[int],
                extent_offsets: Sequence[int], value_lens: Sequence[int], versions: Sequence[int],
                value_hashes: Sequence[int], header_bytes: Sequence[int], meta: Sequence[int],
                flush: bool = False) -> None:
    """``Region.index_store`` through ``region.read``/``copy_in``/``flush``: per slot,
    seq made odd (written back in flush mode, as a stalled master would leave it),
    the fields and checksum, seq made even, the line written back; then a fence.
    Every slot is checked before any is written.

    Raises:
        OutOfRange: the table outside the region, a slot number >= ``nslots``, a
            value too large for its field.
        InvalidArgument: ragged columns, a table offset not a multiple of 64.
        RegionError: as ``region.copy_in``.
    """
    cols = _ints(slot_nos, key_hashes, extent_offsets, value_lens, versions, value_hashes, header_bytes, meta)
    if table_offset % _SLOT_BYTES:
        raise InvalidArgument(f"index_store: the table offset {table_offset} must be a multiple of {_SLOT_BYTES}")
    if table_offset < 0 or nslots < 0 or table_offset + nslots * _SLOT_BYTES > region.size_bytes:
        raise OutOfRange(f"index_store: a table of {nslots} slots at {table_offset} is outside the region")
    for i, sn in enumerate(cols[0]):
        if sn >= nslots:
            raise OutOfRange(f"index_store: slot #{i} is number {sn}, the table has {nslots}; nothing was written")
    if any(x >> 32 for c in cols[6:] for x in c):
        raise OutOfRange("index_store: header_bytes and meta must be in [0, 2**32)")
    for sn, kh, ext, vlen, ver, vh, hb, mt in zip(*cols):
        off = table_offset + sn * _SLOT_BYTES
        if flush:
            region.invalidate(off, _SLOT_BYTES)  # the seq from memory (see cxlkv_index_store)
        (seq,) = _SEQ.unpack(region.read(off, 8))
        seq = (seq + 1) & ~1
        region.copy_in(off, _SEQ.pack(seq + 1))
        if flush:
            region.flush(off, _SLOT_BYTES)
        raw = pack_slot(seq + 2, kh, ext, vlen, ver, vh, hb, mt)
        region.copy_in(off + 8, raw[8:])
        region.copy_in(off, raw[:8])
        if flush:
            region.flush(off, _SLOT_BYTES)
    region.fence()


class IndexView(NamedTuple):
    """What the reference reader needs: ``cxlkv_index_t`` in Python (see its fields in
    cxlkv_transport.h); ``regions[i]`` a region-like object or ``None``."""

    table_region: Any
    header_offset: int
    table_offset: int
    buckets: int
    regions: tuple[Any, ...]
    max_value_bytes: int
    invalidate: bool
    verify_first: bool = False


def _read_slot(ix: IndexView, off: int, raw: bytes | None) -> tuple[int, ...] | None | Literal[False]:
    """A stable slot's fields, ``None`` for an empty (never written) slot, ``False``
    when it never read stable. ``raw``: the slot's bytes from a bucket read, tried first."""
    tr = ix.table_region
    for spin in range(_SPINS):
        if spin:
            time.sleep(0)  # let a writer thread run (cpu_relax)
            if ix.invalidate:
                tr.invalidate(off, _SLOT_BYTES)
        if raw is None:
            raw = tr.read(off, _SLOT_BYTES)
        f = unpack_slot(raw)
        if f is not None:
            # the seqlock's second read: unchanged seq, the snapshot is one write's
            if _SEQ.unpack(tr.read(off, 8))[0] == f[0]:
                return f
        elif raw == bytes(_SLOT_BYTES):
            return None
        raw = None
    return False


def _find(ix: IndexView, h: int) -> tuple[int, ...] | None | Literal[False]:
    """The key hash's stable LIVE slot, ``None`` (absent), ``False`` (unsure)."""
    mask = ix.buckets - 1
    b1 = h & mask
    buckets = [b1]
    if ix.buckets > 1:
        b2 = (h >> 32) & mask
        buckets.append((b1 + 1) & mask if b2 == b1 else b2)
    tr = ix.table_region
    unsure = False
    for b in buckets:
        base = ix.table_offset + b * _BUCKET_BYTES
        if ix.invalidate:
            tr.invalidate(base, _BUCKET_BYTES)
        bucket = tr.read(base, _BUCKET_BYTES)
        for j in range(_BUCKET_SLOTS):
            raw = bucket[j * _SLOT_BYTES:(j + 1) * _SLOT_BYTES]
            seq, kh = struct.unpack_from("<QQ", raw, 0)
            if not seq & 1 and kh != h:
                continue  # stably another key's hash, or none (empty, tombstone): as the C probe
            f = _read_slot(ix, base + j * _SLOT_BYTES, raw)
            if f is False:
                unsure = True
            elif f is not None and f[1] == h and f[7] & _LIVE:
                return f
    return False if unsure else None


def index_lookup(ix: IndexView, key: bytes, dst: Any, probe: bool) -> tuple[int, int, int, int, int]:
    """``cxlkv_index_get`` (``probe`` False: copy into writable ``dst``) or
    ``cxlkv_index_probe``, step for step, through the regions' own methods.

    Returns:
        ``(outcome, tier, value_len, version, retries)`` (outcomes: ``CXLKV_IX_*``).

    Raises:
        InvalidArgument: a key of 0 or more than 4,096 bytes; ``dst`` not a
            writable contiguous buffer.
        RegionError: the index's region is closed.
    """
    if not 1 <= len(key) <= MAX_KEY_BYTES:
        raise InvalidArgument(f"index lookup: a key is 1 to {MAX_KEY_BYTES} bytes, got {len(key)}")
    view = None
    if not probe:
        try:
            view = memoryview(dst).cast("B")
        except TypeError:
            raise InvalidArgument(f"dst must be a bytes-like object, got {type(dst).__name__}") from None
        if view.readonly:
            raise InvalidArgument("dst is read-only; pass a writable buffer such as a bytearray")
    h = _xxh3(key)
    tr = ix.table_region
    retries = 0
    for attempt in range(2):
        if ix.invalidate:
            tr.invalidate(ix.header_offset + _PUBLISH_AT, 16)
        publish, overflow = _PUB.unpack(tr.read(ix.header_offset + _PUBLISH_AT, 16))
        if publish == 0:
            break
        f = _find(ix, h)
        if f is False:
            break
        if f is None:
            return (_UNSURE if overflow else _MISS, 0, 0, 0, retries)
        _, _, ext, vlen, version, vhash, hb, meta = f
        region_no, tier = (meta >> 16) & 0xFF, meta >> 24
        if region_no >= _MAX_REGIONS:
            break
        rr = ix.regions[region_no] if region_no < len(ix.regions) else None
        if (meta & _ELSEWHERE or rr is None or rr.closed
                or (not probe and ix.max_value_bytes and vlen > ix.max_value_bytes)):
            return (_ELSEWHERE_OUT, tier, vlen, version, retries)
        if hb < OBJECT_HEADER_BYTES or ext + hb + vlen > rr.size_bytes:
            break
        if probe:
            if ix.invalidate:
                rr.invalidate(ext, hb)
            if object_mismatch(rr.read(ext, hb), key, version, vlen, hb, vhash) is None:
                return (_HIT, tier, vlen, version, retries)
        else:
            assert view is not None
            if view.nbytes < vlen:
                return (_TOO_SMALL, tier, vlen, version, retries)
            if ix.invalidate and ix.verify_first and attempt == 0:
                rr.invalidate(ext, hb)  # verify first: the value through the cache, hashed
            elif ix.invalidate:
                rr.invalidate(ext, hb + vlen)
            got = view[:vlen]
            rr.copy_out(ext + hb, got)
            if _xxh3(got) == vhash and object_mismatch(rr.read(ext, hb), key, version, vlen, hb, vhash) is None:
                return (_HIT, tier, vlen, version, retries)
        retries = 1
    return (_UNSURE, 0, 0, 0, retries)
