"""Leader election among masters on etcd, and the fence a leader's every write passes.

Keys under ``etcd_prefix`` (``P``; values are JSON):

* ``P/leader`` — the leader's :class:`MasterInfo`, attached to its etcd lease:
  created only if absent (a Txn on ``create_revision == 0``); etcd deletes it when
  the lease is not renewed for its TTL (the leader died, hung or lost etcd);
* ``P/epoch`` — the owner epoch of the latest leadership term (also recorded in
  the region's owner lease, docs/index.md §12); written with a Txn guarded by the
  leader key this master created, so a deposed master cannot write it;
* ``P/meta`` — the small cluster metadata a standby needs besides the region's
  index (:class:`ClusterMeta`: segments, version floor, configuration digest);
* ``P/masters/<master_id>`` — every running master (leader and standbys) on its
  own lease, for ``cxlkv status``.

:class:`Elector` holds one etcd lease for the life of the process and renews it
every quarter of its TTL. :class:`LeaderFence` turns each renewal into a local
deadline: a renewal *sent* at monotonic time ``t`` makes the leadership valid
until ``t + 0.9 × TTL`` — before etcd (whose expiry counts from when it
*received* the renewal) can delete the leader key. The fence closes for good at
that deadline, when the leader key is deleted or changes, or when the region's
owner record names another epoch; a closed fence refuses every RPC
(:class:`~cxlkv.errors.NotLeader`) and every index write (:class:`FencedIndex`).
A leader SIGSTOPped past its lease finds, when resumed, that its monotonic clock
(which runs on while stopped) has passed the deadline: it writes nothing and
steps down. The algorithm is the lease-based fencing of Gray & Cheriton,
"Leases" (SOSP 1989) with the TTL margin of etcd's own ``concurrency.Election``
(clientv3/concurrency, which campaigns the same way: put-if-absent on a lease,
watch for the deletion).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import socket
import time
from typing import Any, Callable

from cxlkv.errors import CxlkvError, NotLeader, Unavailable
from cxlkv.master.etcd import EtcdClient, KeyValue
from cxlkv.master.objects import ObjectVersion

__all__ = ["MasterInfo", "ClusterMeta", "LeaderFence", "FencedIndex", "Elector", "Term",
           "VALIDITY_FRACTION"]

log = logging.getLogger("cxlkv.master")

#: Share of the lease TTL a renewal buys locally (the rest is the margin for the
#: renewal's travel time and clock-rate differences between hosts).
VALIDITY_FRACTION = 0.9


@dataclasses.dataclass(frozen=True)
class MasterInfo:
    """What one master says about itself in etcd.

    Attributes:
        master_id: the instance id (first 12 hex digits of its owner id).
        address: gRPC ``host:port`` clientds dial.
        host: hostname; pid: process id.
        epoch: owner epoch while leading (0 while standby).
        since_s: wall-clock time (s since the Unix epoch) of the last role change.
        role: ``"leader"`` or ``"standby"``.
        metrics_url: where its /metrics is served ("" if none).
    """

    master_id: str
    address: str
    host: str = dataclasses.field(default_factory=socket.gethostname)
    pid: int = dataclasses.field(default_factory=os.getpid)
    epoch: int = 0
    since_s: float = dataclasses.field(default_factory=time.time)
    role: str = "standby"
    metrics_url: str = ""

    def encode(self) -> bytes:
        """JSON bytes."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> "MasterInfo | None":
        """Parse; None when it is not a MasterInfo (an operator's key, an older format)."""
        try:
            d = json.loads(raw)
            return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})
        except (ValueError, TypeError, KeyError):
            return None


@dataclasses.dataclass(frozen=True)
class ClusterMeta:
    """The cluster metadata kept in etcd (``P/meta``), rewritten by the leader.

    Attributes:
        segments: ``{name, tier, size_bytes, region_uuid, path}`` of every mounted segment.
        version_floor: every version, put token and epoch the leader handed out is
            below this; a new leader starts its counters at or above it.
        config: the leader's settings that must agree across masters (allocation
            strategy, eviction policy, alignment); a standby with other settings
            logs a warning before it serves.
        updated_s: wall-clock time of the write.
    """

    segments: list[dict[str, Any]]
    version_floor: int
    config: dict[str, Any]
    updated_s: float = dataclasses.field(default_factory=time.time)

    def encode(self) -> bytes:
        """JSON bytes."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> "ClusterMeta | None":
        """Parse; None when malformed."""
        try:
            d = json.loads(raw)
            return cls(list(d["segments"]), int(d["version_floor"]), dict(d["config"]), float(d["updated_s"]))
        except (ValueError, TypeError, KeyError):
            return None


class LeaderFence:
    """Whether this master may still act as the leader (one per leadership term).

    Args:
        epoch: the term's owner epoch (0 until the region is taken).
        clock: monotonic clock, seconds.

    Once closed a fence never reopens: a new term gets a new fence.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.valid_until = 0.0
        self.epoch = 0
        self.closed = ""
        #: Calls and index writes refused since the fence closed.
        self.refused = 0
        #: Reads the epoch in the index region's owner record (set once the region is taken).
        self.region_epoch: Callable[[], int] | None = None

    def extend(self, sent_at: float, ttl_s: float) -> None:
        """A renewal sent at ``sent_at`` (monotonic) was granted ``ttl_s``."""
        if not self.closed:
            self.valid_until = max(self.valid_until, sent_at + VALIDITY_FRACTION * ttl_s)

    def close(self, reason: str) -> None:
        """Close for good (the first reason is kept)."""
        if not self.closed:
            self.closed = reason
            log.warning("leadership ended: %s; this master commits, publishes and frees nothing more", reason)

    def valid(self) -> bool:
        """Open and within the lease (monotonic clock only; a few hundred ns)."""
        if self.closed:
            return False
        if self._clock() >= self.valid_until:
            self.close("the etcd lease was not renewed in time (etcd unreachable, or this process was "
                       "stopped past its lease)")
            return False
        return True

    def check_fast(self) -> None:
        """:meth:`valid`, raising.

        Raises:
            NotLeader: the fence is closed.
        """
        if not self.valid():
            self.refused += 1
            raise NotLeader(f"this master is no longer the leader: {self.closed}")

    def check(self) -> None:
        """:meth:`check_fast` and the region's owner epoch (before every RPC; a few µs).

        Raises:
            NotLeader: the fence is closed, or another epoch is in the region.
        """
        self.check_fast()
        if self.region_epoch is not None:
            try:
                seen = self.region_epoch()
            except CxlkvError:
                return
            if seen != self.epoch:
                self.close(f"the region's owner record holds epoch {seen}, this master's is {self.epoch}")
                self.refused += 1
                raise NotLeader(f"this master is no longer the leader: {self.closed}")


class FencedIndex:
    """The state's index behind a :class:`LeaderFence`: every publish, retire,
    grant and ungrant checks the fence first (a deposed leader writes nothing into
    the region, whatever call it was in the middle of)."""

    def __init__(self, inner: Any, fence: LeaderFence) -> None:
        self.inner = inner
        self.fence = fence

    def publish(self, obj: ObjectVersion) -> None:
        """Fence, then publish."""
        self.fence.check_fast()
        self.inner.publish(obj)

    def retire(self, obj: ObjectVersion) -> None:
        """Fence, then retire."""
        self.fence.check_fast()
        self.inner.retire(obj)

    def grant(self, obj: ObjectVersion, *, ahead: bool = False) -> bool:
        """Fence, then grant."""
        self.fence.check_fast()
        return self.inner.grant(obj, ahead=ahead)

    def ungrant(self, obj: ObjectVersion) -> None:
        """Fence, then ungrant."""
        self.fence.check_fast()
        self.inner.ungrant(obj)

    def sync(self) -> None:
        """Fence, then make the writes visible."""
        self.fence.check_fast()
        self.inner.sync()

    def damaged(self, obj: ObjectVersion) -> bool | None:
        """As the inner index (reads only)."""
        return self.inner.damaged(obj)

    def usage(self) -> Any:
        """As the inner index (reads only: answers after the fence closed too)."""
        return self.inner.usage()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@dataclasses.dataclass
class Term:
    """One leadership term: the leader key this master created, and its fence."""

    create_revision: int
    fence: LeaderFence
    started_s: float = dataclasses.field(default_factory=time.monotonic)


class Elector:
    """Campaigns for ``P/leader`` on etcd and keeps this master's lease alive.

    Args:
        client: the etcd connection.
        prefix: ``etcd_prefix``.
        info: this master's :class:`MasterInfo` (role and epoch are filled in).
        ttl_s: the lease TTL asked for (etcd may raise it to its minimum).
        clock: monotonic clock.

    Thread-safety: event-loop confined.
    """

    def __init__(self, client: EtcdClient, prefix: str, info: MasterInfo, ttl_s: int, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.prefix = prefix.rstrip("/")
        self.info = info
        self.ttl_s = ttl_s
        self._clock = clock
        self.lease_id = 0
        self.granted_ttl_s = ttl_s
        #: Local deadline of the lease (monotonic), from the last renewal.
        self.lease_valid_until = 0.0
        self.term: Term | None = None
        #: The leader this master last saw (None: none / unknown).
        self.leader: MasterInfo | None = None
        self._ka = client.keepalive_stream()
        self._ka_task: asyncio.Task[None] | None = None
        self._lease_changed = asyncio.Event()
        self._warned = False
        #: Leadership terms won by this process (metrics).
        self.terms_won = 0

    # -- keys ----------------------------------------------------------------
    @property
    def leader_key(self) -> bytes:
        """``P/leader``."""
        return f"{self.prefix}/leader".encode()

    @property
    def epoch_key(self) -> bytes:
        """``P/epoch``."""
        return f"{self.prefix}/epoch".encode()

    @property
    def meta_key(self) -> bytes:
        """``P/meta``."""
        return f"{self.prefix}/meta".encode()

    @property
    def overflow_key(self) -> bytes:
        """``P/overflow``: committed objects the index has no slot for (see :func:`overflow_records`)."""
        return f"{self.prefix}/overflow".encode()

    @property
    def member_key(self) -> bytes:
        """``P/masters/<master_id>``."""
        return f"{self.prefix}/masters/{self.info.master_id}".encode()

    # -- lease ---------------------------------------------------------------
    async def start(self) -> None:
        """Grant the lease (waiting for etcd as long as it takes) and keep it alive."""
        await self._new_lease()
        self._ka_task = asyncio.get_running_loop().create_task(self._keepalive_loop(), name="etcd-keepalive")

    async def _new_lease(self) -> None:
        delay = 0.05
        while True:
            try:
                sent = self._clock()
                self.lease_id, self.granted_ttl_s = await self.client.grant(self.ttl_s)
                self.lease_valid_until = sent + VALIDITY_FRACTION * self.granted_ttl_s
                if self.granted_ttl_s != self.ttl_s:
                    log.warning("etcd raised the leader lease from %d s to %d s (its minimum: start etcd with a "
                                "shorter --heartbeat-interval/--election-timeout for a faster failover)",
                                self.ttl_s, self.granted_ttl_s)
                await self.client.put(self.member_key, self.info.encode(), lease=self.lease_id)
                if self._warned:
                    log.info("etcd reachable again: new lease %x", self.lease_id)
                self._warned = False
                self._lease_changed.set()
                return
            except Unavailable as exc:
                if not self._warned:
                    log.warning("waiting for etcd: %s", exc.message)
                    self._warned = True
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)

    async def _keepalive_loop(self) -> None:
        while True:
            period = self.granted_ttl_s / 4
            await asyncio.sleep(period)
            sent = self._clock()
            try:
                ttl = await self._ka.renew(self.lease_id, timeout_s=period)
            except Unavailable as exc:
                if not self._warned:
                    log.warning("%s (leadership lapses %.1f s after the last renewal)", exc.message,
                                VALIDITY_FRACTION * self.granted_ttl_s)
                    self._warned = True
                if self._clock() >= self.lease_valid_until:
                    self._lease_lost("etcd unreachable for longer than the lease")
                    await self._new_lease()
                continue
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug; keep renewing
                log.exception("etcd keep-alive failed")
                continue
            if ttl <= 0:
                self._lease_lost("etcd says the lease expired")
                await self._new_lease()
                continue
            if self._warned:
                log.info("etcd reachable again")
                self._warned = False
            self.lease_valid_until = sent + VALIDITY_FRACTION * ttl
            if self.term is not None:
                self.term.fence.extend(sent, ttl)

    def _lease_lost(self, why: str) -> None:
        log.warning("etcd lease %x lost: %s", self.lease_id, why)
        if self.term is not None:
            self.term.fence.close(why)
        self.lease_valid_until = 0.0

    async def close(self, *, resign: bool) -> None:
        """Stop renewing; with ``resign`` revoke the lease (the leader key goes at
        once: a standby takes over without waiting for the TTL)."""
        if self._ka_task is not None:
            self._ka_task.cancel()
            try:
                await self._ka_task
            except (asyncio.CancelledError, Exception):
                pass
            self._ka_task = None
        self._ka.close()
        if resign and self.lease_id:
            await self.client.revoke(self.lease_id)

    # -- campaign --------------------------------------------------------------
    async def campaign(self, stop: asyncio.Event) -> Term | None:
        """Wait until this master holds ``P/leader`` (or ``stop`` is set: None).

        Standbys watch the leader key and try again the moment it is deleted.
        """
        while not stop.is_set():
            if self._clock() >= self.lease_valid_until:
                await asyncio.sleep(0.05)  # the keep-alive loop is granting a new lease
                continue
            info = dataclasses.replace(self.info, role="leader", since_s=time.time())
            try:
                created, rev, cur = await self.client.create(self.leader_key, info.encode(), lease=self.lease_id)
            except Unavailable as exc:
                log.debug("campaign: %s", exc.message)
                await asyncio.sleep(0.1)
                continue
            if created:
                fence = LeaderFence(self._clock)
                fence.valid_until = self.lease_valid_until
                self.term = Term(rev, fence)
                self.leader = info
                self.terms_won += 1
                return self.term
            assert cur is not None
            self.leader = MasterInfo.decode(cur.value)
            if cur.lease == self.lease_id:  # our own key from a term that ended without resigning
                await self.client.delete_if(self.leader_key, cur.create_revision)
                continue
            await self._wait_deleted(cur, stop)
        return None

    async def _wait_deleted(self, cur: KeyValue, stop: asyncio.Event) -> None:
        """Return when the leader key ``cur`` is deleted, ``stop`` is set, our lease
        changes, or the watch breaks (the caller tries again)."""
        async def deleted() -> None:
            try:
                async for ev in self.client.watch(self.leader_key, cur.mod_revision + 1):
                    if ev.deleted:
                        return
                    self.leader = MasterInfo.decode(ev.value)
            except Unavailable as exc:
                log.debug("campaign watch: %s", exc.message)
                await asyncio.sleep(0.1)

        self._lease_changed.clear()
        tasks = [asyncio.ensure_future(deleted()), asyncio.ensure_future(stop.wait()),
                 asyncio.ensure_future(self._lease_changed.wait())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def announce(self, term: Term, info: MasterInfo, epoch: int) -> bool:
        """Record the term's epoch and this leader's address in etcd, guarded by the
        leader key (a deposed leader's write is refused); returns whether it held."""
        self.info = info
        ok = await self.client.put_if(self.leader_key, term.create_revision, [
            (self.leader_key, info.encode(), self.lease_id),
            (self.epoch_key, str(epoch).encode(), 0),
            (self.member_key, info.encode(), self.lease_id),
        ])
        if ok:
            self.leader = info
        return ok

    async def watch_term(self, term: Term, stop: asyncio.Event) -> str:
        """Return why the term ended ("" when ``stop`` was set first): the leader
        key deleted or replaced, or the fence closed (lease lapsed, region epoch)."""
        async def watcher() -> str:
            start = 0
            while True:
                try:
                    kv = await self.client.get(self.leader_key)
                    if kv is None or kv.create_revision != term.create_revision:
                        return "the leader key in etcd was deleted or is another master's"
                    start = kv.mod_revision + 1
                    async for ev in self.client.watch(self.leader_key, start):
                        if ev.deleted:
                            return "the leader key in etcd was deleted"
                except Unavailable as exc:
                    log.debug("term watch: %s", exc.message)
                await asyncio.sleep(0.1)

        async def ticker() -> str:
            while term.fence.valid():
                await asyncio.sleep(0.02)
            return term.fence.closed

        tasks = [asyncio.ensure_future(watcher()), asyncio.ensure_future(ticker()),
                 asyncio.ensure_future(stop.wait())]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for t in done:
            r = t.result()
            if isinstance(r, str):
                term.fence.close(r)
                return r
        return ""

    async def step_down(self, term: Term) -> None:
        """Delete the leader key if it is still this term's (clean stop or resign)."""
        try:
            await self.client.delete_if(self.leader_key, term.create_revision)
        except Unavailable as exc:
            log.warning("could not delete the leader key: %s", exc.message)
        self.term = None
        try:
            await self.client.put(self.member_key, dataclasses.replace(
                self.info, role="standby", epoch=0, since_s=time.time()).encode(), lease=self.lease_id)
        except Unavailable:
            pass

    # -- metadata -------------------------------------------------------------
    async def read_epoch(self) -> int:
        """``P/epoch`` (0 when absent)."""
        kv = await self.client.get(self.epoch_key)
        try:
            return int(kv.value) if kv is not None else 0
        except ValueError:
            return 0

    async def read_meta(self) -> ClusterMeta | None:
        """``P/meta`` (None when absent or malformed)."""
        kv = await self.client.get(self.meta_key)
        return ClusterMeta.decode(kv.value) if kv is not None else None

    async def write_meta(self, term: Term, meta: ClusterMeta, overflow: bytes | None = None) -> bool:
        """Write ``P/meta`` (and ``P/overflow`` when given), guarded by the leader key."""
        puts = [(self.meta_key, meta.encode(), 0)]
        if overflow is not None:
            puts.append((self.overflow_key, overflow, 0))
        return await self.client.put_if(self.leader_key, term.create_revision, puts)

    async def read_overflow(self) -> list[list[Any]]:
        """``P/overflow``'s records (``[]`` when absent or malformed)."""
        kv = await self.client.get(self.overflow_key)
        try:
            data = json.loads(kv.value) if kv is not None else []
        except ValueError:
            return []
        return [r for r in data if isinstance(r, list) and len(r) == 7] if isinstance(data, list) else []


#: Most overflowed objects recorded in etcd (an etcd value stays well under its 1.5 MiB limit).
OVERFLOW_RECORDS_MAX = 8192


def overflow_records(state: Any, writer: Any) -> list[list[Any]]:
    """The committed objects the index has no slot for (its table overflowed), as
    ``[key, segment, offset_bytes, value_bytes, header_bytes, version, checksum]``:
    a new leader restores them from these records (each checked against its
    extent's header), since a rebuild from the slots cannot see them. At most
    :data:`OVERFLOW_RECORDS_MAX`."""
    out: list[list[Any]] = []
    for key in list(getattr(writer, "_overflowed", {})):
        if len(out) >= OVERFLOW_RECORDS_MAX:
            break
        obj = state.get_object(key)
        if obj is None or not obj.extents or not obj.header_bytes:
            continue
        sid, off, _ = obj.extents[0]
        seg = state.segment(sid)
        if seg is None:
            continue
        out.append([key, seg.name, off, obj.size_bytes, obj.header_bytes, obj.version, obj.checksum])
    return out
