"""The sorted key index behind ListKeys: a part of :class:`~cxlkv.master.state.MasterState`.

Built on the first ListKeys (one O(n log n) sort) and dropped after
:data:`IDLE_S` without one, so puts and removes pay for it (O(log n) string
compares, :class:`sortedcontainers.SortedList`) only while someone is listing.
Pure, ``now`` passed in; event-loop thread only.
"""

from __future__ import annotations

from typing import Mapping

from sortedcontainers import SortedList

from cxlkv.master.objects import ObjectVersion

__all__ = ["KeyListing", "IDLE_S", "DEFAULT_PAGE", "MAX_PAGE"]

#: Seconds without ListKeys after which the index is dropped.
IDLE_S = 60.0
#: Keys per page when the caller asks for 0, and the most a page holds.
DEFAULT_PAGE = 1000
MAX_PAGE = 10000


class KeyListing:
    """Committed keys in order, while someone lists them.

    Args:
        objects: the state's committed objects, key → version (read, never written).
    """

    def __init__(self, objects: Mapping[str, ObjectVersion]) -> None:
        self._objects = objects
        #: The sorted keys, or ``None`` while nobody lists.
        self.keys: SortedList | None = None
        self._used_at = 0.0

    def added(self, key: str) -> None:
        """``key`` became committed (it was not before)."""
        if self.keys is not None:
            self.keys.add(key)

    def removed(self, key: str) -> None:
        """``key`` is no longer committed."""
        if self.keys is not None:
            self.keys.remove(key)

    def sweep(self, now: float) -> None:
        """Drop the index after :data:`IDLE_S` seconds without a page."""
        if self.keys is not None and now - self._used_at > IDLE_S:
            self.keys = None

    def page(self, prefix: str, page_size: int, after: str | None,
             now: float) -> tuple[list[ObjectVersion], str | None]:
        """Committed objects in key order, starting after ``after``, with ``prefix``.

        The first call after the index was dropped sorts every key once,
        O(n log n); later pages are O(log n + page).

        Args:
            prefix: only keys starting with it.
            page_size: 0 means :data:`DEFAULT_PAGE`; capped at :data:`MAX_PAGE`.
            after: the last key of the previous page, or ``None``.
            now: master clock, seconds (keeps the index alive).

        Returns:
            ``(objects, last_key)``; ``last_key`` is ``None`` on the last page.
        """
        size = DEFAULT_PAGE if page_size <= 0 else min(page_size, MAX_PAGE)
        if self.keys is None:
            self.keys = SortedList(self._objects)
        self._used_at = now
        if after is not None and after >= prefix:
            it = self.keys.irange(minimum=after, inclusive=(False, True))
        else:
            it = self.keys.irange(minimum=prefix)
        out: list[ObjectVersion] = []
        for key in it:
            if not key.startswith(prefix):
                return out, None
            if len(out) == size:
                return out, out[-1].key
            out.append(self._objects[key])
        return out, None
