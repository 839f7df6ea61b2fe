"""Registrations of clientds in the master: ids, epochs, heartbeats, expiry.

A part of :class:`~cxlkv.master.state.MasterState` (pure, ``now`` passed in,
event-loop thread only). A registration is ``(client_id, epoch)``: a clientd that
registers again keeps its id under a new epoch, which fences the old one. When a
registration ends (expiry, re-registration, deregistration) its in-flight puts
are revoked and, with its reservations and fenced puts, quarantined
(:class:`~cxlkv.master.quarantine.Quarantine`): its writers may still be copying.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Sequence

from cxlkv.errors import InvalidArgument, StaleToken, UnknownClient
from cxlkv.master.objects import ClientRecord, ObjState, RegionReport
from cxlkv.master.segments import SegmentTable

if TYPE_CHECKING:
    from cxlkv.master.state import MasterState

__all__ = ["Registrations"]

_EXPIRED_CLIENTS_KEPT = 256


class Registrations:
    """Live clientd registrations, and the recently expired ones (for Stat).

    The state calls :meth:`register`, :meth:`writer` (every call of a clientd:
    it counts as a heartbeat), :meth:`deregister`, :meth:`expire` (sweeps,
    overdue writers) and :meth:`end` (a registration that stops owning its
    writes); :attr:`live` is the table the state and its parts read.
    """

    def __init__(self, state: "MasterState") -> None:
        self._st = state
        self.config = state.config
        self.counters = state.counters
        #: client id → its live registration.
        self.live: dict[str, ClientRecord] = {}
        #: Recently expired registrations, oldest first (at most 256).
        self.expired: OrderedDict[str, ClientRecord] = OrderedDict()
        self._seq_no = 0
        #: When the master last ran (monotonic; set by the server, moved by every
        #: sweep and every check of a client that looked overdue), or ``None``: the caller passes time in and no stall is
        #: credited (:meth:`credit_stall`).
        self.loop_tick: float | None = None
        #: Seconds of the master's own stalls credited to its clients so far.
        self.stall_credited_s = 0.0

    def credit_stall(self, now: float) -> float:
        """Credit the master's own stall to its clients' heartbeats.

        While the master process is stopped (SIGSTOP, a VM pause, a loop held by a
        long call) it hears no heartbeat, so on resuming every clientd looked silent
        for longer than ``client_ttl_s`` and was expired — its puts revoked, its
        reservations quarantined — although it heartbeated all along. A gap of more
        than a second beyond ``sweep_interval_s`` since the master last ran (a sweep,
        or a check of a client that looked overdue) is added to every live client's
        last heartbeat first. A partition is not a stall (the sweep keeps running),
        so silent clients still expire. Called by every sweep and before any client
        is expired (:meth:`overdue`); no-op when :attr:`loop_tick` is ``None``.

        Returns:
            The seconds credited now (0 when there was no stall).
        """
        tick = self.loop_tick
        if tick is None:
            return 0.0
        self.loop_tick = now
        gap = now - tick - self.config.sweep_interval_s
        if gap <= 1.0:
            return 0.0
        for client in self.live.values():
            client.last_heartbeat = min(now, client.last_heartbeat + gap)
        self.stall_credited_s += gap
        return gap

    def overdue(self, client: ClientRecord, now: float) -> bool:
        """Whether ``client`` has been silent past ``client_ttl_s``, once any stall of
        the master itself is credited (:meth:`credit_stall`, only when the client
        looks overdue: no cost on the calls of a live client)."""
        ttl = self.config.client_ttl_s
        if now - client.last_heartbeat <= ttl:
            return False
        self.credit_stall(now)  # the master's own pause is not the client's silence
        return now - client.last_heartbeat > ttl

    def register(
        self, hostname: str, name: str, pid: int, regions: Sequence[RegionReport],
        previous_client_id: str, metrics_url: str, now: float,
    ) -> ClientRecord:
        """Register a clientd; returns its record (``client_id``, new ``epoch``).

        Each reported region is checked against the mounted segment of that
        name: the size must equal ``size_bytes`` and the uuid the segment's (a
        segment with no uuid adopts the first one reported). With
        ``previous_client_id`` the client keeps its id under a new epoch, and
        the old registration's in-flight puts are revoked (fenced).

        Raises:
            InvalidArgument: an unknown segment, a size or uuid mismatch (the
                message names the segment, both values and the path); nothing
                changes then.
        """
        st = self._st
        adopt: dict[str, str] = {}
        for r in regions:
            seg = st.segment_table.by_name(r.segment_name)
            if seg is None or not seg.mounted:
                known = ", ".join(s.name for s in st.segment_table.mounted) or "(none)"
                raise InvalidArgument(
                    f"region at {r.device_path or '?'}: segment {r.segment_name!r} is not mounted "
                    f"on the master (mounted: {known})"
                )
            SegmentTable.check_identity(seg, r.region_uuid, r.size_bytes, r.device_path)
            if not seg.region_uuid and adopt.setdefault(seg.name, r.region_uuid) != r.region_uuid:
                raise InvalidArgument(
                    f"segment {seg.name!r}: two regions reported with uuids "
                    f"{adopt[seg.name]!r} and {r.region_uuid!r} ({r.device_path or '?'})"
                )
        for seg_name, uuid in adopt.items():
            st.segment_table.by_name(seg_name).region_uuid = uuid  # type: ignore[union-attr]
        old = self.live.get(previous_client_id) if previous_client_id else None
        if old is not None:
            self.end(old, f"client {old.client_id} re-registered (epoch {old.epoch} fenced)", now)
        if previous_client_id:
            client_id = previous_client_id
            self.expired.pop(client_id, None)
        else:
            self._seq_no += 1
            client_id = f"{st.master_id}-{self._seq_no}"
        client = ClientRecord(client_id, st._next_seq(), hostname, name, pid, metrics_url, now)
        client.mapped = {r.segment_name for r in regions}
        self.live[client_id] = client
        self.counters["clients_registered"] += 1
        return client

    def heartbeat(self, client_id: str, epoch: int, now: float) -> ClientRecord:
        """Record a heartbeat.

        Raises:
            UnknownClient: unknown or expired (register again).
            StaleToken: ``epoch`` is not the current registration's.
        """
        return self.writer(client_id, epoch, now)

    def writer(self, client_id: str, epoch: int, now: float) -> ClientRecord:
        """The live registration ``(client_id, epoch)``; expires it first if overdue.

        Any successful call of a client counts as a heartbeat.

        Raises:
            UnknownClient: unknown or expired client id.
            StaleToken: the client re-registered since (``epoch`` is fenced).
        """
        client = self.live.get(client_id)
        if client is None:
            raise UnknownClient(f"client {client_id!r} is unknown or expired: register again")
        if self.overdue(client, now):
            self.expire(client, now)
            raise UnknownClient(f"client {client_id!r} expired (no heartbeat for "
                                f"{now - client.last_heartbeat:.1f} s): register again")
        if epoch != client.epoch:
            raise StaleToken(f"client {client_id!r} epoch {epoch} is fenced (current epoch {client.epoch})")
        client.last_heartbeat = now
        return client

    def expire(self, client: ClientRecord, now: float) -> None:
        self.drop(client, f"writer client {client.client_id} expired", now)
        self.expired[client.client_id] = client
        while len(self.expired) > _EXPIRED_CLIENTS_KEPT:
            self.expired.popitem(last=False)
        self.counters["clients_expired"] += 1

    def deregister(self, client_id: str, epoch: int, now: float) -> ClientRecord:
        """End the registration ``(client_id, epoch)`` at the clientd's own word (a
        planned stop): the same clean-up as an expiry — its in-flight puts revoked
        and, with its reservations, quarantined until its next process (or
        ``writer_reclaim_s``) says its writers stopped; its DRAM tier unmounted —
        but it is counted in ``clients_deregistered``, not ``clients_expired``, and
        no longer listed by :meth:`clients`.

        Raises:
            UnknownClient: unknown or already expired (nothing to end).
            StaleToken: ``epoch`` is not the current registration's.
        """
        client = self.writer(client_id, epoch, now)
        self.drop(client, f"writer client {client_id} deregistered", now)
        self.counters["clients_deregistered"] += 1
        return client

    def drop(self, client: ClientRecord, why: str, now: float) -> None:
        st = self._st
        self.end(client, why, now)
        del self.live[client.client_id]
        for seg in list(st.segment_table.mounted):
            if seg.owner_client_id == client.client_id:
                st.mounts.unmount(seg, now)

    def end(self, client: ClientRecord, why: str, now: float = 0.0) -> None:
        """End a registration: its puts are revoked and, with its reservations and
        fenced puts, quarantined — the writer may still be copying (stopped,
        partitioned): the space is reused only once it is known to have stopped."""
        st = self._st
        client.alive = False
        for obj in list(client.puts.values()):
            st._revoke(obj, why, quarantine=True, now=now)
            self.counters["puts_reclaimed"] += 1
        client.puts.clear()
        for token, obj in list(client.reserved.items()):
            del st.reservations.held[token]
            obj.state = ObjState.FAILED
            st.quarantine.hold(obj, now)
        client.reserved.clear()
        client.reserved_bytes = 0
        if st._fenced:
            for token in [t for t, o in st._fenced.items() if o.client_id == client.client_id]:
                st.quarantine.hold(st._fenced.pop(token), now)
        st.tiering.registration_ended(client.client_id, now)

    def listed(self) -> list[ClientRecord]:
        """Live clients, then recently expired ones."""
        return list(self.live.values()) + list(self.expired.values())
