"""MasterState: the master's metadata state machine — no gRPC, no asyncio, no clock.

Every method that depends on time takes ``now`` (seconds on the master's
monotonic clock), so tests advance time instead of sleeping. Per-key work is
constant-time dictionary work plus the O(log n)-or-better allocator; nothing on
the hot path is proportional to the number of keys (RemoveAll and
UnmountSegment are O(n) by nature). Operations take one item; the service
(:mod:`cxlkv.master.service`) runs a batch call's items one by one and answers one
result per position, so a failing item never fails the others.

Object lifecycle (DESIGN.md, master.proto)::

    put_start ──► PROCESSING ──put_end──► COMPLETE ──remove/evict/upsert──► REMOVED
                      │                                                  (freed when
                      └─put_revoke / timeout / writer expiry──► FAILED    unleased)

Space accounting is exact: an extent is live from ``put_start`` until it is
freed; a REMOVED version that is still leased keeps its extents live (deferred
free) until its last lease ends. :meth:`MasterState.check_invariants` verifies
``used == sum of live extents``, no overlap, ``free + used == capacity`` and
``key count == committed objects`` from scratch.

The state keeps the object lifecycle (puts, commits, reads, removal, frees,
sweeps). The rest lives in parts, one module each, attributes of the state that
work on its tables under the same rules (pure, ``now`` passed in)::

    registrations  master/clients.py       clientd ids, epochs, heartbeats, expiry
    quarantine     master/quarantine.py    space held for writers that may still write
    reservations   master/reservations.py  extents taken ahead of need; commit in one round trip
    mounts         master/mounts.py        run-time mounts; unmounts by slices
    tiering        master/tiering.py       demotion, promotion, DRAM caching, move tasks
    evictor        master/eviction.py      the eviction loop (policies only nominate)
    leases         master/leases.py        read leases of the RPC path
    listing        master/listing.py       the sorted key index of ListKeys
    segment_table  master/segments.py      segments and their allocators
    index          master/publish.py       the committed-object index in the region

with :mod:`~cxlkv.master.cursors` (RemoveAll and unmounts by slices),
:mod:`~cxlkv.master.restore` (objects found in a region) and
:mod:`~cxlkv.master.invariants` (the auditor). The RPC surface stays on the state:
calls that belong to a part are one-line delegates.

Not thread-safe: the service calls it from its event-loop thread only.
Counters live in one dict (:attr:`MasterState.counters`) so metrics can wrap
the state without touching it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Callable, Iterable, Sequence

from cxlkv.config import MasterConfig
from cxlkv.errors import (
    AlreadyExists, CxlkvError, InvalidArgument, InvalidKey, NoSpace, NotFound, NotReady,
    StaleToken, TooLarge, Unavailable, UnknownClient, HasLease,
)
from cxlkv.wire.keys import compile_key_pattern, key_error
from cxlkv.master.clients import Registrations
from cxlkv.master.cursors import RemoveAllCursor, UnmountCursor
from cxlkv.master.eviction import EvictionPolicy, Evictor, load_policy
from cxlkv.master.invariants import check_invariants
from cxlkv.master.leases import Lease, LeaseTable
from cxlkv.master.listing import KeyListing
from cxlkv.master.mounts import Mounts
from cxlkv.master.objects import (
    MAX_HEADER_BYTES, ClientRecord, Extent, ObjectVersion, ObjState, RegionReport, RestoredObject,
    RestoreReport, short_key as _short,
)
from cxlkv.master.publish import NoIndex, ObjectIndex
from cxlkv.master.quarantine import Quarantine, owners_of
from cxlkv.master.reservations import Reservations
from cxlkv.master.restore import restore_objects
from cxlkv.master.segments import Segment, SegmentTable, Tier, place_extents, tier_from_name
from cxlkv.master.strategies import AllocationStrategy, PlacementRequest, load_strategy
from cxlkv.master.tiering import MoveTask, Tiering

__all__ = ["MasterState", "COUNTERS"]

#: Names of :attr:`MasterState.counters` (all start at 0 and only grow).
COUNTERS = (
    "puts_started", "puts_committed", "puts_revoked", "puts_reclaimed", "upserts",
    "lease_grants", "lease_releases", "lease_expiries", "get_misses",
    "removes", "evictions", "evicted_bytes", "deferred_frees",
    "no_space", "too_large", "clients_registered", "clients_expired", "clients_deregistered",
    "segments_mounted", "segments_unmounted", "replicas_lost", "objects_lost",
    "objects_recovered", "puts_fenced", "index_hits",
    # writes in one round trip and writer fencing (docs/master.md)
    "reservations", "reservations_returned", "commits", "quarantined", "quarantine_released_bytes",
    "grants_unrecorded", "grants_recovered", "objects_damaged_dropped", "damage_reports_unverified",
    "damage_reports_ssd",
    # tiers (docs/tiers.md)
    "demotions_started", "demotions", "demotions_no_copy", "promotions_started", "promotions", "promotions_skipped",
    "dram_caches_started", "dram_caches", "moves_failed", "moves_retried", "moves_dropped",
    "moves_fenced", "moves_fence_released",
    "ssd_puts", "ssd_evictions", "dram_uncached", "ssd_copies_started", "ssd_copies",
    "tier_write_refusals",
)

_REVOKE_REASONS_KEPT = 4096


_new_tuple = tuple.__new__  # builds a NamedTuple without its Python-level __new__ (hot path)


class MasterState:
    """The master's metadata: segments, objects, leases, clients, counters.

    Args:
        config: validated master configuration.
        strategy: allocation strategy (default: loaded from ``config``).
        policy: eviction policy (default: loaded from ``config``).
        master_id: identifies this master run (changes on restart).
        id_base: first value of the version/token, epoch and lease-id counters;
            the server passes wall-clock microseconds so that they keep growing
            across master restarts.
        work_clock: measures the eviction time budget only (seconds); never
            used for lease, put or client times, which always come in as ``now``.

    Raises:
        ConfigError: unknown strategy/policy or an invalid segment in ``config``.
    """

    def __init__(
        self,
        config: MasterConfig,
        *,
        strategy: AllocationStrategy | None = None,
        policy: EvictionPolicy | None = None,
        master_id: str = "master",
        id_base: int = 1,
        work_clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.config = config
        self.master_id = master_id
        self.strategy = strategy if strategy is not None else load_strategy(config.allocation_strategy, config)
        self.policy = policy if policy is not None else load_policy(config.eviction_policy, config)
        self._work_clock = work_clock
        self.counters: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self._align = config.alignment_bytes
        self._seq = id_base  # versions (= put tokens) and epochs
        self._lease_ttl_s = config.lease_ttl_s
        self.leases = LeaseTable(config.lease_ttl_s, self._on_last_release, id_base)
        #: Every segment (mounted ones, capacities, the segments version).
        self.segment_table = SegmentTable(config.alignment_bytes, config.segments)
        # objects
        self._objects: dict[str, ObjectVersion] = {}
        #: The sorted key index of ListKeys (built while someone lists).
        self.listing = KeyListing(self._objects)
        self._pending: dict[str, ObjectVersion] = {}
        self._puts: dict[int, ObjectVersion] = {}  # insertion order == start order == timeout order
        self._retired: dict[int, ObjectVersion] = {}
        # segment id → bytes of committed hard-pinned replicas there (never evicted;
        # NO_SPACE reports them from this counter, not from a scan)
        self._pinned_bytes: dict[int, int] = {}
        self._revoked: OrderedDict[int, str] = OrderedDict()
        # token → a put revoked by put_timeout_s while its writer was still
        # registered: its extents stay allocated ("fenced") until the writer ends
        # the attempt with PutRevoke or its registration ends, so a writer that
        # is still copying never lands in space given to another object.
        self._fenced: dict[int, ObjectVersion] = {}
        #: Registrations of clientds; space quarantined for writers that may still
        #: write; extents reserved ahead of need (writes in one round trip).
        self.registrations = Registrations(self)
        self._clients = self.registrations.live  # read on every write: the registrations' table
        self.quarantine = Quarantine(self)
        self.reservations = Reservations(self)
        #: Segment mounts at run time and unmounts by slices.
        self.mounts = Mounts(self)
        #: Tiering decisions and move tasks (docs/tiers.md); the eviction loop.
        self.tiering = Tiering(self)
        self.evictor = Evictor(self)
        #: Queued and running move tasks (``tiering.tasks``).
        self.tasks = self.tiering.tasks
        #: The committed-object index in the region (master/publish.py): told of
        #: every commit and readable-replica change, and of every retirement
        #: before an extent is freed. :class:`NoIndex` until the server maps a region.
        self.index: ObjectIndex = NoIndex()
        for sc in config.segments:
            try:
                tier = tier_from_name(sc.tier)
            except ValueError as exc:
                raise InvalidArgument(f"segments[{sc.name}].tier: {exc}") from None
            self.segment_table.mount(sc.name, tier, sc.size_bytes, sc.region_uuid, sc.path)
            self.counters["segments_mounted"] += 1
        self.tiering.tiers_changed()

    # ------------------------------------------------------------------ ids
    def _next_seq(self) -> int:
        n = self._seq
        self._seq = n + 1
        return n

    # ------------------------------------------------------------- segments
    @property
    def segments_version(self) -> int:
        """Changes whenever a segment is mounted or unmounted."""
        return self.segment_table.version

    def _kept_bytes(self, seg: Segment) -> int:
        """The largest extent ``seg`` keeps past its next eviction sweep, in bytes: a CXL
        segment past ``high_watermark`` of its capacity (anything else stored or reserved
        beside the value takes it there) is drained down to ``low_watermark``, and a value
        larger than that cannot survive the drain, however recently used; so no more
        than ``low_watermark`` x capacity. An SSD tier segment (with tiering) and a
        segment under ``high_watermark = 1`` keep up to their capacity."""
        if self.config.high_watermark >= 1.0 or (seg.tier == Tier.SSD and self.tiering.has_ssd):
            return seg.capacity_bytes
        return int(self.config.low_watermark * seg.capacity_bytes)

    def _keeps(self, seg: Segment, need: int) -> bool:
        """Whether ``seg`` keeps an extent of ``need`` bytes (:meth:`_kept_bytes`)."""
        return need <= self._kept_bytes(seg)

    def _largest_kept(self) -> int:
        """The largest extent some mounted segment keeps (:meth:`_kept_bytes`), in bytes;
        DRAM tiers hold only extra copies (never a new object's home)."""
        return max((self._kept_bytes(seg) for seg in self.segment_table.mounted if seg.tier != Tier.DRAM),
                   default=0)

    def segments(self, include_unmounted: bool = False) -> list[Segment]:
        """Mounted segments in id order; with ``include_unmounted``, the current
        segment of every name (unmounted ones included)."""
        if include_unmounted:
            return self.segment_table.named()
        return list(self.segment_table.mounted)

    def segment(self, segment_id: int) -> Segment | None:
        """The segment with this id (mounted or not), or ``None``."""
        return self.segment_table.by_id.get(segment_id)

    # ----------------------------------------------------------------- puts
    def extent_bytes(self, value_size_bytes: int) -> int:
        """Extent length for a value (aligned; an empty value takes one alignment unit)."""
        a = self._align
        return (value_size_bytes + a - 1) & ~(a - 1) or a

    def put_start(
        self, client_id: str, epoch: int, key: str, value_size_bytes: int, now: float, *,
        replica_num: int = 1, upsert: bool = False, soft_pin: bool = False,
        hard_pin: bool = False, preferred_segment: str = "", header_bytes: int = 0,
    ) -> ObjectVersion:
        """Reserve space for a new object (or, with ``upsert``, a new version).

        Each extent holds ``header_bytes + value_size_bytes`` bytes (aligned): the
        writer's object header and key come first (see :mod:`cxlkv.layout.objheader`);
        ``value_size_bytes`` alone is the size users see.

        The version stays invisible until :meth:`put_end`. Replicas go on
        distinct segments in the strategy's order, best effort (at least one).
        When nothing fits, committed objects are evicted until the value fits
        (not limited by the eviction budget) and the allocation is retried once.

        Raises:
            UnknownClient, StaleToken: the writer's registration is not current.
            InvalidKey: bad key. InvalidArgument: bad size, unknown preferred segment.
            AlreadyExists: committed key without ``upsert``.
            NotReady: another live put of the key is in flight; or the region
                index has no slot left to record the put's extent (a grant: every
                extent handed to a writer is recorded, so that a master taking over
                never gives it to another object) — transient: a slot frees as soon
                as a put in flight ends, so it is a retry, not a full cache.
            TooLarge: larger than every mounted segment, or than what any keeps past its
                next eviction sweep (``low_watermark`` of a CXL segment's capacity:
                :meth:`_largest_kept`; a hard-pinned value is never evicted, so only
                the first bound applies to it); nothing evicted.
            NoSpace: no room even after eviction (the message says why).
            Unavailable: no segment is mounted.
        """
        client = self.writer(client_id, epoch, now)
        bad = key_error(key)
        if bad is not None:
            raise InvalidKey(bad, key=key[:64] if isinstance(key, str) else None)
        if value_size_bytes < 0:
            raise InvalidArgument(f"value_size_bytes must be >= 0, got {value_size_bytes}", key=key)
        if not 0 <= header_bytes <= MAX_HEADER_BYTES:
            raise InvalidArgument(
                f"header_bytes must be in [0, {MAX_HEADER_BYTES}], got {header_bytes}", key=key)
        if not upsert and key in self._objects:
            raise AlreadyExists(f"key {_short(key)} is already committed (use upsert to replace it)", key=key)
        pend = self._pending.get(key)
        if pend is not None:
            why = self._abandoned(pend, now)
            if why is None:
                raise NotReady(f"key {_short(key)}: put {pend.version} by client {pend.client_id} "
                               "is in flight", key=key)
            if self._puts.get(pend.version) is pend:  # not already revoked by a client expiry
                self._revoke(pend, why, fence=True)
                self.counters["puts_reclaimed"] += 1
        a = self._align
        need = (value_size_bytes + header_bytes + a - 1) & ~(a - 1) or a
        table = self.segment_table
        if need > table.max_capacity:
            if not table.mounted:
                raise Unavailable("no segment is mounted", key=key)
            self.counters["too_large"] += 1
            raise TooLarge(
                f"key {_short(key)}: value of {value_size_bytes} B needs {need} B with its "
                f"{header_bytes}-B object header and key (aligned to {a} B), more than the largest "
                f"segment holds ({table.max_capacity} B); nothing was evicted",
                key=key, requested_bytes=value_size_bytes,
            )
        high = self.config.high_watermark
        # A value over low_watermark of a CXL segment would be that segment's sweep's to
        # evict (see _largest_kept): placed only where it is kept (None: anywhere it fits)
        low = self.config.low_watermark
        keeps = None if high >= 1.0 or hard_pin or need <= low * table.min_capacity else self._keeps
        if keeps is not None and need > low * table.max_capacity and need > (kept := self._largest_kept()):
            self.counters["too_large"] += 1
            raise TooLarge(
                f"key {_short(key)}: value of {value_size_bytes} B needs {need} B with its object header, "
                f"more than any segment keeps: a segment past high_watermark "
                f"({self.config.high_watermark:g} of its capacity) is evicted down to low_watermark "
                f"({self.config.low_watermark:g}), which a value this large cannot fit under, so the "
                f"first sweep after anything else is stored beside it would evict it; "
                f"the most a segment keeps is {kept} B (raise low_watermark, or add a larger segment); "
                "nothing was evicted",
                key=key, requested_bytes=value_size_bytes,
            )
        if preferred_segment and table.by_name(preferred_segment) is None:
            raise InvalidArgument(f"preferred_segment {preferred_segment!r} is not a known segment", key=key)
        if replica_num < 1:
            replica_num = 1
        mounted = table.mounted
        fitting = mounted if need <= table.min_capacity else [s for s in mounted if s.capacity_bytes >= need]
        if keeps is not None:
            fitting = [s for s in fitting if keeps(s, need)]
        if self.tiering.active:  # DRAM tiers are host-local caches: never the home of a new object;
            # a tier whose filesystem refused a write waits out its backoff
            fitting = [s for s in fitting if s.tier != Tier.DRAM and s.refused_until <= now]
        request = _new_tuple(PlacementRequest, (need, replica_num, preferred_segment, 0))
        candidates = self.strategy.select(fitting, request)
        tiering = self.tiering
        if tiering.has_ssd and candidates and candidates[0].tier == Tier.CXL:
            tiering.room_in_cxl(candidates[0], need, now)
        extents = place_extents(candidates, need, replica_num)
        if not extents:
            self.evictor.until_fits(candidates, need, now)
            extents = place_extents(candidates, need, replica_num)
            if not extents:
                self.counters["no_space"] += 1
                raise self._no_space(key, value_size_bytes, need, candidates, now)
        if tiering.has_ssd:
            seg = table.by_id[extents[0][0]]
            if seg.tier == Tier.SSD:
                self.counters["ssd_puts"] += 1  # CXL had no room while demotions run
            elif seg.tier == Tier.CXL and seg.used_bytes > self.config.high_watermark * seg.capacity_bytes:
                self.evictor.drain(seg, now, self._work_clock() + self.config.evict_budget_s)
        version = self._seq
        self._seq = version + 1
        obj = ObjectVersion(
            key, value_size_bytes, version, extents, client_id, epoch, now, hard_pin,
            now + self.config.soft_pin_ttl_s if soft_pin and not hard_pin else 0.0, replica_num,
            header_bytes,
        )
        if not self.index.grant(obj):
            # No slot to record the writer's hold in: a master taking over could not know of it
            # and might give the space to another object while this writer still writes.
            obj.state = ObjState.FAILED
            self._free_extents(obj)  # and drops any replica's grant that was recorded
            self.counters["grants_unrecorded"] += 1
            raise NotReady(f"key {_short(key)}: the region index has no free slot to record this put's extent "
                           f"({len(self._puts)} puts in flight hold one each): retry when some finish, or "
                           f"format the region with a larger --expected-objects", key=key)
        self._pending[key] = obj
        self._puts[version] = obj
        client.puts[version] = obj
        self.counters["puts_started"] += 1
        return obj

    def _no_space(self, key: str, size: int, need: int, candidates: Sequence[Segment],
                  now: float) -> NoSpace:
        if not candidates:
            return NoSpace(f"key {_short(key)}: the allocation strategy offered no segment for "
                           f"{need} B", key=key, requested_bytes=size, free_bytes=0)
        best = max(candidates, key=lambda s: s.largest_free_bytes)
        # held: the segment's hard-pinned bytes (a counter) and its leased committed
        # unpinned versions (each once); in flight and deferred: those tables. Never a
        # scan of every object (this answer comes on every NO_SPACE of a full cache).
        sid = best.segment_id
        leased = {}
        for lease in self.leases.leases():
            o = lease.obj
            if o.state == ObjState.COMPLETE and not o.hard_pin:
                leased[o.version] = o
        held = self._pinned_bytes.get(sid, 0) + sum(e[2] for o in leased.values() for e in o.extents if e[0] == sid)
        inflight = sum(e[2] for o in self._puts.values() for e in o.extents if e[0] == sid)
        deferred = sum(e[2] for o in self._retired.values() for e in o.extents if e[0] == sid)
        reserved = sum(e[2] for o in self.reservations.held.values() for e in o.extents if e[0] == sid)
        quarantined = sum(e[2] for o in self.quarantine.held.values() for e in o.extents if e[0] == sid)
        return NoSpace(
            f"key {_short(key)}: no free extent of {need} B even after eviction; segment "
            f"{best.name!r} has {best.free_bytes} B free, largest free extent "
            f"{best.largest_free_bytes} B; {held} B are leased or hard-pinned, {inflight} B "
            f"in in-flight puts, {deferred} B awaiting the end of leases, {reserved} B reserved ahead "
            f"for writers (reserve_max_ratio), {quarantined} B quarantined",
            key=key, requested_bytes=size, free_bytes=best.free_bytes,
        )

    def _abandoned(self, obj: ObjectVersion, now: float) -> str | None:
        """Why an in-flight put may be revoked now, or ``None`` if it is live."""
        if now - obj.started_at >= self.config.put_timeout_s:
            return f"put timed out after {self.config.put_timeout_s:g} s"
        client = self._clients.get(obj.client_id)
        if client is None or client.epoch != obj.epoch:
            return f"writer client {obj.client_id} is gone"
        if self.registrations.overdue(client, now):
            self.registrations.expire(client, now)
            return f"writer client {obj.client_id} expired"
        return None

    def _live_put(self, client_id: str, epoch: int, key: str, token: int, now: float) -> ObjectVersion:
        obj = self._puts.get(token)
        if obj is None or obj.key != key:
            fenced = self._fenced.get(token)
            if fenced is not None and fenced.key == key and fenced.client_id == client_id:
                raise StaleToken(
                    f"key {_short(key)}: put token {token} was revoked "
                    f"({self._revoked.get(token, 'timed out')}); its space is held until this writer "
                    "ends the attempt with PutRevoke", key=key)
            why = self._revoked.get(token)
            raise StaleToken(
                f"key {_short(key)}: put token {token} is not the key's current attempt"
                + (f" ({why})" if why and obj is None else ""), key=key,
            )
        if obj.client_id != client_id:
            raise StaleToken(f"key {_short(key)}: put token {token} belongs to client {obj.client_id}",
                             key=key)
        try:
            self.writer(client_id, epoch, now)
        except UnknownClient as exc:  # it expired just now, which revoked the put
            raise StaleToken(f"key {_short(key)}: put token {token} was revoked ({exc})", key=key) from None
        if obj.epoch != epoch:  # pragma: no cover - re-registration revokes old-epoch puts
            raise StaleToken(f"key {_short(key)}: put token {token} is from epoch {obj.epoch}", key=key)
        return obj

    def put_end(self, client_id: str, epoch: int, key: str, put_token: int, now: float,
                checksum: int = 0) -> ObjectVersion:
        """Commit a put: the version becomes visible, replacing any older one.

        Raises:
            StaleToken: the token is not the key's current attempt (revoked,
                timed out, superseded, another key's or client's), or the
                writer's epoch is fenced. A put whose writer expired was revoked,
                so its late PutEnd gets StaleToken too.
            UnknownClient: the token is live but the writer just expired.
        """
        obj = self._live_put(client_id, epoch, key, put_token, now)
        del self._puts[put_token]
        del self._pending[key]
        client = self._clients[client_id]
        client.puts.pop(put_token, None)
        self._install(obj, self._objects.get(key), checksum, now)
        return obj

    def _install(self, obj: ObjectVersion, old: ObjectVersion | None, checksum: int, now: float) -> None:
        """Make ``obj`` (its writer done) its key's committed version, replacing ``old``
        (put_end and commit): published before ``old`` is retired."""
        key = obj.key
        obj.state = ObjState.COMPLETE
        obj.checksum = checksum
        self.index.ungrant(obj)  # its writer is done
        self.index.publish(obj)  # readers move to the new version before the old one's space is freed
        if old is not None:
            self._retire(old, evicted=False)
            self.counters["upserts"] += 1
        else:
            self.listing.added(key)
        self._objects[key] = obj
        if not obj.hard_pin:
            self.tiering.track(obj)
            if self.tiering.has_ssd:
                self.tiering.copy_ahead(obj, now)
        else:
            self._count_pinned(obj.extents, 1)
        self.counters["puts_committed"] += 1

    def put_revoke(self, client_id: str, epoch: int, key: str, put_token: int, now: float) -> None:
        """Abandon a put: its space returns to the free pool at once.

        Raises:
            StaleToken, UnknownClient: as for :meth:`put_end`.
        """
        held = self.quarantine.held.get(put_token)
        if held is not None and held.key in (key, "") and held.client_id in owners_of(client_id):
            # The writer of an ended registration ends its attempt itself: it has
            # stopped writing there, so that space is free to reuse. A reservation
            # carries no key (the writer named it only at PackedCommit): its
            # token and client identify it; a grant inherited from a previous master
            # is known by the client id's hash (the writer's put outlived a master).
            self.quarantine.take(put_token)
            self.counters["quarantine_released_bytes"] += sum(e[2] for e in held.extents)
            self._free_extents(held)
            raise StaleToken(f"key {_short(key)}: put token {put_token} had been revoked "
                             f"({self._revoked.get(put_token, 'its registration ended')}); its space is "
                             "freed now", key=key)
        fenced = self._fenced.get(put_token)
        if fenced is not None and fenced.key == key and fenced.client_id == client_id:
            # The writer ends an attempt the master revoked while it was still
            # writing: the space is free to reuse now. The put itself stays revoked.
            del self._fenced[put_token]
            self._free_extents(fenced)
            raise StaleToken(f"key {_short(key)}: put token {put_token} had been revoked "
                             f"({self._revoked.get(put_token, 'timed out')}); its space is freed now", key=key)
        obj = self._live_put(client_id, epoch, key, put_token, now)
        self._revoke(obj, "revoked by its writer")

    def _revoke(self, obj: ObjectVersion, why: str, *, fence: bool = False, quarantine: bool = False,
                now: float = 0.0) -> None:
        """Revoke an in-flight put. With ``fence`` (a timeout) and the writer still
        registered under the put's epoch, its extents stay allocated in
        ``_fenced`` until the writer ends the attempt or its registration ends:
        a writer that is merely slow (or stopped) may still be copying into them."""
        token, key = obj.version, obj.key
        del self._puts[token]
        if self._pending.get(key) is obj:
            del self._pending[key]
        client = self._clients.get(obj.client_id)
        if client is not None:
            client.puts.pop(token, None)
        obj.state = ObjState.FAILED
        if fence and client is not None and client.alive and client.epoch == obj.epoch and obj.extents:
            self._fenced[token] = obj
            self.counters["puts_fenced"] += 1
        elif quarantine:
            self.quarantine.hold(obj, now)
        else:
            self._free_extents(obj)
        self._revoked[token] = why
        if len(self._revoked) > _REVOKE_REASONS_KEPT:
            self._revoked.popitem(last=False)
        self.counters["puts_revoked"] += 1

    # ---------------------------------------------------------------- reads
    def get(self, client_id: str, key: str, now: float, no_lease: bool = False) -> tuple[ObjectVersion, Lease | None]:
        """Locate a committed object and (unless ``no_lease``) lease this version.

        Raises:
            InvalidKey: bad key. NotFound: absent or not yet committed.
        """
        obj = self._objects.get(key)
        if obj is None:
            self.counters["get_misses"] += 1
            raise self._missing(key)
        lease = None
        if not no_lease:
            lease = self.leases.grant(obj, client_id, now)
            self.counters["lease_grants"] += 1
        tiering = self.tiering
        if tiering.active:
            tiering.on_hit(client_id, obj, now, not no_lease)
        elif not obj.hard_pin:
            self.policy.on_hit(key)
        return obj, lease

    def report_hits(self, client_id: str, keys: Iterable[str], now: float,
                    prefixes: Iterable[tuple[Sequence[str], int]] = ()) -> int:
        """Reads served from the region's index (no lease, no RPC), reported
        afterwards in batches: each feeds the eviction policy, and with tiers the
        access statistics, as a leased read of the key would. Keys no longer
        committed (removed or evicted since) are skipped; ``client_id`` need not
        be registered (a report may arrive after its sender expired).
        ``prefixes``: the prefix queries behind the hits, ``(chain keys, matched)``
        each, handed to the policy's ``on_prefix`` after the hits.

        Returns:
            Hits applied.
        """
        objects = self._objects
        policy = self.policy
        tiering = self.tiering
        tiered = tiering.active
        n = 0
        for key in keys:
            obj = objects.get(key)
            if obj is None:
                continue
            n += 1
            if obj.hard_pin:
                continue
            if tiered:
                tiering.on_hit(client_id, obj, now)
            else:
                policy.on_hit(key)
        for chain, matched in prefixes:
            policy.on_prefix(chain, matched)
        self.counters["index_hits"] += n
        return n

    def report_damaged(self, items: Iterable[tuple[str, int]]) -> int:
        """Readers found these ``(key, version)`` destroyed under a valid lease: each
        committed version the index confirms damaged (its header or checksum no
        longer holds in the region), or held only on the SSD tier (clientds read it,
        the master cannot: the report is trusted), is dropped, so it is not listed forever; the
        others (another version by now, or not checkable) are left alone.

        Returns:
            Objects dropped.
        """
        dropped = 0
        for key, version in items:
            obj = self._objects.get(key)
            if obj is None or obj.version != version:
                continue
            verdict = self.index.damaged(obj)
            if verdict is None and self._only_on_ssd(obj):
                # SSD tier files are read by clientds (pread), never by the master: the
                # reader's verified copy, under a lease (its extent cannot be reused),
                # is the proof. Kept, the object would fail every read and promotion.
                self.counters["damage_reports_ssd"] += 1
                verdict = True
            if verdict:
                self._drop_committed(obj, evicted=False)
                dropped += 1
            elif verdict is None:
                self.counters["damage_reports_unverified"] += 1
        self.counters["objects_damaged_dropped"] += dropped
        return dropped

    def _missing(self, key: str) -> CxlkvError:
        why = key_error(key)
        if why is not None:
            return InvalidKey(why, key=key[:64] if isinstance(key, str) else None)
        if key in self._pending:
            return NotFound(f"key {_short(key)} is not committed yet (put in flight)", key=key)
        return NotFound(f"key {_short(key)} not found", key=key)

    def match_prefix(self, client_id: str, keys: Sequence[str], now: float, no_lease: bool = False,
                     release_lease_ids: Iterable[int] = ()) -> list[tuple[ObjectVersion, Lease | None]]:
        """The longest committed prefix of ``keys``, each leased (unless ``no_lease``).

        Stops at the first key that is absent, uncommitted or invalid.
        """
        self.release_leases(client_id, release_lease_ids)
        out: list[tuple[ObjectVersion, Lease | None]] = []
        objects = self._objects
        for key in keys:
            if key not in objects:
                break
            out.append(self.get(client_id, key, now, no_lease))
        self.policy.on_prefix(keys, len(out))
        return out

    def exists(self, key: str) -> bool:
        """Whether ``key`` is committed (no lease).

        Raises:
            InvalidKey: bad key.
        """
        if key in self._objects:
            return True
        why = key_error(key)
        if why is not None:
            raise InvalidKey(why, key=key[:64] if isinstance(key, str) else None)
        return False

    def release_leases(self, client_id: str, lease_ids: Iterable[int]) -> int:
        """End leases early; unknown, expired or other clients' ids are ignored.

        Returns:
            Number released.
        """
        n = 0
        release = self.leases.release
        for lease_id in lease_ids:
            if release(lease_id, client_id):
                n += 1
        self.counters["lease_releases"] += n
        return n

    # -------------------------------------------------------------- removal
    def remove(self, key: str, now: float, force: bool = False) -> None:
        """Remove a committed object (its bytes stay until its last lease ends).

        Raises:
            InvalidKey: bad key. NotFound: absent. HasLease: leased and not ``force``.
        """
        obj = self._objects.get(key)
        if obj is None:
            raise self._missing(key)
        if obj.leases and not force:
            raise HasLease(f"key {_short(key)} has {obj.leases} live lease(s); use force", key=key)
        self._drop_committed(obj, evicted=False)
        self.counters["removes"] += 1

    def remove_all(self, now: float, force: bool = False, pattern: str | None = None) -> tuple[int, int]:
        """Remove every committed object (whose key matches ``pattern``, an RE2
        pattern searched in the key, when given) in one go. In-flight puts are untouched.

        The service runs :meth:`remove_all_start` by slices instead, so that one
        call never holds the event loop; this form is for tests and tools.

        Returns:
            ``(removed, skipped_leased)``.

        Raises:
            InvalidArgument: ``pattern`` does not compile.
        """
        cursor = self.remove_all_start(force, pattern)
        while not cursor.step(now, None):
            pass
        return cursor.removed, cursor.skipped

    def remove_all_start(self, force: bool = False, pattern: str | None = None) -> RemoveAllCursor:
        """Begin a RemoveAll (with or without a pattern) to run by slices (:meth:`RemoveAllCursor.step`).

        The objects committed now are the ones considered; each is removed when its
        slice comes unless it was removed or replaced (upsert) meanwhile. Objects
        committed after this call are kept. ``pattern`` is an RE2 pattern
        (:func:`cxlkv.wire.keys.compile_key_pattern`: linear time in the key's length).

        Raises:
            InvalidArgument: ``pattern`` does not compile.
        """
        matcher = compile_key_pattern(pattern) if pattern is not None else None
        return RemoveAllCursor(self, matcher, force)

    def _only_on_ssd(self, obj: ObjectVersion) -> bool:
        """Whether every replica of ``obj`` is on an SSD tier segment."""
        by_id = self.segment_table.by_id
        return bool(obj.extents) and all(
            (seg := by_id.get(sid)) is not None and seg.tier == Tier.SSD for sid, _, _ in obj.extents)

    def _drop_committed(self, obj: ObjectVersion, evicted: bool) -> None:
        """Take a committed version out of the key space and retire it."""
        del self._objects[obj.key]
        self.listing.removed(obj.key)
        self._retire(obj, evicted)

    def _retire(self, obj: ObjectVersion, evicted: bool) -> None:
        """Mark a committed version REMOVED: free now, or when its last lease ends."""
        self.index.retire(obj)
        if not obj.hard_pin:
            self.tiering.untrack(obj, evicted)
        else:
            self._count_pinned(obj.extents, -1)
        obj.state = ObjState.REMOVED
        if obj.leases:
            self._retired[obj.version] = obj
        else:
            self._free_extents(obj)

    def _count_pinned(self, extents: Iterable[Extent], sign: int) -> None:
        """Add (``sign`` 1) or take away (-1) replicas of a committed hard-pinned
        version in the per-segment pinned bytes that NO_SPACE reports."""
        pinned = self._pinned_bytes
        for sid, _, n in extents:
            pinned[sid] = pinned.get(sid, 0) + sign * n

    def _free_extents(self, obj: ObjectVersion) -> None:
        self.index.ungrant(obj)
        segments = self.segment_table.by_id
        for sid, off, _ in obj.extents:
            seg = segments[sid]
            if seg.mounted:
                seg.allocator.free(off)
                seg.object_count -= 1
                if seg.tier == Tier.DRAM:
                    lru = self.tiering.dram_lru.get(sid)
                    if lru is not None and lru.get(obj.key) is obj:
                        del lru[obj.key]
        obj.extents = []
        if obj.detached:
            self._free_detached(obj)

    def _free_detached(self, obj: ObjectVersion) -> None:
        segments = self.segment_table.by_id
        for sid, off, _ in obj.detached:
            seg = segments[sid]
            if seg.mounted:
                seg.allocator.free(off)
                seg.object_count -= 1
        obj.detached = []

    def _on_last_release(self, obj: ObjectVersion) -> None:
        if obj.state == ObjState.REMOVED and self._retired.pop(obj.version, None) is not None:
            self._free_extents(obj)
            self.counters["deferred_frees"] += 1
        elif obj.detached:
            self._free_detached(obj)
            self.counters["deferred_frees"] += 1

    # ------------------------------------------------ calls the parts serve
    # The RPC surface stays here; each part's method documents its rules and errors.
    def register_client(self, hostname: str, name: str, pid: int, regions: Sequence[RegionReport],
                        previous_client_id: str, metrics_url: str, now: float) -> ClientRecord:
        """:meth:`Registrations.register <cxlkv.master.clients.Registrations.register>`."""
        return self.registrations.register(hostname, name, pid, regions, previous_client_id, metrics_url, now)

    def heartbeat(self, client_id: str, epoch: int, now: float) -> ClientRecord:
        """Record a heartbeat: :meth:`Registrations.writer <cxlkv.master.clients.Registrations.writer>`."""
        return self.registrations.writer(client_id, epoch, now)

    def writer(self, client_id: str, epoch: int, now: float) -> ClientRecord:
        """:meth:`Registrations.writer <cxlkv.master.clients.Registrations.writer>`."""
        return self.registrations.writer(client_id, epoch, now)

    def deregister_client(self, client_id: str, epoch: int, now: float) -> ClientRecord:
        """:meth:`Registrations.deregister <cxlkv.master.clients.Registrations.deregister>`."""
        return self.registrations.deregister(client_id, epoch, now)

    def clients(self) -> list[ClientRecord]:
        """Live clients, then recently expired ones."""
        return self.registrations.listed()

    def release_quarantine(self, client_id: str, epoch: int, upto_epoch: int, now: float,
                           keep: Iterable[int] = ()) -> int:
        """:meth:`Quarantine.release_for <cxlkv.master.quarantine.Quarantine.release_for>` (bytes freed)."""
        return self.quarantine.release_for(client_id, epoch, upto_epoch, now, keep)

    def quarantine_granted(self, segment_id: int, offset_bytes: int, length_bytes: int, put_token: int,
                           writer_hash: int, now: float) -> bool:
        """:meth:`Quarantine.hold_granted <cxlkv.master.quarantine.Quarantine.hold_granted>`."""
        return self.quarantine.hold_granted(segment_id, offset_bytes, length_bytes, put_token, writer_hash, now)

    def release_quarantine_of(self, client_id: str) -> int:
        """:meth:`Quarantine.release_of <cxlkv.master.quarantine.Quarantine.release_of>` (bytes freed)."""
        return self.quarantine.release_of(client_id)

    @property
    def quarantined_count(self) -> int:
        """Puts and reservations held for writers that may still be writing."""
        return self.quarantine.count

    @property
    def quarantined_bytes(self) -> int:
        """Bytes held for writers that may still be writing."""
        return self.quarantine.held_bytes

    def reserve(self, client_id: str, epoch: int, need_bytes: int, count: int, now: float) -> list[ObjectVersion]:
        """:meth:`Reservations.reserve <cxlkv.master.reservations.Reservations.reserve>`."""
        return self.reservations.reserve(client_id, epoch, need_bytes, count, now)

    def commit(self, client_id: str, epoch: int, key: str, put_token: int, value_size_bytes: int,
               header_bytes: int, checksum: int, now: float, *, upsert: bool = False, soft_pin: bool = False,
               hard_pin: bool = False) -> ObjectVersion:
        """:meth:`Reservations.commit <cxlkv.master.reservations.Reservations.commit>`."""
        return self.reservations.commit(client_id, epoch, key, put_token, value_size_bytes, header_bytes,
                                        checksum, now, upsert=upsert, soft_pin=soft_pin, hard_pin=hard_pin)

    def unreserve(self, client_id: str, epoch: int, put_token: int, now: float) -> None:
        """:meth:`Reservations.unreserve <cxlkv.master.reservations.Reservations.unreserve>`."""
        self.reservations.unreserve(client_id, epoch, put_token, now)

    @property
    def reserved_bytes(self) -> int:
        """Bytes clientds hold reserved ahead of need."""
        return self.reservations.held_bytes

    @property
    def reserved_count(self) -> int:
        """Extents clientds hold reserved ahead of need."""
        return self.reservations.count

    def mount_segment(self, client_id: str, epoch: int, name: str, tier: int, size_bytes: int,
                      region_uuid: str, device_path: str, now: float) -> Segment:
        """:meth:`Mounts.mount <cxlkv.master.mounts.Mounts.mount>`."""
        return self.mounts.mount(client_id, epoch, name, tier, size_bytes, region_uuid, device_path, now)

    def unmount_segment(self, name: str, now: float) -> tuple[int, int]:
        """:meth:`Mounts.unmount_by_name <cxlkv.master.mounts.Mounts.unmount_by_name>`, in one go."""
        return self.mounts.unmount_by_name(name, now)

    def unmount_start(self, name: str, now: float) -> UnmountCursor:
        """:meth:`Mounts.start <cxlkv.master.mounts.Mounts.start>`: an unmount by slices."""
        return self.mounts.start(name, now)

    def restore_objects(self, segment_id: int, objects: Iterable[RestoredObject], now: float) -> RestoreReport:
        """:func:`cxlkv.master.restore.restore_objects`."""
        return restore_objects(self, segment_id, objects, now)

    def evict_to_watermark(self, now: float, budget_s: float | None = None) -> int:
        """:meth:`Evictor.to_watermark <cxlkv.master.eviction.Evictor.to_watermark>` (objects evicted)."""
        return self.evictor.to_watermark(now, budget_s)

    def fetch_tasks(self, client_id: str, epoch: int, max_tasks: int, now: float) -> list[MoveTask]:
        """:meth:`Tiering.fetch_tasks <cxlkv.master.tiering.Tiering.fetch_tasks>`."""
        return self.tiering.fetch_tasks(client_id, epoch, max_tasks, now)

    def complete_tasks(self, client_id: str, epoch: int, results: Iterable[tuple[int, int, str]],
                       now: float) -> list[CxlkvError | None]:
        """:meth:`Tiering.complete_tasks <cxlkv.master.tiering.Tiering.complete_tasks>`."""
        return self.tiering.complete_tasks(client_id, epoch, results, now)

    @property
    def last_move_failure(self) -> str:
        """Why the last move task failed ("" if none failed), for Stat and logs."""
        return self.tiering.last_move_failure

    @property
    def last_tier_refusal(self) -> str:
        """The last time a tier was marked full (NO_SPACE from a move), one line ("" if never)."""
        return self.tiering.last_tier_refusal

    @property
    def tier_pauses(self) -> int:
        """Times a tier was paused for a full filesystem (one per backoff period)."""
        return self.tiering.tier_pauses

    # ---------------------------------------------------------------- sweep
    def sweep(self, now: float, budget_s: float | None = None) -> dict[str, int]:
        """Periodic work: client expiry, put timeouts, lease expiry (deferred
        frees), watermark eviction under the time budget.

        Returns:
            What this sweep did: ``clients_expired``, ``puts_reclaimed`` (of
            expired writers and timed out), ``leases_expired``, ``evicted``.
        """
        self.registrations.credit_stall(now)
        ttl = self.config.client_ttl_s
        reclaimed_before = self.counters["puts_reclaimed"]
        expired_clients = 0
        for client in list(self._clients.values()):
            if now - client.last_heartbeat > ttl:
                self.registrations.expire(client, now)
                expired_clients += 1
        timeout = self.config.put_timeout_s
        stale = []
        for obj in self._puts.values():  # oldest first: stop at the first live put
            if now - obj.started_at < timeout:
                break
            stale.append(obj)
        for obj in stale:
            self._revoke(obj, f"put timed out after {timeout:g} s", fence=True)
        timed_out = len(stale)
        self.counters["puts_reclaimed"] += timed_out
        reclaimed = self.counters["puts_reclaimed"] - reclaimed_before
        leases_expired = self.leases.expire(now)
        self.counters["lease_expiries"] += leases_expired
        self.quarantine.reclaim(now)
        if self.tasks:
            self.tiering.sweep_tasks(now)
        evicted = self.evictor.to_watermark(now, budget_s)
        self.listing.sweep(now)
        return {"clients_expired": expired_clients, "puts_reclaimed": reclaimed,
                "leases_expired": leases_expired, "evicted": evicted}

    # ----------------------------------------------------------- inspection
    def list_keys(self, prefix: str = "", page_size: int = 0, after: str | None = None,
                  now: float = 0.0) -> tuple[list[ObjectVersion], str | None]:
        """A ListKeys page: ``(objects, last_key)`` (:meth:`KeyListing.page`)."""
        return self.listing.page(prefix, page_size, after, now)

    def get_object(self, key: str) -> ObjectVersion | None:
        """The committed version of ``key`` (no lease, no policy hit), or ``None``."""
        return self._objects.get(key)

    @property
    def key_count(self) -> int:
        """Committed objects."""
        return len(self._objects)

    @property
    def fenced_count(self) -> int:
        """Timed-out puts whose space is held until their live writer ends them."""
        return len(self._fenced)

    @property
    def processing_count(self) -> int:
        """Puts in flight."""
        return len(self._puts)

    @property
    def deferred_count(self) -> int:
        """Removed versions whose extents wait for their last lease."""
        return len(self._retired)

    def check_invariants(self) -> None:
        """Verify all accounting invariants from scratch (:mod:`cxlkv.master.invariants`).

        Raises:
            AssertionError: naming the first violation.
        """
        check_invariants(self)

    def invariant_violation(self) -> str:
        """"" when :meth:`check_invariants` passes, else its one-line message."""
        try:
            self.check_invariants()
        except AssertionError as exc:
            return str(exc) or "invariant violated"
        return ""
