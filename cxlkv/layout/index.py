"""The committed-object index in the region: layout, the master's writer, recovery reads.

The master publishes every committed object into a table of one-cache-line
**slots** that lives in the shared region itself, so every host finds a key and
copies its value with memory operations only (no RPC). The master is the only
writer; readers (clientd, and SDK processes that map the region) probe, copy,
and verify (:mod:`cxlkv.transport.index` does that in one C call). The whole
format is in docs/index.md; this module is its reference.

Where it lives (set at format time, :func:`index_geometry`): the **index area**
is the last ``index_bytes`` of the region, 4096-aligned; the region identity
header (:mod:`cxlkv.layout.region`, format version 2) records its offset and size, and
object extents live in ``[REGION_HEADER_BYTES, index_offset)``::

    region:  [ identity header 4 KiB | object extents ........ | index header 4 KiB | slots ]
                                                               ^ index_offset

Index header page (little-endian, offsets from ``index_offset``):

====== ====== ==============================================================
offset bytes  field
====== ====== ==============================================================
0      8      magic ``b"CXLKVIX1"``
8      4      format version (u32, 1)
12     4      slots per bucket (u32, 8)
16     8      buckets (u64, a power of two)
24     8      table offset: absolute region offset of slot 0 (u64)
32     8      xxh3_64 of bytes [0, 32) (u64)
64     8      publish word (u64): 0 = no master publishes (readers use the
              RPC path); else the publishing master's owner epoch
72     8      overflow (u64): committed objects not in the table (a key not
              found is then "unsure", not a miss)
128    64     owner lease (:class:`OwnerLease`)
256    4      region table: number of entries (u32, at most 32)
320    16×n   region table entries: region uuids (RFC 4122 bytes); a slot's
              region number is a position in this table
====== ====== ==============================================================

Slot (64 bytes, one cache line; ``buckets × 8`` of them from the table offset):

====== ====== ==============================================================
offset bytes  field
====== ====== ==============================================================
0      8      seq (u64): even = stable, odd = being written (seqlock)
8      8      key hash: xxh3_64 (seed 0) of the key's UTF-8 bytes (u64)
16     8      extent offset: absolute offset of the object header (u64)
24     8      value length in bytes (u64)
32     8      version (u64)
40     8      value checksum: xxh3_64 of the value (u64)
48     4      header bytes: the value's offset from the extent start (u32)
52     2      flags (u16): bit 0 LIVE, bit 1 ELSEWHERE (committed, not in a
              CXL region: read it through the leased RPC path), bit 2 GRANT
              (without LIVE: space handed to a writer, see below)
54     1      region number (u8): position in the region table
55     1      tier (u8): ``cxlkv.v1.Tier`` of the replica described
56     8      slot checksum: xxh3_64 of bytes [0, 56), seq included (u64)
====== ====== ==============================================================

A key's two **buckets** (8 slots each): ``b1 = h mod B`` and ``b2 = (h >> 32)
mod B`` (``b1 + 1`` when equal), ``B`` the number of buckets; the master places
a new key in whichever has a free slot, the first one first; when neither has,
or another live key has the same 64-bit hash, the object is counted in
``overflow`` instead and read through the RPC path. Two-choice bucketed hashing
(Azar, Broder, Karlin, Upfal, "Balanced Allocations", STOC 1994) keeps the
overflow negligible at the default half-full sizing.

Writes (seqlock; Lamport, "Concurrent reading and writing", CACM 1977): seq
goes odd, the fields and a checksum computed with the final even seq are
written, seq goes even, the line is written back (``flush`` coherence), then
one fence. A reader accepts a slot only if seq is even and unchanged and the
checksum holds, then checks the extent's own header (key, version, lengths)
and the delivered bytes' checksum against the slot, so a reused extent, a torn
slot or a stale cache line is a retry or a miss, never data.

A **grant slot** (flags GRANT, not LIVE) records an extent the master handed to
a writer and that is not yet committed or freed: key hash = xxh3_64 of a NUL
byte followed by ``grant:<token>:<region number>`` (no user key holds a NUL),
extent offset, its length (in the value length field), version = the put
token, value checksum = xxh3_64 of the writer's client id, region number. Readers skip it (not LIVE); a master that starts on the region
finds every grant of its predecessor and keeps that space out of use until the
writer's clientd says it stopped writing — a writer stalled across a master
restart never lands in space given to another object.

This module needs no compiled code for the layout functions; :class:`IndexWriter`
and :func:`read_slots` take a mapped region (:class:`cxlkv.transport.Region` or
one with the same methods).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import struct
import uuid
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import xxhash

from cxlkv.errors import InvalidArgument, RegionError

__all__ = [
    "INDEX_MAGIC", "INDEX_FORMAT_VERSION", "INDEX_HEADER_BYTES", "SLOT_BYTES", "BUCKET_SLOTS",
    "MAX_REGIONS", "SLOT_LIVE", "SLOT_ELSEWHERE", "SLOT_GRANT", "DEFAULT_BYTES_PER_OBJECT", "Grant",
    "IndexGeometry", "Slot", "OwnerLease", "index_geometry", "buckets_of", "pack_slot", "unpack_slot",
    "format_index", "read_index_header", "read_slots", "read_grants", "client_hash", "set_publish_word",
    "read_owner", "write_owner", "write_region_table",
    "IndexWriter",
]

#: First 8 bytes of the index header page.
INDEX_MAGIC = b"CXLKVIX1"
#: Index layout version.
INDEX_FORMAT_VERSION = 1
#: Bytes of the index header page that precedes the slots.
INDEX_HEADER_BYTES = 4096
#: One slot: one cache line.
SLOT_BYTES = 64
#: Slots per bucket (one probe reads at most two buckets: 1 KiB).
BUCKET_SLOTS = 8
#: Regions one index can name (entries of its region table).
MAX_REGIONS = 32
#: Slot flag: the slot describes a committed object.
SLOT_LIVE = 1
#: Slot flag: committed, but not readable from a CXL region (SSD or DRAM tier only).
SLOT_ELSEWHERE = 2
#: Slot flag (without LIVE): an extent the master handed to a writer (an in-flight put or
#: a reservation) and not yet committed or freed. Readers skip it; a master starting on
#: the region quarantines it for its writer (docs/master.md "Reservations and fencing").
SLOT_GRANT = 4
#: Default sizing: one expected object per this many bytes of region (16 KiB),
#: two slots per expected object — the index then costs 128 B per expected
#: object, 0.8 % of the region.
DEFAULT_BYTES_PER_OBJECT = 16 * 1024

_HDR_STATIC = struct.Struct("<8sIIQQ")      # magic, version, bucket slots, buckets, table offset: 32 B
_U64 = struct.Struct("<Q")
_PUBLISH_AT = 64
_OVERFLOW_AT = 72
_OWNER_AT = 128
_REGIONS_AT = 256
_REGION_ENTRIES_AT = 320
_SLOT_FIELDS = struct.Struct("<QQQQQQIHBB")  # 56 bytes, covered by the slot checksum
_OWNER = struct.Struct("<8sQ16sdd")           # magic, epoch, owner id, heartbeat, ttl: 48 B
_OWNER_MAGIC = b"CXLKVOW1"
_xxh3 = xxhash.xxh3_64_intdigest
assert _SLOT_FIELDS.size + 8 == SLOT_BYTES


@dataclasses.dataclass(frozen=True, slots=True)
class IndexGeometry:
    """Where an index lives in its region.

    Attributes:
        index_offset_bytes: absolute offset of the index header page (4096-aligned).
        buckets: number of buckets (a power of two); slots = ``buckets * 8``.
    """

    index_offset_bytes: int
    buckets: int

    @property
    def slots(self) -> int:
        """Number of slots."""
        return self.buckets * BUCKET_SLOTS

    @property
    def table_offset_bytes(self) -> int:
        """Absolute offset of slot 0."""
        return self.index_offset_bytes + INDEX_HEADER_BYTES

    @property
    def index_bytes(self) -> int:
        """Bytes of region the index takes (header page and slots)."""
        return INDEX_HEADER_BYTES + self.slots * SLOT_BYTES


def index_geometry(region_size_bytes: int, expected_objects: int | None = None) -> IndexGeometry:
    """Size and place an index for a region.

    Args:
        region_size_bytes: the whole region's size in bytes.
        expected_objects: objects the region should index; default one per
            :data:`DEFAULT_BYTES_PER_OBJECT` bytes. The table gets at least two
            slots per expected object (a power of two buckets of 8), so it is at
            most half full.

    Returns:
        The geometry: the index at the end of the region.

    Raises:
        InvalidArgument: a negative count, or an index that would not leave
            room for objects (at most half the region).
    """
    if expected_objects is None:
        expected_objects = max(1, region_size_bytes // DEFAULT_BYTES_PER_OBJECT)
    if not isinstance(expected_objects, int) or expected_objects < 1:
        raise InvalidArgument(f"expected objects must be a positive integer, got {expected_objects!r}")
    want_buckets = -(-2 * expected_objects // BUCKET_SLOTS)
    buckets = 1 << max(0, (want_buckets - 1).bit_length())
    index_bytes = INDEX_HEADER_BYTES + buckets * BUCKET_SLOTS * SLOT_BYTES
    offset = (region_size_bytes - index_bytes) & ~4095
    if index_bytes > region_size_bytes // 2 or offset < 8192:
        raise InvalidArgument(
            f"an index for {expected_objects} objects takes {index_bytes} bytes, more than half of a "
            f"{region_size_bytes}-byte region; expect fewer objects or use a larger region")
    return IndexGeometry(offset, buckets)


def buckets_of(key_hash: int, buckets: int) -> tuple[int, ...]:
    """The buckets a key may be placed in, in probe order.

    Args:
        key_hash: xxh3_64 of the key's UTF-8 bytes.
        buckets: the table's bucket count (a power of two).

    Returns:
        ``(b1, b2)``, or ``(b1,)`` for a one-bucket table.
    """
    mask = buckets - 1
    b1 = key_hash & mask
    if buckets == 1:
        return (b1,)
    b2 = (key_hash >> 32) & mask
    if b2 == b1:
        b2 = (b1 + 1) & mask
    return (b1, b2)


class Slot(NamedTuple):
    """A decoded, verified slot (see the module docstring for the fields)."""

    seq: int
    key_hash: int
    extent_offset_bytes: int
    value_len_bytes: int
    version: int
    value_checksum: int
    header_bytes: int
    flags: int
    region_no: int
    tier: int


def pack_slot(slot: Slot) -> bytes:
    """The 64 bytes of a slot, its checksum computed over ``slot.seq`` as given (even)."""
    fields = _SLOT_FIELDS.pack(*slot)
    return fields + _U64.pack(_xxh3(fields))


def unpack_slot(raw: bytes | memoryview) -> Slot | None:
    """Decode a slot; ``None`` when it is being written (odd seq), torn or never written
    (checksum mismatch). A tombstone decodes with ``flags == 0``."""
    fields = bytes(raw[:_SLOT_FIELDS.size])
    slot = Slot(*_SLOT_FIELDS.unpack(fields))
    if slot.seq & 1 or _U64.unpack_from(raw, _SLOT_FIELDS.size)[0] != _xxh3(fields):
        return None
    return slot


# ------------------------------------------------------------------ header page
def format_index(region: Any, geometry: IndexGeometry, region_uuid: uuid.UUID) -> None:
    """Lay out an empty, inactive index: zero the slots and the header page, then write
    the header with a region table naming ``region_uuid`` as region 0; flushed.

    Raises:
        OutOfRange: the geometry does not fit the region.
    """
    chunk = bytes(1 << 20)
    end = geometry.index_offset_bytes + geometry.index_bytes
    off = geometry.index_offset_bytes
    while off < end:
        n = min(len(chunk), end - off)
        region.copy_in(off, chunk[:n] if n < len(chunk) else chunk)
        off += n
    page = bytearray(INDEX_HEADER_BYTES)
    static = _HDR_STATIC.pack(INDEX_MAGIC, INDEX_FORMAT_VERSION, BUCKET_SLOTS, geometry.buckets,
                              geometry.table_offset_bytes)
    page[0:32] = static
    page[32:40] = _U64.pack(_xxh3(static))
    page[_REGIONS_AT:_REGION_ENTRIES_AT + 16 * MAX_REGIONS] = _region_table([region_uuid])
    region.copy_in(geometry.index_offset_bytes, bytes(page))
    region.flush(geometry.index_offset_bytes, geometry.index_bytes)


def _region_table(uuids: Sequence[uuid.UUID]) -> bytes:
    """The region table's bytes (count, then the uuids) from its offset in the header page."""
    raw = bytearray(_REGION_ENTRIES_AT - _REGIONS_AT + 16 * MAX_REGIONS)
    struct.pack_into("<I", raw, 0, len(uuids))
    for i, u in enumerate(uuids):
        off = _REGION_ENTRIES_AT - _REGIONS_AT + 16 * i
        raw[off:off + 16] = u.bytes
    return bytes(raw)


def write_region_table(region: Any, geometry: IndexGeometry, uuids: Sequence[uuid.UUID]) -> None:
    """Name the regions slots refer to (region number = position, at most
    :data:`MAX_REGIONS`), written back."""
    if len(uuids) > MAX_REGIONS:
        raise InvalidArgument(f"an index names at most {MAX_REGIONS} regions, got {len(uuids)}")
    at = geometry.index_offset_bytes + _REGIONS_AT
    raw = _region_table(uuids)
    region.copy_in(at, raw)
    region.flush(at, len(raw))


class IndexHeader(NamedTuple):
    """What the index header page says (see the module docstring)."""

    buckets: int
    table_offset_bytes: int
    publish_epoch: int
    overflow: int
    region_uuids: tuple[uuid.UUID, ...]


def read_index_header(region: Any, geometry: IndexGeometry) -> IndexHeader:
    """Read and check the index header page (invalidated first).

    Raises:
        RegionError: no index there (magic), a corrupt header, another format
            version, or a header that disagrees with ``geometry``.
    """
    off = geometry.index_offset_bytes
    region.invalidate(off, INDEX_HEADER_BYTES)
    page = region.read(off, 1024)
    path = getattr(region, "path", "?")
    if page[:8] != INDEX_MAGIC:
        raise RegionError(f"region {path} has no index at offset {off} (re-format it)", path=path)
    magic, version, bslots, buckets, table = _HDR_STATIC.unpack_from(page, 0)
    if _U64.unpack_from(page, 32)[0] != _xxh3(page[:32]):
        raise RegionError(f"region {path}: the index header is corrupt (checksum)", path=path)
    if version != INDEX_FORMAT_VERSION or bslots != BUCKET_SLOTS:
        raise RegionError(f"region {path}: index format {version} with {bslots}-slot buckets; "
                          f"this cxlkv reads format {INDEX_FORMAT_VERSION}", path=path)
    if buckets != geometry.buckets or table != geometry.table_offset_bytes:
        raise RegionError(f"region {path}: the index header disagrees with the region header "
                          f"({buckets} buckets at {table}, expected {geometry.buckets} at "
                          f"{geometry.table_offset_bytes})", path=path)
    (count,) = struct.unpack_from("<I", page, _REGIONS_AT)
    count = min(count, MAX_REGIONS)
    uuids = tuple(uuid.UUID(bytes=bytes(page[_REGION_ENTRIES_AT + 16 * i:_REGION_ENTRIES_AT + 16 * i + 16]))
                  for i in range(count))
    return IndexHeader(buckets, table, _U64.unpack_from(page, _PUBLISH_AT)[0],
                       _U64.unpack_from(page, _OVERFLOW_AT)[0], uuids)


def set_publish_word(region: Any, geometry: IndexGeometry, epoch: int) -> None:
    """Write the publish word (0: readers stop trusting the index), flushed and fenced."""
    off = geometry.index_offset_bytes + _PUBLISH_AT
    region.copy_in(off, _U64.pack(epoch))
    region.flush(off, 8)


def _set_overflow(region: Any, geometry: IndexGeometry, overflow: int) -> None:
    off = geometry.index_offset_bytes + _OVERFLOW_AT
    region.copy_in(off, _U64.pack(overflow))
    region.flush(off, 8)


def _scan(region: Any, geometry: IndexGeometry, flag: int, chunk_slots: int) -> Iterator[tuple[int, Slot]]:
    """``(slot number, slot)`` of every verified slot whose flags have ``flag`` (LIVE:
    objects; GRANT without LIVE: grants), reading the table in invalidated chunks."""
    base = geometry.table_offset_bytes
    want = np.uint64(flag)
    for first in range(0, geometry.slots, chunk_slots):
        n = min(chunk_slots, geometry.slots - first)
        region.invalidate(base + first * SLOT_BYTES, n * SLOT_BYTES)
        raw = region.read(base + first * SLOT_BYTES, n * SLOT_BYTES)
        words = np.frombuffer(raw, dtype="<u8").reshape(n, 8)
        flags = (words[:, 6] >> np.uint64(32)) & np.uint64(0xFFFF)
        for i in np.flatnonzero(flags & want):
            i = int(i)
            slot = unpack_slot(raw[i * SLOT_BYTES:(i + 1) * SLOT_BYTES])
            if slot is not None and slot.flags & flag:
                yield first + i, slot


def read_slots(region: Any, geometry: IndexGeometry, *, chunk_slots: int = 16384) -> Iterator[tuple[int, Slot]]:
    """Every live, verified slot of the table: ``(slot number, slot)``, in slot order.

    Slots being written or torn (a master died mid-write) are skipped. Reads in
    chunks (invalidated first). For recovery and ``cxlkv region index``.
    """
    return _scan(region, geometry, SLOT_LIVE, chunk_slots)


# ------------------------------------------------------------------ owner lease
class OwnerLease(NamedTuple):
    """The owner lease record of a region: which master publishes its index.

    Attributes:
        epoch: increases at every takeover; a master whose epoch is not the
            record's is deposed and must write nothing more.
        owner_id: the owning master's instance id (16 bytes, a uuid).
        heartbeat_s: wall-clock time (seconds since the epoch) of the owner's
            last heartbeat.
        ttl_s: the lease lapses this long after the last heartbeat.
    """

    epoch: int
    owner_id: uuid.UUID
    heartbeat_s: float
    ttl_s: float


def read_owner(region: Any, geometry: IndexGeometry) -> OwnerLease | None:
    """The region's owner lease, or ``None`` when none was ever written (or it is corrupt)."""
    off = geometry.index_offset_bytes + _OWNER_AT
    region.invalidate(off, 64)
    raw = region.read(off, 64)
    if raw[:8] != _OWNER_MAGIC or _U64.unpack_from(raw, _OWNER.size)[0] != _xxh3(raw[:_OWNER.size]):
        return None
    _, epoch, owner, hb, ttl = _OWNER.unpack_from(raw, 0)
    return OwnerLease(epoch, uuid.UUID(bytes=owner), hb, ttl)


def write_owner(region: Any, geometry: IndexGeometry, lease: OwnerLease) -> None:
    """Write the owner lease record (one cache line), flushed and fenced."""
    fields = _OWNER.pack(_OWNER_MAGIC, lease.epoch, lease.owner_id.bytes, lease.heartbeat_s, lease.ttl_s)
    off = geometry.index_offset_bytes + _OWNER_AT
    region.copy_in(off, fields + _U64.pack(_xxh3(fields)))
    region.flush(off, 64)


# ------------------------------------------------------------------ the master's writer
class _Placed(NamedTuple):
    slot_no: int
    key: str
    version: int


class IndexWriter:
    """The master's side of one region's index: where each key's slot is, and the writes.

    The master calls :meth:`publish` when an object is committed or its readable
    replica changes and :meth:`retire` before any extent of a version it
    published is freed; both write through to the region (slot written, line
    flushed in ``flush`` mode, fence) before they return, so a reader can never
    be sent to space that has been given to another object.

    Per key the cost is constant: a dict lookup, a bucket bitmask, one C call.

    Args:
        region: the mapped region holding the index.
        geometry: where the index lives.
        flush: write back each slot's cache line (non-coherent sharing).

    Thread-safety: none; the master calls it from its event loop only.
    """

    def __init__(self, region: Any, geometry: IndexGeometry, *, flush: bool) -> None:
        self.region = region
        self.geometry = geometry
        self.flush = bool(flush)
        self._by_hash: dict[int, _Placed] = {}
        self._overflowed: dict[str, int] = {}  # key → version, not in the table
        self._used = bytearray(geometry.buckets)  # per bucket: bitmask of occupied slots
        self._pending: list[tuple[int, int, int, int, int, int, int, int]] = []
        self._grants: dict[int, list[str]] = {}  # put token → its grant slots' keys
        self._ahead: set[int] = set()  # tokens granted ahead of need (reservations, a previous master's)
        self._ahead_slots = 0
        self._key_slots = 0
        self._free_hint = 0
        #: Most grant slots ahead of need (1/:data:`AHEAD_GRANT_SHARE` of the table).
        self.ahead_limit = max(1, geometry.slots // AHEAD_GRANT_SHARE)
        #: Most slots holding keys; a new key past it overflows. What neither keys nor
        #: ahead-of-need grants may take (at least 1/8 of the table) is kept for the
        #: grants of puts and moves in flight, which may take any free slot.
        self.key_limit = geometry.slots - 2 * self.ahead_limit
        self._overflow_dirty = False
        #: Slots written since start (publishes and tombstones).
        self.writes = 0

    # -- placement -------------------------------------------------------------
    @property
    def overflow(self) -> int:
        """Committed objects not in the table (read through the RPC path)."""
        return len(self._overflowed)

    @property
    def live_slots(self) -> int:
        """Slots in use: keys and grants."""
        return len(self._by_hash)

    @property
    def key_slots(self) -> int:
        """Slots holding a committed key."""
        return self._key_slots

    def adopt(self, slot_no: int, key: str, key_hash: int, version: int) -> None:
        """Take over a key's slot found in the region (recovery from the index)."""
        self._take(slot_no, key, key_hash, version)
        self._key_slots += 1

    def adopt_many(self, placed: dict[int, "_Placed"], used: bytearray) -> None:
        """:meth:`adopt` of every key slot of ``placed`` (key hash → placement), whose
        bucket bitmasks are ``used``, in bulk (a warm standby taking over)."""
        self._by_hash.update(placed)
        merged = np.bitwise_or(np.frombuffer(bytes(self._used), dtype=np.uint8),
                               np.frombuffer(bytes(used), dtype=np.uint8))
        self._used = bytearray(merged.tobytes())
        self._key_slots += len(placed)

    def _take(self, slot_no: int, key: str, key_hash: int, version: int) -> None:
        b, i = divmod(slot_no, BUCKET_SLOTS)
        self._used[b] |= 1 << i
        self._by_hash[key_hash] = _Placed(slot_no, key, version)

    def published_version(self, key: str, key_hash: int) -> int | None:
        """The version ``key``'s slot describes, or ``None`` (no slot)."""
        placed = self._by_hash.get(key_hash)
        return placed.version if placed is not None and placed.key == key else None

    def _place(self, key_hash: int) -> int | None:
        """The lowest free slot of the emptier of the key's buckets (ties: the first).

        Two-choice placement into the less loaded bin (Azar, Broder, Karlin and Upfal,
        "Balanced allocations", STOC 1994): 8,192 slots take 6,144 keys (75 %) with no
        overflow, where first-bucket-first placement overflows ~65 of them and
        already ~10 at 62.5 % (measured, xxh3 of sequential keys). Readers probe both
        buckets whatever the writer chose (docs/index.md §5).
        """
        used = self._used
        bs = buckets_of(key_hash, self.geometry.buckets)
        b = bs[0]
        if len(bs) == 2 and used[bs[1]].bit_count() < used[b].bit_count():
            b = bs[1]
        return None if used[b] == 0xFF else self._take_lowest(b)

    def _take_lowest(self, b: int) -> int:
        """Mark the lowest free slot of bucket ``b`` (not full) used; its slot number."""
        m = self._used[b]
        i = (~m & (m + 1)).bit_length() - 1
        self._used[b] = m | (1 << i)
        return b * BUCKET_SLOTS + i

    def _place_anywhere(self, key_hash: int) -> int | None:
        """A slot for a grant: in its own buckets if one is free, else the lowest free
        slot of the first bucket with one (grants are found by scanning the table,
        never by their hash: docs/index.md §12)."""
        slot_no = self._place(key_hash)
        if slot_no is not None:
            return slot_no
        used = self._used
        m = _NOT_FULL.search(used, self._free_hint) or _NOT_FULL.search(used)
        if m is None:
            return None
        self._free_hint = m.start()
        return self._take_lowest(m.start())

    # -- writes ----------------------------------------------------------------
    def publish(self, key: str, key_hash: int, *, extent_offset_bytes: int, value_len_bytes: int,
                version: int, value_checksum: int, header_bytes: int, region_no: int, tier: int,
                elsewhere: bool) -> bool:
        """Publish (or republish) ``key``'s committed version; written through before returning.

        Args:
            key: the key (its hash ``key_hash`` = xxh3_64 of its UTF-8 bytes).
            extent_offset_bytes, value_len_bytes, version, value_checksum,
                header_bytes: where and what the readable replica is.
            region_no: the replica's region in the region table.
            tier: the replica's ``cxlkv.v1.Tier``.
            elsewhere: no CXL replica readers can map: the slot says "committed,
                read it through the RPC path".

        Returns:
            True when the key has a slot, False when it overflowed (counted in
            the overflow word, so readers that do not find it ask the RPC path).
        """
        placed = self._by_hash.get(key_hash)
        if placed is not None and placed.key != key:
            slot_no = None  # another live key has this 64-bit hash: overflow (RPC path)
        elif placed is not None:
            slot_no = placed.slot_no
        elif self._key_slots < self.key_limit:
            slot_no = self._place(key_hash)
            if slot_no is not None:
                self._key_slots += 1
        else:
            slot_no = None  # the rest of the table is kept for the grants of writes in flight
        if slot_no is None:
            if key not in self._overflowed:
                self._overflow_dirty = True
            self._overflowed[key] = version
            return False
        self._by_hash[key_hash] = _Placed(slot_no, key, version)
        flags = SLOT_LIVE | (SLOT_ELSEWHERE if elsewhere else 0)
        self._store(slot_no, key_hash, extent_offset_bytes, value_len_bytes, version, value_checksum,
                    header_bytes, flags | (region_no << 16) | (tier << 24))
        if self._overflowed.pop(key, None) is not None:  # in the table now: out of the overflow
            self._overflow_dirty = True
        return True

    def retire(self, key: str, key_hash: int, version: int | None = None) -> None:
        """Take ``key`` out of the index (tombstone, or the overflow count), written
        through; a no-op when absent, or when the index describes another version
        of it than ``version`` (when given)."""
        placed = self._by_hash.get(key_hash)
        if placed is not None and placed.key == key:
            if version is not None and placed.version != version:
                return
            self._empty(key_hash, placed)
            self._key_slots -= 1
            return
        v = self._overflowed.get(key)
        if v is not None and (version is None or v == version):
            del self._overflowed[key]
            self._overflow_dirty = True

    def _empty(self, key_hash: int, placed: "_Placed") -> None:
        del self._by_hash[key_hash]
        b, i = divmod(placed.slot_no, BUCKET_SLOTS)
        self._used[b] &= ~(1 << i) & 0xFF
        self._store(placed.slot_no, 0, 0, 0, 0, 0, 0, 0)

    def tombstone(self, slot_no: int) -> None:
        """Empty a slot no key was adopted into (recovery: a slot that does not verify)."""
        b, i = divmod(slot_no, BUCKET_SLOTS)
        if self._used[b] >> i & 1:
            raise ValueError(f"slot {slot_no} holds a key")
        self._store(slot_no, 0, 0, 0, 0, 0, 0, 0)

    def clear(self) -> None:
        """Forget every slot and zero the table and the overflow word (a master
        starting without recovery); the publish word is left as it is."""
        g = self.geometry
        chunk = bytes(1 << 20)
        off, end = g.table_offset_bytes, g.table_offset_bytes + g.slots * SLOT_BYTES
        while off < end:
            n = min(len(chunk), end - off)
            self.region.copy_in(off, chunk[:n] if n < len(chunk) else chunk)
            off += n
        self.region.flush(g.table_offset_bytes, g.slots * SLOT_BYTES)
        self._pending = []
        self._grants.clear()
        self._ahead.clear()
        self._ahead_slots = 0
        self._key_slots = 0
        self._by_hash.clear()
        self._overflowed.clear()
        self._used = bytearray(g.buckets)
        self._overflow_dirty = False
        _set_overflow(self.region, g, 0)

    def _store(self, slot_no: int, key_hash: int, extent: int, vlen: int, version: int, vsum: int,
               hbytes: int, meta: int) -> None:
        self._pending.append((slot_no, key_hash, extent, vlen, version, vsum, hbytes, meta))
        if len(self._pending) >= _MAX_PENDING:
            self.sync()

    def sync(self) -> None:
        """Write the slots queued since the last call, in order, in one C call (each
        slot written back, then one fence), then the overflow word.

        The master calls it before it answers any call (and at the end of each
        sweep): a commit is published, and a tombstone is visible, before anyone
        learns of the commit or of the freed space (docs/index.md).
        """
        pending, self._pending = self._pending, []
        if pending:
            self.writes += len(pending)
            g = self.geometry
            store = getattr(self.region, "index_store", None)
            if store is not None:
                store(g.table_offset_bytes, g.slots, *zip(*pending), self.flush)  # eight tuples
            else:  # a region-like object without the C call (the transport's reference writer)
                from cxlkv.transport.portable import index_store

                index_store(self.region, g.table_offset_bytes, g.slots, *[list(c) for c in zip(*pending)],
                            self.flush)
        if self._overflow_dirty:
            self._overflow_dirty = False
            _set_overflow(self.region, self.geometry, len(self._overflowed))

    # -- grants (space handed to writers) ---------------------------------------
    def grant(self, token: int, client_id: str, *, extent_offset_bytes: int, length_bytes: int,
              region_no: int, ahead: bool = False) -> bool:
        """Record that the extent of put token ``token`` was handed to ``client_id``.

        Args:
            ahead: the extent is handed out ahead of need (a reservation). Such
                grants hold at most :attr:`ahead_limit` slots together, so that
                space reserved for writers never crowds committed keys out of the
                table (into the overflow, read through the RPC path).

        Returns:
            False when no slot is free for it, or (``ahead``) the ahead-of-need
            share is used up: the caller must not hand the extent out (a master
            taking over could not know of it).
        """
        key = _grant_key(token, region_no)
        h = _xxh3(key.encode())
        placed = self._by_hash.get(h)
        known = placed is not None and placed.key == key
        if ahead and not known and self._ahead_slots >= self.ahead_limit:
            return False
        slot_no = placed.slot_no if known else self._place_anywhere(h)
        if slot_no is None:
            return False
        self._by_hash[h] = _Placed(slot_no, key, token)
        keys = self._grants.setdefault(token, [])
        if key not in keys:
            keys.append(key)
            if ahead or token in self._ahead:
                self._ahead.add(token)
                self._ahead_slots += 1
        self._store(slot_no, h, extent_offset_bytes, length_bytes, token, client_hash(client_id), 0,
                    SLOT_GRANT | (region_no << 16))
        return True

    def ungrant(self, token: int) -> None:
        """Forget the grants of ``token`` (committed, revoked and freed, or released)."""
        keys = self._grants.pop(token, ())
        if token in self._ahead:
            self._ahead.discard(token)
            self._ahead_slots -= len(keys)
        for key in keys:
            h = _xxh3(key.encode())
            placed = self._by_hash.get(h)
            if placed is not None and placed.key == key:
                self._empty(h, placed)

    def regrant(self, g: "Grant") -> bool:
        """Write a grant found before the table was emptied again (same token, writer, extent)."""
        key = _grant_key(g.put_token, g.region_no)
        h = _xxh3(key.encode())
        slot_no = self._place_anywhere(h)
        if slot_no is None:
            return False
        self._by_hash[h] = _Placed(slot_no, key, g.put_token)
        self._hold_ahead(g.put_token, key)
        self._store(slot_no, h, g.extent_offset_bytes, g.length_bytes, g.put_token, g.client_hash, 0,
                    SLOT_GRANT | (g.region_no << 16))
        return True

    def adopt_grant(self, g: "Grant") -> None:
        """Take over a grant slot found in the region (a master starting on it)."""
        key = _grant_key(g.put_token, g.region_no)
        self._take(g.slot_no, key, _xxh3(key.encode()), g.put_token)
        self._hold_ahead(g.put_token, key)

    def _hold_ahead(self, token: int, key: str) -> None:
        # A previous master's grant: reserved or in flight, it cannot tell; counted as
        # ahead of need (until its writer says it stopped) so new reservations wait.
        self._grants.setdefault(token, []).append(key)
        self._ahead.add(token)
        self._ahead_slots += 1

    @property
    def ahead_slots(self) -> int:
        """Grant slots held ahead of need (reservations and a previous master's grants)."""
        return self._ahead_slots

    @property
    def grants(self) -> int:
        """Tokens holding grant slots."""
        return len(self._grants)


#: Grant slots held ahead of need take at most 1/AHEAD_GRANT_SHARE of the table. The
#: table is sized half full at the expected object count (:func:`index_geometry`), so
#: keys and reservations together fill at most 5/8 of it, where two choices of
#: 8-slot buckets leave no key without a slot (none overflowed up to 75 %: _place).
AHEAD_GRANT_SHARE = 8

_NOT_FULL = re.compile(rb"[^\xff]")  # a bucket bitmask with a free slot

#: Queued slot writes that make :meth:`IndexWriter.sync` run at once (a long batch).
_MAX_PENDING = 4096


class Grant(NamedTuple):
    """A grant slot found in a region (:func:`read_grants`)."""

    slot_no: int
    put_token: int
    client_hash: int
    region_no: int
    extent_offset_bytes: int
    length_bytes: int


def _grant_key(token: int, region_no: int) -> str:
    return f"\0grant:{token}:{region_no}"  # NUL: never a user key


@functools.lru_cache(maxsize=1024)
def client_hash(client_id: str) -> int:
    """xxh3_64 of a client id, as grant slots record their writer (cached: one per grant)."""
    return _xxh3(client_id.encode())


def read_grants(region: Any, geometry: IndexGeometry, *, chunk_slots: int = 16384) -> list[Grant]:
    """Every verified grant slot of the table (extents handed to writers)."""
    return [Grant(no, slot.version, slot.value_checksum, slot.region_no, slot.extent_offset_bytes,
                  slot.value_len_bytes)
            for no, slot in _scan(region, geometry, SLOT_GRANT, chunk_slots) if not slot.flags & SLOT_LIVE]

