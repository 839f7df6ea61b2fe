"""Region layout and identity, shared by the master, clientd and tools.

A region (a DAX device or an emulating file) starts with a REGION_HEADER_BYTES
header holding its identity (written by ``cxlkv region format``); object extents
live in ``[REGION_HEADER_BYTES, size_bytes)`` and carry absolute offsets from the
region's start. The master's allocatable capacity of a segment is therefore
``size_bytes - REGION_HEADER_BYTES``.

Identity header (little-endian, at offset 0; the rest of the first
REGION_HEADER_BYTES is zero):

====== ====== ==============================================================
offset bytes  field
====== ====== ==============================================================
0      8      magic ``b"CXLKVRG1"``
8      4      format version (u32, currently 1)
12     4      flags (u32, 0; reserved)
16     16     region uuid (uuid4, RFC 4122 bytes)
32     8      size_bytes (u64) the region had when formatted
40     8      created time (f64, seconds since the Unix epoch)
48     2      segment name length in bytes (u16, 1..64)
50     64     segment name, UTF-8, zero-padded
114    6      zero padding
120    8      xxh3_64 (seed 0) of bytes [0, 120) (u64)
128    8      index offset (u64, format version 2): where the committed-object
              index starts (:mod:`cxlkv.layout.index`); object extents end there
136    8      index buckets (u64, format version 2): its size
144    8      xxh3_64 (seed 0) of bytes [128, 144) (u64, format version 2)
====== ====== ==============================================================

A version-1 region (no index fields) is still read: it has no index, its objects
are read through the leased RPC path only, and extents run to its end.

Every host mapping the region reads the same identity, so the master can tell
that two clientds mapped the same CXL device (same uuid) and refuse a region
whose size changed since it was formatted. Writes are flushed and reads are
preceded by an invalidate, so the header is also right under non-coherent
sharing.

This module does not import the C transport at load time: the master can use
the constants without it.
"""

from __future__ import annotations

import dataclasses
import struct
import time
import uuid
from typing import TYPE_CHECKING, Any

import xxhash

from cxlkv.errors import InvalidArgument, RegionError
from cxlkv.layout.index import IndexGeometry, format_index, index_geometry

if TYPE_CHECKING:
    from cxlkv.transport import Region

__all__ = [
    "REGION_HEADER_BYTES",
    "HEADER_MAGIC",
    "FORMAT_VERSION",
    "SEGMENT_NAME_MAX_BYTES",
    "RegionIdentity",
    "format_region",
    "read_identity",
]

#: Bytes at the start of every region reserved for its identity header.
REGION_HEADER_BYTES = 4096
#: First 8 bytes of a formatted region.
HEADER_MAGIC = b"CXLKVRG1"
#: Header layout version written by :func:`format_region` (2: with the index fields).
FORMAT_VERSION = 2
#: Regions smaller than this get no index by default (bytes).
_MIN_INDEXED_BYTES = 1 << 20
#: Longest segment name, in UTF-8 bytes.
SEGMENT_NAME_MAX_BYTES = 64

_FIELDS = struct.Struct("<8sII16sQdH64s6x")  # 120 bytes, checksummed
_CHECKSUM = struct.Struct("<Q")
_INDEX_FIELDS = struct.Struct("<QQ")  # index offset, buckets: 16 bytes at 128, checksummed
_HEADER_USED_BYTES = 128 + _INDEX_FIELDS.size + _CHECKSUM.size  # 152


@dataclasses.dataclass(frozen=True)
class RegionIdentity:
    """Who a region is: written once by :func:`format_region`, read by every host.

    Attributes:
        region_uuid: random (uuid4) id given at format time.
        size_bytes: region size in bytes when formatted.
        segment_name: operator-chosen name, 1..64 UTF-8 bytes.
        created_s: format time, seconds since the Unix epoch.
        format_version: header layout version.
        index_offset_bytes: where the region's index starts (0: no index, a
            version-1 region).
        index_buckets: the index's size in buckets of 8 slots (0: no index).
    """

    region_uuid: uuid.UUID
    size_bytes: int
    segment_name: str
    created_s: float
    format_version: int = FORMAT_VERSION
    index_offset_bytes: int = 0
    index_buckets: int = 0

    @property
    def index(self) -> IndexGeometry | None:
        """The index's geometry, or ``None`` for a region without one."""
        if not self.index_buckets:
            return None
        return IndexGeometry(self.index_offset_bytes, self.index_buckets)

    @property
    def data_end_bytes(self) -> int:
        """End of the object area: the index's offset, or the region's size without one."""
        return self.index_offset_bytes if self.index_buckets else self.size_bytes

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (uuid as a string)."""
        return {
            "region_uuid": str(self.region_uuid),
            "size_bytes": self.size_bytes,
            "segment_name": self.segment_name,
            "created_s": self.created_s,
            "format_version": self.format_version,
            "index_offset_bytes": self.index_offset_bytes,
            "index_buckets": self.index_buckets,
        }


def _encode_name(segment_name: str) -> bytes:
    if not isinstance(segment_name, str) or not segment_name:
        raise InvalidArgument(f"segment name must be a non-empty string, got {segment_name!r}")
    raw = segment_name.encode("utf-8")
    if len(raw) > SEGMENT_NAME_MAX_BYTES:
        raise InvalidArgument(
            f"segment name {segment_name!r} is {len(raw)} UTF-8 bytes; the limit is {SEGMENT_NAME_MAX_BYTES}"
        )
    if b"\0" in raw:
        raise InvalidArgument(f"segment name {segment_name!r} contains NUL")
    return raw


def _pack(identity: RegionIdentity) -> bytes:
    name = _encode_name(identity.segment_name)
    fields = _FIELDS.pack(
        HEADER_MAGIC,
        identity.format_version,
        0,
        identity.region_uuid.bytes,
        identity.size_bytes,
        identity.created_s,
        len(name),
        name,
    )
    out = bytearray(_HEADER_USED_BYTES)
    out[:128] = fields + _CHECKSUM.pack(xxhash.xxh3_64_intdigest(fields))
    ext = _INDEX_FIELDS.pack(identity.index_offset_bytes, identity.index_buckets)
    out[128:144] = ext
    out[144:152] = _CHECKSUM.pack(xxhash.xxh3_64_intdigest(ext))
    return bytes(out)


def _unpack(raw: bytes, path: str) -> RegionIdentity:
    """Parse a header; ``raw`` starts with the magic (checked by the caller)."""
    fields = raw[: _FIELDS.size]
    (stored,) = _CHECKSUM.unpack_from(raw, _FIELDS.size)
    if xxhash.xxh3_64_intdigest(fields) != stored:
        raise RegionError(
            f"region {path} has a corrupt header (checksum mismatch); "
            "re-format it with `cxlkv region format --force` if its contents are expendable",
            path=path,
        )
    _magic, version, _flags, uuid_bytes, size_bytes, created_s, name_len, name = _FIELDS.unpack(fields)
    if version > FORMAT_VERSION:
        raise RegionError(
            f"region {path} has header format version {version}; this cxlkv reads up to {FORMAT_VERSION}",
            path=path,
        )
    if not 1 <= name_len <= SEGMENT_NAME_MAX_BYTES:
        raise RegionError(f"region {path} has a corrupt header (segment name length {name_len})", path=path)
    try:
        segment_name = name[:name_len].decode("utf-8")
    except UnicodeDecodeError:
        raise RegionError(f"region {path} has a corrupt header (segment name not UTF-8)", path=path) from None
    index_offset = buckets = 0
    if version >= 2:
        ext = raw[128:144]
        (stored_ext,) = _CHECKSUM.unpack_from(raw, 144)
        if len(ext) < 16 or xxhash.xxh3_64_intdigest(ext) != stored_ext:
            raise RegionError(f"region {path} has a corrupt header (index fields checksum)", path=path)
        index_offset, buckets = _INDEX_FIELDS.unpack(ext)
        if buckets:
            geo = IndexGeometry(index_offset, buckets)
            if (buckets & (buckets - 1) or index_offset < REGION_HEADER_BYTES
                    or index_offset + geo.index_bytes > size_bytes):
                raise RegionError(f"region {path} has a corrupt header (index of {buckets} buckets at "
                                  f"{index_offset} in {size_bytes} bytes)", path=path)
    return RegionIdentity(
        region_uuid=uuid.UUID(bytes=uuid_bytes),
        size_bytes=size_bytes,
        segment_name=segment_name,
        created_s=created_s,
        format_version=version,
        index_offset_bytes=index_offset,
        index_buckets=buckets,
    )


def _read_raw(region: Region) -> bytes:
    if region.size_bytes < REGION_HEADER_BYTES:
        raise RegionError(
            f"region {region.path} is {region.size_bytes} bytes, smaller than its "
            f"{REGION_HEADER_BYTES}-byte header",
            path=region.path,
        )
    region.invalidate(0, _HEADER_USED_BYTES)  # another host may have written it
    return region.read(0, _HEADER_USED_BYTES)


def read_identity(region: Region) -> RegionIdentity:
    """Read and verify the identity header of a mapped region.

    Args:
        region: a mapped :class:`cxlkv.transport.Region`.

    Returns:
        The region's identity.

    Raises:
        RegionError: the region is not formatted (no magic), its header is corrupt
            (checksum), of a newer format version, or records a size other than
            the region's (the region was resized or the header copied). The
            message names the path and what to run.
    """
    raw = _read_raw(region)
    if raw[: len(HEADER_MAGIC)] != HEADER_MAGIC:
        raise RegionError(
            f"region {region.path} is not formatted "
            f"(run `cxlkv region format {region.path} --segment NAME`)",
            path=region.path,
        )
    identity = _unpack(raw, region.path)
    if identity.size_bytes != region.size_bytes:
        raise RegionError(
            f"region {region.path} is {region.size_bytes} bytes but its header records "
            f"{identity.size_bytes} bytes (resized after formatting?); re-format with --force",
            path=region.path,
        )
    return identity


def format_region(
    region: Region,
    segment_name: str,
    *,
    force: bool = False,
    created_s: float | None = None,
    region_uuid: uuid.UUID | None = None,
    expected_objects: int | None = None,
    index: bool = True,
) -> RegionIdentity:
    """Lay out a region: an empty committed-object index at its end, then a new
    identity header at offset 0; both flushed.

    The object area is left as it is: a re-formatted region's old objects are
    forgotten (its index is emptied, so no recovery brings them back), not erased.
    The old header is cleared first, so a format interrupted half-way leaves an
    unformatted region, never an old header over a new index.

    Args:
        region: a mapped :class:`cxlkv.transport.Region` of at least
            REGION_HEADER_BYTES bytes.
        segment_name: 1..64 UTF-8 bytes, no NUL.
        force: overwrite an existing (valid or corrupt) header.
        created_s: format time in seconds since the epoch (default: now).
        region_uuid: the uuid to record (default: a new uuid4).
        expected_objects: objects to size the index for (:func:`cxlkv.layout.index.index_geometry`;
            default one per 16 KiB of region).
        index: lay out an index (default). Without one (or in a region under
            1 MiB when ``expected_objects`` is not given) every read goes
            through the leased RPC path.

    Returns:
        The identity written.

    Raises:
        InvalidArgument: a bad segment name, or an index for ``expected_objects``
            that does not fit the region.
        RegionError: the region is too small, or already holds a header and
            ``force`` is false (the message names its segment and uuid).
    """
    _encode_name(segment_name)
    raw = _read_raw(region)
    if not force and raw[: len(HEADER_MAGIC)] == HEADER_MAGIC:
        try:
            old = _unpack(raw, region.path)
            what = f"segment {old.segment_name!r}, uuid {old.region_uuid}"
        except RegionError:
            what = "a corrupt header"
        raise RegionError(
            f"region {region.path} is already formatted ({what}); "
            "re-format it with --force (every object in it is lost)",
            path=region.path,
        )
    geometry = None
    if index and (expected_objects is not None or region.size_bytes >= _MIN_INDEXED_BYTES):
        geometry = index_geometry(region.size_bytes, expected_objects)
    identity = RegionIdentity(
        region_uuid=region_uuid or uuid.uuid4(),
        size_bytes=region.size_bytes,
        segment_name=segment_name,
        created_s=time.time() if created_s is None else float(created_s),
        format_version=FORMAT_VERSION,
        index_offset_bytes=geometry.index_offset_bytes if geometry else 0,
        index_buckets=geometry.buckets if geometry else 0,
    )
    region.copy_in(0, bytes(_HEADER_USED_BYTES))  # no valid header while the index is laid out
    region.flush(0, _HEADER_USED_BYTES)
    if geometry is not None:
        format_index(region, geometry, identity.region_uuid)
    block = bytearray(REGION_HEADER_BYTES)
    packed = _pack(identity)
    block[: len(packed)] = packed
    region.copy_in(0, block)
    region.flush(0, REGION_HEADER_BYTES)
    return identity
