"""Segments: units of capacity the master allocates from.

A :class:`Segment` is one CXL region (later a host's DRAM or SSD tier) with its
own :class:`~cxlkv.master.allocator.ExtentAllocator`. Allocation strategies see
segments read-only; only :class:`~cxlkv.master.state.MasterState` allocates and
frees.
"""

from __future__ import annotations

import enum

from cxlkv.master.allocator import ExtentAllocator
from cxlkv.region import REGION_HEADER_BYTES
from cxlkv.v1 import common_pb2

__all__ = ["Tier", "Segment", "tier_from_name"]

#: Storage tier, the ``cxlkv.v1.Tier`` enum as a Python IntEnum (one source).
Tier = enum.IntEnum("Tier", dict(common_pb2.Tier.items()))  # type: ignore[misc]

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
        allocator: the free-space manager over ``[REGION_HEADER_BYTES, size_bytes)``.
        object_count: live replicas placed in this segment.

    Strategies must treat a segment as read-only.
    """

    __slots__ = (
        "segment_id", "name", "tier", "size_bytes", "region_uuid", "device_path",
        "owner_client_id", "mounted", "allocator", "object_count",
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
