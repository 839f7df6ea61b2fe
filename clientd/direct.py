"""Direct mode, the daemon's side: metadata for SDK processes that copy bytes themselves.

A process that may map the region (same file or device, read-write, and the
same identity header) asks the daemon only for metadata and moves the bytes
itself; the daemon does no copy (docs/sdk.md "Direct mode"):

* ``DirectInfo``: whether direct mode is offered (config ``direct_mode``), the
  coherence mode, and the CXL regions a direct caller may map with their identity.
* ``DirectPutStart`` → the caller copies the value, hashes it (xxh3_64), writes the
  object header after the value (flushing both in ``flush`` mode) →
  ``DirectPutEnd``. The daemon owns the put token: it keeps every pending direct
  put with the caller's pid and revokes it when that process exits (checked every
  :data:`REAP_INTERVAL_S`), so a writer killed between start and end leaves
  nothing behind — and the master's ``put_timeout_s`` still applies on top.
  Before committing, the daemon checks the object header the caller wrote
  (magic, key, version, length, checksum): a buggy writer cannot commit garbage.
  An item placed on a segment the caller cannot map (another tier, or a region
  not offered) is revoked at once and answered ``fallback``.
* ``DirectGet`` grants a lease per key (the master's GetReplicaList) and
  answers the extents; the caller copies, verifies, and ends the lease with
  ``DirectRelease`` (or piggy-backed on its next ``DirectGet``). Releases go to
  the master batched, like the daemon's own.
* ``DirectReserve`` (direct commit): reservations from the daemon's pool handed
  to a writer, with the registration to commit them under; the writer commits
  to the master's lean port itself (one round trip per put or batch, none
  through the daemon). They are the writer's pending puts until it says it is
  done with them (``done_put_tokens``) or exits: then they go back to the master
  (``Reserve`` with ``unreserve_put_tokens``, or ``PutRevoke`` when their
  registration ended), never into the daemon's pool — the master refuses the
  give-back of a token that was committed, so no committed object's extent is
  ever reused. The daemon does not check the header of a directly committed
  object: a reader checks it (a value whose header does not match is a miss).
* A caller acts only on its own direct puts and leases (the caller is known from
  the socket, ``SO_PEERCRED``, on the lean socket; all gRPC callers are one
  caller): ``DirectPutEnd`` of another's put token answers STALE_TOKEN, as an
  unknown one; lease ids ``DirectGet`` did not grant to it — another process's
  direct leases, the daemon's own — are ignored, so no caller ends a lease that
  protects another's copy.

Thread-safety: event-loop confined.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cxlkv.clientd.buffers import process_start_time
from cxlkv.clientd.reserve import commit_flags
from cxlkv.errors import CxlkvError, ErrorCode, InvalidArgument
from cxlkv.wire.keys import key_error, options_error
from cxlkv.layout.objheader import check_copy, header_bytes_for
from cxlkv.wire.lean import PEER_CRED
from cxlkv.v1 import client_pb2, common_pb2, master_pb2

if TYPE_CHECKING:
    from cxlkv.clientd.core import ClientdCore
    from cxlkv.clientd.reserve import Reservation
    from cxlkv.clientd.regions import MappedRegion

__all__ = ["DirectPuts", "REAP_INTERVAL_S"]

log = logging.getLogger(__name__)

#: How often pending direct puts are checked for a dead writer, seconds.
REAP_INTERVAL_S = 0.5
#: A direct put start of at least this many bytes never lingers for other callers
#: (its caller's copy is what takes time).
LARGE_PUT_BYTES = 1 << 20
#: Most pending direct puts one daemon keeps (a runaway caller gets NOT_READY).
MAX_PENDING = 1 << 20
#: Most reservations one writer process holds from DirectReserve at once (two
#: batches of the SDK's largest direct-commit call).
MAX_HANDED_PER_WRITER = 1024
#: Most direct leases remembered (with their caller) for DirectRelease; the oldest
#: are forgotten first (their leases end on the master by themselves).
MAX_LEASES = 1 << 20
#: A granted direct lease is remembered this long past its TTL (seconds).
LEASE_GRACE_S = 1.0

_OK = int(ErrorCode.OK)
_INVALID_KEY = int(ErrorCode.INVALID_KEY)
_STALE_TOKEN = int(ErrorCode.STALE_TOKEN)
_UNKNOWN_CLIENT = int(ErrorCode.UNKNOWN_CLIENT)
_CHECKSUM_MISMATCH = int(ErrorCode.CHECKSUM_MISMATCH)
_INVALID_ARGUMENT = int(ErrorCode.INVALID_ARGUMENT)
_CXL = common_pb2.CXL
_OK_STATUS = common_pb2.Status()
_UNSPECIFIED = common_pb2.TIER_UNSPECIFIED


def _status(code: int, message: str) -> common_pb2.Status:
    return common_pb2.Status(code=code, message=message)  # type: ignore[arg-type]


@dataclass(slots=True)
class _Pending:
    """One direct put between DirectPutStart and DirectPutEnd."""

    key: str
    token: int
    version: int
    size: int
    header_bytes: int
    extents: list[Any]  # Extent-like: segment_id, offset_bytes, length_bytes
    pid: int
    pid_start: int | None
    generation: int
    started: float = field(default_factory=time.monotonic)
    #: The reserved extent this put writes (committed with Commit, given back to
    #: the pool on revoke), or ``None``: a PutStart put (PutEnd / PutRevoke).
    reservation: "Reservation | None" = None
    flags: int = 0
    #: The caller that started it (``SO_PEERCRED`` of its lean connection), or
    #: ``None``: unknown (gRPC, or adopted from a previous process) — then any
    #: caller may end it.
    caller: Any = None
    #: Handed to the writer by DirectReserve: the writer may commit it to the master
    #: itself, so the daemon never puts it back in its own pool (the extent may be
    #: a committed object's by now); it is given back to the master, which refuses
    #: a token already committed.
    handed: bool = False


class DirectPuts:
    """The direct-mode RPCs over the daemon's core (master link, mapped regions).

    Args:
        core: the daemon's protocols (its ``link``, ``regions``, ``cfg``, ``counters``).
        offered: whether direct mode is offered (config ``direct_mode``).
    """

    def __init__(self, core: "ClientdCore", *, offered: bool) -> None:
        self.core = core
        self.offered = offered
        self._pending: dict[int, _Pending] = {}
        #: Writer pid → how many of ``_pending`` are handed to it (DirectReserve's bound, O(1)).
        self._handed: dict[int, int] = {}
        #: Changes to ``_pending`` not yet in the incarnation's record: started, ended.
        self._started: list[_Pending] = []
        self._ended: list[int] = []
        #: Leases DirectGet granted: lease id -> (the caller from the socket, None on
        #: gRPC; monotonic time after which it is forgotten). Insertion order.
        self._leases: OrderedDict[int, tuple[Any, float]] = OrderedDict()
        self._reaper: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        #: Records the pending direct puts for a later process of this daemon (clientd/writers.py).
        self.incarnation: Any = None
        core.direct_pending = self.pending_tokens

    def pending_tokens(self, generation: int) -> list[int]:
        """Tokens of the pending direct puts begun in generations up to ``generation``."""
        return [p.token for p in self._pending.values() if p.generation <= generation]

    def adopt_previous(self, writers: list[Any]) -> None:
        """Watch the direct puts a previous process of this daemon had pending whose
        writers still run: each is ended when its writer sends DirectPutEnd (STALE_TOKEN,
        then PutRevoke frees its quarantined space) or revoked when the writer exits."""
        for w in writers:
            # a key-less one was handed to the writer (DirectReserve): it may have committed it
            self._add(_Pending(w.key, w.put_token, w.put_token, 0, 0, [], w.pid, w.pid_start, -1,
                               handed=not w.key))
        if writers:
            self._ensure_reaper()
            self._record()

    def _add(self, p: _Pending) -> None:
        old = self._pending.get(p.token)
        if old is not None and old.handed:
            self._unhand(old.pid)
        self._pending[p.token] = p
        if p.handed:
            self._handed[p.pid] = self._handed.get(p.pid, 0) + 1
        self._started.append(p)

    def _drop(self, token: int) -> None:
        p = self._pending.pop(token, None)
        if p is not None:
            if p.handed:
                self._unhand(p.pid)
            self._ended.append(token)

    def _unhand(self, pid: int) -> None:
        n = self._handed.get(pid, 0) - 1
        if n > 0:
            self._handed[pid] = n
        else:
            self._handed.pop(pid, None)

    def _record(self) -> None:
        """Tell the incarnation's record what started and ended since the last call
        (O(changes): one append each way, clientd/writers.py)."""
        started, self._started = self._started, []
        ended, self._ended = self._ended, []
        if self.incarnation is None:
            return
        from cxlkv.clientd.writers import DirectWriter

        if started:
            self.incarnation.direct_started(DirectWriter(p.token, p.key, p.pid, p.pid_start)
                                            for p in started if p.token in self._pending)
        if ended:
            self.incarnation.direct_ended(ended)

    # ------------------------------------------------------------- regions
    def _direct_region(self, segment_id: int) -> "MappedRegion | None":
        """The mapped region of ``segment_id`` when a direct caller may copy it."""
        if not self.offered:
            return None
        m = self.core.regions.by_segment_id(segment_id)
        if m is None or m.broken or m.info is None or m.info.tier not in (_CXL, _UNSPECIFIED):
            return None  # a broken region (its file shrank) is no longer offered
        return m

    def _tier(self, segment_id: int) -> int:
        for s in self.core.link.segments:
            if s.segment_id == segment_id:
                return int(s.tier)
        return int(_UNSPECIFIED)

    def _extent(self, ext: Any, tier: int | None = None) -> client_pb2.DirectExtent:
        """``ext``: anything with the fields of ``cxlkv.v1.Extent`` (a started put's
        extent, a located replica)."""
        direct = self._direct_region(ext.segment_id) is not None
        return client_pb2.DirectExtent(
            extent=common_pb2.Extent(segment_id=ext.segment_id, offset_bytes=ext.offset_bytes,
                                     length_bytes=ext.length_bytes),
            tier=self._tier(ext.segment_id) if tier is None else tier,  # type: ignore[arg-type]
            direct=direct)

    def info(self) -> client_pb2.DirectInfoResponse:
        """DirectInfo: the offer and the regions a direct caller may map."""
        resp = client_pb2.DirectInfoResponse(offered=self.offered, coherence=self.core.cfg.coherence,
                                             flush_reads=self.core.cfg.flush_reads,
                                             max_inline_bytes=self.core.max_inline_bytes)
        if not self.offered:
            return resp
        for m in self.core.regions:
            if m.segment_id and self._direct_region(m.segment_id) is not None:
                resp.regions.add(segment_id=m.segment_id, segment_name=m.segment, path=m.path,
                                 region_uuid=str(m.identity.region_uuid), size_bytes=m.size_bytes)
        if self.core.index.reader() is not None:  # the master publishes an index this daemon reads
            resp.index_region_uuid = self.core.link.index_region_uuid
            resp.index_epoch = self.core.link.index_epoch
        return resp

    def _check_offered(self) -> None:
        if not self.offered:
            raise InvalidArgument("direct mode is not offered by this clientd (config direct_mode = false)")

    # ---------------------------------------------------------------- puts
    async def put_start(self, req: client_pb2.DirectPutStartRequest) -> client_pb2.DirectPutStartResponse:
        """DirectPutStart: start each item's put; one result per item.

        Raises:
            InvalidArgument: direct mode is not offered; ``pid`` is not a running process.
            Unavailable, NotReady: the master cannot be reached.
        """
        self._check_offered()
        pid = int(req.pid)
        pid_start = process_start_time(pid) if pid else None
        if pid and pid_start is None:
            raise InvalidArgument(f"direct writer pid {pid} is not running")
        self._ensure_reaper()
        core = self.core
        link = core.link
        n = len(req.items)
        results: list[client_pb2.DirectPutStartResult | None] = [None] * n
        todo: list[int] = []
        for i, it in enumerate(req.items):
            why = key_error(it.key)
            if why is not None:
                results[i] = client_pb2.DirectPutStartResult(status=_status(_INVALID_KEY, why))
            elif it.HasField("options") and (why := options_error(it.options)) is not None:
                results[i] = client_pb2.DirectPutStartResult(status=_status(_INVALID_ARGUMENT, why))
            elif len(self._pending) + len(todo) >= MAX_PENDING:
                results[i] = client_pb2.DirectPutStartResult(status=_status(
                    int(ErrorCode.NOT_READY), f"{MAX_PENDING} direct puts are pending; end some first"))
            else:
                todo.append(i)
        core.counters["put_items"] += n          # puts this daemon served (metrics), of which
        core.counters["direct_put_items"] += n   # ... direct (the caller copied)
        if todo:
            items = req.items
            hbs = {i: header_bytes_for(len(items[i].key.encode("utf-8"))) for i in todo}
            urgent = sum(items[i].value_size_bytes for i in todo) >= LARGE_PUT_BYTES

            def specs(positions: list[int]) -> list[tuple[str, int, Any, int]]:
                return [(items[i].key, items[i].value_size_bytes,
                         items[i].options if items[i].HasField("options") else None, hbs[i]) for i in positions]

            gen = link.generation
            if pid:  # a writer the reaper can watch: reserved extents, committed in one round trip
                todo = self._start_reserved(items, todo, hbs, results, pid, pid_start, gen)
            try:
                starts = list(await link.put_start.submit(specs(todo), urgent=urgent)) if todo else []
                again = [j for j, r in enumerate(starts) if r.status.code == _UNKNOWN_CLIENT]
                if again and link.generation != gen:  # the link registered again meanwhile: once more
                    gen = link.generation
                    for j, r in zip(again, await link.put_start.submit(specs([todo[j] for j in again]),
                                                                       urgent=urgent)):
                        starts[j] = r
            except CxlkvError as exc:
                st = exc.to_status()
                for i in todo:
                    results[i] = client_pb2.DirectPutStartResult(status=st)
                starts = []
            revokes: list[tuple[str, int, int]] = []
            for i, r in zip(todo, starts):
                key = items[i].key
                if r.status.code:
                    results[i] = client_pb2.DirectPutStartResult(status=r.status)
                    continue
                exts = list(r.extents)
                if not exts or any(self._direct_region(e.segment_id) is None for e in exts):
                    revokes.append((key, r.put_token, 0))
                    results[i] = client_pb2.DirectPutStartResult(
                        fallback=True, extents=[self._extent(e) for e in exts])
                    core.counters["direct_put_fallbacks"] += 1
                    continue
                self._add(_Pending(
                    key, r.put_token, r.version, items[i].value_size_bytes, hbs[i], exts, pid, pid_start, gen,
                    caller=PEER_CRED.get()))
                results[i] = client_pb2.DirectPutStartResult(
                    put_token=r.put_token, version=r.version, header_bytes=hbs[i],
                    extents=[self._extent(e, int(_CXL)) for e in exts])
            if revokes:
                await self._revoke(revokes)
        self._record()  # before the writer learns its extents: a later process must know of it
        return client_pb2.DirectPutStartResponse(results=results)  # type: ignore[arg-type]

    def _start_reserved(self, items: Any, todo: list[int], hbs: dict[int, int],
                        results: list[client_pb2.DirectPutStartResult | None], pid: int,
                        pid_start: int | None, gen: int) -> list[int]:
        """Start from the daemon's reservations what may use one (as its own puts do:
        :meth:`~cxlkv.clientd.reserve.ReservePool.take_for`); returns the positions
        left for PutStart. A direct put from a reservation costs the master one round
        trip in all (the Commit of DirectPutEnd)."""
        pool = self.core.reserve
        got = pool.take_for([(items[i].key, items[i].value_size_bytes,
                              items[i].options if items[i].HasField("options") else None, hbs[i]) for i in todo])
        if not got:
            return todo
        rest: list[int] = []
        for j, i in enumerate(todo):
            r = got.get(j)
            if r is None:
                rest.append(i)
                continue
            if self._direct_region(r.segment_id) is None:  # not a region direct callers map
                pool.give_back(hbs[i] + items[i].value_size_bytes, [r])
                rest.append(i)
                continue
            it = items[i]
            o = it.options if it.HasField("options") else None
            ext = common_pb2.Extent(segment_id=r.segment_id, offset_bytes=r.offset_bytes, length_bytes=r.length_bytes)
            self._add(_Pending(
                it.key, r.put_token, r.put_token, it.value_size_bytes, hbs[i], [ext], pid, pid_start, gen,
                reservation=r, flags=commit_flags(o), caller=PEER_CRED.get()))
            results[i] = client_pb2.DirectPutStartResult(
                put_token=r.put_token, version=r.put_token, header_bytes=hbs[i],
                extents=[self._extent(ext, int(_CXL))])
            self.core.counters["direct_put_reserved"] += 1
        return rest

    def _give_back(self, pending: list[_Pending]) -> list[_Pending]:
        """Return the reserved extents of ended writers to the pool (the writer is done
        with them: it said so, or it exited); returns the puts to revoke with the
        master: PutStart puts, and reservations taken under a registration that
        ended (the master quarantined them; PutRevoke frees them, the writer is done)."""
        rest: list[_Pending] = []
        handed: list[_Pending] = []
        for p in pending:
            if p.handed:
                handed.append(p)
            elif p.reservation is None or p.generation != self.core.link.generation:
                rest.append(p)
            else:
                self.core.reserve.give_back(p.header_bytes + p.size, [p.reservation])
        if handed:
            self._spawn(self._end_handed(handed))
        return rest

    async def _end_handed(self, handed: list[_Pending]) -> None:
        """Give reservations a writer is done with back to the master: those of the
        current registration with ``Reserve(unreserve_put_tokens)``, older ones
        (quarantined when their registration ended) with ``PutRevoke``. A token the
        writer committed is refused (STALE_TOKEN) and stays the object's."""
        link = self.core.link
        gen = link.generation
        current = [p.token for p in handed if p.generation == gen]
        older = [("", p.token, 0) for p in handed if p.generation != gen]
        if current:
            try:
                await link.call("Reserve", lambda: master_pb2.ReserveRequest(
                    client_id=link.client_id, epoch=link.epoch, unreserve_put_tokens=current))
            except CxlkvError as exc:  # quarantined with the registration when it ends
                log.debug("giving back %d handed reservation(s) failed: %s", len(current), exc.message)
        if older:
            await self._revoke(older)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _reserve_now(self, need_bytes: int, count: int, gen: int) -> list["Reservation"]:
        """``count`` reservations of ``need_bytes`` straight from the master (none
        when it has no room, cannot be reached, or the registration changed)."""
        from cxlkv.clientd.reserve import MAX_RESERVED_BYTES, Reservation

        link = self.core.link
        if need_bytes > MAX_RESERVED_BYTES or need_bytes <= 0:
            return []
        try:
            resp = await link.call("Reserve", lambda: master_pb2.ReserveRequest(
                client_id=link.client_id, epoch=link.epoch, need_bytes=[need_bytes], counts=[count]))
        except CxlkvError as exc:
            log.debug("Reserve of %d handed extent(s) failed: %s", count, exc.message)
            return []
        got = [Reservation(t, sid, o, n) for t, sid, o, n in zip(
            resp.put_tokens, resp.segment_ids, resp.offsets_bytes, resp.lengths_bytes)]
        if link.generation != gen:  # granted to a registration that has ended: quarantined there
            return []
        return got

    def _end_reported(self, req: client_pb2.DirectReserveRequest, caller: Any) -> None:
        """Forget the handed reservations the writer reports done: a committed one
        the index shows committed with its version is the object's now; every other
        (unused, or a claim the index does not confirm) goes back to the master,
        which refuses — and so keeps — a token that was committed."""
        back: list[_Pending] = []

        def own(t: int) -> _Pending | None:
            p = self._pending.get(t)
            if p is None or not p.handed or (p.caller is not None and p.caller != caller):
                return None
            self._drop(t)
            return p

        for t in req.done_put_tokens:
            if (p := own(t)) is not None:
                back.append(p)
        claimed = [(p, k) for t, k in zip(req.committed_put_tokens, req.committed_keys) if (p := own(t)) is not None]
        if claimed:
            reader = self.core.index.reader()
            keys = [k.encode("utf-8", "surrogatepass") for _, k in claimed]
            try:
                if reader is None or any(not 1 <= len(k) <= 4096 for k in keys):
                    raise InvalidArgument("no index to confirm the commits")
                found = reader.probe_many(keys)
            except CxlkvError:
                found = [None] * len(claimed)
            confirmed = written = 0
            for (p, _), r, k in zip(claimed, found, keys):
                if r is None or r.version != p.token:
                    back.append(p)
                else:
                    confirmed += 1
                    written += max(0, p.size - header_bytes_for(len(k)))  # the value's bytes (0: adopted)
            counters = self.core.counters
            counters["direct_commit_bytes"] += written  # value bytes the host's writers put themselves
            counters["put_items"] += confirmed         # puts this daemon served (metrics), of which
            counters["direct_put_items"] += confirmed  # ... direct (the caller copied), of which
            counters["direct_commits"] += confirmed    # ... committed by the caller itself
        if back:
            self._give_back(back)

    async def reserve(self, req: client_pb2.DirectReserveRequest) -> client_pb2.DirectReserveResponse:
        """DirectReserve: hand reservations to a direct writer that commits them itself.

        Raises:
            InvalidArgument: direct mode is not offered; no ``pid``, or it is not
                running; ``need_bytes`` and ``counts`` differ in length.
        """
        self._check_offered()
        pid = int(req.pid)
        pid_start = process_start_time(pid) if pid else None
        if pid_start is None:
            raise InvalidArgument(f"DirectReserve needs the pid of a running writer process (got {pid})")
        needs, counts = list(req.need_bytes), list(req.counts)
        if len(needs) != len(counts):
            raise InvalidArgument(f"DirectReserve: {len(needs)} sizes with {len(counts)} counts")
        caller = PEER_CRED.get()
        if len(req.committed_put_tokens) != len(req.committed_keys):
            raise InvalidArgument(f"DirectReserve: {len(req.committed_put_tokens)} committed tokens with "
                                  f"{len(req.committed_keys)} keys")
        if req.done_put_tokens or req.committed_put_tokens:
            self._end_reported(req, caller)
        resp = client_pb2.DirectReserveResponse()
        core = self.core
        route = core.link.commit_route() if core.cfg.direct_commit else None
        why = ("config direct_commit is off" if not core.cfg.direct_commit
               else "reservations are off (config reserve_ahead)" if not core.reserve.enabled
               else ("the master link is not plaintext lean framing, not registered, or to one of several "
                     "masters") if route is None else "")
        if why:
            resp.why_not = why
            self._record()
            return resp
        resp.offered = True
        resp.master_address, resp.client_id, resp.epoch = route  # type: ignore[misc]
        self._ensure_reaper()
        gen = core.link.generation
        pool = core.reserve
        held = self._handed.get(pid, 0)
        packed = req.packed_extents
        mapped: dict[int, bool] = {}  # segment id → whether direct callers map its region
        for need, count in zip(needs, counts):
            count = max(0, min(int(count), MAX_HANDED_PER_WRITER - held, MAX_PENDING - len(self._pending)))
            got = pool.take(int(need), count) if count else []
            if len(got) < count:  # the pool is short: the rest from the master, in this call
                got += await self._reserve_now(int(need), count - len(got), gen)
            handed: list[Reservation] = []
            for r in got:
                ok = mapped.get(r.segment_id)
                if ok is None:
                    ok = mapped[r.segment_id] = self._direct_region(r.segment_id) is not None
                if not ok:  # not a region direct callers map
                    pool.give_back(int(need), [r])
                    continue
                handed.append(r)
                self._add(_Pending("", r.put_token, r.put_token, int(need), 0, [r], pid, pid_start, gen,
                                   reservation=r, caller=caller, handed=True))
            resp.put_tokens.extend([r.put_token for r in handed])
            if packed:
                resp.segment_ids.extend([r.segment_id for r in handed])
                resp.offsets_bytes.extend([r.offset_bytes for r in handed])
                resp.lengths_bytes.extend([r.length_bytes for r in handed])
            else:
                resp.extents.extend([self._extent(r, int(_CXL)) for r in handed])
            held += len(handed)
            resp.granted.append(len(handed))
            core.counters["direct_reserved_handed"] += len(handed)
        self._record()  # before the writer learns its extents: a later process must know of it
        return resp

    async def put_end(self, req: client_pb2.DirectPutEndRequest) -> client_pb2.DirectPutEndResponse:
        """DirectPutEnd: commit (or revoke) each item; one status per item.

        An item whose token this daemon did not hand out (or already ended or
        revoked, e.g. after its writer was taken for dead, or after it took longer
        than the master's ``put_timeout_s``) answers STALE_TOKEN: the attempt is
        dead and is not redone by the SDK (a later retry could land after newer
        puts of the key). A put whose attempt died because this daemon's
        registration with the master ended while it was written answers
        UNKNOWN_CLIENT instead: nothing of it was committed, and the SDK starts it
        again at once, as clientd does with its own puts. One whose header does
        not describe the value answers CHECKSUM_MISMATCH and is revoked.

        Raises:
            Unavailable, NotReady: the master cannot be reached (the puts stay
                pending; the master reclaims them after ``put_timeout_s``).
        """
        link = self.core.link
        caller = PEER_CRED.get()
        n = len(req.items)
        out: list[common_pb2.Status | None] = [None] * n
        ends: list[tuple[int, tuple[str, int, int]]] = []
        commits: list[tuple[int, _Pending, int]] = []
        revokes: list[tuple[int, tuple[str, int, int]]] = []
        begun: dict[int, int] = {}  # position -> the registration (link generation) its put began in
        for i, it in enumerate(req.items):
            p = self._pending.get(it.put_token)
            if p is None or p.handed or p.key != it.key or (p.caller is not None and p.caller != caller):
                out[i] = _status(_STALE_TOKEN, f"no pending direct put of key {it.key!r} with token "
                                               f"{it.put_token} (already ended, revoked or reclaimed)")
                continue
            self._drop(it.put_token)
            begun[i] = p.generation
            if it.revoke:
                if not self._give_back([p]):
                    out[i] = _OK_STATUS
                    continue
                revokes.append((i, (p.key, p.token, 0)))
                continue
            why = self._check_header(p, it.checksum)
            if why is not None:
                log.warning("direct put of key %r: %s; revoked", p.key[:64], why)
                out[i] = _status(_CHECKSUM_MISMATCH, f"key {p.key!r}: {why}; the put was revoked")
                if self._give_back([p]):
                    revokes.append((i, (p.key, p.token, 0)))
                continue
            if p.reservation is not None and p.generation != link.generation:
                # reserved under a registration that ended: the master quarantined the
                # extent, a commit would only be refused. The writer is done with it:
                # PutRevoke frees it (answered STALE_TOKEN, i.e. UNKNOWN_CLIENT below:
                # nothing was committed, the SDK starts the put again)
                revokes.append((i, (p.key, p.token, 0)))
            elif p.reservation is not None:
                commits.append((i, p, it.checksum))
            else:
                ends.append((i, (p.key, p.token, it.checksum)))
        if commits:
            await self._commit(commits, out)
        if revokes:
            st = await self._revoke([r for _, r in revokes])
            for (i, _), s in zip(revokes, st):
                if out[i] is None:
                    out[i] = s
        if ends:
            gen = link.generation
            statuses = await link.put_end.submit([e for _, e in ends], urgent=True)
            fenced: list[tuple[str, int, int]] = []
            for (i, e), s in zip(ends, statuses):
                out[i] = s
                if s.code == _STALE_TOKEN:
                    # timed out while the writer copied, or begun under a registration that
                    # ended: the writer is done now, so its held space may be freed
                    fenced.append((e[0], e[1], 0))
            if fenced:
                await self.core.release_fenced(fenced)
        self.core.counters["direct_put_ends"] += len(ends) + len(commits)
        gen = link.generation
        for i, g in begun.items():
            s = out[i]
            if s is not None and s.code == _STALE_TOKEN and g != gen:
                out[i] = _status(_UNKNOWN_CLIENT, (
                    f"key {req.items[i].key!r}: this daemon re-registered with the master while the put was "
                    f"written; nothing was committed, start the put again ({s.message})"))
        self._record()
        return client_pb2.DirectPutEndResponse(results=out)  # type: ignore[arg-type]

    async def _commit(self, commits: list[tuple[int, _Pending, int]], out: list[common_pb2.Status | None]) -> None:
        """Commit the reserved direct puts; one status each into ``out``. A
        commit that fails leaves the reservation with the master: it is consumed
        (an error of the item) or stays this registration's (the call failed; the
        master quarantines it when the registration ends)."""
        link = self.core.link
        try:
            statuses = await link.commit.submit(
                [(p.key, p.token, p.size, p.header_bytes, checksum, p.flags) for _, p, checksum in commits],
                urgent=True)
        except CxlkvError as exc:
            st = exc.to_status()
            for i, _, _ in commits:
                out[i] = st
            return
        for (i, _, _), st in zip(commits, statuses):
            out[i] = st

    def _check_header(self, p: _Pending, checksum: int) -> str | None:
        """Why the header the writer wrote at every extent does not describe this put."""
        key_utf8 = p.key.encode("utf-8")
        for ext in p.extents:
            m = self._direct_region(ext.segment_id)
            if m is None:
                return f"segment {ext.segment_id} is no longer mapped"
            # written by another process: drop any line of ours first (both modes; 1-2 lines)
            why = check_copy(m.region, ext.offset_bytes, p.header_bytes, key_utf8, p.version, p.size, checksum,
                             invalidate=True)
            if why is not None:
                return f"{why} (was the header written before DirectPutEnd?)"
        return None

    async def _revoke(self, items: list[tuple[str, int, int]]) -> list[common_pb2.Status]:
        try:
            return list(await self.core.link.put_revoke.submit(items))
        except CxlkvError as exc:  # the master reclaims them after put_timeout_s
            log.warning("PutRevoke of %d direct put(s) failed: %s", len(items), exc.message)
            return [exc.to_status()] * len(items)

    # ---------------------------------------------------------- dead writers
    def _ensure_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.get_running_loop().create_task(self._reap_loop())

    async def _reap_loop(self) -> None:
        while True:
            await asyncio.sleep(REAP_INTERVAL_S)
            try:
                await self.reap_dead_writers()
            except Exception:  # a bug; keep the daemon up
                log.exception("direct-put reaper failed")
            if not self._pending:
                self._reaper = None
                return

    async def reap_dead_writers(self) -> int:
        """Revoke the pending direct puts whose writer process has exited.

        Returns:
            Puts revoked.
        """
        from cxlkv.clientd.writers import running

        watched = [p for p in self._pending.values() if p.pid]  # pid 0: a writer of unknown process
        alive = {id(p) for p in running(watched)}
        dead = [p for p in watched if id(p) not in alive]
        if not dead:
            return 0
        for p in dead:
            self._drop(p.token)
        self._record()
        log.info("revoking %d direct put(s) of exited writer(s) %s", len(dead),
                 sorted({p.pid for p in dead}))
        started = self._give_back(dead)
        if started:
            await self._revoke([(p.key, p.token, 0) for p in started])
        self.core.counters["direct_puts_reaped"] += len(dead)
        return len(dead)

    @property
    def pending(self) -> int:
        """Direct puts started and not yet ended."""
        return len(self._pending)

    # --------------------------------------------------------------- reads
    async def get(self, req: client_pb2.DirectGetRequest) -> client_pb2.DirectGetResponse:
        """DirectGet: locate and lease each key; one result per key.

        Raises:
            InvalidArgument: direct mode is not offered.
        """
        self._check_offered()
        core = self.core
        link = core.link
        if req.release_lease_ids:
            self._release_own(req.release_lease_ids)
        keys = list(req.keys)
        n = len(keys)
        resp = client_pb2.DirectGetResponse()
        results: list[client_pb2.DirectGetResult | None] = [None] * n
        todo: list[int] = []
        for i, k in enumerate(keys):
            why = key_error(k)
            if why is not None:
                results[i] = client_pb2.DirectGetResult(status=_status(_INVALID_KEY, why))
            else:
                todo.append(i)
        core.counters["get_items"] += n
        core.counters["direct_get_items"] += n
        if todo:
            try:
                located = await link.locate.submit([keys[i] for i in todo], urgent=True)
            except CxlkvError as exc:
                st = exc.to_status()
                for i in todo:
                    results[i] = client_pb2.DirectGetResult(status=st)
            else:
                for i, loc in zip(todo, located.locations):
                    if loc.status.code:
                        results[i] = client_pb2.DirectGetResult(status=loc.status)
                        if loc.lease_id:
                            link.release_leases([loc.lease_id])
                        continue
                    if loc.lease_id:
                        self._granted(loc.lease_id, loc.lease_ttl_ms)
                    reps = [self._extent(r, int(r.tier)) for r in loc.replicas]
                    reps.sort(key=lambda e: not e.direct)
                    results[i] = client_pb2.DirectGetResult(
                        value_size_bytes=loc.value_size_bytes, version=loc.version, checksum=loc.checksum,
                        header_bytes=loc.header_bytes, lease_id=loc.lease_id, lease_ttl_ms=loc.lease_ttl_ms,
                        replicas=reps)
        resp.results.extend(results)  # type: ignore[arg-type]
        return resp

    def _granted(self, lease_id: int, ttl_ms: int) -> None:
        """Remember that the current caller holds ``lease_id`` (from DirectGet)."""
        now = time.monotonic()
        leases = self._leases
        while leases:  # forget leases long ended (deadlines grow with insertion order)
            first = next(iter(leases.values()))
            if first[1] >= now and len(leases) < MAX_LEASES:
                break
            leases.popitem(last=False)
        leases[lease_id] = (PEER_CRED.get(), now + ttl_ms / 1000.0 + LEASE_GRACE_S)

    def _release_own(self, lease_ids: Any) -> None:
        """Release the leases of ``lease_ids`` that DirectGet granted to this caller;
        ignore the others (not granted to it, or already released)."""
        caller = PEER_CRED.get()
        own: list[int] = []
        leases = self._leases
        for lid in lease_ids:
            held = leases.get(lid)
            if held is not None and held[0] == caller:
                del leases[lid]
                own.append(lid)
        if own:
            self.core.link.release_leases(own)
        if len(own) < len(lease_ids):
            log.debug("ignored the release of %d lease(s) not granted to this caller", len(lease_ids) - len(own))

    def release(self, req: client_pb2.DirectReleaseRequest) -> client_pb2.DirectReleaseResponse:
        """DirectRelease: end leases of finished direct reads (sent to the master batched);
        count the caller's checksum failures with the daemon's own."""
        self._release_own(req.lease_ids)
        self.core.counters["reads_copied_again"] += req.reads_copied_again
        if req.checksum_failures:
            self.core.counters["checksum_failures"] += req.checksum_failures
            log.warning("a direct reader saw %d checksum mismatch(es); answered as misses", req.checksum_failures)
        return client_pb2.DirectReleaseResponse()
