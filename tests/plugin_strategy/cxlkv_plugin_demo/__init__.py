"""A third-party allocation strategy: the highest segment id first."""

from __future__ import annotations

from typing import Sequence

from cxlkv.master.segments import Segment
from cxlkv.master.strategies import AllocationStrategy, PlacementRequest


class LastSegmentStrategy(AllocationStrategy):
    """Segments by decreasing segment id (the preferred one first). Best-effort; stateless."""

    def select(self, segments: Sequence[Segment], request: PlacementRequest) -> list[Segment]:
        """See :meth:`cxlkv.master.strategies.AllocationStrategy.select`."""
        ordered = sorted(segments, key=lambda s: -s.segment_id)
        ordered.sort(key=lambda s: s.name != request.preferred_segment)
        return ordered
