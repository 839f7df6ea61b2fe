"""The built-in allocation strategies: ``cxl_first``, ``free_ratio_first``, ``random``.

All three are best-effort (never all-or-nothing): they order candidates and the
master places as many replicas as fit, in that order. None of them locks or
mutates; the master calls them on its single event-loop thread.
"""

from __future__ import annotations

import random as _random
from typing import Sequence

from cxlkv.config import MasterConfig
from cxlkv.master.segments import Segment, Tier
from cxlkv.master.strategies import AllocationStrategy, PlacementRequest

__all__ = ["CxlFirstStrategy", "FreeRatioFirstStrategy", "RandomStrategy"]

_TIER_RANK = {Tier.CXL: 0, Tier.DRAM: 1, Tier.SSD: 2}


def _preferred_first(ordered: list[Segment], preferred: str) -> list[Segment]:
    if preferred:
        for i, seg in enumerate(ordered):
            if seg.name == preferred:
                if i:
                    ordered.insert(0, ordered.pop(i))
                break
    return ordered


def _tier_filter(segments: Sequence[Segment], tier: int) -> list[Segment]:
    return [s for s in segments if s.tier == tier] if tier else list(segments)


class CxlFirstStrategy(AllocationStrategy):
    """Shared CXL segments first, then DRAM, then SSD (the default).

    Within a tier, the segment with the largest free block comes first, so a
    large value goes where it fits and replicas spread over devices. The
    preferred segment, when given and eligible, is tried first. With a ``tier``
    in the request, only that tier is returned. Best-effort; stateless.
    """

    def select(self, segments: Sequence[Segment], request: PlacementRequest) -> list[Segment]:
        """See :meth:`AllocationStrategy.select`."""
        if len(segments) == 1 and not request.tier:
            return [segments[0]]  # the common single-region case, on every put
        pool = _tier_filter(segments, request.tier)
        if len(pool) > 1:
            pool.sort(key=lambda s: (_TIER_RANK.get(s.tier, 9), -s.largest_free_bytes, s.segment_id))
        return _preferred_first(pool, request.preferred_segment)


class FreeRatioFirstStrategy(AllocationStrategy):
    """Segments by decreasing free ratio (free/capacity), whatever their tier.

    Balances regions of different sizes: each fills at the same relative pace.
    The preferred segment, when given, is tried first. Best-effort; stateless.
    """

    def select(self, segments: Sequence[Segment], request: PlacementRequest) -> list[Segment]:
        """See :meth:`AllocationStrategy.select`."""
        pool = _tier_filter(segments, request.tier)
        if len(pool) > 1:
            pool.sort(key=lambda s: (-s.free_ratio, s.segment_id))
        return _preferred_first(pool, request.preferred_segment)


class RandomStrategy(AllocationStrategy):
    """Segments in uniformly random order (the preferred one first when given).

    Best-effort. Its only state is a private random generator (``seed`` makes it
    reproducible); it never mutates segments.
    """

    def __init__(self, config: MasterConfig | None = None, seed: int | None = None) -> None:
        super().__init__(config, seed)
        self._rng = _random.Random(seed)

    def select(self, segments: Sequence[Segment], request: PlacementRequest) -> list[Segment]:
        """See :meth:`AllocationStrategy.select`."""
        pool = _tier_filter(segments, request.tier)
        if len(pool) > 1:
            self._rng.shuffle(pool)
        return _preferred_first(pool, request.preferred_segment)
