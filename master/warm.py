"""A standby that keeps the master's state warm: the index followed by diffs (docs/ha.md).

Rebuilding a master's state from the region's index costs tens of microseconds of
Python per object (a slot decoded, its extent's header read and checked, an object
built, its extent claimed): minutes at a million objects on a small VM. A standby
therefore rebuilds *ahead of need* and keeps up:

* :meth:`WarmState.refresh` copies the whole slot table out of the index region in
  one read (a few hundred MB/s even in Python: one C copy), compares it with the
  copy of the previous pass as a ``(slots, 64)`` numpy array, and applies only the
  slots that changed: objects whose slot was tombstoned or replaced leave its
  :class:`~cxlkv.master.state.MasterState` (their extents freed there), objects whose
  new slot verifies against its extent's header come in (all removals of a pass
  before any addition, so an extent freed and reused between two passes never
  conflicts). A slot caught mid-write (odd sequence word) is looked at again next
  pass.
* At takeover (:meth:`finish`, called by
  :meth:`~cxlkv.master.owner.RegionOwnership.start_index` once the region's owner
  lease is taken, the previous leader fenced), one last pass applies what changed
  since, the index writer adopts every slot, and the state's counters move above
  everything handed out before (the version floor from etcd, the wall clock). What
  the slots do not hold — extents handed to writers (grant slots) — is read at
  takeover as in a cold rebuild.

The warm state is private to the standby (its index is :class:`NoIndex` until the
takeover): nothing it does writes into the region. Thread-safety: refreshed from one
worker thread at a time (:class:`~cxlkv.master.ha.HaNode` runs passes with
``asyncio.to_thread``), never while a takeover uses it.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import numpy as np

from cxlkv.config import MasterConfig
from cxlkv.errors import CxlkvError
from cxlkv.layout.index import (
    BUCKET_SLOTS, SLOT_BYTES, SLOT_ELSEWHERE, SLOT_LIVE, _Placed, read_index_header, unpack_slot,
)
from cxlkv.master.objects import RestoredObject
from cxlkv.master.publish import NoIndex
from cxlkv.master.state import MasterState

__all__ = ["WarmState"]

log = logging.getLogger("cxlkv.master")


class WarmState:
    """A standby's copy of the master state, kept up with the index by diffs.

    Args:
        config: the master's configuration (its CXL segments with a ``path``).

    Raises:
        CxlkvError: a region cannot be mapped or has no index (the standby then
            rebuilds cold at takeover).
    """

    def __init__(self, config: MasterConfig) -> None:
        from cxlkv.layout.region import read_identity
        from cxlkv.transport import Region

        self.config = config
        self.owner_id = uuid.uuid4()
        self.master_id = self.owner_id.hex[:12]
        self.state = MasterState(config, master_id=self.master_id, id_base=time.time_ns() // 1000)
        self.state.index = NoIndex()
        #: segment id -> (mapping, identity) of every configured CXL region that has an index.
        self.regions: dict[int, tuple[Any, Any]] = {}
        self._by_uuid: dict[str, int] = {}
        self.index_region: Any = None
        self.geometry: Any = None
        try:
            for sc in config.segments:
                if sc.tier != "cxl" or not sc.path:
                    continue
                seg = self.state.segment_table.by_name(sc.name)
                if seg is None or not seg.mounted:
                    continue
                region = Region.open(sc.path)
                identity = read_identity(region)
                if identity.index is None or identity.segment_name != sc.name:
                    region.close()
                    continue
                self.state.segment_table.set_data_end(seg, identity.data_end_bytes)
                seg.region_uuid = str(identity.region_uuid)
                self.regions[seg.segment_id] = (region, identity)
                self._by_uuid[str(identity.region_uuid)] = seg.segment_id
                if self.index_region is None:
                    self.index_region, self.geometry = region, identity.index
        except BaseException:
            self.close()
            raise
        if self.index_region is None:
            self.close()
            raise CxlkvError("no configured CXL region has an index to keep warm")
        n = self.geometry.slots
        self._table = np.zeros((n, SLOT_BYTES), dtype=np.uint8)
        #: slot number -> (key, key hash, version) of the object restored from it.
        self.by_slot: dict[int, tuple[str, int, int]] = {}
        # The index writer's placement tables for those slots, kept up pass by pass so
        # a takeover hands them over in bulk instead of adopting a million slots one
        # by one (cxlkv.layout.index.IndexWriter: key hash -> _Placed, one occupancy bitmask
        # per bucket).
        self._placed: dict[int, Any] = {}
        self._used = bytearray(self.geometry.buckets)
        self.passes = 0
        self.last_pass_s = 0.0
        self.last_changed = 0

    def close(self) -> None:
        """Unmap the regions (the state is dropped with the object)."""
        for region, _ in self.regions.values():
            try:
                region.close()
            except Exception:  # noqa: BLE001 - closing must not hide another error
                pass
        self.regions = {}

    def _numbers(self) -> dict[int, int]:
        """Region number (the index's region table) -> segment id."""
        hdr = read_index_header(self.index_region, self.geometry)
        return {i: self._by_uuid[str(u)] for i, u in enumerate(hdr.region_uuids) if str(u) in self._by_uuid}

    def refresh(self) -> int:
        """One pass: apply the slots that changed since the last one; returns how many.

        Raises:
            CxlkvError: the index region cannot be read.
        """
        from cxlkv.master.recovery import _verified_key
        from cxlkv.layout.objheader import OBJECT_HEADER_BYTES, parse_header

        t0 = time.perf_counter()
        g = self.geometry
        region = self.index_region
        region.invalidate(g.table_offset_bytes, g.slots * SLOT_BYTES)
        now_tab = np.frombuffer(region.read(g.table_offset_bytes, g.slots * SLOT_BYTES),
                                dtype=np.uint8).reshape(g.slots, SLOT_BYTES)
        changed = np.flatnonzero((now_tab != self._table).any(axis=1))
        if not len(changed):
            self.passes += 1
            self.last_pass_s, self.last_changed = time.perf_counter() - t0, 0
            return 0
        numbers = self._numbers()
        st = self.state
        t = time.monotonic()
        settled: list[int] = []
        adds: dict[int, list[tuple[int, RestoredObject, int]]] = {}
        for slot_no in changed.tolist():
            raw = now_tab[slot_no].tobytes()
            slot = unpack_slot(raw)
            if slot is None and raw[0] & 1:
                continue  # being written: look again next pass
            old = self.by_slot.pop(slot_no, None)
            if old is not None:
                b, i = divmod(slot_no, BUCKET_SLOTS)
                self._used[b] &= ~(1 << i) & 0xFF
                p = self._placed.get(old[1])
                if p is not None and p.slot_no == slot_no:
                    del self._placed[old[1]]
                obj = st.get_object(old[0])
                if obj is not None and obj.version == old[2]:
                    try:
                        st.remove(old[0], t, force=True)
                    except CxlkvError:  # already gone from the warm state
                        pass
            if slot is None or not slot.flags & SLOT_LIVE or slot.flags & SLOT_ELSEWHERE:
                settled.append(slot_no)
                continue
            sid = numbers.get(slot.region_no)
            key = (_verified_key(self.regions[sid][0], slot, OBJECT_HEADER_BYTES, parse_header)
                   if sid is not None else None)
            if key is None:
                settled.append(slot_no)  # a cold rebuild empties it too
                continue
            adds.setdefault(sid, []).append((slot_no, RestoredObject(
                key, slot.extent_offset_bytes, slot.value_len_bytes, slot.header_bytes, slot.version,
                slot.value_checksum), slot.key_hash))
        for sid, items in adds.items():
            st.restore_objects(sid, [o for _, o, _ in items], t)
            for slot_no, o, h in items:
                obj = st.get_object(o.key)
                if obj is not None and obj.version == o.version:
                    settled.append(slot_no)  # a refused one is tried again next pass
                    self.by_slot[slot_no] = (o.key, h, o.version)
                    b, i = divmod(slot_no, BUCKET_SLOTS)
                    self._used[b] |= 1 << i
                    self._placed[h] = _Placed(slot_no, o.key, o.version)
        if settled:
            idx = np.asarray(settled, dtype=np.int64)
            self._table[idx] = now_tab[idx]
        self.passes += 1
        self.last_pass_s, self.last_changed = time.perf_counter() - t0, len(settled)
        return len(settled)

    def bump_counters(self, floor: int) -> None:
        """Versions, put tokens, epochs and lease ids start above ``floor`` and the wall
        clock (microseconds): above anything a previous leader handed out."""
        base = max(floor, time.time_ns() // 1000)
        st = self.state
        st._seq = max(st._seq, base)  # noqa: SLF001 - the state's id counter (master/state.py)
        st.leases._next_id = max(st.leases._next_id, base)  # noqa: SLF001

    def finish(self, ownership: Any, numbers: dict[int, int], now: float) -> dict[str, Any] | None:
        """The takeover's last pass, then the index writer adopts every slot.

        Args:
            ownership: the new leader's :class:`~cxlkv.master.owner.RegionOwnership`
                (owner lease taken, writer made; ``state.index`` is its publisher).
            numbers: segment id -> region number of the index's region table.
            now: master clock.

        Returns:
            Counts like :func:`~cxlkv.master.recovery.recover_from_index`'s, or None
            when the warm state does not match the regions the new leader owns
            (then the caller rebuilds cold).
        """
        t0 = time.perf_counter()
        try:
            same = (ownership.index_region.geometry == self.geometry
                    and {sid: rno for rno, sid in self._numbers().items()} == numbers)
        except CxlkvError:
            same = False
        if not same:
            log.warning("warm standby: the regions differ from those kept warm; rebuilding from the index")
            st = self.state
            for key in list(st._objects):  # noqa: SLF001 - empty the state for the cold rebuild
                st.remove(key, now, force=True)
            self.by_slot.clear()
            return None
        saved, self.state.index = self.state.index, NoIndex()
        try:
            changed = self.refresh()
        finally:
            self.state.index = saved
        writer = ownership.writer
        # the same as writer.adopt() of every held slot, in bulk (the writer has adopted the
        # grant slots already: its bits and entries are kept)
        writer.adopt_many(self._placed, self._used)
        # live slots the warm state does not hold (did not verify, ELSEWHERE, unmapped): emptied, as a
        # cold rebuild empties them (byte 52 of a slot: its flags, SLOT_LIVE the lowest bit)
        emptied = 0
        for slot_no in np.flatnonzero(self._table[:, 52] & SLOT_LIVE).tolist():
            if slot_no not in self.by_slot:
                writer.tombstone(slot_no)
                emptied += 1
        seconds = time.perf_counter() - t0
        counts: dict[str, Any] = {"slots": len(self.by_slot) + emptied, "restored": len(self.by_slot),
                                  "invalid": emptied, "elsewhere": 0, "unmapped": 0, "refused": 0,
                                  "warm": 1, "changed_at_takeover": changed, "seconds": seconds}
        log.info("recovery: took the warm state over (%d object(s), %d slot(s) changed since the last pass, %d "
                 "emptied); %.3f s", len(self.by_slot), changed, emptied, seconds)
        return counts
