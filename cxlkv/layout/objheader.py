"""The object header: what makes every extent self-describing.

Each extent written by a clientd starts with a 64-byte header (one cache line),
followed by the key's UTF-8 bytes, zero padding to the next 64-byte boundary,
and then the value::

    extent:  [ header (64 B) | key (key_len B) | pad to 64 | value (value_len B) | alloc pad ]
             ^ extent offset                               ^ extent offset + header_bytes

``header_bytes = 64 + align64(key_len)`` is what the clientd asks the master for
on top of the value (``PutStartRequest.header_bytes``); the master returns it in
every location (``Locations.header_bytes``) so readers find the value without parsing first.

Header layout (little-endian):

====== ====== ==============================================================
offset bytes  field
====== ====== ==============================================================
0      8      magic ``b"CXLKVOB1"``
8      2      format version (u16, currently 1)
10     2      flags (u16, 0; reserved)
12     4      key length in bytes (u32, 1..4096)
16     8      key hash: xxh3_64 (seed 0) of the key's UTF-8 bytes (u64)
24     8      version: the put's version from PutStart (u64)
32     8      value length in bytes (u64)
40     8      value checksum: xxh3_64 (seed 0) of the value bytes (u64)
48     4      header_bytes: the value's offset from the extent start (u32)
52     4      zero (reserved)
56     8      header checksum: xxh3_64 of bytes [0, 56) followed by the key bytes (u64)
====== ====== ==============================================================

Writers write the key and value, flush them (``coherence = "flush"``), then write
the header and flush it: a reader that sees a valid header for the version it
was told to read has the whole value behind it (the value checksum confirms it).
A region scan (``cxlkv region scan``) finds objects by walking 64-byte aligned
offsets for a valid magic and header checksum; the master can rebuild its index
from those headers (``cxlkv master --recover-from-region``).

This module is pure Python (struct + xxhash); it does not import the transport
(an SDK-only install has none). The C transport defines the same layout
(``CXLKV_OBJ_*`` in ``transport/cxlkv_transport.h``); :mod:`cxlkv.transport.bindings`
checks :data:`OBJECT_LAYOUT` against it through cffi at import and refuses to load
when they differ.
"""

from __future__ import annotations

import dataclasses
from typing import Any
import struct

import xxhash

__all__ = [
    "OBJECT_MAGIC",
    "OBJECT_FORMAT_VERSION",
    "OBJECT_HEADER_BYTES",
    "OBJECT_LAYOUT",
    "ObjectHeader",
    "header_bytes_for",
    "key_hash",
    "pack_header",
    "parse_header",
    "object_mismatch",
]

#: First 8 bytes of every object header.
OBJECT_MAGIC = b"CXLKVOB1"
#: Header layout version written by :func:`pack_header`.
OBJECT_FORMAT_VERSION = 1
#: Size of the fixed header in bytes (one cache line).
OBJECT_HEADER_BYTES = 64
#: Longest key the header can describe, in UTF-8 bytes (the keys contract).
MAX_KEY_BYTES = 4096

# magic, format version, flags, key length, key hash, version, value length,
# value checksum, header_bytes, reserved: 56 bytes, covered by the header checksum
_FIELD_CODES = ("8s", "H", "H", "I", "Q", "Q", "Q", "Q", "I", "4x")
_FIELDS = struct.Struct("<" + "".join(_FIELD_CODES))
_CHECKSUM = struct.Struct("<Q")
_xxh3 = xxhash.xxh3_64_intdigest
assert _FIELDS.size + _CHECKSUM.size == OBJECT_HEADER_BYTES


def _offset(field_no: int) -> int:
    """Byte offset of field ``field_no`` of :data:`_FIELD_CODES` in the header."""
    return struct.calcsize("<" + "".join(_FIELD_CODES[:field_no]))


#: The layout as the C transport names it (``CXLKV_OBJ_<name>``), offsets in bytes
#: from the extent's start; :mod:`cxlkv.transport.bindings` checks it against C.
OBJECT_LAYOUT: dict[str, int] = {
    "HEADER_BYTES": OBJECT_HEADER_BYTES,
    "MAGIC_U64": int.from_bytes(OBJECT_MAGIC, "little"),
    "FORMAT_VERSION": OBJECT_FORMAT_VERSION,
    "MAX_KEY_BYTES": MAX_KEY_BYTES,
    "FORMAT_VERSION_OFFSET": _offset(1),
    "FLAGS_OFFSET": _offset(2),
    "KEY_LEN_OFFSET": _offset(3),
    "KEY_HASH_OFFSET": _offset(4),
    "VERSION_OFFSET": _offset(5),
    "VALUE_LEN_OFFSET": _offset(6),
    "VALUE_HASH_OFFSET": _offset(7),
    "HEADER_BYTES_OFFSET": _offset(8),
    "CHECKSUM_OFFSET": _FIELDS.size,
}


def header_bytes_for(key_len_bytes: int) -> int:
    """Bytes before the value in an extent: the header, the key, padding to 64.

    Args:
        key_len_bytes: the key's UTF-8 length in bytes.

    Returns:
        ``64 + align64(key_len_bytes)``, in bytes.
    """
    return OBJECT_HEADER_BYTES + ((key_len_bytes + 63) & ~63)


def key_hash(key_utf8: bytes) -> int:
    """xxh3_64 (seed 0) of the key's UTF-8 bytes, as stored in the header."""
    return _xxh3(key_utf8)


@dataclasses.dataclass(frozen=True, slots=True)
class ObjectHeader:
    """A decoded object header.

    Attributes:
        key_len_bytes: key length in bytes.
        key_hash: xxh3_64 of the key's UTF-8 bytes.
        version: the put's version (from PutStart).
        value_len_bytes: value length in bytes.
        value_checksum: xxh3_64 of the value bytes.
        header_bytes: the value's offset from the extent start, in bytes.
        format_version: header layout version.
    """

    key_len_bytes: int
    key_hash: int
    version: int
    value_len_bytes: int
    value_checksum: int
    header_bytes: int
    format_version: int = OBJECT_FORMAT_VERSION


def pack_header(key_utf8: bytes, version: int, value_len_bytes: int, value_checksum: int) -> bytes:
    """The 64-byte header of an object (the key bytes follow it in the extent).

    Args:
        key_utf8: the key's UTF-8 bytes (1..4096).
        version: the put's version.
        value_len_bytes: value length in bytes.
        value_checksum: xxh3_64 of the value.

    Returns:
        Exactly :data:`OBJECT_HEADER_BYTES` bytes.
    """
    n = len(key_utf8)
    fields = _FIELDS.pack(
        OBJECT_MAGIC, OBJECT_FORMAT_VERSION, 0, n, _xxh3(key_utf8), version,
        value_len_bytes, value_checksum, header_bytes_for(n),
    )
    h = xxhash.xxh3_64()
    h.update(fields)
    h.update(key_utf8)
    return fields + _CHECKSUM.pack(h.intdigest())


def parse_header(header: bytes | memoryview, key_utf8: bytes | memoryview | None) -> ObjectHeader | None:
    """Decode and check a header.

    Args:
        header: the first 64 bytes of an extent.
        key_utf8: the key bytes stored after the header (``key_len_bytes`` of
            them), used for the header checksum; ``None`` to check everything but
            the key-dependent checksum (a scan peeks at the key length first).

    Returns:
        The header, or ``None`` when the magic, format version, lengths or the
        header checksum do not match (not a header, stale, torn or corrupt).
    """
    if len(header) < OBJECT_HEADER_BYTES or bytes(header[:8]) != OBJECT_MAGIC:
        return None
    (_, fmt, _flags, klen, khash, version, vlen, vsum, hbytes) = _FIELDS.unpack_from(header, 0)
    if fmt != OBJECT_FORMAT_VERSION or not 1 <= klen <= MAX_KEY_BYTES or hbytes != header_bytes_for(klen):
        return None
    if key_utf8 is not None:
        if len(key_utf8) != klen:
            return None
        h = xxhash.xxh3_64()
        h.update(bytes(header[:_FIELDS.size]))
        h.update(key_utf8)
        if h.intdigest() != _CHECKSUM.unpack_from(header, _FIELDS.size)[0]:
            return None
        if _xxh3(key_utf8) != khash:
            return None
    return ObjectHeader(klen, khash, version, vlen, vsum, hbytes, fmt)


def object_mismatch(head: bytes | memoryview, key_utf8: bytes, version: int, value_len_bytes: int,
                    header_bytes: int, value_checksum: int) -> str | None:
    """Why an extent's first ``header_bytes`` bytes (header + key) do not describe
    ``key_utf8`` at ``version`` with a ``value_len_bytes``-byte value whose xxh3_64
    is ``value_checksum``; ``None`` when they do.

    The one check every reader of an extent makes (clientd reads, the SDK's direct
    reads, tier moves), so they agree on what a valid object is.

    Returns:
        A one-line reason (for logs and CHECKSUM_MISMATCH messages), or ``None``.
    """
    stored_key = bytes(head[OBJECT_HEADER_BYTES:OBJECT_HEADER_BYTES + len(key_utf8)])
    h = parse_header(head, stored_key)
    if h is None:
        return "no valid object header (bad magic or header checksum)"
    if stored_key != key_utf8:
        return "the object header belongs to another key"
    if h.version != version:
        return f"the object header holds version {h.version}, expected {version}"
    if h.value_len_bytes != value_len_bytes or h.header_bytes != header_bytes:
        return (f"the object header holds a {h.value_len_bytes}-byte value after {h.header_bytes} "
                f"header bytes, expected {value_len_bytes} after {header_bytes}")
    if h.value_checksum != value_checksum:
        return "bytes read do not match the object header's checksum"
    return None


def check_copy(region: Any, extent_offset_bytes: int, header_bytes: int, key_utf8: bytes, version: int,
               value_len_bytes: int, got_checksum: int, expected_checksum: int = 0, *,
               invalidate: bool = False) -> str | None:
    """Why ``value_len_bytes`` bytes copied out of the extent at ``extent_offset_bytes``
    (whose xxh3_64 is ``got_checksum``) are not ``key_utf8`` at ``version``; ``None``
    when they are. The rule every reader on the leased path applies after its copy
    (clientd's reads, the SDK's direct reads; the index kernels apply the same rule
    in C: docs/index.md):

    1. the delivered bytes hash to the checksum the master committed
       (``expected_checksum``; 0: not known to the caller);
    2. the extent's header is a valid object header (magic, header checksum) for
       the same key, version, value length and header size, and its value checksum
       is the delivered bytes' (:func:`object_mismatch`).

    The header is read after the value (in ``flush`` mode its lines are invalidated
    first, ``invalidate=True``): a writer that reused the extent while the bytes
    were copied has changed the header or the bytes. A caller that gets a reason
    copies once more from memory and checks again, then answers a miss
    (CHECKSUM_MISMATCH) -- never the bytes.

    Args:
        region: a mapped region (``read``, ``invalidate``).
        header_bytes: the value's offset in the extent; 0: a bare value, checked
            against ``expected_checksum`` only.

    Returns:
        A one-line reason, or ``None``.
    """
    from cxlkv.errors import CxlkvError

    if expected_checksum and got_checksum != expected_checksum:
        return "bytes read do not match the committed checksum"
    if not header_bytes:
        return None
    try:
        if invalidate:
            region.invalidate(extent_offset_bytes, header_bytes)
        head = region.read(extent_offset_bytes, header_bytes)
    except CxlkvError as exc:
        return f"object header unreadable: {exc.message}"
    return object_mismatch(head, key_utf8, version, value_len_bytes, header_bytes, got_checksum)
