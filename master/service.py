"""MasterService: a thin grpc.aio servicer translating proto ↔ MasterState calls.

Every state call runs on the event-loop thread (the handlers are coroutines that
never await in the middle of state work), so the state needs no lock; ``now`` is
``time.monotonic()`` read once per call. The O(keys) calls (RemoveAll,
UnmountSegment) run by slices of at most ``slice_s`` and await between them, so
no call holds the loop (heartbeats are answered within 100 ms throughout); batch
calls over ``max_batch_items`` are refused before any work (:mod:`cxlkv.wire.limits`).

Errors: a call whose request is refused as a whole aborts with the cxlkv error
packed in the gRPC status details (:func:`cxlkv.errors.rpc_status_for`); batch
RPCs (every hot operation) answer a code per position. Invalid input never crashes the server: an unexpected exception
becomes INTERNAL with a one-line message and is logged once with its traceback.

Per-item results are packed columns (a code per position, messages of the
failed ones), or leave ``status`` unset on success (it reads as code OK = 0):
building fewer protobuf objects is most of the cost of a batch in Python.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextvars
import functools
import logging
import time
from time import perf_counter
from typing import Any, Awaitable, Callable, Iterator

import grpc
from grpc_status import rpc_status

from cxlkv import __version__
from cxlkv.errors import CxlkvError, Internal, InvalidArgument, rpc_status_for
from cxlkv.wire.lean import PEER_IDENTITY, LeanRoute, service_methods
from cxlkv.wire.keys import prefix_chains
from cxlkv.wire.limits import BatchLimit
from cxlkv.wire.tls import identity_from_auth_context
from cxlkv.master.objects import ObjectVersion
from cxlkv.master.segments import Segment, Tier
from cxlkv.master.state import MasterState
from cxlkv.v1 import common_pb2, master_pb2, master_pb2_grpc

__all__ = ["MasterServicer", "segment_info"]

log = logging.getLogger("cxlkv.master.service")

#: Longest ExchangeTasks wait a clientd may ask for, in milliseconds.
_MAX_TASK_WAIT_MS = 5000
_TIER_RANK = {Tier.DRAM: 0, Tier.CXL: 1, Tier.SSD: 2}
#: Between two slices of a long operation the loop is left to other work for this
#: fraction of ``slice_s`` (the operation takes that much longer in all).
_SLICE_PAUSE_FRACTION = 0.2

Handler = Callable[[Any, Any, grpc.aio.ServicerContext], Any]

#: The identity of the caller whose handler runs (TLS on; ``None`` otherwise).
_CALLER: contextvars.ContextVar[Any] = contextvars.ContextVar("_CALLER", default=None)


def _caller(context: Any) -> Any:
    """The TLS identity of a call: from gRPC's auth context, else the lean connection's."""
    if context is not None:
        return identity_from_auth_context(context.auth_context())
    return PEER_IDENTITY.get()


def _invoke(self: "MasterServicer", fn: Handler, name: str, request: Any, context: Any) -> tuple[Any, CxlkvError | None]:
    """Run handler ``fn``; return (response, None) or (None, error), observed once.

    With an :class:`~cxlkv.master.auth.Authorizer` (TLS on) the caller's identity is
    checked first; a refused call never reaches the state."""
    t0 = perf_counter()
    auth = self.auth
    token = None
    try:
        if self.fence is not None:
            self.fence.check()  # a deposed or lapsed leader answers nothing (master/election.py)
        if auth is not None:
            who = _caller(context)
            auth.check(name, request, who)
            token = _CALLER.set(who)
        if name in self._limit_fields:
            self.batch_limit.check(name, request)
        try:
            response = fn(self, request, context)
        finally:
            self.state.index.sync()  # what the call published or tombstoned, visible before it answers
        if auth is not None and name == "RegisterClient":
            auth.registered(response.client_id, who, (c.client_id for c in self.state.clients()))
    except CxlkvError as err:
        error: CxlkvError = err
    except Exception as exc:  # a bug: one line to the caller, the traceback to the log once
        log.exception("%s failed", name)
        error = Internal(f"{name}: {type(exc).__name__}: {' '.join(str(exc).split())}")
    else:
        if token is not None:
            _CALLER.reset(token)
        if self.observe is not None:
            self.observe(name, 0, request, perf_counter() - t0)
        if self._task_waiters and self.state.tasks.queued:
            self.wake_task_waiters()
        return response, None
    if token is not None:
        _CALLER.reset(token)
    if self.observe is not None:
        self.observe(name, int(error.code), request, perf_counter() - t0)
    return None, error


def _rpc(fn: Handler) -> Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[Any]]:
    """Run a synchronous handler on the event loop; map errors to gRPC statuses."""

    name = fn.__name__

    @functools.wraps(fn)
    async def handler(self: "MasterServicer", request: Any, context: grpc.aio.ServicerContext) -> Any:
        response, error = _invoke(self, fn, name, request, context)
        if error is None:
            return response
        await context.abort_with_status(rpc_status.to_status(rpc_status_for(error)))

    return handler


def _per_item(n: int, op: Callable[[int], Any]) -> master_pb2.ItemResults:
    """Run ``op(i)`` for every position; its errors become that position's code and
    message (packed columns), so one failing item never fails the others."""
    codes = [0] * n
    err_pos: list[int] = []
    err_msg: list[str] = []
    for i in range(n):
        try:
            op(i)
        except CxlkvError as err:
            codes[i] = int(err.code)
            err_pos.append(i)
            err_msg.append(err.message)
    return master_pb2.ItemResults(codes=codes, error_positions=err_pos, messages=err_msg)


def _with_policy_counters(state: MasterState) -> dict[str, int]:
    """The master's counters and its eviction policy's own (``policy_<name>``), if it keeps any."""
    extra = getattr(state.policy, "counters", None)
    if not extra:
        return state.counters
    return {**state.counters, **{f"policy_{k}": int(v) for k, v in extra.items()}}


def segment_info(seg: Segment, info: common_pb2.SegmentInfo | None = None) -> common_pb2.SegmentInfo:
    """Fill (or build) a ``SegmentInfo`` for ``seg``."""
    if info is None:
        info = common_pb2.SegmentInfo()
    info.segment_id = seg.segment_id
    info.name = seg.name
    info.tier = seg.tier
    info.capacity_bytes = seg.capacity_bytes
    info.used_bytes = seg.used_bytes
    info.size_bytes = seg.size_bytes
    info.region_uuid = seg.region_uuid
    info.device_path = seg.device_path
    info.mounted = seg.mounted
    info.object_count = seg.object_count
    info.owner_client_id = seg.owner_client_id
    return info


def _page_token(key: str) -> str:
    return base64.urlsafe_b64encode(key.encode("utf-8", "surrogatepass")).decode("ascii")


def _after_key(token: str) -> str | None:
    if not token:
        return None
    try:
        raw = base64.b64decode(token.encode("ascii"), altchars=b"-_", validate=True)
        return raw.decode("utf-8", "surrogatepass")
    except (binascii.Error, UnicodeError, ValueError):
        raise InvalidArgument(f"page_token {token[:40]!r} is not one this master returned") from None


class _LocationColumns:
    """Builds a ``Locations`` answer position by position (columns, no
    message per key)."""

    __slots__ = ("_servicer", "_client_id", "_ttl_ms", "codes", "sizes", "versions", "leases", "ttls",
                 "checksums", "header_bytes", "counts", "sids", "offs", "lens", "tiers", "err_pos", "err_msg")

    def __init__(self, servicer: "MasterServicer", client_id: str) -> None:
        self._servicer = servicer
        self._client_id = client_id
        self._ttl_ms = servicer._lease_ttl_ms
        self.codes: list[int] = []
        self.sizes: list[int] = []
        self.versions: list[int] = []
        self.leases: list[int] = []
        self.ttls: list[int] = []
        self.checksums: list[int] = []
        self.header_bytes: list[int] = []
        self.counts: list[int] = []
        self.sids: list[int] = []
        self.offs: list[int] = []
        self.lens: list[int] = []
        self.tiers: list[int] = []
        self.err_pos: list[int] = []
        self.err_msg: list[str] = []

    def add(self, obj: ObjectVersion, lease: Any) -> None:
        """One located object (``lease`` ``None``: not leased)."""
        self.codes.append(0)
        self.sizes.append(obj.size_bytes)
        self.versions.append(obj.version)
        if lease is not None:
            self.leases.append(lease.lease_id)
            self.ttls.append(self._ttl_ms)
        else:
            self.leases.append(0)
            self.ttls.append(0)
        self.checksums.append(obj.checksum or 0)
        self.header_bytes.append(obj.header_bytes or 0)
        reps = self._servicer._replicas(obj, self._client_id)
        self.counts.append(len(reps))
        for sid, off, n, tier in reps:
            self.sids.append(sid)
            self.offs.append(off)
            self.lens.append(n)
            self.tiers.append(int(tier))

    def add_error(self, err: CxlkvError) -> None:
        """One failed position."""
        self.err_pos.append(len(self.codes))
        self.err_msg.append(err.message)
        self.codes.append(int(err.code))
        for col in (self.sizes, self.versions, self.leases, self.ttls, self.checksums, self.header_bytes,
                    self.counts):
            col.append(0)

    def message(self) -> master_pb2.Locations:
        return master_pb2.Locations(
            codes=self.codes, value_size_bytes=self.sizes, versions=self.versions, lease_ids=self.leases,
            lease_ttl_ms=self.ttls, checksums=self.checksums, header_bytes=self.header_bytes,
            replica_counts=self.counts, segment_ids=self.sids, offsets_bytes=self.offs,
            lengths_bytes=self.lens, tiers=self.tiers, error_positions=self.err_pos, messages=self.err_msg)


class MasterServicer(master_pb2_grpc.MasterServiceServicer):
    """The ``cxlkv.v1.MasterService`` over one :class:`MasterState`.

    Args:
        state: the metadata state machine (owned by the event-loop thread).
        started_at: ``time.monotonic()`` at start, for Stat's uptime.
        metrics_url: where /metrics is served ("" if not).
        clock: the master clock (seconds); ``time.monotonic`` in production.

    Attributes:
        observe: ``None``, or a callable ``(method, code, request, seconds)``
            run after every RPC on the event-loop thread (``code`` 0 = OK) —
            the metrics hook (:class:`cxlkv.master.metrics.RpcObserver`).
    """

    observe: Callable[[str, int, Any, float], None] | None = None
    #: ``None`` (no TLS: no identities, every call allowed), or the
    #: :class:`~cxlkv.master.auth.Authorizer` checking each call's identity.
    auth: Any = None
    #: With leader election: the :class:`~cxlkv.master.election.LeaderFence` every call passes first.
    fence: Any = None
    #: TCP port of the lean-framing MasterService (0: not served); told to clients at registration.
    lean_port: int = 0
    #: The lean service's Unix socket ("" = none), told to clientds at registration.
    lean_socket_path: str = ""
    #: The region holding the index this master publishes ("" = none) and its epoch; told at registration.
    index_region_uuid: str = ""
    index_epoch: int = 0

    def __init__(self, state: MasterState, *, started_at: float | None = None, metrics_url: str = "",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.state = state
        self.clock = clock
        self.started_at = clock() if started_at is None else started_at
        self.metrics_url = metrics_url
        self._lease_ttl_ms = int(round(state.config.lease_ttl_s * 1000))
        self._task_waiters = 0
        self._task_event: asyncio.Event | None = None
        #: Refuses batch calls over ``max_batch_items`` (docs/protocol.md, Limits).
        self.batch_limit = BatchLimit(master_pb2.DESCRIPTOR.services_by_name["MasterService"],
                                      state.config.max_batch_items)
        self._limit_fields = self.batch_limit.fields

    def wake_task_waiters(self) -> None:
        """Answer every ExchangeTasks long poll now (tasks were queued)."""
        ev = self._task_event
        if ev is not None:
            self._task_event = None
            ev.set()

    def lean_routes(self) -> dict[int, LeanRoute]:
        """Every MasterService RPC as a lean-framing route (:mod:`cxlkv.wire.lean`): the
        same handlers, errors and metrics hook as the gRPC path, without HTTP/2."""
        routes: dict[int, LeanRoute] = {}
        for m in service_methods(master_pb2.DESCRIPTOR.services_by_name["MasterService"]):
            waits = {"ExchangeTasks": self._lean_exchange_tasks, "RemoveAll": self._lean_remove_all,
                     "UnmountSegment": self._lean_unmount}.get(m.name)
            if waits is not None:  # long polls and sliced operations: run as tasks
                routes[m.number] = LeanRoute(m.name, m.request_type.FromString, waits, m.request_type)
                continue
            fn = getattr(type(self), m.name).__wrapped__
            routes[m.number] = LeanRoute(m.name, m.request_type.FromString, self._lean_handler(fn, m.name),
                                       m.request_type, inline=True)
        return routes

    def _lean_handler(self, fn: Handler, name: str) -> Callable[[Any], Any]:
        """``fn`` as an inline lean route: every master handler but ExchangeTasks,
        RemoveAll and UnmountSegment answers without waiting."""

        def handler(request: Any) -> Any:
            response, error = _invoke(self, fn, name, request, None)
            if error is not None:
                raise error
            return response

        return handler

    async def _lean_exchange_tasks(self, request: Any) -> Any:
        response, error = await self._exchange_tasks(request)
        if error is not None:
            raise error
        return response

    async def _exchange_tasks(self, request: Any) -> tuple[Any, CxlkvError | None]:
        """ExchangeTasks: apply the reported results, then hand out tasks as a long
        poll: answer at once when tasks are queued (or none are wanted), else wait
        (up to ``wait_ms``) until a call queues some, then ask once more."""
        response, error = _invoke(self, type(self)._exchange_tasks_now, "ExchangeTasks", request, None)
        wait_ms = min(request.wait_ms, _MAX_TASK_WAIT_MS)
        if error is not None or response.tasks or not wait_ms or not request.max_tasks:
            return response, error
        if self._task_event is None:
            self._task_event = asyncio.Event()
        ev = self._task_event
        self._task_waiters += 1
        try:
            await asyncio.wait_for(ev.wait(), wait_ms / 1000.0)
        except asyncio.TimeoutError:
            return response, None
        finally:
            self._task_waiters -= 1
        again, error = _invoke(self, type(self)._fetch_tasks_now, "ExchangeTasks", request, None)
        if error is not None:
            return None, error
        response.tasks.extend(again.tasks)
        return response, None

    # -------------------------------------------------------------- helpers
    def _replicas(self, obj: ObjectVersion, client_id: str) -> list[tuple[int, int, int, int]]:
        """``(segment_id, offset, length, tier)`` of the replicas a reader on
        ``client_id`` may use, best first: its own DRAM, CXL, SSD; others' DRAM never."""
        segment = self.state.segment
        extents = obj.extents
        if len(extents) == 1:
            sid, off, n = extents[0]
            return [(sid, off, n, segment(sid).tier)]  # type: ignore[union-attr]
        ranked = []
        for sid, off, n in extents:
            seg = segment(sid)
            if seg.tier == Tier.DRAM and seg.owner_client_id != client_id:  # type: ignore[union-attr]
                continue
            ranked.append((_TIER_RANK.get(seg.tier, 3), (sid, off, n, seg.tier)))  # type: ignore[union-attr]
        ranked.sort(key=lambda r: r[0])
        return [r[1] for r in ranked]

    # -------------------------------------------------------------- clients
    @_rpc
    def RegisterClient(self, request, context):
        st = self.state
        client = st.register_client(
            request.hostname, request.name, request.pid, request.regions,
            request.previous_client_id, request.metrics_url, self.clock(),
        )
        log.info("client %s registered (epoch %d, %s/%s pid %d, %d region(s))", client.client_id,
                 client.epoch, request.hostname, request.name, request.pid, len(request.regions))
        resp = master_pb2.RegisterClientResponse(
            client_id=client.client_id, epoch=client.epoch,
            heartbeat_interval_s=st.config.heartbeat_interval_s, client_ttl_s=st.config.client_ttl_s,
            lease_ttl_s=st.config.lease_ttl_s, master_id=st.master_id, lean_port=self.lean_port,
            lean_socket_path=self.lean_socket_path,
            index_region_uuid=self.index_region_uuid, index_epoch=self.index_epoch,
        )
        for seg in st.segments():
            segment_info(seg, resp.segments.add())
        return resp

    @_rpc
    def Heartbeat(self, request, context):
        st = self.state
        st.heartbeat(request.client_id, request.epoch, self.clock())
        return master_pb2.HeartbeatResponse(master_id=st.master_id, segments_version=st.segments_version)

    @_rpc
    def DeregisterClient(self, request, context):
        client = self.state.deregister_client(request.client_id, request.epoch, self.clock())
        log.info("client %s deregistered (%s/%s pid %d stopping)", client.client_id, client.hostname,
                 client.name, client.pid)
        return master_pb2.DeregisterClientResponse()

    # ------------------------------------------------------------- segments
    @_rpc
    def MountSegment(self, request, context):
        seg = self.state.mount_segment(
            request.client_id, request.epoch, request.name, request.tier, request.size_bytes,
            request.region_uuid, request.device_path, self.clock(),
        )
        log.info("segment %r mounted (id %d, %d B)", seg.name, seg.segment_id, seg.size_bytes)
        return master_pb2.MountSegmentResponse(segment=segment_info(seg))

    async def UnmountSegment(self, request, context):
        if self.auth is not None:  # _sliced reads the caller's identity the lean way
            PEER_IDENTITY.set(_caller(context))
        response, error = await self._unmount(request)
        if error is None:
            return response
        await context.abort_with_status(rpc_status.to_status(rpc_status_for(error)))

    async def _lean_unmount(self, request: Any) -> Any:
        response, error = await self._unmount(request)
        if error is not None:
            raise error
        return response

    async def _unmount(self, request: Any) -> tuple[Any, CxlkvError | None]:
        def start() -> Any:
            return self.state.unmount_start(request.name, self.clock())

        def answer(cursor: Any) -> Any:
            log.warning("segment %r unmounted: %d replica(s) lost, %d object(s) lost", request.name,
                        cursor.replicas_lost, cursor.objects_lost)
            return master_pb2.UnmountSegmentResponse(replicas_lost=cursor.replicas_lost,
                                                     objects_lost=cursor.objects_lost)

        return await self._sliced("UnmountSegment", request, start, answer)

    @_rpc
    def ListSegments(self, request, context):
        resp = master_pb2.ListSegmentsResponse()
        for seg in self.state.segments(include_unmounted=True):
            segment_info(seg, resp.segments.add())
        return resp

    # ----------------------------------------------------------------- puts
    @_rpc
    def PutStart(self, request, context):
        keys = request.keys
        n = len(keys)
        sizes = request.value_size_bytes
        header_bytes = request.header_bytes
        options = request.options
        if len(sizes) != n or (header_bytes and len(header_bytes) != n) or (options and len(options) != n):
            raise InvalidArgument(
                f"PutStart: {n} keys with {len(sizes)} sizes, {len(header_bytes)} header_bytes "
                f"and {len(options)} options (each must have one per key; the last two may be empty)")
        put_start = self.state.put_start
        client_id, epoch, now = request.client_id, request.epoch, self.clock()
        codes = [0] * n
        versions = [0] * n
        wanted = [0] * n
        counts = [0] * n
        sids: list[int] = []
        offs: list[int] = []
        lens: list[int] = []
        err_pos: list[int] = []
        err_msg: list[str] = []
        keys = list(keys)  # one conversion each, not one per access
        sizes = list(sizes)
        header_bytes = list(header_bytes) if header_bytes else None
        for i in range(n):
            try:
                if options:
                    o = options[i]
                    obj = put_start(
                        client_id, epoch, keys[i], sizes[i], now,
                        replica_num=o.replica_num, upsert=o.upsert, soft_pin=o.soft_pin,
                        hard_pin=o.hard_pin, preferred_segment=o.preferred_segment,
                        header_bytes=header_bytes[i] if header_bytes else 0,
                    )
                elif header_bytes:
                    obj = put_start(client_id, epoch, keys[i], sizes[i], now, header_bytes=header_bytes[i])
                else:
                    obj = put_start(client_id, epoch, keys[i], sizes[i], now)
            except CxlkvError as err:
                codes[i] = int(err.code)
                err_pos.append(i)
                err_msg.append(err.message)
                continue
            versions[i] = obj.version
            wanted[i] = obj.replicas_wanted
            exts = obj.extents
            counts[i] = len(exts)
            for sid, off, ln in exts:
                sids.append(sid)
                offs.append(off)
                lens.append(ln)
        return master_pb2.PutStartResponse(
            codes=codes, put_tokens=versions, versions=versions, replicas_wanted=wanted,
            extent_counts=counts, segment_ids=sids, offsets_bytes=offs, lengths_bytes=lens,
            error_positions=err_pos, messages=err_msg)

    def _end(self, request: Any, op: Callable[..., Any], end: bool) -> master_pb2.ItemResults:
        """PutEnd (``end``) or PutRevoke: ``op`` per position."""
        keys = list(request.keys)
        n = len(keys)
        tokens = list(request.put_tokens)
        checksums = list(request.checksums) if end and request.checksums else None
        if len(tokens) != n or (checksums is not None and len(checksums) != n):
            raise InvalidArgument(
                f"{'PutEnd' if end else 'PutRevoke'}: {n} keys with {len(tokens)} put_tokens "
                f"and {len(request.checksums)} checksums (one per key; checksums may be empty)")
        client_id, epoch, now = request.client_id, request.epoch, self.clock()
        if end:
            return _per_item(n, lambda i: op(client_id, epoch, keys[i], tokens[i], now,
                                             checksums[i] if checksums else 0))
        return _per_item(n, lambda i: op(client_id, epoch, keys[i], tokens[i], now))

    @_rpc
    def PutEnd(self, request, context):
        return self._end(request, self.state.put_end, True)

    @_rpc
    def PutRevoke(self, request, context):
        return self._end(request, self.state.put_revoke, False)

    # ---------------------------------------------------------------- reads
    def _locate_each(self, request: Any) -> Iterator[tuple[ObjectVersion, Any] | CxlkvError]:
        """Per key of a GetReplicaListRequest: ``(object, lease)`` or the error,
        after ending the leases the request releases."""
        st = self.state
        client_id, no_lease, now = request.client_id, request.no_lease, self.clock()
        if request.release_lease_ids:
            st.release_leases(client_id, request.release_lease_ids)
        get = st.get
        for key in request.keys:
            try:
                yield get(client_id, key, now, no_lease)
            except CxlkvError as err:
                yield err

    @_rpc
    def GetReplicaList(self, request, context):
        cols = _LocationColumns(self, request.client_id)
        for found in self._locate_each(request):
            if isinstance(found, CxlkvError):
                cols.add_error(found)
            else:
                cols.add(*found)
        return cols.message()

    @_rpc
    def ReleaseLeases(self, request, context):
        return master_pb2.ReleaseLeasesResponse(
            released=self.state.release_leases(request.client_id, request.lease_ids)
        )

    @_rpc
    def Reserve(self, request, context):
        needs, counts = list(request.need_bytes), list(request.counts)
        if len(needs) != len(counts):
            raise InvalidArgument(f"Reserve: {len(needs)} sizes with {len(counts)} counts")
        st, cid, epoch, now = self.state, request.client_id, request.epoch, self.clock()
        resp = master_pb2.ReserveResponse()
        if request.unreserve_put_tokens:  # given back first: their space serves this call's grants
            tokens = list(request.unreserve_put_tokens)
            resp.unreserved.CopyFrom(_per_item(len(tokens), lambda i: st.unreserve(cid, epoch, tokens[i], now)))
        for need, count in zip(needs, counts):
            got = st.reserve(cid, epoch, need, count, now)
            resp.granted.append(len(got))
            for obj in got:
                sid, off, n = obj.extents[0]
                resp.put_tokens.append(obj.version)
                resp.segment_ids.append(sid)
                resp.offsets_bytes.append(off)
                resp.lengths_bytes.append(n)
        return resp

    @_rpc
    def Commit(self, request, context):
        # the columns are indexed in place (no copies): this runs for every put
        keys, tokens, sizes = request.keys, request.put_tokens, request.value_size_bytes
        hbytes, sums, flags = request.header_bytes, request.checksums, request.flags
        n = len(keys)
        if not (len(tokens) == len(sizes) == len(hbytes) == len(sums) == n and len(flags) in (0, n)):
            raise InvalidArgument(f"Commit: {n} keys with {len(tokens)} tokens, {len(sizes)} sizes, "
                                  f"{len(hbytes)} header sizes, {len(sums)} checksums, {len(flags)} flags")
        st, cid, epoch, now = self.state, request.client_id, request.epoch, self.clock()
        commit = st.reservations.commit

        def one(i: int) -> None:
            f = flags[i] if flags else 0
            commit(cid, epoch, keys[i], tokens[i], sizes[i], hbytes[i], sums[i], now,
                   upsert=bool(f & 1), soft_pin=bool(f & 2), hard_pin=bool(f & 4))

        return _per_item(n, one)

    @_rpc
    def ReleaseQuarantine(self, request, context):
        st = self.state
        if request.writers_gone:  # an operator's word (admin only: master/auth.py)
            if any(c.client_id == request.client_id and c.alive for c in st.clients()):
                raise InvalidArgument(f"client {request.client_id} is registered and alive: its writers have "
                                      "not stopped; release-writer is for a host that is gone")
            freed = st.release_quarantine_of(request.client_id)
            log.warning("operator released %d quarantined bytes of client %s (its writers are gone)", freed,
                        request.client_id)
            return master_pb2.ReleaseQuarantineResponse(freed_bytes=freed)
        freed = st.release_quarantine(request.client_id, request.epoch, request.upto_epoch, self.clock(),
                                      request.keep_put_tokens)
        if freed:
            log.info("client %s: %d quarantined bytes of registrations up to epoch %d freed (its writers "
                     "stopped)", request.client_id, freed, request.upto_epoch)
        return master_pb2.ReleaseQuarantineResponse(freed_bytes=freed)

    @_rpc
    def ReportReads(self, request, context):
        st = self.state
        keys, versions = list(request.damaged_keys), list(request.damaged_versions)
        if len(keys) != len(versions):
            raise InvalidArgument(f"ReportReads: {len(keys)} damaged keys with {len(versions)} versions")
        applied = st.report_hits(request.client_id, request.keys, self.clock(),
                                 prefix_chains(request.prefix_keys, request.prefix_lengths, request.prefix_matched))
        dropped = st.report_damaged(zip(keys, versions)) if keys else 0
        if dropped:
            log.warning("dropped %d object(s) whose bytes were destroyed (reported by client %s, checked in "
                        "the region)", dropped, request.client_id)
        return master_pb2.ReportReadsResponse(applied=applied, dropped=dropped)

    @_rpc
    def ExistKey(self, request, context):
        exists = self.state.exists
        resp = master_pb2.ExistKeyResponse()
        flags = resp.exists
        add = resp.results.add
        for key in request.keys:
            try:
                flags.append(exists(key))
            except CxlkvError as err:
                flags.append(False)
                add(code=err.code, message=err.message)
                continue
            add()
        return resp

    @_rpc
    def MatchPrefix(self, request, context):
        now = self.clock()
        client_id, no_lease = request.client_id, request.no_lease
        if request.release_lease_ids:
            self.state.release_leases(client_id, request.release_lease_ids)
        match = self.state.match_prefix
        cols = _LocationColumns(self, client_id)
        matched: list[int] = []
        for query in request.queries:
            found = match(client_id, query.keys, now, no_lease)
            matched.append(len(found))
            for obj, lease in found:
                cols.add(obj, lease)
        return master_pb2.MatchPrefixResponse(matched=matched, locations=cols.message())

    # -------------------------------------------------------------- removal
    @_rpc
    def Remove(self, request, context):
        remove = self.state.remove
        now, force = self.clock(), request.force
        resp = master_pb2.RemoveResponse()
        add = resp.results.add
        for key in request.keys:
            try:
                remove(key, now, force)
            except CxlkvError as err:
                add(code=err.code, message=err.message)
                continue
            add()
        return resp

    async def RemoveAll(self, request, context):
        if self.auth is not None:  # _sliced reads the caller's identity the lean way
            PEER_IDENTITY.set(_caller(context))
        response, error = await self._remove_all(request)
        if error is None:
            return response
        await context.abort_with_status(rpc_status.to_status(rpc_status_for(error)))

    async def _lean_remove_all(self, request: Any) -> Any:
        response, error = await self._remove_all(request)
        if error is not None:
            raise error
        return response

    async def _remove_all(self, request: Any) -> tuple[Any, CxlkvError | None]:
        """RemoveAll by slices (:class:`~cxlkv.master.cursors.RemoveAllCursor`), of
        every object or of those whose key matches ``request.pattern``."""
        return await self._sliced(
            "RemoveAll", request, lambda: self.state.remove_all_start(request.force, request.pattern or None),
            lambda c: master_pb2.RemoveAllResponse(removed=c.removed, skipped_leased=c.skipped))

    async def _sliced(self, name: str, request: Any, start: Callable[[], Any],
                      answer: Callable[[Any], Any]) -> tuple[Any, CxlkvError | None]:
        """Run an O(objects) state operation by slices of at most ``slice_s`` of
        event-loop time (``start()`` returns a cursor whose ``step(now, budget_s)``
        returns true when done), yielding to the loop between slices: heartbeats and
        every other call are answered meanwhile. ``answer(cursor)`` builds the response."""
        t0 = perf_counter()
        error: CxlkvError | None = None
        response = None
        slice_s = self.state.config.slice_s
        pause_s = slice_s * _SLICE_PAUSE_FRACTION
        try:
            if self.fence is not None:  # as _invoke: a deposed or lapsed leader answers nothing
                self.fence.check()
            if self.auth is not None:  # the identity check of every call (_invoke)
                self.auth.check(name, request, _caller(None))
            if name in self._limit_fields:
                self.batch_limit.check(name, request)
            cursor = start()
            while not cursor.step(self.clock(), slice_s):
                self.state.index.sync()
                # A pause, not sleep(0): one gRPC call needs several turns of the loop,
                # and sleep(0) gives the others one turn per slice (2M-key RemoveAll:
                # heartbeats p50 87 ms with sleep(0))
                await asyncio.sleep(pause_s)
            response = answer(cursor)
        except CxlkvError as err:
            error = err
        except Exception as exc:  # a bug: one line to the caller, the traceback to the log once
            log.exception("%s failed", name)
            error = Internal(f"{name}: {type(exc).__name__}: {' '.join(str(exc).split())}")
        try:
            self.state.index.sync()
        except CxlkvError as err:  # the term ended meanwhile (NotLeader): what it did is not published
            if error is None:
                response, error = None, err
        if self.observe is not None:
            self.observe(name, int(error.code) if error is not None else 0, request, perf_counter() - t0)
        return response, error

    # ---------------------------------------------------------- tier moves
    async def ExchangeTasks(self, request, context):
        if self.auth is not None:  # _exchange_tasks reads the caller's identity the lean way
            PEER_IDENTITY.set(_caller(context))
        response, error = await self._exchange_tasks(request)
        if error is None:
            return response
        await context.abort_with_status(rpc_status.to_status(rpc_status_for(error)))

    def _exchange_tasks_now(self, request, context):
        """The reported results applied, then the tasks queued now (at most ``max_tasks``)."""
        resp = master_pb2.ExchangeTasksResponse()
        if request.results:
            self._complete_tasks(request, resp)
        if request.max_tasks:
            self._add_tasks(request, resp)
        return resp

    def _fetch_tasks_now(self, request, context):
        """The tasks queued now (after a long poll's wait: the results were applied before it)."""
        resp = master_pb2.ExchangeTasksResponse()
        self._add_tasks(request, resp)
        return resp

    _exchange_tasks_now.__name__ = _fetch_tasks_now.__name__ = "ExchangeTasks"

    def _add_tasks(self, request: Any, resp: master_pb2.ExchangeTasksResponse) -> None:
        tasks = self.state.fetch_tasks(request.client_id, request.epoch, request.max_tasks, self.clock())
        add = resp.tasks.add
        deadline_ms = int(self.state.config.task_timeout_s * 1000 * 0.8)  # leave the report time to arrive
        for t in tasks:
            obj = t.obj
            m = add(task_id=t.task_id, kind=t.kind, key=obj.key, version=obj.version,
                    value_size_bytes=obj.size_bytes, header_bytes=obj.header_bytes, checksum=obj.checksum,
                    deadline_ms=deadline_ms)
            m.source.segment_id, m.source.offset_bytes, m.source.length_bytes = t.source
            d = m.destination
            d.segment_id, d.offset_bytes, d.length_bytes = t.destination

    def _complete_tasks(self, request: Any, resp: master_pb2.ExchangeTasksResponse) -> None:
        state = self.state
        refused = state.counters["tier_write_refusals"]
        pauses = state.tier_pauses
        errs = state.complete_tasks(
            request.client_id, request.epoch,
            [(r.task_id, r.status.code, r.status.message) for r in request.results], self.clock())
        if state.tier_pauses != pauses:  # a tier was paused for a full filesystem: once per backoff period
            log.warning("%s (%d refused writes so far)", state.last_tier_refusal,
                        state.counters["tier_write_refusals"])
        elif state.counters["tier_write_refusals"] != refused:
            log.debug("%d more writes refused by a full tier", state.counters["tier_write_refusals"] - refused)
        add = resp.results.add
        for err in errs:
            if err is None:
                add()
            else:
                add(code=err.code, message=err.message)

    # ----------------------------------------------------------- inspection
    @_rpc
    def ListKeys(self, request, context):
        now = self.clock()
        objs, last = self.state.list_keys(request.prefix, request.page_size, _after_key(request.page_token), now)
        resp = master_pb2.ListKeysResponse(next_page_token=_page_token(last) if last is not None else "")
        segment = self.state.segment
        add = resp.entries.add
        for obj in objs:
            add(
                key=obj.key, value_size_bytes=obj.size_bytes, version=obj.version,
                replica_count=len(obj.extents),
                tiers=[segment(e[0]).tier for e in obj.extents],  # type: ignore[union-attr]
                hard_pinned=obj.hard_pin, soft_pinned=obj.soft_pin_until > now,
                lease_count=obj.leases,
            )
        return resp

    @_rpc
    def Stat(self, request, context):
        st = self.state
        now = self.clock()
        mounted = st.segments()
        resp = master_pb2.StatResponse(
            master_id=st.master_id, version=__version__,
            key_count=st.key_count, processing_count=st.processing_count, lease_count=len(st.leases),
            fenced_count=st.fenced_count, reserved_count=st.reserved_count, reserved_bytes=st.reserved_bytes,
            quarantined_count=st.quarantined_count, quarantined_bytes=st.quarantined_bytes,
            capacity_bytes=sum(s.capacity_bytes for s in mounted),
            used_bytes=sum(s.used_bytes for s in mounted),
            counters=_with_policy_counters(st),
            high_watermark=st.config.high_watermark, low_watermark=st.config.low_watermark,
            allocation_strategy=st.strategy.name, eviction_policy=st.policy.name,
            uptime_s=now - self.started_at, metrics_url=self.metrics_url,
        )
        usage = st.index.usage()  # O(1): the writer's counts
        if usage is not None:
            resp.index.slots = usage.slots
            resp.index.object_slots = usage.object_slots
            resp.index.grant_slots = usage.grant_slots
            resp.index.key_limit = usage.key_limit
            resp.index.overflow_objects = usage.overflow_objects
        full = self.auth is None or self.auth.full_stat(_CALLER.get())
        for seg in st.segments(include_unmounted=True):
            info = segment_info(seg, resp.segments.add())
            if not full:
                info.region_uuid = info.device_path = ""
        if not full:  # client table, metrics URLs, region identities and paths: admins only
            resp.metrics_url = ""
            return resp
        for c in st.clients():
            resp.clients.add(
                client_id=c.client_id, hostname=c.hostname, name=c.name, epoch=c.epoch,
                alive=c.alive, last_heartbeat_age_s=now - c.last_heartbeat, metrics_url=c.metrics_url,
            )
        if request.check_invariants:
            resp.invariant_violation = st.invariant_violation()
        return resp
