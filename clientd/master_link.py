"""clientd's connection to the master: registration, heartbeats, coalesced calls.

:class:`MasterLink` owns the gRPC channel to the master and the daemon's
identity there (client id, fencing epoch). It

* registers at start with the identities of the mapped regions, and registers
  again by itself when the master answers UNKNOWN_CLIENT (the registration
  expired) or reports another ``master_id`` (the master restarted);
* heartbeats every ``heartbeat_interval_s`` the master asked for;
* funnels the master work of all concurrent callers through one
  :class:`~cxlkv.clientd.batcher.Coalescer` per kind (group commit);
* releases read leases as soon as a copy is done: the ids ride on the next
  GetReplicaList / MatchPrefix call, or go out in a ReleaseLeases call
  within :data:`RELEASE_DELAY_S` if none comes.

The master's answers become the records of this module (:class:`StartedPut`,
:class:`Location`, :class:`PrefixMatch`), one per concept, read from the packed
columns of the wire form without a protobuf message per key.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from typing import Any, Callable, Iterable, NamedTuple, Sequence

import grpc

from cxlkv.clientd.batcher import Coalescer
from cxlkv.clientd.regions import RegionSet, StartupError
from cxlkv.config import ClientdConfig
from cxlkv.errors import CxlkvError, ErrorCode, Internal, NotLeader, NotReady, StaleToken, Unavailable, UnknownClient, from_rpc_error
from cxlkv.wire.keys import pack_prefix_chains
from cxlkv.wire.lean import LeanChannel, LeanConnectError, service_methods
from cxlkv.v1 import common_pb2, master_pb2, master_pb2_grpc

_MASTER_METHODS = service_methods(master_pb2.DESCRIPTOR.services_by_name["MasterService"])
#: Longest wait for DeregisterClient at a planned stop, seconds.
DEREGISTER_TIMEOUT_S = 2.0
#: Calls sent over the lean link when the master serves one: all but registration,
#: heartbeats and segment mounts, which stay on gRPC (they also prove the gRPC path
#: and are rare).
_LEAN_METHODS = frozenset(m.name for m in _MASTER_METHODS) - {
    "RegisterClient", "Heartbeat", "DeregisterClient", "MountSegment", "UnmountSegment"}

__all__ = ["MasterLink", "Located", "Location", "LocatedReplica", "PrefixMatch", "unpack_locations",
           "RELEASE_DELAY_S", "MAX_BATCH_ITEMS"]

log = logging.getLogger(__name__)

#: Longest a finished read's lease waits for a master call to ride on, in seconds.
#: Under load every release rides on the next read's call; an idle daemon sends
#: them within this delay (Remove flushes them at once, and waits for leases).
RELEASE_DELAY_S = 0.01
#: Hits read from the region's index are reported to the master within this
#: long (seconds), or at once when :data:`HITS_BATCH_MAX` are pending.
HITS_DELAY_S = 0.02
#: Most hits one ReportReads call carries.
HITS_BATCH_MAX = 8192
#: Most items in one coalesced master call.
MAX_BATCH_ITEMS = 1024
#: Concurrent coalesced calls of one kind (1: classic group commit; 2 keeps the
#: master busy while an answer travels back: 16 callers' single 4 KiB puts 5.7k ->
#: 6.9k/s, batched gets and the replay no worse). Items of one submission never
#: split across calls; calls of one kind carry independent items.
MAX_IN_FLIGHT = 2
#: Adaptive linger of coalesced calls (see :class:`~cxlkv.clientd.batcher.Coalescer`):
#: fraction of the last call's latency, and its cap in seconds.
LINGER_FRACTION = 1.0
MAX_LINGER_S = 0.002
#: gRPC message size limit towards the master, in bytes (keys may be 4 KiB each).
MAX_MESSAGE_BYTES = 64 << 20
#: gRPC reconnect backoff towards the master, in milliseconds: the first wait after
#: a failed connection, and the longest (gRPC's defaults, 1 s growing to 120 s, kept
#: clientds away for up to a minute after a restarted master was serving again).
RECONNECT_BACKOFF_INITIAL_MS = 100
RECONNECT_BACKOFF_MAX_MS = 250
#: Time one connection attempt may take, in milliseconds (gRPC's
#: ``min_reconnect_backoff_ms``: its minimum connect deadline; default 20 s).
RECONNECT_CONNECT_TIMEOUT_MS = 1000
#: While the master is unreachable, the heartbeat loop tries this often, in seconds
#: (instead of every ``heartbeat_interval_s``), so the daemon registers again as soon
#: as a restarted master serves.
RECONNECT_POLL_S = 0.1


#: Calls whose lost answer may leave space granted to this registration unseen.
_GRANTING = frozenset({"PutStart", "Reserve"})


class StartedExtent(NamedTuple):
    """Where one replica of a started put goes: ``length_bytes`` at ``offset_bytes``
    of segment ``segment_id`` (object header, key and value)."""

    segment_id: int
    offset_bytes: int
    length_bytes: int


class StartedPut(NamedTuple):
    """One started put (a position of a PutStart answer, or a reservation taken
    ahead of need): ``status`` (a ``common_pb2.Status``; code 0 = started), the
    attempt's ``put_token`` (PutEnd/PutRevoke carry it), the ``version`` it
    commits as, one extent per placed replica, and ``replicas_wanted``."""

    status: common_pb2.Status
    put_token: int
    version: int
    extents: tuple[StartedExtent, ...]
    replicas_wanted: int


_OK_STATUS = common_pb2.Status()
_UNKNOWN_CLIENT_CODE = int(ErrorCode.UNKNOWN_CLIENT)
#: Builds a NamedTuple without its Python-level ``__new__`` (a generated lambda,
#: ≈ 8 % of clientd's CPU in batched reads when called per position).
_new = tuple.__new__


def _statuses(codes: Sequence[int], error_positions: Sequence[int],
              messages: Sequence[str]) -> list[common_pb2.Status]:
    """Per-position statuses of a packed answer (one shared OK status object).

    Raises:
        Internal: the error columns disagree with the codes (a master bug): a
            message without a position, a position out of range or with code 0,
            or a failed position that is not listed.
    """
    n = len(codes)
    failed = sum(1 for c in codes if c)
    if len(error_positions) != len(messages) or len(error_positions) != failed:
        raise Internal(f"packed answer: {len(error_positions)} error positions and {len(messages)} messages "
                       f"for {failed} failed positions")
    out = [_OK_STATUS] * n
    for pos, msg in zip(error_positions, messages):
        if not 0 <= pos < n or not codes[pos]:
            raise Internal(f"packed answer: error position {pos} is out of range or not failed")
        out[pos] = common_pb2.Status(code=codes[pos], message=msg)  # type: ignore[arg-type]
    return out


def unpack_put_starts(resp: master_pb2.PutStartResponse) -> list[StartedPut]:
    """A PutStartResponse as one :class:`StartedPut` per position.

    Raises:
        Internal: the columns disagree in length (a master bug).
    """
    codes = resp.codes
    n = len(codes)
    counts = resp.extent_counts
    sids, offs, lens = resp.segment_ids, resp.offsets_bytes, resp.lengths_bytes
    if not (len(resp.put_tokens) == len(resp.versions) == len(counts) == len(resp.replicas_wanted) == n) \
            or not (len(sids) == len(offs) == len(lens) == sum(counts)):
        raise Internal(f"PutStartResponse columns disagree ({n} codes, {len(counts)} extent "
                       f"counts, {len(sids)} extents)")
    statuses = _statuses(codes, resp.error_positions, resp.messages)
    tokens, versions, wanted = resp.put_tokens, resp.versions, resp.replicas_wanted
    out: list[StartedPut] = []
    j = 0
    for i in range(n):
        c = counts[i]
        if c == 1:
            exts: tuple[StartedExtent, ...] = (_new(StartedExtent, (sids[j], offs[j], lens[j])),)
        else:
            exts = tuple(_new(StartedExtent, (sids[k], offs[k], lens[k])) for k in range(j, j + c))
        j += c
        out.append(_new(StartedPut, (statuses[i], tokens[i], versions[i], exts, wanted[i])))
    return out


class LocatedReplica(NamedTuple):
    """One readable replica of a located object: ``length_bytes`` at ``offset_bytes``
    of segment ``segment_id``, in ``tier`` (a ``common_pb2.Tier`` value)."""

    segment_id: int
    offset_bytes: int
    length_bytes: int
    tier: int


class Location(NamedTuple):
    """One located object (a position of a GetReplicaList or MatchPrefix answer):
    ``status`` (a ``common_pb2.Status``; code 0 = found), ``value_size_bytes``,
    ``version``, its readable replicas best first, the read lease (``lease_id`` 0:
    none) lasting ``lease_ttl_ms`` from the call, the value's ``checksum`` (0:
    none) and ``header_bytes`` before the value in each extent."""

    status: common_pb2.Status
    value_size_bytes: int
    version: int
    replicas: tuple[LocatedReplica, ...]
    lease_id: int
    lease_ttl_ms: int
    checksum: int
    header_bytes: int


class PrefixMatch(NamedTuple):
    """One query of a prefix match: ``keys[:matched]`` are located (and leased)."""

    matched: int
    locations: list[Location]


def unpack_locations(resp: master_pb2.Locations) -> list[Location]:
    """A Locations answer as one :class:`Location` per position.

    Raises:
        Internal: the columns disagree in length (a master bug).
    """
    codes = resp.codes
    n = len(codes)
    counts = resp.replica_counts
    sids, offs, lens, tiers = resp.segment_ids, resp.offsets_bytes, resp.lengths_bytes, resp.tiers
    sizes, versions, leases, ttls = resp.value_size_bytes, resp.versions, resp.lease_ids, resp.lease_ttl_ms
    checksums, hbytes = resp.checksums, resp.header_bytes
    if not (len(sizes) == len(versions) == len(leases) == len(ttls) == len(checksums) == len(hbytes)
            == len(counts) == n) or not (len(sids) == len(offs) == len(lens) == len(tiers) == sum(counts)):
        raise Internal(f"Locations columns disagree ({n} codes, {len(counts)} replica counts, "
                       f"{len(sids)} replicas)")
    statuses = _statuses(codes, resp.error_positions, resp.messages)
    out: list[Location] = []
    j = 0
    for i in range(n):
        c = counts[i]
        if c == 1:
            reps: tuple[LocatedReplica, ...] = (_new(LocatedReplica, (sids[j], offs[j], lens[j], tiers[j])),)
        else:
            reps = tuple(_new(LocatedReplica, (sids[k], offs[k], lens[k], tiers[k])) for k in range(j, j + c))
        j += c
        out.append(_new(Location, (statuses[i], sizes[i], versions[i], reps, leases[i], ttls[i], checksums[i],
                                   hbytes[i])))
    return out


class Located:
    """Locations from one GetReplicaList call and when it was sent.

    A sequence for the :class:`~cxlkv.clientd.batcher.Coalescer` (``len``, slices),
    without a tuple per item. ``t0`` (monotonic seconds, taken before the call)
    starts every lease's clock: a lease of ``lease_ttl_ms`` surely lasts until
    ``t0 + lease_ttl_ms / 1000``.
    """

    __slots__ = ("locations", "t0")

    def __init__(self, locations: Sequence[Location], t0: float) -> None:
        self.locations = locations
        self.t0 = t0

    def __len__(self) -> int:
        return len(self.locations)

    def __getitem__(self, s: slice) -> "Located":
        return Located(self.locations[s], self.t0)


class MasterLink:
    """The daemon's session with the master.

    Args:
        cfg: the daemon's configuration (``master_address``, ``master_timeout_s``, ``name``).
        regions: the mapped regions (their identities are registered; segment ids bound).
        metrics_url: where this daemon's /metrics is served ("" if none).
        clock: monotonic clock in seconds (tests may pass their own).

    Thread-safety: event-loop confined.
    """

    def __init__(
        self,
        cfg: ClientdConfig,
        regions: RegionSet,
        *,
        metrics_url: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg = cfg
        self.regions = regions
        self.metrics_url = metrics_url
        self.clock = clock
        #: Every master the daemon may follow (``master_address`` split at commas; docs/ha.md).
        self.addresses = cfg.master_addresses or [cfg.master_address]
        self.address = self.addresses[0]
        #: Times the daemon moved to another master of ``addresses``.
        self.master_switches = 0
        self.client_id = ""
        self.epoch = 0
        self.master_id = ""
        self._lean: LeanChannel | None = None
        #: Client TLS context of the lean link (``None``: plaintext).
        self._ssl: Any = None
        self.segments: list[common_pb2.SegmentInfo] = []
        self.segments_version = 0
        self.heartbeat_interval_s = 1.0
        self.client_ttl_s = 10.0
        self.lease_ttl_s = 5.0
        #: Grows by one on every successful registration.
        self.generation = 0
        self._connected = False
        #: Called with the new value whenever :attr:`connected` changes (clientd's
        #: health follows it: NOT_SERVING while the master is lost).
        self.on_connected: list[Callable[[bool], None]] = []
        self._registered = asyncio.Event()
        self._register_lock = asyncio.Lock()
        self._closed = False
        self._channel: grpc.aio.Channel | None = None
        self._stub: Any = None
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._pending_releases: list[int] = []
        self._release_handle: asyncio.TimerHandle | None = None
        self._pending_hits: list[str] = []
        self._pending_chains: list[tuple[list[str], int]] = []  # prefix queries behind the hits
        self._pending_chain_keys = 0
        self._hits_handle: asyncio.TimerHandle | None = None
        #: Hits reports dropped because the master could not be reached (counted, never retried).
        self.hits_dropped = 0
        #: Called after every registration with ``(first, old_epoch, old_generation)``:
        #: the registration that ended (epoch 0 on the first) — clientd then frees
        #: its quarantined space once its writers are known to have stopped.
        self.on_registered: list[Callable[[bool, int, int], None]] = []
        #: The region holding the index the master publishes ("" = none) and its epoch (docs/index.md).
        self.index_region_uuid = ""
        self.index_epoch = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._warned_unavailable = False

        # Items are plain tuples; the request is built once per call (no message copies).
        #: Items: ``(key, value_size_bytes, options or None, header_bytes)``.
        self.put_start: Coalescer[tuple[str, int, Any, int], StartedPut] = Coalescer(
            "PutStart", self._send_put_start, max_items=MAX_BATCH_ITEMS, max_in_flight=MAX_IN_FLIGHT,
            linger_fraction=LINGER_FRACTION, max_linger_s=MAX_LINGER_S)
        self.put_end: Coalescer[tuple[str, int, int], common_pb2.Status] = Coalescer(
            "PutEnd", self._send_put_end, max_items=MAX_BATCH_ITEMS, max_in_flight=MAX_IN_FLIGHT,
            linger_fraction=LINGER_FRACTION, max_linger_s=MAX_LINGER_S)
        #: Items: ``(key, put_token, value_size_bytes, header_bytes, checksum, flags)`` (reservations).
        self.commit: Coalescer[tuple[str, int, int, int, int, int], common_pb2.Status] = Coalescer(
            "Commit", self._send_commit, max_items=MAX_BATCH_ITEMS, max_in_flight=MAX_IN_FLIGHT,
            linger_fraction=LINGER_FRACTION, max_linger_s=MAX_LINGER_S)
        self.put_revoke: Coalescer[tuple[str, int, int], common_pb2.Status] = Coalescer(
            "PutRevoke", self._send_put_revoke, max_items=MAX_BATCH_ITEMS, max_in_flight=MAX_IN_FLIGHT,
            linger_fraction=LINGER_FRACTION, max_linger_s=MAX_LINGER_S)
        self.locate: Coalescer[str, Location] = Coalescer(
            "GetReplicaList", self._send_locate, max_items=MAX_BATCH_ITEMS, max_in_flight=MAX_IN_FLIGHT,
            linger_fraction=LINGER_FRACTION, max_linger_s=MAX_LINGER_S)
        self.exist: Coalescer[str, tuple[bool, common_pb2.Status]] = Coalescer(
            "ExistKey", self._send_exist, max_items=MAX_BATCH_ITEMS, max_in_flight=MAX_IN_FLIGHT,
            linger_fraction=LINGER_FRACTION, max_linger_s=MAX_LINGER_S)
        self.match_prefix: Coalescer[list[str], tuple[PrefixMatch, float]] = Coalescer(
            "MatchPrefix", self._send_match_prefix, max_items=MAX_BATCH_ITEMS,
            weight=lambda q: max(1, len(q)))  # the master counts every query's keys
        self.remove = {
            force: Coalescer(f"Remove(force={force})",
                             lambda keys, f=force: self._send_remove(keys, f), max_items=MAX_BATCH_ITEMS, max_in_flight=MAX_IN_FLIGHT,
            linger_fraction=LINGER_FRACTION, max_linger_s=MAX_LINGER_S)
            for force in (False, True)
        }

    # -- lifecycle ----------------------------------------------------------
    @property
    def connected(self) -> bool:
        """Whether the last call to the master got through."""
        return self._connected

    @connected.setter
    def connected(self, value: bool) -> None:
        if value == self._connected:
            return
        self._connected = value
        for cb in self.on_connected:
            try:
                cb(value)
            except Exception:  # a bug in a callback must not fail the call that noticed
                log.exception("connection callback failed")

    @property
    def registered(self) -> bool:
        """Whether the daemon holds a registration (it may have expired unnoticed)."""
        return self._registered.is_set()

    def commit_route(self) -> tuple[str, str, int] | None:
        """Where a direct-mode writer may commit reservations of this registration
        itself: ``(master lean host:port, client_id, epoch)``, or ``None`` — not
        registered, no lean link, the link uses TLS (the writer holds no
        identity of the cluster's: it commits through the daemon then), or several
        masters (the daemon follows the leader; a writer would wait on a stopped one)."""
        lean = self._lean
        if (lean is None or self._ssl is not None or not self.registered or not self.client_id
                or len(self.addresses) > 1):
            return None
        if lean.unix_path:
            return f"unix:{lean.unix_path}", self.client_id, self.epoch
        host = lean.host if ":" not in lean.host else f"[{lean.host}]"
        return f"{host}:{lean.port}", self.client_id, self.epoch

    def coalescers(self) -> list[Coalescer[Any, Any]]:
        """Every coalescer, for stats."""
        return [self.put_start, self.put_end, self.commit, self.put_revoke, self.locate, self.exist,
                self.match_prefix, *self.remove.values()]

    async def start(self) -> None:
        """Open the channel and register, waiting for the master as long as it takes.

        Raises:
            StartupError: the master refused the registration for a reason other
                than being unreachable (e.g. a region that is not the master's segment).
        """
        self._open_channel()
        delay = 0.05
        while not self._closed:
            try:
                await self._register(first=True, timeout=self._register_timeout())
                break
            except Unavailable as exc:
                if not self._warned_unavailable:
                    log.warning("waiting for the master at %s: %s", self.address, exc.message)
                    self._warned_unavailable = True
                if len(self.addresses) > 1:
                    await self._next_master()
                    delay = 0.05 if self.master_switches % len(self.addresses) else min(delay * 2, 0.5)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
            except CxlkvError as exc:
                raise StartupError(f"the master at {self.address} refused registration: {exc.message}") from None
        self._heartbeat_task = asyncio.get_running_loop().create_task(self._heartbeat_loop())

    def _register_timeout(self) -> float | None:
        """With several masters, a registration that hangs (a stopped master whose
        port still accepts) gives up soon, so the next master is tried."""
        return min(self.cfg.master_timeout_s, 1.0) if len(self.addresses) > 1 else None

    async def _next_master(self) -> None:
        """Move to the next master of ``addresses`` (its channel; registration follows)."""
        old = self._channel
        i = self.addresses.index(self.address) if self.address in self.addresses else -1
        self.address = self.addresses[(i + 1) % len(self.addresses)]
        self.master_switches += 1
        if self._lean is not None:
            self._lean.close()
            self._lean = None
        self._open_channel()
        if old is not None:
            await old.close()

    def _open_channel(self) -> None:
        options = [
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.enable_http_proxy", 0),
            ("grpc.keepalive_time_ms", 10_000),
            # Back within a second of a restarted master serving, whatever the
            # outage's length: gRPC's default backoff grows to 120 s between attempts.
            ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_INITIAL_MS),
            ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MAX_MS),
            ("grpc.min_reconnect_backoff_ms", RECONNECT_CONNECT_TIMEOUT_MS),
        ]
        tls = self.cfg.tls
        if tls.enabled:
            from cxlkv.wire.tls import client_context, grpc_channel_credentials

            self._ssl = client_context(tls)
            self._channel = grpc.aio.secure_channel(self.address, grpc_channel_credentials(tls), options=options)
        else:
            self._channel = grpc.aio.insecure_channel(self.address, options=options)
        self._stub = master_pb2_grpc.MasterServiceStub(self._channel)

    async def close(self, *, deregister: bool = False) -> None:
        """Release pending leases, stop heartbeats and close the channel.

        Args:
            deregister: end the registration on the master too (a planned stop:
                not counted as an expiry, no longer listed); a master that is
                known lost, or does not answer within :data:`DEREGISTER_TIMEOUT_S`,
                lets it expire instead (a stop never waits longer for it).
        """
        if self._closed:
            return
        self._closed = True
        if self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
            try:
                await self._heartbeat_task
            except (asyncio.CancelledError, Exception):
                pass
        for c in self.coalescers():
            await c.drain()
        if self._release_handle is not None:
            self._release_handle.cancel()
            self._release_handle = None
        if self._hits_handle is not None:
            self._hits_handle.cancel()
            self._hits_handle = None
        if (self._pending_hits or self._pending_chains) and self.registered:
            await self._flush_hits()
        if self._pending_releases and self.registered:
            try:
                await self._flush_releases()
            except CxlkvError:
                pass
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if deregister and self.registered and self.connected:  # a master known lost: let it expire
            await self._deregister()
        if self._lean is not None:
            self._lean.close()
        if self._channel is not None:
            await self._channel.close()

    async def _deregister(self) -> None:
        try:
            await self._raw("DeregisterClient",
                            master_pb2.DeregisterClientRequest(client_id=self.client_id, epoch=self.epoch),
                            timeout=min(self.cfg.master_timeout_s, DEREGISTER_TIMEOUT_S))
        except CxlkvError as exc:  # unreachable or already expired: the registration expires or is gone
            log.warning("deregistration from the master at %s failed (%s); it expires after client_ttl_s",
                        self.address, exc.message)
        else:
            log.info("deregistered from the master at %s (%s)", self.address, self.client_id)
        self._registered.clear()

    # -- registration -------------------------------------------------------
    async def _register(self, *, first: bool = False, timeout: float | None = None) -> None:
        req = master_pb2.RegisterClientRequest(
            hostname=socket.gethostname(),
            name=self.cfg.name,
            pid=os.getpid(),
            regions=self.regions.identities(),
            previous_client_id=self.client_id,
            metrics_url=self.metrics_url,
        )
        resp = await self._raw("RegisterClient", req, timeout=timeout)
        problems = self.regions.bind(resp.segments)
        if problems:
            if first:
                raise StartupError(problems[0])
            for p in problems:
                log.error("after re-registration: %s; reads and writes there fail", p)
        was = self.master_id
        old_epoch, old_gen = (self.epoch if resp.client_id == self.client_id else 0), self.generation
        self.client_id = resp.client_id
        self.epoch = resp.epoch
        self.master_id = resp.master_id
        self.segments = list(resp.segments)
        self.heartbeat_interval_s = resp.heartbeat_interval_s or 1.0
        self.client_ttl_s = resp.client_ttl_s or 10.0
        self.lease_ttl_s = resp.lease_ttl_s or 5.0
        self._use_lean(resp.lean_port, resp.lean_socket_path)
        self.index_region_uuid = resp.index_region_uuid
        self.index_epoch = resp.index_epoch
        await self._mount_local()
        self.generation += 1
        self._registered.set()
        self._warned_unavailable = False
        for cb in self.on_registered:
            try:
                cb(first, old_epoch, old_gen)
            except Exception:  # a bug in a callback must not undo the registration
                log.exception("registration callback failed")
        if first:
            log.info(
                "registered with master %s (%s) as %s, epoch %d; %d segment(s), %d mapped here",
                self.address, resp.master_id, resp.client_id, resp.epoch, len(resp.segments),
                sum(1 for s in resp.segments if self.regions.by_segment_id(s.segment_id)),
            )
        else:
            log.info(
                "re-registered with master %s as %s, epoch %d%s", self.address, resp.client_id,
                resp.epoch, " (master restarted)" if was and was != resp.master_id else "",
            )

    async def _mount_local(self) -> None:
        """Mount this daemon's DRAM tier on the master (after every registration:
        the master drops it when the registration expires), then bind it."""
        m = self.regions.local()
        if m is None:
            return
        req = master_pb2.MountSegmentRequest(
            client_id=self.client_id, epoch=self.epoch, name=m.segment, tier=common_pb2.DRAM,
            size_bytes=m.size_bytes, region_uuid=str(m.identity.region_uuid), device_path=m.path)
        try:
            await self._raw("MountSegment", req)
            listing = await self._raw("ListSegments", master_pb2.ListSegmentsRequest())
        except CxlkvError as exc:
            log.error("DRAM tier %s not mounted: %s", m.segment, exc.message)
            return
        self.regions.bind(listing.segments)
        self.segments = [s for s in listing.segments if s.mounted]

    def _use_lean(self, port: int, unix_path: str = "") -> None:
        """Send hot-path calls over the master's lean framing when it serves one
        (a Python gRPC call costs 0.5-1 ms of CPU on each side; a lean one a tenth):
        on its Unix socket when it serves one and its address is a loopback one
        (the same host; about half a TCP loopback round trip), else on its TCP port."""
        host = self.address.rsplit(":", 1)[0].strip("[]")
        if self._ssl is not None or not _is_loopback(host):
            unix_path = ""  # a path of the master's host means nothing here
        if self._lean is not None and self._lean.port == port and self._lean.unix_path == unix_path:
            return
        if self._lean is not None:
            self._lean.close()
            self._lean = None
        if port:
            self._lean = LeanChannel(host, port, _MASTER_METHODS, ssl=self._ssl, unix_path=unix_path)
            log.info("lean link to the master on %s%s", unix_path or f"{host}:{port}",
                     " (mutual TLS)" if self._ssl else "")

    async def reregister(self, seen_generation: int) -> None:
        """Register again unless another caller already did since ``seen_generation``.

        Raises:
            Unavailable: the master is unreachable.
            CxlkvError: the master refused.
        """
        async with self._register_lock:
            if self.generation != seen_generation or self._closed:
                return
            self._registered.clear()
            await self._register(timeout=self._register_timeout())

    async def _follow_leader(self, gen: int) -> None:
        """With several masters: the current one is unreachable or not the leader;
        try the next one and register there (the caller retries on the next tick)."""
        async with self._register_lock:
            if self.generation != gen or self._closed:
                return
            await self._next_master()
            self._registered.clear()
            try:
                await self._register(timeout=self._register_timeout())
            except Unavailable:
                return
            log.warning("now following master %s (%s)", self.address, self.master_id)

    async def _heartbeat_loop(self) -> None:
        while not self._closed:
            # Unreachable master: poll quickly, to be back within a second of its return.
            await asyncio.sleep(self.heartbeat_interval_s if self.connected
                                else min(self.heartbeat_interval_s, RECONNECT_POLL_S))
            gen = self.generation
            try:
                if len(self.addresses) > 1 and not self.connected:
                    await self._follow_leader(gen)
                    continue
                if not self.registered:
                    await self.reregister(gen)
                    continue
                resp = await self._raw(
                    "Heartbeat",
                    master_pb2.HeartbeatRequest(client_id=self.client_id, epoch=self.epoch),
                    timeout=max(2 * self.heartbeat_interval_s, 0.5),
                )
                if resp.master_id and self.master_id and resp.master_id != self.master_id:
                    log.warning("master %s restarted (id %s → %s); registering again",
                                self.address, self.master_id, resp.master_id)
                    await self.reregister(gen)
                elif resp.segments_version != self.segments_version:
                    await self._refresh_segments(resp.segments_version)
            except (UnknownClient, StaleToken):
                log.warning("the master no longer knows this clientd (expired or fenced); registering again")
                try:
                    await self.reregister(gen)
                except CxlkvError as exc:
                    log.warning("re-registration failed: %s", exc.message)
            except Unavailable as exc:
                if not self._warned_unavailable:
                    log.warning("master %s unreachable: %s", self.address, exc.message)
                    self._warned_unavailable = True
            except CxlkvError as exc:
                log.warning("heartbeat failed: %s", exc.message)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug; keep heartbeating
                log.exception("heartbeat loop error")

    async def _refresh_segments(self, version: int) -> None:
        resp = await self._raw("ListSegments", master_pb2.ListSegmentsRequest())
        for p in self.regions.bind(resp.segments):
            log.error("%s; reads and writes there fail", p)
        self.segments = list(resp.segments)
        self.segments_version = version

    # -- raw calls ----------------------------------------------------------
    async def _raw(self, method: str, request: Any, *, timeout: float | None = None) -> Any:
        """One call, errors translated (no re-registration)."""
        if self._stub is None:
            raise NotReady("clientd is starting (not connected to the master yet)")
        lean = self._lean
        if lean is not None and method in _LEAN_METHODS:
            try:
                resp = await lean.call(method, request, timeout=timeout or self.cfg.master_timeout_s)
            except LeanConnectError as exc:
                # Nothing was sent: use gRPC until the next registration offers the link again
                # (e.g. a firewall that lets the gRPC port through but not the lean one).
                log.warning("%s; using gRPC for every master call until the next registration", exc.message)
                self._lean = None
                lean.close()
            except Unavailable:
                self.connected = False
                raise
            else:
                self.connected = True
                return resp
        try:
            resp = await getattr(self._stub, method)(request, timeout=timeout or self.cfg.master_timeout_s)
        except grpc.aio.AioRpcError as exc:
            err = from_rpc_error(exc, target=f"master {self.address}")
            if err.code == ErrorCode.UNAVAILABLE:
                self.connected = False
            raise err from None
        self.connected = True
        return resp

    async def call(self, method: str, build: Callable[[], Any], *, timeout: float | None = None) -> Any:
        """Call the master, re-registering once if it says UNKNOWN_CLIENT.

        Args:
            method: MasterService RPC name.
            build: makes the request from the current identity (called again after
                a re-registration, so ``client_id`` / ``epoch`` are fresh).
            timeout: deadline in seconds (default ``master_timeout_s``).

        Raises:
            NotReady: not registered yet.
            Unavailable: the master is unreachable.
            CxlkvError: the master's error.
        """
        if not self.registered:
            if self.generation == 0:
                raise NotReady("clientd is not registered with the master yet")
            try:
                await self.reregister(self.generation)
            except Unavailable:
                raise
        gen = self.generation
        try:
            try:
                return await self._raw(method, build(), timeout=timeout)
            except UnknownClient:
                await self.reregister(gen)
                return await self._raw(method, build(), timeout=timeout)
        except NotLeader:
            raise  # refused: nothing was granted
        except Unavailable as exc:
            if method in _GRANTING and self.generation == gen and self.registered:
                self._renew_after_lost_answer(method, exc)
            raise

    def _renew_after_lost_answer(self, method: str, exc: CxlkvError) -> None:
        """A call that hands this registration space (a put started, extents
        reserved) got no answer: the master may have granted it anyway, to a writer
        that never learns its token, so neither a PutRevoke nor a commit would ever
        end it and it would stay held ("fenced" after put_timeout_s) as long as the
        registration lives. Register again (the next call or heartbeat does): the
        master quarantines what the old registration held and frees it once this
        daemon's put rounds of that registration are over
        (:meth:`~cxlkv.clientd.core.ClientdCore.release_when_drained`)."""
        log.warning("%s to master %s got no answer (%s); registering again so that what it may have "
                    "granted unseen is freed", method, self.address, exc.message)
        self._registered.clear()

    # -- coalesced sends ----------------------------------------------------
    async def _send_put_start(
        self, items: list[tuple[str, int, common_pb2.PutOptions | None, int]]
    ) -> Sequence[StartedPut]:
        def build() -> master_pb2.PutStartRequest:
            req = master_pb2.PutStartRequest(
                client_id=self.client_id, epoch=self.epoch,
                keys=[it[0] for it in items], value_size_bytes=[it[1] for it in items],
                header_bytes=[it[3] for it in items])
            if any(it[2] is not None for it in items):
                default = common_pb2.PutOptions()
                req.options.extend(it[2] if it[2] is not None else default for it in items)
            return req

        gen = self.generation
        started = unpack_put_starts(await self.call("PutStart", build))
        await self._registration_ended(gen, (r.status.code for r in started))
        return started

    def _end_request(self, items: list[tuple[str, int, int]]) -> master_pb2.PutEndRequest:
        req = master_pb2.PutEndRequest(
            client_id=self.client_id, epoch=self.epoch,
            keys=[it[0] for it in items], put_tokens=[it[1] for it in items])
        if any(it[2] for it in items):
            req.checksums.extend(it[2] for it in items)
        return req

    async def _send_commit(self, items: list[tuple[str, int, int, int, int, int]]) -> Sequence[common_pb2.Status]:
        def build() -> master_pb2.CommitRequest:
            req = master_pb2.CommitRequest(
                client_id=self.client_id, epoch=self.epoch, keys=[it[0] for it in items],
                put_tokens=[it[1] for it in items], value_size_bytes=[it[2] for it in items],
                header_bytes=[it[3] for it in items], checksums=[it[4] for it in items])
            if any(it[5] for it in items):
                req.flags.extend(it[5] for it in items)
            return req

        gen = self.generation
        resp = await self.call("Commit", build)
        await self._registration_ended(gen, resp.codes)
        return _statuses(resp.codes, resp.error_positions, resp.messages)

    async def _registration_ended(self, gen: int, codes: Iterable[int]) -> None:
        """A batch answered per item that this registration is unknown (it expired, or
        the master restarted and this daemon has not noticed yet): register again, so
        the callers' retries go under a live registration."""
        if any(c == _UNKNOWN_CLIENT_CODE for c in codes):
            try:
                await self.reregister(gen)
            except CxlkvError as exc:
                log.debug("re-registration after a per-item UNKNOWN_CLIENT failed: %s", exc.message)

    async def _send_put_end(self, items: list[tuple[str, int, int]]) -> Sequence[common_pb2.Status]:
        resp = await self.call("PutEnd", lambda: self._end_request(items))
        return _statuses(resp.codes, resp.error_positions, resp.messages)

    async def _send_put_revoke(self, items: list[tuple[str, int, int]]) -> Sequence[common_pb2.Status]:
        resp = await self.call("PutRevoke", lambda: self._end_request(items))
        return _statuses(resp.codes, resp.error_positions, resp.messages)

    async def _send_locate(self, keys: list[str]) -> "Located":
        releases = self._take_releases()
        t0 = self.clock()
        try:
            resp = await self.call("GetReplicaList", lambda: master_pb2.GetReplicaListRequest(
                client_id=self.client_id, keys=keys, release_lease_ids=releases))
        except BaseException:
            self._return_releases(releases)
            raise
        return Located(unpack_locations(resp), t0)

    async def _send_match_prefix(self, queries: list[list[str]]) -> list[tuple[PrefixMatch, float]]:
        releases = self._take_releases()
        t0 = self.clock()
        try:
            resp = await self.call("MatchPrefix", lambda: master_pb2.MatchPrefixRequest(
                client_id=self.client_id,
                queries=[master_pb2.PrefixQuery(keys=q) for q in queries],
                release_lease_ids=releases))
        except BaseException:
            self._return_releases(releases)
            raise
        locations = unpack_locations(resp.locations)
        if len(resp.matched) != len(queries) or sum(resp.matched) != len(locations):
            raise Internal(f"MatchPrefix: {len(resp.matched)} answers for {len(queries)} queries, "
                           f"{len(locations)} locations for {sum(resp.matched)} matched keys")
        out: list[tuple[PrefixMatch, float]] = []
        j = 0
        for m in resp.matched:
            out.append((PrefixMatch(m, locations[j:j + m]), t0))
            j += m
        return out

    async def _send_exist(self, keys: list[str]) -> list[tuple[bool, common_pb2.Status]]:
        resp = await self.call("ExistKey", lambda: master_pb2.ExistKeyRequest(keys=keys))
        if len(resp.results) == len(keys):
            return list(zip(resp.exists, resp.results))
        ok = common_pb2.Status()
        return [(e, ok) for e in resp.exists]

    async def _send_remove(self, keys: list[str], force: bool) -> Sequence[common_pb2.Status]:
        resp = await self.call("Remove", lambda: master_pb2.RemoveRequest(keys=keys, force=force))
        return resp.results

    # -- leases -------------------------------------------------------------
    def release_leases(self, lease_ids: list[int]) -> None:
        """End leases whose copy is done (0 ids are ignored); sent within a few ms."""
        ids = [i for i in lease_ids if i]
        if not ids:
            return
        self._pending_releases.extend(ids)
        if self._release_handle is None and not self._closed:
            self._release_handle = asyncio.get_running_loop().call_later(RELEASE_DELAY_S, self._release_timer)

    def _take_releases(self) -> list[int]:
        """Up to :data:`MAX_BATCH_ITEMS` pending lease ids, to ride on one call (the
        master refuses a call over its ``max_batch_items``); the rest wait for the
        next call or the release timer."""
        ids = self._pending_releases
        if len(ids) <= MAX_BATCH_ITEMS:
            self._pending_releases = []
            return ids
        self._pending_releases = ids[MAX_BATCH_ITEMS:]
        if self._release_handle is None and not self._closed:
            self._release_handle = asyncio.get_running_loop().call_later(RELEASE_DELAY_S, self._release_timer)
        return ids[:MAX_BATCH_ITEMS]

    def _return_releases(self, ids: list[int]) -> None:
        if ids:
            self._pending_releases.extend(ids)

    def _release_timer(self) -> None:
        self._release_handle = None
        if not self._pending_releases:
            return
        task = asyncio.get_running_loop().create_task(self._flush_releases())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def flush_releases(self) -> None:
        """Send the pending lease releases now (before a Remove, so this daemon's own
        finished reads do not stand in its way)."""
        if self._pending_releases and self.registered:
            await self._flush_releases()

    async def _flush_releases(self) -> None:
        ids = self._take_releases()
        if not ids:
            return
        try:
            await self.call("ReleaseLeases", lambda: master_pb2.ReleaseLeasesRequest(
                client_id=self.client_id, lease_ids=ids))
        except CxlkvError as exc:
            # The leases end by themselves after lease_ttl; nothing is lost.
            log.debug("ReleaseLeases of %d lease(s) failed: %s", len(ids), exc.message)

    # -- hits read from the index ---------------------------------------------
    def report_hits(self, keys: list[str], chains: Sequence[tuple[list[str], int]] = ()) -> None:
        """Tell the master's eviction policy about reads served from the index
        (no lease was taken); sent within :data:`HITS_DELAY_S`, batched.
        ``chains``: the prefix queries behind them, ``(keys asked, matched)`` each
        (``ReportReadsRequest.prefix_*``, for a prefix-aware policy)."""
        if (not keys and not chains) or self._closed:
            return
        self._pending_hits.extend(keys)
        for chain in chains:
            self._pending_chains.append(chain)
            self._pending_chain_keys += len(chain[0])
        if len(self._pending_hits) + self._pending_chain_keys >= HITS_BATCH_MAX:
            self._hits_timer()
        elif self._hits_handle is None:
            self._hits_handle = asyncio.get_running_loop().call_later(HITS_DELAY_S, self._hits_timer)

    def _hits_timer(self) -> None:
        if self._hits_handle is not None:
            self._hits_handle.cancel()
            self._hits_handle = None
        if not self._pending_hits and not self._pending_chains:
            return
        task = asyncio.get_running_loop().create_task(self._flush_hits())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _flush_hits(self) -> None:
        keys, self._pending_hits = self._pending_hits, []
        chains, self._pending_chains = self._pending_chains, []
        self._pending_chain_keys = 0
        parts = [keys[i:i + HITS_BATCH_MAX] for i in range(0, len(keys), HITS_BATCH_MAX)]
        groups: list[list[tuple[list[str], int]]] = []  # chains, at most HITS_BATCH_MAX keys a call
        size = HITS_BATCH_MAX
        for chain in chains:
            if size + len(chain[0]) > HITS_BATCH_MAX:
                groups.append([])
                size = 0
            groups[-1].append(chain)
            size += len(chain[0])
        for i in range(max(len(parts), len(groups))):
            part = parts[i] if i < len(parts) else []
            pk, pl, pm = pack_prefix_chains(groups[i]) if i < len(groups) else ([], [], [])
            try:
                await self.call("ReportReads", lambda: master_pb2.ReportReadsRequest(
                    client_id=self.client_id, keys=part, prefix_keys=pk, prefix_lengths=pl, prefix_matched=pm))
            except CxlkvError as exc:
                # Only the policy's information is lost (recency of these keys), never data.
                self.hits_dropped += len(part)
                log.debug("ReportReads of %d hit(s) failed: %s", len(part), exc.message)

    def report_damaged(self, key: str, version: int) -> None:
        """Tell the master a committed version's bytes were found destroyed (sent at once,
        in the background; the master checks before it drops anything)."""
        if self._closed or not self.registered:
            return

        async def send() -> None:
            try:
                await self.call("ReportReads", lambda: master_pb2.ReportReadsRequest(
                    client_id=self.client_id, damaged_keys=[key], damaged_versions=[version]))
            except CxlkvError as exc:
                log.debug("ReportReads of damaged %r failed: %s", key[:64], exc.message)

        task = asyncio.get_running_loop().create_task(send())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @property
    def pending_hits(self) -> int:
        """Hits waiting to be reported."""
        return len(self._pending_hits)

    @property
    def pending_releases(self) -> int:
        """Leases waiting to be released."""
        return len(self._pending_releases)


def _is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this host's loopback."""
    if host == "localhost":
        return True
    import ipaddress

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
