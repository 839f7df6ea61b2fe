"""ClientService as coroutines over protobuf messages, shared by both front-ends.

Each method of :class:`ClientApi` is named like its RPC in client.proto, takes the
request message and returns the response message; a failed single-item call
raises the :class:`~cxlkv.errors.CxlkvError` it stands for, a batch call answers
per position. The gRPC servicer and the lean server only move these messages
on and off their sockets.

This is the one place (with :mod:`cxlkv.clientd.direct`) where the core's
records (:mod:`cxlkv.clientd.results`) become messages: a record becomes its
result message, a per-item error its ``cxlkv.v1.Status``
(:meth:`~cxlkv.errors.CxlkvError.to_status`).
"""

from __future__ import annotations

import logging
import socket
import time
from typing import TYPE_CHECKING, Any

from cxlkv import __version__
from cxlkv.clientd.buffers import BufferRegistry, SharedBuffer
from cxlkv.clientd.core import ClientdCore
from cxlkv.clientd.results import Outcome, PutSpec, Read, ReadTarget, Stored
from cxlkv.clientd.direct import DirectPuts
from cxlkv.errors import CxlkvError, InvalidArgument, TooLarge
from cxlkv.wire.keys import key_error, prefix_chains, validate_key
from cxlkv.wire.lean import PEER_CRED
from cxlkv.wire.limits import BatchLimit
from cxlkv.v1 import client_pb2, common_pb2

if TYPE_CHECKING:
    from cxlkv.config import ClientdConfig

__all__ = ["ClientApi", "MAX_LIST_PAGE"]

log = logging.getLogger(__name__)

#: Largest List page, in entries.
MAX_LIST_PAGE = 10_000

_PutResult = client_pb2.PutResult
_GetResult = client_pb2.GetResult
_GetIntoResult = client_pb2.GetIntoResult
#: Counters are uint64 on the wire: one fed by callers' reports (ReportHits, DirectRelease) saturates there.
_U64_MAX = (1 << 64) - 1
_OK_STATUS = common_pb2.Status()


def _limited(handler: Any, name: str, limit: BatchLimit) -> Any:
    """``handler`` that first refuses a request over ``limit`` (LimitExceeded, code TOO_LARGE)."""
    check = limit.check

    async def call(request: Any) -> Any:
        check(name, request)
        return await handler(request)

    call.__name__ = name
    call.__doc__ = getattr(handler, "__doc__", None)
    return call


def _raised(entry: Any, key: str) -> Any:
    """``entry`` when it is a record; raise it (naming ``key``) when it is an error."""
    if isinstance(entry, CxlkvError):
        if entry.key is None:
            entry.key = key
        raise entry
    return entry


def _put_result(r: Outcome[Stored]) -> client_pb2.PutResult:
    """A put's per-item result message."""
    if isinstance(r, CxlkvError):
        return _PutResult(status=r.to_status())
    return _PutResult(version=r.version, replicas_placed=r.replicas_placed)


class ClientApi:
    """The ClientService methods.

    Args:
        cfg: daemon configuration.
        core: the protocols.
        buffers: the shared-buffer registry.
        metrics_url: reported by Stat.

    Thread-safety: event-loop confined.
    """

    def __init__(self, cfg: "ClientdConfig", core: ClientdCore, buffers: BufferRegistry, *, metrics_url: str = "") -> None:
        self.cfg = cfg
        self.core = core
        self.buffers = buffers
        self.metrics_url = metrics_url
        self.started = time.monotonic()
        self.max_inline_bytes = cfg.max_inline_bytes
        self._hostname = socket.gethostname()
        #: Direct mode: metadata for SDK processes that copy bytes themselves.
        self.direct = DirectPuts(core, offered=bool(getattr(cfg, "direct_mode", True)))
        #: Refuses batch calls over ``max_batch_items`` before any work (docs/protocol.md, Limits).
        self.batch_limit = BatchLimit(client_pb2.DESCRIPTOR.services_by_name["ClientService"],
                                      cfg.max_batch_items)
        for name in self.batch_limit.fields:
            setattr(self, name, _limited(getattr(self, name), name, self.batch_limit))

    # -- inline values ------------------------------------------------------
    def _inline_spec(self, req: client_pb2.PutRequest, upsert: bool) -> PutSpec | CxlkvError:
        """The put of an inline value, or TooLarge when it is over ``max_inline_bytes``."""
        value = req.value
        if len(value) > self.max_inline_bytes:
            return TooLarge(
                f"inline value of {len(value)} bytes is over the limit of {self.max_inline_bytes} "
                "bytes: use PutFrom with a shared buffer", key=req.key, requested_bytes=len(value))
        opts = req.options if req.HasField("options") else None
        if upsert:
            opts = _with_upsert(opts)
        return PutSpec(req.key, len(value), opts, value, 0)

    async def _put_specs(self, items: list[PutSpec | CxlkvError]) -> list[Outcome[Stored]]:
        """Put the specs among ``items``; the errors stand for their item."""
        specs = [s for s in items if isinstance(s, PutSpec)]
        done = await self.core.put(specs) if specs else []
        if len(specs) == len(items):
            return done
        it = iter(done)
        return [next(it) if isinstance(s, PutSpec) else s for s in items]

    async def _put_one(self, req: client_pb2.PutRequest, upsert: bool) -> client_pb2.PutResponse:
        spec = _raised(self._inline_spec(req, upsert), req.key)
        (r,) = await self.core.put([spec])
        r = _raised(r, req.key)
        return client_pb2.PutResponse(version=r.version, replicas_placed=r.replicas_placed)

    async def Put(self, req: client_pb2.PutRequest) -> client_pb2.PutResponse:
        """Put an inline value. Raises ALREADY_EXISTS, TOO_LARGE, NO_SPACE, INVALID_KEY, …"""
        return await self._put_one(req, upsert=False)

    async def Upsert(self, req: client_pb2.PutRequest) -> client_pb2.PutResponse:
        """Put with ``options.upsert = true``."""
        return await self._put_one(req, upsert=True)

    async def BatchPut(self, req: client_pb2.BatchPutRequest) -> client_pb2.BatchPutResponse:
        """Put inline values; one result per item."""
        results = await self._put_specs(_one_source([self._inline_spec(it, False) for it in req.items]))
        return client_pb2.BatchPutResponse(results=[_put_result(r) for r in results])

    async def Get(self, req: client_pb2.GetRequest) -> client_pb2.GetResponse:
        """Read a value inline. Raises NOT_FOUND, TOO_LARGE (``requested_bytes`` = value size), …"""
        (o,) = await self.core.get([req.key], [None])
        o = _raised(o, req.key)
        return client_pb2.GetResponse(value=o.value or b"", version=o.version)

    async def BatchGet(self, req: client_pb2.BatchGetRequest) -> client_pb2.BatchGetResponse:
        """Read values inline; one result per key."""
        keys = list(req.keys)
        outs = await self.core.get(keys, [None] * len(keys))
        resp = client_pb2.BatchGetResponse()
        add = resp.results.add
        for o in outs:
            if isinstance(o, CxlkvError):
                add(status=o.to_status())
            else:
                add(value=o.value or b"", version=o.version)
        return resp

    # -- existence and removal ----------------------------------------------
    async def Exist(self, req: client_pb2.ExistRequest) -> client_pb2.ExistResponse:
        """Whether a key is committed. Raises INVALID_KEY."""
        validate_key(req.key)
        (exists,) = await self.core.exist([req.key])
        return client_pb2.ExistResponse(exists=_raised(exists, req.key))

    async def BatchExist(self, req: client_pb2.BatchExistRequest) -> client_pb2.BatchExistResponse:
        """Existence of each key; invalid keys answer false with INVALID_KEY."""
        res = await self.core.exist(list(req.keys))
        return client_pb2.BatchExistResponse(
            exists=[r is True for r in res],
            results=[r.to_status() if isinstance(r, CxlkvError) else _OK_STATUS for r in res])

    async def Remove(self, req: client_pb2.ClientRemoveRequest) -> client_pb2.ClientRemoveResponse:
        """Remove a key. Raises NOT_FOUND, HAS_LEASE (without force), INVALID_KEY."""
        validate_key(req.key)
        (err,) = await self.core.remove([req.key], req.force)
        _raised(err, req.key)
        return client_pb2.ClientRemoveResponse()

    async def BatchRemove(self, req: client_pb2.ClientBatchRemoveRequest) -> client_pb2.ClientBatchRemoveResponse:
        """Remove keys; one status per key."""
        errs = await self.core.remove(list(req.keys), req.force)
        return client_pb2.ClientBatchRemoveResponse(
            results=[_OK_STATUS if e is None else e.to_status() for e in errs])

    async def RemoveAll(self, req: client_pb2.ClientRemoveAllRequest) -> client_pb2.ClientRemoveAllResponse:
        """Remove every committed object (or those matching ``regex``)."""
        r = await self.core.remove_all(req.force, req.regex)
        return client_pb2.ClientRemoveAllResponse(removed=r.removed, skipped_leased=r.skipped_leased)

    # -- shared buffers -----------------------------------------------------
    async def RegisterBuffer(self, req: client_pb2.RegisterBufferRequest) -> client_pb2.RegisterBufferResponse:
        """Map a caller's /dev/shm file. Raises INVALID_ARGUMENT with the reason.

        The caller's pid and uid come from the socket (``SO_PEERCRED``) on the lean
        socket; the gRPC server does not expose them (docs/clientd.md).
        """
        peer = PEER_CRED.get()
        buf = self.buffers.register(req.path, req.size_bytes, req.pid,
                                    peer_pid=peer[0] if peer else None, peer_uid=peer[1] if peer else None)
        return client_pb2.RegisterBufferResponse(buffer_id=buf.buffer_id)

    async def UnregisterBuffer(self, req: client_pb2.UnregisterBufferRequest) -> client_pb2.UnregisterBufferResponse:
        """Drop a buffer. Raises UNKNOWN_BUFFER."""
        self.buffers.unregister(req.buffer_id)
        return client_pb2.UnregisterBufferResponse()

    async def PutFrom(self, req: client_pb2.PutFromRequest) -> client_pb2.PutFromResponse:
        """Put ``source`` bytes of a shared buffer. Raises UNKNOWN_BUFFER, OUT_OF_RANGE, …"""
        src = req.source
        buf = self.buffers.acquire(src.buffer_id, src.offset_bytes, src.length_bytes)
        try:
            opts = req.options if req.HasField("options") else None
            (r,) = await self.core.put([PutSpec(req.key, src.length_bytes, opts, buf.view, src.offset_bytes)])
        finally:
            self.buffers.release(buf)
        r = _raised(r, req.key)
        return client_pb2.PutFromResponse(version=r.version, replicas_placed=r.replicas_placed)

    # -- buffer ranges, in message form or packed: one implementation each --
    def _hold(self, ids: list[int], offs: list[int], lens: list[int]) -> list[SharedBuffer | CxlkvError]:
        """Per item, the held buffer range or its error (release the held ones)."""
        return self.buffers.acquire_many(list(zip(ids, offs, lens)))

    async def _put_from(self, keys: list[str], offs: list[int], lens: list[int],
                        got: list[SharedBuffer | CxlkvError], opts: list[Any]) -> list[Outcome[Stored]]:
        """Put every held range (a bad one fails only its item); releases them."""
        held = [b for b in got if isinstance(b, SharedBuffer)]
        try:
            items: list[PutSpec | CxlkvError] = [
                buf if isinstance(buf, CxlkvError) else PutSpec(key, ln, opt, buf.view, off)
                for key, off, ln, buf, opt in zip(keys, offs, lens, got, opts)]
            return await self._put_specs(items)
        finally:
            self.buffers.release_many(held)

    async def _get_into(self, keys: list[str], offs: list[int], lens: list[int],
                        got: list[SharedBuffer | CxlkvError]) -> list[Outcome[Read]]:
        """Read every key into its held range (a bad one fails only its item); releases them."""
        positions = [i for i, buf in enumerate(got) if not isinstance(buf, CxlkvError)]
        try:
            outs = await self.core.get(
                [keys[i] for i in positions],
                [ReadTarget(got[i].view, offs[i], lens[i]) for i in positions]) if positions else []  # type: ignore[union-attr]
        finally:
            self.buffers.release_many([got[i] for i in positions])  # type: ignore[misc]
        result: list[Outcome[Read]] = [b if isinstance(b, CxlkvError) else None for b in got]  # type: ignore[misc]
        for i, o in zip(positions, outs):
            result[i] = o
        return result

    async def _get_prefix(self, keys: list[str], offs: list[int], lens: list[int],
                          got: list[SharedBuffer | CxlkvError]) -> tuple[int, list[Read]]:
        """The longest cached prefix copied into the held ranges; releases them.

        Raises:
            UNKNOWN_BUFFER / OUT_OF_RANGE: a range is bad (checked before anything is read).
        """
        held = [b for b in got if isinstance(b, SharedBuffer)]
        try:
            for buf in got:
                if isinstance(buf, CxlkvError):
                    raise buf
            return await self.core.get_prefix(
                keys, [ReadTarget(buf.view, off, ln) for buf, off, ln in zip(held, offs, lens)])
        finally:
            self.buffers.release_many(held)

    @staticmethod
    def _columns(items: Any, source: bool) -> tuple[list[str], list[int], list[int], list[int]]:
        """Keys, buffer ids, offsets and lengths of message-form items."""
        keys, ids, offs, lens = [], [], [], []
        for it in items:
            r = it.source if source else it.target
            keys.append(it.key)
            ids.append(r.buffer_id)
            offs.append(r.offset_bytes)
            lens.append(r.length_bytes)
        return keys, ids, offs, lens

    async def BatchPutFrom(self, req: client_pb2.BatchPutFromRequest) -> client_pb2.BatchPutFromResponse:
        """Put many buffer ranges; one result per item (bad ranges fail only their item)."""
        keys, ids, offs, lens = self._columns(req.items, source=True)
        opts = [it.options if it.HasField("options") else None for it in req.items]
        results = await self._put_from(keys, offs, lens, self._hold(ids, offs, lens), opts)
        return client_pb2.BatchPutFromResponse(results=[_put_result(r) for r in results])

    async def GetInto(self, req: client_pb2.GetIntoRequest) -> client_pb2.GetIntoResponse:
        """Copy a value into a buffer range. Raises NOT_FOUND, OUT_OF_RANGE (value larger
        than the range; ``requested_bytes`` = value size), UNKNOWN_BUFFER, …"""
        t = req.target
        buf = self.buffers.acquire(t.buffer_id, t.offset_bytes, t.length_bytes)
        try:
            (o,) = await self.core.get([req.key], [ReadTarget(buf.view, t.offset_bytes, t.length_bytes)])
        finally:
            self.buffers.release(buf)
        o = _raised(o, req.key)
        return client_pb2.GetIntoResponse(value_size_bytes=o.size_bytes, version=o.version)

    async def BatchGetInto(self, req: client_pb2.BatchGetIntoRequest) -> client_pb2.BatchGetIntoResponse:
        """Copy many values into buffer ranges; one result per item."""
        keys, ids, offs, lens = self._columns(req.items, source=False)
        outs = await self._get_into(keys, offs, lens, self._hold(ids, offs, lens))
        resp = client_pb2.BatchGetIntoResponse()
        add = resp.results.add
        for o in outs:
            if isinstance(o, CxlkvError):
                add(status=o.to_status())
            else:
                add(value_size_bytes=o.size_bytes, version=o.version)
        return resp

    async def GetPrefixInto(self, req: client_pb2.GetPrefixIntoRequest) -> client_pb2.GetPrefixIntoResponse:
        """Longest cached prefix of the items' keys, copied into their targets.

        Raises:
            UNKNOWN_BUFFER / OUT_OF_RANGE: a target is not a valid buffer range
                (checked for every item before anything is read).
            INVALID_KEY: a key is invalid.
            OUT_OF_RANGE: a matched value is larger than its target.
        """
        keys, ids, offs, lens = self._columns(req.items, source=False)
        matched, outs = await self._get_prefix(keys, offs, lens, self._hold(ids, offs, lens))
        resp = client_pb2.GetPrefixIntoResponse(matched=matched)
        add = resp.results.add
        for o in outs:
            add(value_size_bytes=o.size_bytes, version=o.version, tier=o.tier)  # type: ignore[arg-type]
        return resp

    async def BufferStatus(self, req: client_pb2.BufferStatusRequest) -> client_pb2.BufferStatusResponse:
        """Whether each buffer id is registered here (no side effect)."""
        return client_pb2.BufferStatusResponse(registered=self.buffers.registered(req.buffer_ids))

    async def ReportHits(self, req: client_pb2.ClientReportHitsRequest) -> client_pb2.ClientReportHitsResponse:
        """Keys an SDK read from the region's index itself, and the prefix queries behind
        them: forwarded to the master's eviction policy in this daemon's next hits batch
        (invalid keys are dropped, a chain with one whole).

        Raises:
            InvalidArgument: the ``chain_*`` columns disagree (:func:`cxlkv.wire.keys.prefix_chains`).
        """
        keys = [k for k in req.keys if key_error(k) is None]
        chains = [(list(chain), m) for chain, m in prefix_chains(req.chain_keys, req.chain_lengths, req.chain_matched)
                  if all(key_error(k) is None for k in chain)]
        c = self.core.counters
        c["index_hits_reported"] += len(keys)
        c["get_items"] += req.get_items
        c["bytes_out"] += req.bytes_out
        c["prefix_queries"] += req.prefix_queries
        c["prefix_keys"] += req.prefix_keys
        c["prefix_hits"] += req.prefix_hits
        c["reads_copied_again"] += req.reads_copied_again
        self.core.link.report_hits(keys, chains)
        return client_pb2.ClientReportHitsResponse()

    # -- packed batch forms ---------------------------------------------------
    def _packed_columns(self, req: Any, name: str) -> tuple[list[str], list[int], list[int], list[int]]:
        """Keys, buffer ids (one per key), offsets and lengths of a packed request.

        Raises:
            InvalidArgument: the arrays disagree in length.
        """
        keys = list(req.keys)
        n = len(keys)
        ids = list(req.buffer_ids)
        offs = list(req.offsets_bytes)
        lens = list(req.lengths_bytes)
        if len(ids) == 1 and n > 1:
            ids *= n
        if len(ids) != n or len(offs) != n or len(lens) != n:
            raise InvalidArgument(
                f"{name}: {n} keys with {len(req.buffer_ids)} buffer_ids, {len(offs)} offsets_bytes and "
                f"{len(lens)} lengths_bytes (one per key; buffer_ids may hold a single id for every key)")
        return keys, ids, offs, lens

    async def PackedPutFrom(self, req: client_pb2.PackedPutFromRequest) -> client_pb2.PackedPutResponse:
        """BatchPutFrom in packed arrays; per item: code, version (bad ranges fail only
        their item). Raises INVALID_ARGUMENT when the arrays disagree in length."""
        keys, ids, offs, lens = self._packed_columns(req, "PackedPutFrom")
        opts = [req.options if req.HasField("options") else None] * len(keys)
        results = await self._put_from(keys, offs, lens, self._hold(ids, offs, lens), opts)
        n = len(results)
        codes = [0] * n
        versions = [0] * n
        placed = [0] * n
        err_pos: list[int] = []
        messages: list[str] = []
        for i, r in enumerate(results):
            if isinstance(r, CxlkvError):
                codes[i] = int(r.code)
                err_pos.append(i)
                messages.append(r.message)
            else:
                versions[i] = r.version
                placed[i] = r.replicas_placed
        return client_pb2.PackedPutResponse(codes=codes, versions=versions, replicas_placed=placed,
                                            error_positions=err_pos, messages=messages)

    async def PackedGetInto(self, req: client_pb2.PackedRangesRequest) -> client_pb2.PackedGetIntoResponse:
        """BatchGetInto in packed arrays; per item: code, value size, version, tier.
        Raises INVALID_ARGUMENT when the arrays disagree in length."""
        keys, ids, offs, lens = self._packed_columns(req, "PackedGetInto")
        outs = await self._get_into(keys, offs, lens, self._hold(ids, offs, lens))
        err_pos = [i for i, o in enumerate(outs) if isinstance(o, CxlkvError)]
        if not err_pos:
            reads: list[Read] = outs  # type: ignore[assignment]
            return client_pb2.PackedGetIntoResponse(
                matched=len(outs), codes=[0] * len(outs), value_sizes_bytes=[o.size_bytes for o in reads],
                versions=[o.version for o in reads], tiers=[o.tier for o in reads])
        codes = [int(o.code) if isinstance(o, CxlkvError) else 0 for o in outs]
        return client_pb2.PackedGetIntoResponse(
            matched=len(outs) - len(err_pos), codes=codes,
            value_sizes_bytes=[0 if c else o.size_bytes for c, o in zip(codes, outs)],  # type: ignore[union-attr]
            versions=[0 if c else o.version for c, o in zip(codes, outs)],  # type: ignore[union-attr]
            tiers=[0 if c else o.tier for c, o in zip(codes, outs)],  # type: ignore[union-attr,misc]
            error_positions=err_pos, messages=[outs[i].message for i in err_pos])  # type: ignore[union-attr]

    async def PackedGetPrefixInto(self, req: client_pb2.PackedRangesRequest) -> client_pb2.PackedGetIntoResponse:
        """GetPrefixInto in packed arrays (the same errors, raised for the whole call)."""
        keys, ids, offs, lens = self._packed_columns(req, "PackedGetPrefixInto")
        matched, outs = await self._get_prefix(keys, offs, lens, self._hold(ids, offs, lens))
        return client_pb2.PackedGetIntoResponse(
            matched=matched, codes=[0] * len(outs), value_sizes_bytes=[o.size_bytes for o in outs],
            versions=[o.version for o in outs], tiers=[o.tier for o in outs])

    # -- direct mode (clientd/direct.py) -------------------------------------
    async def DirectInfo(self, req: client_pb2.DirectInfoRequest) -> client_pb2.DirectInfoResponse:
        """Whether direct mode is offered, and the regions a direct caller may map."""
        return self.direct.info()

    async def DirectPutStart(self, req: client_pb2.DirectPutStartRequest) -> client_pb2.DirectPutStartResponse:
        """Start direct puts (the caller copies). Raises INVALID_ARGUMENT (not offered,
        pid not running); per item ALREADY_EXISTS, NO_SPACE, INVALID_KEY, … or ``fallback``."""
        return await self.direct.put_start(req)

    async def DirectPutEnd(self, req: client_pb2.DirectPutEndRequest) -> client_pb2.DirectPutEndResponse:
        """Commit or revoke direct puts; per item STALE_TOKEN, CHECKSUM_MISMATCH (bad header), …"""
        return await self.direct.put_end(req)

    async def DirectReserve(self, req: client_pb2.DirectReserveRequest) -> client_pb2.DirectReserveResponse:
        """Hand reservations to a direct writer that commits them to the master itself
        (``offered = false`` where it may not). Raises INVALID_ARGUMENT (not offered,
        pid not running)."""
        return await self.direct.reserve(req)

    async def DirectGet(self, req: client_pb2.DirectGetRequest) -> client_pb2.DirectGetResponse:
        """Locate and lease objects for a direct reader; per item NOT_FOUND, INVALID_KEY, …"""
        return await self.direct.get(req)

    async def DirectRelease(self, req: client_pb2.DirectReleaseRequest) -> client_pb2.DirectReleaseResponse:
        """End the leases of finished direct reads."""
        return self.direct.release(req)

    # -- inspection ---------------------------------------------------------
    async def Stat(self, req: client_pb2.ClientStatRequest) -> client_pb2.ClientStatResponse:
        """The daemon's state, with the master's key count and space when reachable."""
        link = self.core.link
        n_buffers, buffer_bytes = self.buffers.stats()
        counters = dict(self.core.counters)
        counters["direct_puts_pending"] = self.direct.pending
        counters["reservations_held"] = self.core.reserve.held
        for c in link.coalescers():
            counters[f"master_calls.{c.name}"] = c.calls
            counters[f"master_items.{c.name}"] = c.items
        resp = client_pb2.ClientStatResponse(
            client_id=link.client_id,
            epoch=link.epoch,
            hostname=self._hostname,
            name=self.cfg.name,
            master_connected=link.connected,
            master_address=link.address,
            segments=link.segments,
            buffers_registered=n_buffers,
            buffer_bytes=buffer_bytes,
            counters={k: min(int(v), _U64_MAX) for k, v in counters.items()},  # callers' reports add up
            version=__version__,
            metrics_url=self.metrics_url,
            uptime_s=time.monotonic() - self.started,
        )
        try:
            ms = await self.core.master_stat()
        except CxlkvError as exc:
            log.debug("Stat: master unreachable: %s", exc.message)
            resp.master_connected = False
            return resp
        resp.master_connected = True
        resp.key_count = ms.key_count
        resp.capacity_bytes = ms.capacity_bytes
        resp.used_bytes = ms.used_bytes
        resp.reserved_bytes = ms.reserved_bytes
        resp.quarantined_bytes = ms.quarantined_bytes
        del resp.segments[:]
        resp.segments.extend(ms.segments)
        return resp

    async def List(self, req: client_pb2.ListRequest) -> client_pb2.ListResponse:
        """One page of committed keys in key order. Raises INVALID_ARGUMENT (page size, token)."""
        if req.page_size > MAX_LIST_PAGE:
            raise InvalidArgument(f"page_size {req.page_size} is over the limit of {MAX_LIST_PAGE}")
        r = await self.core.list_keys(req.prefix, req.page_size, req.page_token)
        return client_pb2.ListResponse(
            entries=[client_pb2.ListEntry(key=e.key, value_size_bytes=e.value_size_bytes,
                                          version=e.version, replica_count=e.replica_count)
                     for e in r.entries],
            next_page_token=r.next_page_token,
        )


def _with_upsert(opts: common_pb2.PutOptions | None) -> common_pb2.PutOptions:
    out = common_pb2.PutOptions()
    if opts is not None:
        out.CopyFrom(opts)
    out.upsert = True
    return out


#: Inline values up to this size are gathered into one buffer per batch call (
#: :func:`_one_source`).
GATHER_MAX_BYTES = 64 << 10


def _one_source(items: list[PutSpec | CxlkvError]) -> list[PutSpec | CxlkvError]:
    """The batch's small inline values (at most :data:`GATHER_MAX_BYTES` each) as
    ranges of one buffer: the core copies the values of one buffer into one region
    in one C call, where each value its own bytes object took one call per value
    (128 values of 4 KiB: one join of 512 KiB instead of 127 more C calls)."""
    small = [i for i, s in enumerate(items) if isinstance(s, PutSpec) and 0 < s.size_bytes <= GATHER_MAX_BYTES]
    if len(small) < 2:
        return items
    blob = b"".join([items[i].src for i in small])  # type: ignore[union-attr]
    out = list(items)
    pos = 0
    for i in small:
        s = out[i]
        out[i] = PutSpec(s.key, s.size_bytes, s.options, blob, pos)  # type: ignore[union-attr]
        pos += s.size_bytes  # type: ignore[union-attr]
    return out
