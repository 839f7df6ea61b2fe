"""The master's accounting invariants, verified from scratch (tests, debugging, Stat).

``check_invariants(state)`` walks every object, put, deferred version, lease and
segment of a :class:`~cxlkv.master.state.MasterState` — O(n log n), never on the
request path — and raises on the first violation of:

* per segment: ``used == sum of live extents`` (in-flight puts, committed
  objects, removed-but-leased versions), no two live extents overlap, the
  allocator's own structure is sound, ``used + free == capacity``, and
  ``object_count`` equals the live extents placed there;
* ``key count == committed objects`` (and the ListKeys index, when built, agrees);
* lease counts match the live leases; deferred versions are exactly the removed
  ones still leased; the eviction policy tracks exactly the evictable objects;
  every client's in-flight puts are live.

It reads the state's private tables on purpose: it is the state's auditor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cxlkv.master.objects import ObjectVersion, ObjState

if TYPE_CHECKING:
    from cxlkv.master.state import MasterState

__all__ = ["check_invariants"]


def check_invariants(state: "MasterState") -> None:
    """Verify all accounting invariants of ``state``; O(n log n).

    Raises:
        AssertionError: naming the first violation.
    """
    live: dict[tuple[int, int], int] = {}
    per_seg: dict[int, int] = {}

    def add(obj: ObjectVersion, where: str) -> None:
        seen: set[int] = set()
        for sid, off, n in obj.extents + obj.detached:
            if sid in seen:
                raise AssertionError(f"{where} {obj!r}: two replicas in segment {sid}")
            seen.add(sid)
            if (sid, off) in live:
                raise AssertionError(f"{where} {obj!r}: extent ({sid}, {off}) owned twice")
            if n != state.extent_bytes(obj.size_bytes + obj.header_bytes):
                raise AssertionError(f"{where} {obj!r}: extent length {n} for {obj.size_bytes} B "
                                     f"+ {obj.header_bytes} B of header")
            live[(sid, off)] = n
            per_seg[sid] = per_seg.get(sid, 0) + 1

    for key, obj in state._objects.items():
        if obj.key != key or obj.state != ObjState.COMPLETE:
            raise AssertionError(f"committed {obj!r} filed under {key!r}")
        if not obj.extents:
            raise AssertionError(f"committed {obj!r} has no replica")
        add(obj, "committed")
    pinned: dict[int, int] = {}  # segment id → bytes of committed hard-pinned replicas
    for obj in state._objects.values():
        if obj.hard_pin:
            for sid, _, n in obj.extents:
                pinned[sid] = pinned.get(sid, 0) + n
    counted = {sid: n for sid, n in state._pinned_bytes.items() if n}
    if counted != pinned:
        raise AssertionError(f"hard-pinned bytes per segment {counted} are not the committed hard-pinned "
                             f"replicas' {pinned}")
    for token, obj in state._puts.items():
        if obj.version != token or obj.state != ObjState.PROCESSING or state._pending.get(obj.key) is not obj:
            raise AssertionError(f"in-flight put {token} inconsistent: {obj!r}")
        add(obj, "in-flight")
    if len(state._pending) != len(state._puts):
        raise AssertionError("pending keys and put tokens disagree")
    for token, obj in state._fenced.items():
        if obj.version != token or obj.state != ObjState.FAILED or not obj.extents:
            raise AssertionError(f"fenced put {token} inconsistent: {obj!r}")
        if token in state._puts:
            raise AssertionError(f"fenced put {token} is also in flight")
        add(obj, "fenced")
    for token, obj in state.reservations.held.items():
        if obj.version != token or obj.state != ObjState.PROCESSING or obj.key or not obj.extents:
            raise AssertionError(f"reservation {token} inconsistent: {obj!r}")
        c = state._clients.get(obj.client_id)
        if c is None or c.reserved.get(token) is not obj:
            raise AssertionError(f"reservation {token} is not its live client's: {obj!r}")
        add(obj, "reserved")
    for c in state._clients.values():
        held = sum(e[2] for o in c.reserved.values() for e in o.extents)
        if c.reserved_bytes != held:
            raise AssertionError(f"client {c.client_id}: reserved_bytes {c.reserved_bytes} but its reservations "
                                 f"hold {held} B")
    for token, obj in state.quarantine.held.items():
        if obj.version != token or obj.state != ObjState.FAILED or not obj.extents:
            raise AssertionError(f"quarantined {token} inconsistent: {obj!r}")
        if token in state._puts or token in state._fenced or token in state.reservations.held:
            raise AssertionError(f"quarantined {token} is also live elsewhere")
        add(obj, "quarantined")
    for version, obj in state._retired.items():
        if obj.state != ObjState.REMOVED or obj.leases <= 0 or obj.version != version:
            raise AssertionError(f"deferred {obj!r} should have been freed")
        add(obj, "deferred")
    for obj in state._objects.values():
        if obj.detached and obj.leases <= 0:
            raise AssertionError(f"{obj!r}: detached replicas {obj.detached} should have been freed")
    for task in state.tasks.all():  # a move's destination is live from allocation to its end
        sid, off, n = task.destination
        if (sid, off) in live:
            raise AssertionError(f"{task!r}: destination owned twice")
        live[(sid, off)] = n
        per_seg[sid] = per_seg.get(sid, 0) + 1
        if state.tasks.by_version.get(task.obj.version) is not task:
            raise AssertionError(f"{task!r} is not indexed by its object version")
    for seg in state.segment_table.by_id.values():
        if not seg.mounted:
            if seg.segment_id in state.mounts.unmounting:  # by slices: its replicas go slice by slice
                continue
            if seg.used_bytes or seg.object_count:
                raise AssertionError(f"unmounted {seg!r} still holds extents")
            continue
        seg.allocator.check()
        mine = {off: n for (sid, off), n in live.items() if sid == seg.segment_id}
        alloc = dict(seg.allocator.extents())
        if mine != alloc:
            leaked = sorted(set(alloc) - set(mine))[:5]
            dangling = sorted(set(mine) - set(alloc))[:5]
            raise AssertionError(
                f"{seg!r}: allocator and objects disagree (leaked {leaked}, dangling {dangling})"
            )
        if seg.used_bytes != sum(mine.values()):
            raise AssertionError(f"{seg!r}: used {seg.used_bytes} != sum of live extents")
        if seg.object_count != per_seg.get(seg.segment_id, 0):
            raise AssertionError(f"{seg!r}: object_count {seg.object_count} != "
                                 f"{per_seg.get(seg.segment_id, 0)} live extents")
        if seg.used_bytes + seg.free_bytes != seg.capacity_bytes:
            raise AssertionError(f"{seg!r}: used + free != capacity")
    for sid in per_seg:
        if not state.segment_table.by_id[sid].mounted and sid not in state.mounts.unmounting:
            raise AssertionError(f"an object still has a replica in unmounted segment {sid}")
    keys = state.listing.keys
    if keys is not None and (len(keys) != len(state._objects) or any(k not in state._objects for k in keys)):
        raise AssertionError("key index and committed objects disagree")
    counts: dict[int, int] = {}
    for lease in state.leases.leases():
        counts[id(lease.obj)] = counts.get(id(lease.obj), 0) + 1
    for obj in list(state._objects.values()) + list(state._retired.values()):
        if obj.leases != counts.get(id(obj), 0):
            raise AssertionError(f"{obj!r}: lease count {obj.leases} != {counts.get(id(obj), 0)} leases")
    upper = {k for k, o in state._objects.items() if not o.hard_pin and state.tiering.has_cxl(o)}
    cold = {k for k, o in state._objects.items() if not o.hard_pin} - upper
    if not state.tiering.active:
        upper |= cold
        cold = set()
    if len(state.policy) != len(upper):
        raise AssertionError(f"eviction policy tracks {len(state.policy)} keys, {len(upper)} are evictable "
                             "with a CXL replica")
    if set(state.tiering.cold) != cold:
        raise AssertionError(f"SSD-only LRU tracks {len(state.tiering.cold)} keys, {len(cold)} objects have no "
                             "CXL replica")
    for client in state._clients.values():
        for token, obj in client.puts.items():
            if state._puts.get(token) is not obj:
                raise AssertionError(f"client {client.client_id} lists dead put {token}")
