"""Restoring committed objects found in a region (the master lost its metadata).

Pure, like :mod:`cxlkv.master.state`, on whose tables it works:
:mod:`cxlkv.master.recovery` and :mod:`cxlkv.master.warm` scan regions or the
region index (I/O) and hand what they found to
:meth:`MasterState.restore_objects <cxlkv.master.state.MasterState.restore_objects>`,
which calls :func:`restore_objects`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from cxlkv.errors import NotFound
from cxlkv.wire.keys import key_error
from cxlkv.master.objects import MAX_HEADER_BYTES, ObjectVersion, ObjState, RestoredObject, RestoreReport

if TYPE_CHECKING:
    from cxlkv.master.state import MasterState

__all__ = ["restore_objects"]


def restore_objects(state: "MasterState", segment_id: int, objects: Iterable[RestoredObject],
                    now: float) -> RestoreReport:
    """Rebuild committed objects from a region scan (the master lost its metadata).

    Each object's extent is claimed exactly where it lies
    (:meth:`ExtentAllocator.claim`, ``header_bytes + value_size_bytes``
    aligned) and the object becomes COMPLETE under its recorded version and
    checksum, unleased and unpinned, with no writer. Per key the newest
    version wins, across calls too: an older restored version is retired
    (its extents freed); the same version found in another segment becomes
    another replica. Versions and put tokens continue above the highest
    restored version. Claims go in ascending offset order (O(1) each on a
    fresh segment); objects reach the eviction policy oldest version first,
    so eviction after a recovery starts with the oldest objects.

    Args:
        segment_id: a mounted segment whose region the objects come from.
        objects: the live objects of one region scan, any order.
        now: master clock, seconds.

    Returns:
        What was restored and what was dropped, and why.

    Raises:
        NotFound: ``segment_id`` is not a mounted segment.
    """
    seg = state.segment_table.by_id.get(segment_id)
    if seg is None or not seg.mounted:
        raise NotFound(f"segment id {segment_id} is not mounted")
    alloc = seg.allocator
    restored: list[ObjectVersion] = []
    replicas = superseded = conflicts = invalid = restored_bytes = 0
    newest: dict[str, RestoredObject] = {}  # one object per key from this segment
    for o in objects:
        if (key_error(o.key) is not None or o.value_size_bytes < 0
                or not 0 <= o.header_bytes <= MAX_HEADER_BYTES or o.version <= 0):
            invalid += 1
            continue
        best = newest.setdefault(o.key, o)
        if best is not o:
            superseded += 1
            if o.version > best.version:
                newest[o.key] = o
    for o in sorted(newest.values(), key=lambda o: o.offset_bytes):
        old = state._objects.get(o.key)
        same = old is not None and old.version == o.version
        if old is not None and (old.version > o.version or (same and (
                old.size_bytes != o.value_size_bytes or old.checksum != o.checksum
                or any(e[0] == segment_id for e in old.extents)))):
            superseded += 1
            continue
        try:
            need = alloc.claim(o.offset_bytes, o.header_bytes + o.value_size_bytes)
        except ValueError:
            conflicts += 1
            continue
        seg.object_count += 1
        restored_bytes += need
        extent = (segment_id, o.offset_bytes, need)
        if same:
            old.extents.append(extent)  # type: ignore[union-attr]
            if old.hard_pin:  # type: ignore[union-attr]
                state._count_pinned((extent,), 1)
            replicas += 1
            continue
        if old is not None:
            state._drop_committed(old, evicted=False)
        obj = ObjectVersion(o.key, o.value_size_bytes, o.version, [extent], "", 0, now,
                            header_bytes=o.header_bytes)
        obj.state = ObjState.COMPLETE
        obj.checksum = o.checksum
        state._objects[o.key] = obj
        state.listing.added(o.key)
        restored.append(obj)
        if o.version >= state._seq:
            state._seq = o.version + 1
    for obj in sorted(restored, key=lambda ob: ob.version):
        state.tiering.track(obj)
        state.index.publish(obj)
    state.counters["objects_recovered"] += len(restored)
    return RestoreReport(len(restored), replicas, superseded, conflicts, invalid, restored_bytes)
