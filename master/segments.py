"""Segments: units of capacity the master allocates from.

A :class:`Segment` is one CXL region (later a host's DRAM or SSD tier) with its
own :class:`~cxlkv.master.allocator.ExtentAllocator`; the :class:`SegmentTable`
knows every segment (who has space). Allocation strategies see segments
read-only; only :class:`~cxlkv.master.state.MasterState` allocates and frees.
"""

from __future__ import annotations

import enum
from typing import Sequence

from cxlkv.config import SegmentConfig, format_size
from cxlkv.errors import InvalidArgument
from cxlkv.master.allocator import ExtentAllocator
from cxlkv.master.objects import Extent
from cxlkv.layout.region import REGION_HEADER_BYTES
from cxlkv.v1 import common_pb2

__all__ = ["Tier", "Segment", "SegmentTable", "tier_from_name", "place_extents"]

class Tier(enum.IntEnum):
    """Storage tier; the values of ``cxlkv.v1.Tier``."""

    TIER_UNSPECIFIED = common_pb2.TIER_UNSPECIFIED  # "strategy decides" in a placement request
    CXL = common_pb2.CXL    # shared CXL region, mapped by every host
    DRAM = common_pb2.DRAM  # one host's private memory
    SSD = common_pb2.SSD    # a directory on a host's SSD, or a shared path

_TIER_NAMES = {"cxl": Tier.CXL, "dram": Tier.DRAM, "ssd": Tier.SSD}


def tier_from_name(name: str) -> int:
    """``"cxl"`` → ``Tier.CXL`` (also ``dram``, ``ssd``).

    Raises:
        ValueError: unknown tier name.
    """
    try:
        return _TIER_NAMES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown tier {name!r} (known: {', '.join(_TIER_NAMES)})") from None


class Segment:
    """One segment and its allocator.

    Attributes:
        segment_id: never reused within one master run (a remount gets a new id).
        name: unique among mounted segments.
        tier: a :data:`Tier` value.
        size_bytes: whole region size, header included.
        region_uuid: the region's identity ("" until a clientd reports it, if
            the config gave none).
        device_path: where the config says the region lives (informational).
        owner_client_id: the clientd owning a host-local tier; "" for shared CXL.
        mounted: False once unmounted: no allocations, its replicas are gone.
        allocator: the free-space manager over ``[REGION_HEADER_BYTES, data_end_bytes)``.
        data_end_bytes: end of the object area: the region's index offset when
            the master maps the region and it has an index (cxlkv.layout.index), else
            ``size_bytes``.
        object_count: live replicas placed in this segment.
        refused_until: master clock (s) before which nothing new is placed here: a
            clientd could not write into it (its filesystem is full, ENOSPC); 0 when
            writable. Only host tiers (SSD) are ever marked.
        refusals: consecutive write refusals (the backoff doubles with each; a
            successful write into the segment resets it).

    Strategies must treat a segment as read-only.
    """

    __slots__ = (
        "segment_id", "name", "tier", "size_bytes", "region_uuid", "device_path",
        "owner_client_id", "mounted", "allocator", "object_count", "data_end_bytes", "refused_until",
        "refusals",
    )

    def __init__(
        self,
        segment_id: int,
        name: str,
        tier: int,
        size_bytes: int,
        *,
        alignment_bytes: int = 64,
        region_uuid: str = "",
        device_path: str = "",
        owner_client_id: str = "",
    ) -> None:
        self.segment_id = segment_id
        self.name = name
        self.tier = tier
        self.size_bytes = size_bytes
        self.region_uuid = region_uuid
        self.device_path = device_path
        self.owner_client_id = owner_client_id
        self.mounted = True
        self.allocator = ExtentAllocator(REGION_HEADER_BYTES, size_bytes, alignment_bytes)
        self.object_count = 0
        self.data_end_bytes = size_bytes
        self.refused_until = 0.0
        self.refusals = 0

    @property
    def capacity_bytes(self) -> int:
        """Allocatable bytes (the region minus its header, alignment trimmed)."""
        return self.allocator.capacity_bytes

    @property
    def used_bytes(self) -> int:
        """Bytes in live extents."""
        return self.allocator.used_bytes

    @property
    def free_bytes(self) -> int:
        """Bytes not in live extents (possibly fragmented)."""
        return self.allocator.free_bytes

    @property
    def largest_free_bytes(self) -> int:
        """The largest extent that could be allocated right now."""
        return self.allocator.largest_free_bytes

    @property
    def free_ratio(self) -> float:
        """free_bytes / capacity_bytes (0 for an empty-capacity segment)."""
        cap = self.allocator.capacity_bytes
        return (cap - self.allocator.used_bytes) / cap if cap else 0.0

    def __repr__(self) -> str:
        return (
            f"Segment({self.segment_id}, {self.name!r}, tier={Tier(self.tier).name}, "
            f"used={self.used_bytes}/{self.capacity_bytes}, mounted={self.mounted})"
        )


class SegmentTable:
    """Every segment of the master: who has space (Mooncake's segment manager).

    Keeps segments by id (ids are never reused: a remount gets a new one) and the
    current segment of each name, the mounted ones in id order, their largest and
    smallest capacity, and a version that changes on every mount and unmount.
    Validates identities (size, region uuid) with messages naming both sides.

    Args:
        alignment_bytes: extent alignment of every allocator.
        configured: ``[[segments]]`` of the master config (sizes a remount must match).
    """

    def __init__(self, alignment_bytes: int, configured: Sequence[SegmentConfig] = ()) -> None:
        self.alignment_bytes = alignment_bytes
        #: segment id → segment, mounted or not (extents name segments by id).
        self.by_id: dict[int, Segment] = {}
        self._by_name: dict[str, Segment] = {}
        self._configured = {s.name: s for s in configured}
        self._next_id = 1
        #: Mounted segments in id order.
        self.mounted: list[Segment] = []
        #: Largest / smallest capacity among mounted segments (0 when none).
        self.max_capacity = 0
        self.min_capacity = 0
        #: Changes whenever a segment is mounted or unmounted.
        self.version = 0

    def get(self, segment_id: int) -> Segment | None:
        """The segment with this id (mounted or not), or ``None``."""
        return self.by_id.get(segment_id)

    def by_name(self, name: str) -> Segment | None:
        """The current segment of this name (mounted or the last unmounted), or ``None``."""
        return self._by_name.get(name)

    def named(self) -> list[Segment]:
        """The current segment of every name ever mounted, in first-mount order."""
        return list(self._by_name.values())

    def mount(self, name: str, tier: int, size_bytes: int, region_uuid: str = "",
              device_path: str = "", owner_client_id: str = "") -> Segment:
        """Create and mount a segment under a new id (no validation: see :meth:`check_mount`)."""
        seg = Segment(self._next_id, name, tier, size_bytes, alignment_bytes=self.alignment_bytes,
                      region_uuid=region_uuid, device_path=device_path, owner_client_id=owner_client_id)
        self._next_id += 1
        self.by_id[seg.segment_id] = seg
        self._by_name[name] = seg
        self._refresh()
        return seg

    def unmount(self, seg: Segment) -> None:
        """Mark ``seg`` unmounted and empty (the caller dropped its replicas first)."""
        seg.mounted = False
        seg.object_count = 0
        seg.allocator = ExtentAllocator(REGION_HEADER_BYTES, seg.data_end_bytes, self.alignment_bytes)
        self._refresh()

    def set_data_end(self, seg: Segment, data_end_bytes: int) -> None:
        """End ``seg``'s object area at ``data_end_bytes`` (where its region's index starts).

        Raises:
            ValueError: the segment already holds extents, or a bad end.
        """
        if seg.allocator.live_extents:
            raise ValueError(f"segment {seg.name!r} already holds extents")
        if not REGION_HEADER_BYTES < data_end_bytes <= seg.size_bytes:
            raise ValueError(f"segment {seg.name!r}: data end {data_end_bytes} outside its region")
        seg.data_end_bytes = data_end_bytes
        seg.allocator = ExtentAllocator(REGION_HEADER_BYTES, data_end_bytes, self.alignment_bytes)
        self._refresh()

    def refresh(self) -> None:
        """Recompute the mounted list after a segment's ``mounted`` flag changed."""
        self._refresh()

    def _refresh(self) -> None:
        self.mounted = [s for s in self.by_id.values() if s.mounted]
        caps = [s.capacity_bytes for s in self.mounted]
        self.max_capacity = max(caps, default=0)
        self.min_capacity = min(caps, default=0)
        self.version += 1

    @staticmethod
    def check_identity(seg: Segment, region_uuid: str, size_bytes: int, path: str) -> None:
        """A region reported as ``seg`` must have its size and (if known) its uuid.

        Raises:
            InvalidArgument: naming the segment, both sizes or uuids, and the path.
        """
        if size_bytes != seg.size_bytes:
            raise InvalidArgument(
                f"segment {seg.name!r}: region at {path or '?'} is {size_bytes} B "
                f"({format_size(size_bytes)}), the master's segment is {seg.size_bytes} B "
                f"({format_size(seg.size_bytes)})"
            )
        if seg.region_uuid and region_uuid != seg.region_uuid:
            raise InvalidArgument(
                f"segment {seg.name!r}: region at {path or '?'} has uuid {region_uuid!r}, "
                f"the master's segment has uuid {seg.region_uuid!r}"
            )

    def check_mount(self, name: str, tier: int, size_bytes: int, region_uuid: str,
                    device_path: str) -> Segment | None:
        """Validate a run-time mount.

        Returns:
            The mounted segment of that name when the identity matches (the
            mount is then a no-op; an unknown uuid is adopted), else ``None``:
            the caller mounts a new segment.

        Raises:
            InvalidArgument: empty name, bad tier, a size not above the region
                header or unlike the configured one, or an identity unlike the
                mounted (or last mounted) segment of that name.
        """
        if not name:
            raise InvalidArgument("segment name is empty")
        if tier not in (Tier.CXL, Tier.DRAM, Tier.SSD):
            raise InvalidArgument(f"segment {name!r}: tier must be CXL, DRAM or SSD, got {tier}")
        if size_bytes <= REGION_HEADER_BYTES:
            raise InvalidArgument(
                f"segment {name!r}: size_bytes {size_bytes} must exceed the {REGION_HEADER_BYTES}-byte region header"
            )
        seg = self._by_name.get(name)
        if seg is not None and seg.mounted:
            self.check_identity(seg, region_uuid, size_bytes, device_path)
            if not seg.region_uuid:
                seg.region_uuid = region_uuid
            return seg
        conf = self._configured.get(name)
        if conf is not None and size_bytes != conf.size_bytes:
            raise InvalidArgument(
                f"segment {name!r}: size {size_bytes} B at {device_path or '?'} differs from the "
                f"configured {conf.size_bytes} B"
            )
        if seg is not None and seg.region_uuid and region_uuid and seg.region_uuid != region_uuid:
            raise InvalidArgument(
                f"segment {name!r}: region_uuid {region_uuid!r} at {device_path or '?'} differs from "
                f"the segment's {seg.region_uuid!r}"
            )
        return None


def place_extents(candidates: Sequence[Segment], need: int, replica_num: int) -> list[Extent]:
    """Allocate up to ``replica_num`` extents of ``need`` bytes on distinct
    ``candidates``, in their order (the allocation strategy's); fewer (or none)
    when the candidates have no room. Each placed extent counts one object on
    its segment.

    Returns:
        ``(segment_id, offset_bytes, need)`` per placed replica.
    """
    # A full segment is skipped without asking its allocator (a failing alloc
    # searches its size class: the common case of a cache that evicts on put).
    if replica_num == 1:
        for seg in candidates:
            allocator = seg.allocator
            if allocator.capacity_bytes - allocator.used_bytes < need:
                continue
            off = allocator.alloc(need)
            if off >= 0:
                seg.object_count += 1
                return [(seg.segment_id, off, need)]
        return []
    extents: list[Extent] = []
    for seg in candidates:
        if seg.allocator.free_bytes < need:
            continue
        off = seg.allocator.alloc(need)
        if off >= 0:
            seg.object_count += 1
            extents.append((seg.segment_id, off, need))
            if len(extents) >= replica_num:
                break
    return extents
