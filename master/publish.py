"""What the master's state machine tells the region's index: publish and retire.

:class:`~cxlkv.master.state.MasterState` calls its ``index`` (an
:class:`ObjectIndex`) at exactly two kinds of points, so the index in the region
always describes committed objects whose bytes are where it says:

* :meth:`ObjectIndex.publish` when a version is committed (before the version it
  replaces is retired) and whenever a committed version's readable replicas
  change (demoted, promoted, a segment unmounted);
* :meth:`ObjectIndex.retire` when a committed version leaves the key space
  (removed, evicted, superseded, lost), before any of its extents is freed.

Both write through to the region before they return (:class:`cxlkv.layout.index.IndexWriter`),
and the state calls them before the allocator can hand the space out again, so
no reader is ever sent to space given to another object — the contract of
docs/index.md. :class:`NoIndex` is the state's default (pure-state tests, a
master that maps no region); :class:`RegionIndex` is the master server's.

:meth:`ObjectIndex.usage` says how full the table is (:class:`IndexUsage`, O(1)):
the master's /metrics, its Stat and ``cxlkv status`` show it, and
:class:`OverflowAlarm` decides when the master warns that objects overflowed the
table (their reads, and every miss, then take the leased RPC path).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import xxhash

from cxlkv.layout.index import IndexWriter
from cxlkv.master.objects import ObjectVersion, ObjState
from cxlkv.master.segments import Segment, Tier

__all__ = ["ObjectIndex", "NoIndex", "RegionIndex", "IndexUsage", "OverflowAlarm", "overflow_warning",
           "VERIFY_MAX_BYTES"]

#: Damage reports of larger values are not checked (and so never drop the object).
VERIFY_MAX_BYTES = 16 << 20

_xxh3 = xxhash.xxh3_64_intdigest


@dataclass(frozen=True, slots=True)
class IndexUsage:
    """How full the region's index is (counts of slots and objects, read in O(1)).

    Attributes:
        slots: slots in the table (fixed at format time: ``cxlkv region format
            --expected-objects N`` gives at least ``2 N``).
        object_slots: slots holding a committed object.
        grant_slots: slots recording an extent handed to a writer (a put in
            flight, a reservation, a previous master's grant).
        key_limit: most slots objects may hold (3/4 of the table); a new object
            past it, or whose two buckets are full, overflows.
        overflow_objects: committed objects without a slot: their reads, and
            every miss while this is non-zero, take the leased RPC path.
    """

    slots: int
    object_slots: int
    grant_slots: int
    key_limit: int
    overflow_objects: int

    @property
    def used_slots(self) -> int:
        """Slots in use: objects and grants."""
        return self.object_slots + self.grant_slots


class OverflowAlarm:
    """When the master warns that objects overflowed the index: the first time the
    overflow count is non-zero, then each time it reaches twice the count last
    warned about — at most ``log2(objects) + 1`` warnings in a master's life, never
    one per put. Pure state (the caller logs); not reset when the count falls
    again, so a count that hovers around a threshold warns once.
    """

    def __init__(self) -> None:
        #: The overflow count of the last warning (0: none yet).
        self.warned_at = 0

    def check(self, overflow_objects: int) -> bool:
        """Whether ``overflow_objects`` (the count now) deserves a warning; if so it
        becomes the count to double before the next one."""
        if overflow_objects <= 0 or (self.warned_at and overflow_objects < 2 * self.warned_at):
            return False
        self.warned_at = overflow_objects
        return True


def overflow_warning(usage: IndexUsage) -> str:
    """The master's warning line for ``usage`` (overflowed objects): the count, the
    table's capacity, what it costs and the fix."""
    objects = usage.object_slots + usage.overflow_objects
    return (f"index overflow: {usage.overflow_objects:,} committed object(s) have no slot in the region's index "
            f"({usage.slots:,} slots, objects take at most {usage.key_limit:,}; {usage.object_slots:,} held): "
            f"their reads, and every miss while any object overflows, take the leased RPC path (a master round "
            f"trip instead of a memory read); size the index for the objects held: cxlkv region format "
            f"--expected-objects N with N >= {objects:,} (re-formatting empties the region; docs/index.md "
            f"\"Sizing and cost\"). Next warning at {2 * usage.overflow_objects:,}")


class ObjectIndex(Protocol):
    """The state machine's view of the committed-object index."""

    def publish(self, obj: ObjectVersion) -> None:
        """``obj`` is the key's committed version, readable where its extents say."""

    def retire(self, obj: ObjectVersion) -> None:
        """``obj`` is no longer readable (a no-op if the index names another version)."""

    def grant(self, obj: ObjectVersion, *, ahead: bool = False) -> bool:
        """``obj``'s extents go to its writer (a put, or ``ahead`` of need: a reservation);
        False: not recordable (no slot, or the reservations' share of the table is used up)."""

    def ungrant(self, obj: ObjectVersion) -> None:
        """``obj``'s writer is done with its extents (committed, or freed)."""

    def sync(self) -> None:
        """Make every write so far visible (before the master answers a call)."""

    def damaged(self, obj: ObjectVersion) -> bool | None:
        """Whether ``obj``'s bytes are destroyed, checked in the region (``None``: cannot tell)."""

    def usage(self) -> IndexUsage | None:
        """How full the table is now, O(1) (``None``: no index)."""


class NoIndex:
    """No index: every read goes through the leased RPC path."""

    def publish(self, obj: ObjectVersion) -> None:
        """Nothing to publish."""

    def retire(self, obj: ObjectVersion) -> None:
        """Nothing to retire."""

    def grant(self, obj: ObjectVersion, *, ahead: bool = False) -> bool:
        """Nothing to record."""
        return True

    def ungrant(self, obj: ObjectVersion) -> None:
        """Nothing to forget."""

    def sync(self) -> None:
        """Nothing to write."""

    def damaged(self, obj: ObjectVersion) -> bool | None:
        """Cannot tell: no region mapped."""
        return None

    def usage(self) -> IndexUsage | None:
        """No table."""
        return None


class RegionIndex:
    """Publishes into the index of one region that the master maps.

    Args:
        writer: the index's writer (placement and slot writes).
        region_numbers: segment id → region number in the index's region table,
            for every CXL segment whose region the index names.
        segments: segment id → segment (for a replica's tier).

    A committed version is published with its first replica in a named region
    whose object header and value checksum are known; otherwise (SSD or DRAM
    tier only, a segment the index does not name, a bare value) as ELSEWHERE:
    readers see it exists and read it through the leased RPC path.
    """

    def __init__(self, writer: IndexWriter, region_numbers: dict[int, int],
                 segments: dict[int, Segment], regions: dict[int, Any] | None = None) -> None:
        self.writer = writer
        self.region_numbers = region_numbers
        #: segment id → the master's mapping of its region (to check damage reports).
        self.regions = dict(regions or {})
        self._segments = segments
        #: Versions published and retired since start.
        self.published = 0
        self.retired = 0

    def publish(self, obj: ObjectVersion) -> None:
        """Write ``obj``'s slot (see the class docstring for what it says)."""
        if obj.state != ObjState.COMPLETE:
            return
        h = _xxh3(obj.key.encode("utf-8"))
        self.published += 1
        numbers = self.region_numbers
        if obj.header_bytes and obj.checksum:
            for sid, off, _ in obj.extents:
                rno = numbers.get(sid)
                if rno is not None:
                    self.writer.publish(obj.key, h, extent_offset_bytes=off, value_len_bytes=obj.size_bytes,
                                        version=obj.version, value_checksum=obj.checksum,
                                        header_bytes=obj.header_bytes, region_no=rno, tier=Tier.CXL,
                                        elsewhere=False)
                    return
        seg = self._segments.get(obj.extents[0][0]) if obj.extents else None
        self.writer.publish(obj.key, h, extent_offset_bytes=0, value_len_bytes=obj.size_bytes,
                            version=obj.version, value_checksum=obj.checksum, header_bytes=obj.header_bytes,
                            region_no=0, tier=int(seg.tier) if seg is not None else 0, elsewhere=True)

    def retire(self, obj: ObjectVersion) -> None:
        """Tombstone ``obj``'s slot if it still describes ``obj``'s version."""
        self.retired += 1
        self.writer.retire(obj.key, _xxh3(obj.key.encode("utf-8")), obj.version)

    def grant(self, obj: ObjectVersion, *, ahead: bool = False) -> bool:
        """Record the writer's extents in named regions (grant slots, one per replica's
        first extent in a named region: a master taking over quarantines them);
        ``ahead``: a reservation (:meth:`IndexWriter.grant`)."""
        ok = True
        for sid, off, n in obj.extents:
            rno = self.region_numbers.get(sid)
            if rno is not None:
                ok = self.writer.grant(obj.version, obj.client_id, extent_offset_bytes=off, length_bytes=n,
                                       region_no=rno, ahead=ahead) and ok
        return ok

    def ungrant(self, obj: ObjectVersion) -> None:
        """Drop ``obj``'s grant slot (a no-op when it has none)."""
        self.writer.ungrant(obj.version)

    def sync(self) -> None:
        """Write the queued slots (one C call)."""
        self.writer.sync()

    def usage(self) -> IndexUsage:
        """The writer's counts (O(1)); ``overflow_objects`` is the count the region's
        overflow word gets at the next :meth:`sync`."""
        w = self.writer
        keys = w.key_slots
        return IndexUsage(slots=w.geometry.slots, object_slots=keys, grant_slots=w.live_slots - keys,
                          key_limit=w.key_limit, overflow_objects=w.overflow)

    def damaged(self, obj: ObjectVersion) -> bool | None:
        """Check ``obj`` in the first named region holding a replica: its object header
        must describe it and its value's xxh3_64 must be ``obj.checksum``. ``None`` when
        no replica is in a region this master maps, or the value is over
        :data:`VERIFY_MAX_BYTES` (hashing it would hold the event loop)."""
        from cxlkv.errors import CxlkvError
        from cxlkv.layout.objheader import object_mismatch

        if not obj.header_bytes or not obj.checksum or obj.size_bytes > VERIFY_MAX_BYTES:
            return None
        for sid, off, _ in obj.extents:
            region = self.regions.get(sid)
            if region is None:
                continue
            if getattr(region, "guard_hits", 0):
                return None  # its file shrank under this mapping: what it reads proves nothing
            try:
                region.invalidate(off, obj.header_bytes + obj.size_bytes)
                head = region.read(off, obj.header_bytes)
                if object_mismatch(head, obj.key.encode("utf-8"), obj.version, obj.size_bytes, obj.header_bytes,
                                   obj.checksum) is not None:
                    return True
                return region.checksum(off + obj.header_bytes, obj.size_bytes) != obj.checksum
            except CxlkvError:
                return None
        return None
