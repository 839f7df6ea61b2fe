"""Mounting and unmounting segments in the master.

A part of :class:`~cxlkv.master.state.MasterState` (pure, ``now`` passed in,
event-loop thread only). Mounting is bounded work; unmounting drops the segment's
replicas from every object, O(objects), so it runs by slices
(:class:`~cxlkv.master.cursors.UnmountCursor`): :meth:`Mounts.begin` at once (no
new extents there; puts, moves, fenced and quarantined space drop it), then
:meth:`Mounts.drop_replica` per object, then :meth:`Mounts.end`. Objects left
without a replica are removed; an object that loses its last CXL replica goes to
the SSD-only LRU (:class:`~cxlkv.master.tiering.Tiering`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cxlkv.errors import NotFound, NotReady
from cxlkv.master.cursors import UnmountCursor
from cxlkv.master.objects import ObjectVersion
from cxlkv.master.segments import Segment, Tier

if TYPE_CHECKING:
    from cxlkv.master.state import MasterState

__all__ = ["Mounts"]


class Mounts:
    """Segment mounts at run time and unmounts by slices.

    The state calls :meth:`mount`, :meth:`start` (an unmount by slices),
    :meth:`unmount_by_name` and :meth:`unmount` (in one go); :attr:`unmounting`
    lists the segments whose replicas are still being dropped.
    """

    def __init__(self, state: "MasterState") -> None:
        self._st = state
        self.config = state.config
        self.counters = state.counters
        #: Segments being unmounted by slices (id → segment): unmounted, their replicas
        #: still listed on the objects not reached yet (:class:`UnmountCursor`).
        self.unmounting: dict[int, Segment] = {}

    def mount(
        self, client_id: str, epoch: int, name: str, tier: int, size_bytes: int,
        region_uuid: str, device_path: str, now: float,
    ) -> Segment:
        """Mount a segment at run time (idempotent for an identical mounted segment).

        Host-local tiers (DRAM, SSD) are owned by the calling client and are
        unmounted when it expires.

        Raises:
            UnknownClient, StaleToken: the caller's registration is not current.
            InvalidArgument: bad name, tier or size, or a mounted segment of that
                name with another identity (the message names both).
        """
        st = self._st
        client = st.writer(client_id, epoch, now)
        if any(s.name == name for s in self.unmounting.values()):
            raise NotReady(f"segment {name!r} is being unmounted; mount it again once that is done")
        table = st.segment_table
        seg = table.check_mount(name, tier, size_bytes, region_uuid, device_path)
        if seg is not None:
            return seg
        owner = client.client_id if tier == Tier.DRAM else ""
        if tier == Tier.DRAM:
            st.tiering.check_mount(client.client_id)
        seg = table.mount(name, tier, size_bytes, region_uuid, device_path, owner)
        self.counters["segments_mounted"] += 1
        client.mapped.add(name)
        st.tiering.on_mount(seg, client.client_id)
        return seg

    def unmount_by_name(self, name: str, now: float) -> tuple[int, int]:
        """Stop allocating from a segment and drop its replicas, in one go.

        Objects with a replica elsewhere stay readable; objects without one are
        removed; puts left without any replica are revoked. O(objects). The
        service runs :meth:`unmount_start` by slices instead.

        Returns:
            ``(replicas_lost, objects_lost)``.

        Raises:
            NotFound: no mounted segment of that name.
        """
        cursor = self.start(name, now)
        while not cursor.step(now, None):
            pass
        return cursor.replicas_lost, cursor.objects_lost

    def start(self, name: str, now: float) -> UnmountCursor:
        """Begin unmounting a segment, to finish by slices (:meth:`UnmountCursor.step`).

        At once: the segment takes no new extents, puts and tier moves that use it
        are revoked or trimmed. Then, slice by slice, committed objects lose their
        replica there (an object left without one is removed). Until an object's
        slice comes its replica there stays listed: the bytes are untouched (nothing
        is freed or allocated in the segment meanwhile), so reads of it still get
        the object. The segment's name cannot be mounted again until the end.

        Raises:
            NotFound: no mounted segment of that name.
        """
        st = self._st
        seg = st.segment_table.by_name(name)
        if seg is None or not seg.mounted:
            raise NotFound(f"segment {name!r} is not mounted")
        return UnmountCursor(st, seg, now)

    def unmount(self, seg: Segment, now: float) -> tuple[int, int]:
        """Unmount ``seg`` in one go (its owner's registration ended): ``(replicas_lost, objects_lost)``."""
        cursor = UnmountCursor(self._st, seg, now)
        while not cursor.step(now, None):
            pass
        return cursor.replicas_lost, cursor.objects_lost

    def begin(self, seg: Segment, now: float) -> None:
        """The bounded first step of an unmount (:class:`UnmountCursor` calls it)."""
        st = self._st
        sid = seg.segment_id
        seg.mounted = False  # frees below must not touch its allocator; strategies skip it
        self.unmounting[sid] = seg
        st.segment_table.refresh()
        st.tiering.tiers_changed()
        self._side_tables(seg)

    def _side_tables(self, seg: Segment) -> None:
        """Drop ``seg`` from the tables that are not O(objects): tasks, puts,
        removed-but-leased and fenced versions (at the start and again at the end
        of a sliced unmount: calls between slices may have added some)."""
        st = self._st
        sid = seg.segment_id
        st.tiering.drop_segment(seg)
        for obj in list(st._puts.values()):
            kept = [e for e in obj.extents if e[0] != sid]
            if len(kept) != len(obj.extents):
                obj.extents = kept
                if not kept:
                    st._revoke(obj, f"segment {seg.name!r} was unmounted during the put")
        for obj in list(st._retired.values()):
            obj.extents = [e for e in obj.extents if e[0] != sid]
            obj.detached = [e for e in obj.detached if e[0] != sid]
        for token, obj in list(st._fenced.items()):
            obj.extents = [e for e in obj.extents if e[0] != sid]
            if not obj.extents:
                del st._fenced[token]
        for held in (st.quarantine.held, st.reservations.held):
            for token, obj in list(held.items()):
                obj.extents = [e for e in obj.extents if e[0] != sid]
                if not obj.extents:
                    del held[token]
                    st.quarantine.held_at.pop(token, None)
                    c = st._clients.get(obj.client_id)
                    if c is not None:
                        c.reserved.pop(token, None)
        for c in st._clients.values():  # the extents left in the other segments
            c.reserved_bytes = sum(e[2] for o in c.reserved.values() for e in o.extents)

    def drop_replica(self, obj: ObjectVersion, sid: int) -> tuple[int, int]:
        """One slice's step: drop ``obj``'s replica in segment ``sid``: (replicas lost, objects lost)."""
        st = self._st
        if obj.detached:
            obj.detached = [e for e in obj.detached if e[0] != sid]
        kept = [e for e in obj.extents if e[0] != sid]
        if len(kept) == len(obj.extents):
            return 0, 0
        lost = len(obj.extents) - len(kept)
        upper = st.tiering.has_cxl(obj)
        if obj.hard_pin:
            st._count_pinned([e for e in obj.extents if e[0] == sid], -1)
        obj.extents = kept
        if not kept:
            st._drop_committed(obj, evicted=False)
            return lost, 1
        st.index.publish(obj)  # readers leave the replica in the unmounted segment
        if upper and not obj.hard_pin and not st.tiering.has_cxl(obj):
            st.tiering.lost_cxl(obj)
        return lost, 0

    def end(self, seg: Segment, replicas_lost: int, objects_lost: int) -> None:
        """The last step of an unmount: the segment is gone, counters added."""
        st = self._st
        sid = seg.segment_id
        self._side_tables(seg)
        self.unmounting.pop(sid, None)
        st._pinned_bytes.pop(sid, None)
        st.segment_table.unmount(seg)
        st.tiering.on_unmount(seg)
        self.counters["segments_unmounted"] += 1
        self.counters["replicas_lost"] += replicas_lost
        self.counters["objects_lost"] += objects_lost
