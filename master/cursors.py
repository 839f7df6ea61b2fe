"""Long master operations that run by slices: RemoveAll (with or without a pattern) and UnmountSegment.

Each is O(objects) by nature. A cursor takes its snapshot of the committed
objects at the start; each :meth:`step` handles objects for at most its budget
of the state's work clock, so the service answers other calls between slices.
Cursors are parts of :class:`~cxlkv.master.state.MasterState` (they call its
private removal and unmount steps) and run on its event-loop thread only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cxlkv.master.objects import ObjectVersion
from cxlkv.master.segments import Segment

if TYPE_CHECKING:
    from cxlkv.master.state import MasterState

__all__ = ["RemoveAllCursor", "UnmountCursor"]


class RemoveAllCursor:
    """One RemoveAll (with or without a pattern) in progress (:meth:`MasterState.remove_all_start`).

    Taking the snapshot of committed objects costs O(n) list work (a few ms per
    million keys); each :meth:`step` removes objects for at most its budget, so
    the caller (the service) answers other calls between slices.

    Attributes:
        removed: objects removed so far.
        skipped: leased objects left in place (not ``force``).
        done: every object of the snapshot has been considered.
    """

    #: Objects handled between two looks at the work clock.
    CHECK_EVERY = 256

    def __init__(self, state: MasterState, matcher: object | None, force: bool) -> None:
        self._state = state
        self._search = matcher.search if matcher is not None else None  # type: ignore[attr-defined]
        self._force = force
        self._todo: list[Any] = list(state._objects.values())  # ObjectVersion, None once handled
        self._pos = 0
        self.removed = 0
        self.skipped = 0
        self.done = not self._todo

    def step(self, now: float, budget_s: float | None) -> bool:
        """Handle the next objects for at most ``budget_s`` seconds of the state's
        work clock (``None``: all of them). Returns :attr:`done`."""
        st = self._state
        objects = st._objects
        todo = self._todo
        search = self._search
        clock = st._work_clock
        deadline = None if budget_s is None else clock() + budget_s
        pos = self._pos
        end = len(todo)
        removed = 0
        while pos < end:
            stop = min(end, pos + self.CHECK_EVERY)
            for i in range(pos, stop):
                obj: ObjectVersion = todo[i]
                todo[i] = None  # freed in its slice, not all at once when the snapshot goes
                if objects.get(obj.key) is not obj:  # removed or replaced since the start
                    continue
                if search is not None and search(obj.key) is None:
                    continue
                if obj.leases and not self._force:
                    self.skipped += 1
                    continue
                st._drop_committed(obj, evicted=False)
                removed += 1
            pos = stop
            if deadline is not None and clock() >= deadline:
                break
        self._pos = pos
        self.removed += removed
        st.counters["removes"] += removed
        if pos >= end:
            self.done = True
            self._todo = []
        return self.done


class UnmountCursor:
    """One segment unmount in progress (:meth:`MasterState.unmount_start`).

    Construction does the bounded part (the segment stops taking extents; puts,
    tasks, leased and fenced versions drop it); each :meth:`step` takes committed
    objects' replicas off the segment for at most its budget; the last one
    finishes (the segment's allocator is reset, counters added).

    Attributes:
        segment: the segment being unmounted.
        replicas_lost: replicas dropped so far.
        objects_lost: objects removed so far (their only replica was there).
        done: finished.
    """

    CHECK_EVERY = 256

    def __init__(self, state: MasterState, seg: Segment, now: float) -> None:
        self._state = state
        self.segment = seg
        state.mounts.begin(seg, now)
        self._todo: list[Any] = list(state._objects.values())  # ObjectVersion, None once handled
        self._pos = 0
        self.replicas_lost = 0
        self.objects_lost = 0
        self.done = False

    def step(self, now: float, budget_s: float | None) -> bool:
        """Handle the next objects for at most ``budget_s`` seconds of the state's
        work clock (``None``: all of them), finishing after the last. Returns :attr:`done`."""
        if self.done:
            return True
        st = self._state
        objects = st._objects
        sid = self.segment.segment_id
        todo = self._todo
        clock = st._work_clock
        deadline = None if budget_s is None else clock() + budget_s
        pos, end = self._pos, len(todo)
        while pos < end:
            stop = min(end, pos + self.CHECK_EVERY)
            for i in range(pos, stop):
                obj: ObjectVersion = todo[i]
                todo[i] = None  # freed in its slice
                if objects.get(obj.key) is not obj:  # removed or replaced meanwhile
                    continue
                lost, gone = st.mounts.drop_replica(obj, sid)
                self.replicas_lost += lost
                self.objects_lost += gone
            pos = stop
            if deadline is not None and clock() >= deadline:
                break
        self._pos = pos
        if pos >= end:
            self._todo = []
            st.mounts.end(self.segment, self.replicas_lost, self.objects_lost)
            self.done = True
        return self.done
