"""Space held for writers that may still be writing: the master's quarantine.

When a registration ends while its writers may still copy (expired, re-registered,
its master link lost), its in-flight puts, fenced puts and reservations are
quarantined: allocated, owned by no object, until the writer is known to have
stopped — its clientd says so (:meth:`Quarantine.release_for`), an operator does
(:meth:`Quarantine.release_of`), or ``writer_reclaim_s`` passes. Extents a previous
master had granted (found in the region index at start) are held the same way
(:meth:`Quarantine.hold_granted`). A part of
:class:`~cxlkv.master.state.MasterState` (pure, ``now`` passed in, event-loop
thread only); docs/master.md describes writer fencing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable

from cxlkv.errors import InvalidArgument
from cxlkv.master.objects import ObjectVersion, ObjState

if TYPE_CHECKING:
    from cxlkv.master.state import MasterState

__all__ = ["Quarantine", "owners_of"]


def _grant_owner(writer_hash: int) -> str:
    """The owner recorded for space a previous master had granted (its writer known by hash)."""
    return f"#grant:{writer_hash:016x}"


def _client_hash(client_id: str) -> int:
    from cxlkv.layout.index import client_hash

    return client_hash(client_id)


def owners_of(client_id: str) -> tuple[str, str]:
    """The owners quarantined space of ``client_id`` is recorded under: its own id
    (taken from one of its registrations) and the owner of a grant inherited from a
    previous master (known by the hash of its client id, docs/index.md)."""
    return client_id, _grant_owner(_client_hash(client_id))


class Quarantine:
    """Quarantined versions (token → version) and when each was quarantined."""

    def __init__(self, state: "MasterState") -> None:
        self._st = state
        self.config = state.config
        self.counters = state.counters
        #: token → a FAILED version whose extents stay allocated for its writer.
        self.held: dict[int, ObjectVersion] = {}
        #: token → master clock when it was quarantined (``writer_reclaim_s``).
        self.held_at: dict[int, float] = {}

    def take(self, token: int) -> ObjectVersion | None:
        """Take ``token``'s version out of the quarantine (not freed), or ``None``."""
        self.held_at.pop(token, None)
        return self.held.pop(token, None)

    def hold(self, obj: ObjectVersion, now: float) -> None:
        if not obj.extents:
            return
        self.held[obj.version] = obj
        self.held_at[obj.version] = now
        self.counters["quarantined"] += 1

    def release_for(self, client_id: str, epoch: int, upto_epoch: int, now: float,
                           keep: Iterable[int] = ()) -> int:
        """Free the space quarantined from ``client_id``'s registrations up to
        ``upto_epoch``: the caller, that client's current registration, says every
        writer of those registrations has stopped (clientd drained its copies, or
        proved its previous process and its direct writers gone). The puts in
        ``keep`` stay quarantined: their writers (direct-mode processes) still run;
        each is freed when its writer ends it (PutRevoke) or is found dead.

        Returns:
            Bytes freed.

        Raises:
            UnknownClient, StaleToken: the caller's registration is not current.
            InvalidArgument: ``upto_epoch`` is not older than the caller's epoch.
        """
        st = self._st
        client = st.writer(client_id, epoch, now)
        if upto_epoch >= client.epoch:
            raise InvalidArgument(f"release_quarantine: epoch {upto_epoch} is not older than the current "
                                  f"registration's ({client.epoch})")
        kept = frozenset(keep)
        owners = owners_of(client_id)
        return self._release(lambda o: o.client_id in owners and o.epoch <= upto_epoch and o.version not in kept)

    def hold_granted(self, segment_id: int, offset_bytes: int, length_bytes: int, put_token: int,
                           writer_hash: int, now: float) -> bool:
        """Hold an extent a previous master had handed to a writer (a grant slot found
        in the region at start): quarantined for that writer (known by the xxh3_64
        of its client id) until its clientd says it stopped writing.

        Returns:
            False when the extent is not free here (an object restored from the
            index owns it: the grant's put was committed), so nothing is held.
        """
        st = self._st
        seg = st.segment_table.by_id.get(segment_id)
        if seg is None or not seg.mounted:
            return False
        try:
            need = seg.allocator.claim(offset_bytes, length_bytes)
        except ValueError:
            return False
        seg.object_count += 1
        obj = ObjectVersion("", need, put_token, [(segment_id, offset_bytes, need)], _grant_owner(writer_hash),
                            0, now)
        obj.state = ObjState.FAILED
        self.hold(obj, now)
        self.counters["grants_recovered"] += 1
        if put_token >= st._seq:
            st._seq = put_token + 1
        return True

    def release_of(self, client_id: str) -> int:
        """Free everything quarantined from ``client_id`` (an operator's word that
        the host is gone: ``cxlkv admin release-writer``). Returns bytes freed."""
        owners = owners_of(client_id)
        return self._release(lambda o: o.client_id in owners)

    def _release(self, match: Callable[[ObjectVersion], bool]) -> int:
        st = self._st
        freed = 0
        for token in [t for t, o in self.held.items() if match(o)]:
            obj = self.held.pop(token)
            self.held_at.pop(token, None)
            freed += sum(e[2] for e in obj.extents)
            st._free_extents(obj)
        if freed:
            self.counters["quarantine_released_bytes"] += freed
        return freed

    def reclaim(self, now: float) -> None:
        """With ``writer_reclaim_s`` > 0, free quarantined space older than that."""
        limit = self.config.writer_reclaim_s
        if not limit or not self.held:
            return
        old = {t for t, at in self.held_at.items() if now - at >= limit}
        if old:
            self._release(lambda o: o.version in old)

    @property
    def count(self) -> int:
        """Puts and reservations held for writers that may still be writing."""
        return len(self.held)

    @property
    def held_bytes(self) -> int:
        """Bytes held for writers that may still be writing."""
        return sum(e[2] for o in self.held.values() for e in o.extents)
