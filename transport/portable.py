"""Pure-Python forms of the transport's batch calls, over any region-like object.

:class:`~cxlkv.transport.Region` does these in one C call each. Objects with the
same method surface that are not a plain mapping — the SSD tier's file
(:class:`cxlkv.clientd.tiers.FileRegion`, pread/pwrite) and the test-only
non-coherent emulation (:class:`cxlkv.transport.emulate.NoncoherentRegion`,
which models a private cache) — implement them with these, through their own
``copy_in``/``copy_out``/``read``/``flush``/``invalidate``, so every reader and
writer agrees on the bytes (:mod:`cxlkv.objheader` defines them).
"""

from __future__ import annotations

from typing import Any, Sequence

import xxhash

from cxlkv.errors import InvalidArgument, OutOfRange
from cxlkv.objheader import MAX_KEY_BYTES, OBJECT_HEADER_BYTES, header_bytes_for, object_mismatch, pack_header

__all__ = ["copy_in_ranges_hashed", "copy_out_ranges_hashed", "write_headers", "verify_headers"]

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
                          lengths: Sequence[int]) -> list[int]:
    """``region.copy_in_ranges`` and the xxh3_64 of each source range."""
    bo, ro, ln = _ints(buf_offsets, region_offsets, lengths)
    region.copy_in_ranges(buf, bo, ro, ln)
    view = memoryview(buf).cast("B")
    return [_xxh3(view[b:b + n]) for b, n in zip(bo, ln)]


def copy_out_ranges_hashed(region: Any, buf: Any, buf_offsets: Sequence[int], region_offsets: Sequence[int],
                           lengths: Sequence[int]) -> list[int]:
    """``region.copy_out_ranges`` and the xxh3_64 of each range delivered."""
    bo, ro, ln = _ints(buf_offsets, region_offsets, lengths)
    region.copy_out_ranges(buf, bo, ro, ln)
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
