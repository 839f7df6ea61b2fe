"""Writes in one round trip: extents taken ahead of need, named at commit.

A clientd reserves CXL extents before it has values for them (:meth:`Reservations.reserve`);
a writer copies an object into one and names it in one round trip
(:meth:`Reservations.commit`) or gives it back (:meth:`Reservations.unreserve`). A
reservation is a keyless PROCESSING version owned by a registration; when the
registration ends it is quarantined. A part of
:class:`~cxlkv.master.state.MasterState` (pure, ``now`` passed in, event-loop
thread only); docs/master.md describes writes in one round trip.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cxlkv.errors import AlreadyExists, CxlkvError, InvalidArgument, InvalidKey, NotReady, StaleToken
from cxlkv.wire.keys import key_error
from cxlkv.master.objects import MAX_HEADER_BYTES, ObjectVersion, ObjState, short_key as _short
from cxlkv.master.segments import Tier, place_extents
from cxlkv.master.strategies import PlacementRequest

if TYPE_CHECKING:
    from cxlkv.master.state import MasterState

__all__ = ["Reservations"]

_new_tuple = tuple.__new__  # builds a NamedTuple without its Python-level __new__


class Reservations:
    """Extents reserved ahead of need (token → keyless PROCESSING version)."""

    def __init__(self, state: "MasterState") -> None:
        self._st = state
        self.config = state.config
        self.counters = state.counters
        #: token → a reservation (its registration's ``reserved`` lists it too).
        self.held: dict[int, ObjectVersion] = {}

    def reserve(self, client_id: str, epoch: int, need_bytes: int, count: int, now: float) -> list[ObjectVersion]:
        """Take up to ``count`` extents of ``need_bytes`` (object header and value,
        before alignment) ahead of need for a writer, in the CXL tier; each has the
        token (= version) its object will have.

        A reserved extent is owned by the writer's registration like an in-flight
        put (counted as used, never evicted); :meth:`commit` names it, in one round
        trip; :meth:`unreserve` gives it back. When the registration ends its
        reservations are quarantined (the writer may still be writing).

        Returns:
            The reservations granted (fewer than ``count`` when space ran out even
            after eviction, or the writer holds ``reserve_max_extents``; none while
            an SSD tier is mounted: puts there may land in either tier).

        Raises:
            UnknownClient, StaleToken: the writer's registration is not current.
            InvalidArgument: a size of 0 or over the largest segment.
        """
        st = self._st
        client = st.writer(client_id, epoch, now)
        a = st._align
        need = (need_bytes + a - 1) & ~(a - 1)
        table = st.segment_table
        if need_bytes <= 0 or need > table.max_capacity:
            raise InvalidArgument(f"reserve: {need_bytes} B must be > 0 and fit a segment "
                                  f"({table.max_capacity} B)")
        count = max(0, min(count, self.config.reserve_max_extents - len(client.reserved)))
        if st.tiering.has_ssd:
            # With an SSD tier a put may land there while CXL makes room by demotion
            # (put_start): reserving CXL space would evict instead. Two round trips.
            return []
        fitting = [s for s in table.mounted if s.tier == Tier.CXL and s.capacity_bytes >= need]
        if not fitting or not count:
            return []
        # bytes too, not only extents: space held ahead of need is never evicted, so
        # idle writers must not hold a cache's capacity (fewer granted: the rest of the
        # puts take the daemon's path)
        room = int(self.config.reserve_max_ratio * sum(s.capacity_bytes for s in fitting)) - client.reserved_bytes
        count = min(count, max(0, room) // need)
        if not count:
            return []
        candidates = st.strategy.select(fitting, _new_tuple(PlacementRequest, (need, 1, "", Tier.CXL)))
        out: list[ObjectVersion] = []
        for _ in range(count):
            extents = place_extents(candidates, need, 1)
            if not extents:  # full: make room for the rest of the batch at once
                st.evictor.until_fits(candidates, need, now, count - len(out))
                extents = place_extents(candidates, need, 1)
                if not extents and count - len(out) > 1:
                    st.evictor.until_fits(candidates, need, now)  # fragmented: room for this one
                    extents = place_extents(candidates, need, 1)
                if not extents:
                    break
            version = st._seq
            st._seq = version + 1
            obj = ObjectVersion("", need_bytes, version, extents, client_id, epoch, now)
            if not st.index.grant(obj, ahead=True):  # no room to record it (or the reservations'
                # share of the index is used up): a master taking over could not know of it
                obj.state = ObjState.FAILED
                st._free_extents(obj)
                break
            self.held[version] = obj
            client.reserved[version] = obj
            client.reserved_bytes += sum(e[2] for e in extents)
            out.append(obj)
        self.counters["reservations"] += len(out)
        if out:
            seg = table.by_id[out[0].extents[0][0]]
            if seg.used_bytes > self.config.high_watermark * seg.capacity_bytes:
                st.evictor.draining.add(seg.segment_id)
        return out

    def commit(self, client_id: str, epoch: int, key: str, put_token: int, value_size_bytes: int,
               header_bytes: int, checksum: int, now: float, *, upsert: bool = False, soft_pin: bool = False,
               hard_pin: bool = False) -> ObjectVersion:
        """Name a reserved extent: the writer wrote the object into it; it becomes
        ``key``'s committed version (the put in one round trip, replacing any older
        version when ``upsert``). On any error but a stale token the reservation is
        consumed (its space freed: the writer is done with it).

        Raises:
            StaleToken: not a live reservation of this registration.
            UnknownClient: the writer's registration is not current.
            InvalidKey: bad key. InvalidArgument: a size unlike the reservation's.
            AlreadyExists: committed key without ``upsert``.
            NotReady: a two-phase put of the key is in flight.
        """
        st = self._st
        client = st.writer(client_id, epoch, now)
        res = self.held.get(put_token)
        if res is None or res.client_id != client_id or res.epoch != epoch:
            raise StaleToken(f"key {_short(key)}: {put_token} is not a live reservation of client "
                             f"{client_id} epoch {epoch}", key=key if isinstance(key, str) else None)
        del self.held[put_token]
        del client.reserved[put_token]
        client.reserved_bytes -= sum(e[2] for e in res.extents)
        try:
            bad = key_error(key)
            if bad is not None:
                raise InvalidKey(bad, key=key[:64] if isinstance(key, str) else None)
            if (value_size_bytes < 0 or not 0 < header_bytes <= MAX_HEADER_BYTES
                    or value_size_bytes + header_bytes != res.size_bytes):
                raise InvalidArgument(f"key {_short(key)}: a {value_size_bytes}-B value with {header_bytes} B "
                                      f"of header does not fill reservation {put_token} of {res.size_bytes} B",
                                      key=key)
            old = st._objects.get(key)
            if old is not None and not upsert:
                raise AlreadyExists(f"key {_short(key)} is already committed (use upsert to replace it)", key=key)
            if key in st._pending:
                raise NotReady(f"key {_short(key)}: a put of it is in flight", key=key)
        except CxlkvError:
            res.state = ObjState.FAILED
            st._free_extents(res)
            raise
        obj = res
        obj.key = key
        obj.size_bytes = value_size_bytes
        obj.header_bytes = header_bytes
        obj.hard_pin = hard_pin
        obj.soft_pin_until = now + self.config.soft_pin_ttl_s if soft_pin and not hard_pin else 0.0
        st._install(obj, old, checksum, now)
        self.counters["commits"] += 1
        return obj

    def unreserve(self, client_id: str, epoch: int, put_token: int, now: float) -> None:
        """Give a reservation back (the writer will not use it); its space is freed.

        Raises:
            StaleToken: not a live reservation of this registration.
            UnknownClient: the writer's registration is not current.
        """
        st = self._st
        client = st.writer(client_id, epoch, now)
        res = self.held.get(put_token)
        if res is None or res.client_id != client_id or res.epoch != epoch:
            raise StaleToken(f"{put_token} is not a live reservation of client {client_id} epoch {epoch}")
        del self.held[put_token]
        del client.reserved[put_token]
        client.reserved_bytes -= sum(e[2] for e in res.extents)
        res.state = ObjState.FAILED
        st._free_extents(res)
        self.counters["reservations_returned"] += 1

    @property
    def held_bytes(self) -> int:
        """Bytes clientds hold reserved ahead of need."""
        return sum(e[2] for o in self.held.values() for e in o.extents)

    @property
    def count(self) -> int:
        """Extents clientds hold reserved ahead of need."""
        return len(self.held)
