"""clientd's logic, independent of its front-ends: the put and read protocols.

* **Put** (all items of one call, and of concurrent callers, coalesced):
  ``BatchPutStart`` (asking for the value's size plus the object header's, see
  :mod:`cxlkv.objheader`) → copy the value into every replica's extent (C, GIL
  released; large copies in a thread pool) while hashing the source (xxh3_64) →
  in ``coherence = "flush"`` mode with the transport's non-coherent copies
  (streaming stores, partial lines written back, SFENCE: in memory on return) →
  write the header and key after the value (and flush them) →
  ``BatchPutEnd`` with the checksum. An item
  whose copy failed is revoked (``BatchPutRevoke``) so its space is freed at once.
  A put whose ``PutEnd`` is refused because the daemon re-registered meanwhile
  (new epoch) is retried once from the start.
* **Read**: ``BatchGetReplicaList`` (or ``BatchMatchPrefix``) grants a lease →
  copy out of a replica mapped on this host → check that the lease had not
  ended before the copy finished (else the space may have been reused: the read
  is retried once, then reported as LEASE_EXPIRED — never wrong bytes) → verify
  the object header (magic, key hash, version, length, header checksum) and the
  value's checksum, in both coherence modes (flush mode verifies first: the
  first copy goes through the cache, the headers' lines are dropped before they
  are checked, and a stale line fails the check); a mismatch is retried once
  with the transport's non-coherent copy (every line dropped before it is
  read), then answered CHECKSUM_MISMATCH (a miss) and counted in
  ``checksum_failures`` → release the lease.

The front-ends (:mod:`cxlkv.clientd.grpc_service`, :mod:`cxlkv.clientd.lean`)
translate messages through :mod:`cxlkv.clientd.api` into these calls.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Callable

import xxhash

from cxlkv.clientd.index_reads import IndexReads
from cxlkv.clientd.master_link import (
    _OK_STATUS as _LINK_OK, MAX_BATCH_ITEMS, Located, Location, MasterLink, StartedExtent, StartedPut,
)
from cxlkv.clientd.reserve import Reservation, ReservePool, commit_flags
from cxlkv.clientd.regions import MappedRegion, RegionSet
from cxlkv.config import ClientdConfig
from cxlkv.errors import CxlkvError, ErrorCode, RegionError
from cxlkv.transport.bindings import cxlkv_guard_total_hits as _guard_total_hits
from cxlkv.keys import key_error, options_error
from cxlkv.objheader import check_copy, header_bytes_for
from cxlkv.transport.index import IX_ELSEWHERE, IX_HIT, IX_MISS, IX_TOO_SMALL
from cxlkv.v1 import client_pb2, common_pb2, master_pb2

__all__ = ["PutSpec", "ReadTarget", "ReadOutcome", "ClientdCore", "LARGE_COPY_BYTES"]

log = logging.getLogger(__name__)

#: Copies of at least this many bytes (per call) run in the copy thread pool so
#: the event loop keeps serving; smaller ones run inline (a C call with the GIL
#: released costs ~2 µs plus ~0.1 ms per MiB, a hop to a thread ~50 µs of CPU
#: plus the GIL hand-offs). Measured on the trace replay (24 blocks of 64 KiB per
#: request): 4 MiB instead of 1 MiB cut clientd's CPU per request by 15 %, and
#: a 4 MiB copy holds the loop for ~0.3 ms.
LARGE_COPY_BYTES = 4 << 20
#: Calls moving at least this many bytes never wait for a cohort in the master
#: link's coalescers (their copies bring callers back at scattered times).
URGENT_BYTES = 1 << 20
#: Copies are split across the copy threads only into pieces of at least this
#: many bytes: the transport's streaming (non-temporal) kernel, which large copies
#: need, starts at 16 MiB, and halves of a 16 MiB copy run slower on two threads
#: (measured: 1.8 ms) than the whole on one (1.1 ms).
SPLIT_COPY_BYTES = 16 << 20
#: Reads of at least this many bytes into a shared buffer copy and hash in one
#: pass (``Region.copy_out_hashed``); smaller ones are copied in batches and
#: hashed from cache afterwards.
FUSED_HASH_MIN_BYTES = 256 << 10
#: A Remove (without force) that meets a lease retries for up to this long, in
#: seconds: reads hold their lease only while they copy.
REMOVE_LEASE_WAIT_S = 0.05
REMOVE_RETRY_FIRST_S = 0.002
#: Deadline of a RemoveAll / RemoveByRegex call to the master, in seconds (it runs by slices).
REMOVE_ALL_TIMEOUT_S = 120.0

_OK = int(ErrorCode.OK)
_NOT_FOUND = int(ErrorCode.NOT_FOUND)
_ALREADY_EXISTS = int(ErrorCode.ALREADY_EXISTS)
_INVALID_KEY = int(ErrorCode.INVALID_KEY)
_INVALID_ARGUMENT = int(ErrorCode.INVALID_ARGUMENT)
_STALE_TOKEN = int(ErrorCode.STALE_TOKEN)
_UNKNOWN_CLIENT = int(ErrorCode.UNKNOWN_CLIENT)
_LEASE_EXPIRED = int(ErrorCode.LEASE_EXPIRED)
_CHECKSUM_MISMATCH = int(ErrorCode.CHECKSUM_MISMATCH)
_TOO_LARGE = int(ErrorCode.TOO_LARGE)
_HAS_LEASE = int(ErrorCode.HAS_LEASE)
_OUT_OF_RANGE = int(ErrorCode.OUT_OF_RANGE)
_UNAVAILABLE = int(ErrorCode.UNAVAILABLE)
_INTERNAL = int(ErrorCode.INTERNAL)


def _code_name(code: int) -> str:
    """The ErrorCode name of ``code`` (its number for one this version does not know)."""
    try:
        return ErrorCode(code).name
    except ValueError:
        return str(code)


_xxh3 = xxhash.xxh3_64_intdigest
_Status = common_pb2.Status
_OK_STATUS = _LINK_OK
_PutResult = client_pb2.PutResult


@dataclass(slots=True)
class PutSpec:
    """One value to put.

    Attributes:
        key: the key (validated here).
        size: value size in bytes.
        options: put options (``None``: defaults).
        src: a bytes-like object holding the value at ``src_offset`` (the inline
            value itself, or a shared buffer's view).
        src_offset: where the value starts in ``src``, in bytes.
    """

    key: str
    size: int
    options: common_pb2.PutOptions | None
    src: Any
    src_offset: int = 0


@dataclass(slots=True)
class ReadTarget:
    """Where a read's bytes go: ``buf[offset : offset + capacity]`` (a shared buffer's view)."""

    buf: Any
    offset: int
    capacity: int


@dataclass(slots=True)
class ReadOutcome:
    """The outcome of reading one key.

    Attributes:
        code: ``ErrorCode`` (0 = OK).
        message: one line when ``code`` is not OK.
        size: value size in bytes (also set on TOO_LARGE / OUT_OF_RANGE).
        version: the version read.
        value: the bytes, for inline reads.
        tier: ``cxlkv.v1.Tier`` of the replica that served the read (0: none copied).
    """

    code: int = 0
    message: str = ""
    size: int = 0
    version: int = 0
    value: bytes | None = None
    tier: int = 0

    def error(self, key: str) -> CxlkvError:
        """The exception this (failed) outcome stands for."""
        from cxlkv.errors import error_for

        return error_for(self.code, self.message, key=key,
                         requested_bytes=self.size if self.code in (_TOO_LARGE, _OUT_OF_RANGE) else None)


@dataclass(slots=True)
class _Copy:
    """One planned copy between a region extent and a caller's memory."""

    index: int
    mapped: MappedRegion
    region_offset: int
    length: int
    buf: Any
    buf_offset: int
    #: Reads only: copy with ``Region.copy_out_hashed`` (one pass) and keep the
    #: xxh3_64 of the bytes delivered in ``checksum`` (set for whole values of
    #: at least :data:`FUSED_HASH_MIN_BYTES` that :func:`_partition` keeps whole).
    fuse: bool = False
    checksum: int | None = None
    #: Reads only: the copy will be checked against a checksum (the master's, or
    #: the header's) before its bytes are used; a flush-mode read then verifies
    #: first. False (a bare value with no known checksum): every line dropped.
    checked: bool = True
    #: Reads only: the first copy did not verify and the value was copied again.
    redone: bool = False


def _status(code: int, message: str) -> common_pb2.Status:
    """A per-item Status (the enum field takes the plain int code)."""
    return _Status(code=code, message=message)  # type: ignore[arg-type]


def _err_status(exc: CxlkvError) -> common_pb2.Status:
    return _status(int(exc.code), exc.message)


class ClientdCore:
    """The daemon's protocols over the master link and the mapped regions.

    Args:
        cfg: daemon configuration (``max_inline_bytes``, ``coherence``).
        regions: the mapped regions, bound to segment ids by ``link``.
        link: the master session.
        executor: thread pool for large copies.
        clock: monotonic clock in seconds (lease deadlines).
        large_copy_bytes: copies of a call totalling at least this many bytes run in ``executor``.
        copy_threads: threads of ``executor``; large copies are spread over them.

    Thread-safety: event-loop confined; copies may run in ``executor``.
    """

    def __init__(
        self,
        cfg: ClientdConfig,
        regions: RegionSet,
        link: MasterLink,
        executor: Executor,
        *,
        clock: Callable[[], float] = time.monotonic,
        large_copy_bytes: int = LARGE_COPY_BYTES,
        copy_threads: int = 1,
    ) -> None:
        self.cfg = cfg
        self.regions = regions
        self.link = link
        self.executor = executor
        self.clock = clock
        self.large_copy_bytes = large_copy_bytes
        self.copy_threads = max(1, copy_threads)
        self.flush_mode = cfg.coherence == "flush"
        #: flush mode: the value's first copy through the cache, checked (config ``flush_reads``)
        self.verify_first = cfg.flush_reads == "verify_first"
        self.max_inline_bytes = cfg.max_inline_bytes
        #: Operation and byte counters (reported by Stat and /metrics).
        self.counters: Counter[str] = Counter()
        #: Reads from the region's index (clientd/index_reads.py).
        self.index = IndexReads(regions, link, invalidate=self.flush_mode, verify_first=self.verify_first,
                                max_value_bytes=cfg.index_max_value_bytes, enabled=cfg.index_reads)
        self._scratch: bytearray | None = None  # inline index reads land here first
        #: Extents reserved ahead of need: puts in one master round trip (clientd/reserve.py).
        self.reserve = ReservePool(link, enabled=cfg.reserve_ahead)
        #: Put rounds running, per master-link generation (registration) they began in.
        self._puts_in_flight: dict[int, int] = {}
        #: Set whenever the last put round of an ended registration finishes.
        self.drained = asyncio.Event()
        #: Tokens of the direct puts begun under registrations up to a generation
        #: that are still pending (set by :class:`cxlkv.clientd.direct.DirectPuts`).
        self.direct_pending: Callable[[int], list[int]] = lambda generation: []
        self._tasks: set[asyncio.Task[Any]] = set()
        link.on_registered.append(self._registered)

    # ================================================================== puts
    async def put(self, specs: list[PutSpec]) -> list[client_pb2.PutResult]:
        """Put every value: one result per spec, in order; never raises for an item.

        Returns:
            ``PutResult`` per position (status OK with version and replicas placed,
            or the item's error).
        """
        n = len(specs)
        results: list[client_pb2.PutResult | None] = [None] * n
        todo: list[int] = []
        for i, s in enumerate(specs):
            why = key_error(s.key)
            if why is not None:
                results[i] = _PutResult(status=_status(_INVALID_KEY, why))
            elif s.options is not None and (why := options_error(s.options)) is not None:
                results[i] = _PutResult(status=_status(_INVALID_ARGUMENT, why))
            else:
                todo.append(i)
        self.counters["put_items"] += n
        for attempt in range(2):
            if not todo:
                break
            todo = await self._put_attempt(specs, todo, results, retry_allowed=attempt == 0)
        for i, r in enumerate(results):
            if r is None:  # unreachable by construction; never answer nothing
                results[i] = _PutResult(status=_status(_INTERNAL, "put produced no result"))
            elif r.status.code == _ALREADY_EXISTS:  # keys are immutable: a replay's put of a cached key
                self.counters["put_already_exists"] += 1
            elif r.status.code:
                self.counters[f"put_errors.{_code_name(r.status.code)}"] += 1
        return results  # type: ignore[return-value]

    async def _put_attempt(
        self,
        specs: list[PutSpec],
        todo: list[int],
        results: list[client_pb2.PutResult | None],
        *,
        retry_allowed: bool,
    ) -> list[int]:
        """One round for ``todo``: reserved extents (copy → PackedCommit: one master
        round trip) where the pool has them, PutStart → copy → PutEnd for the rest;
        returns the positions to retry."""
        link = self.link
        gen = link.generation
        urgent = sum(specs[i].size for i in todo) >= URGENT_BYTES
        key_bytes = {i: specs[i].key.encode("utf-8") for i in todo}
        reserved = self._take_reserved(specs, todo, key_bytes)
        self._puts_in_flight[gen] = self._puts_in_flight.get(gen, 0) + 1
        try:
            return await self._put_round(specs, todo, results, key_bytes, reserved, gen, urgent, retry_allowed)
        finally:
            left = self._puts_in_flight[gen] - 1
            if left:
                self._puts_in_flight[gen] = left
            else:
                del self._puts_in_flight[gen]
                if gen != link.generation:
                    self.drained.set()

    def _take_reserved(self, specs: list[PutSpec], todo: list[int],
                       key_bytes: dict[int, bytes]) -> dict[int, StartedPut]:
        """Reserved extents for the items that may use one
        (:meth:`~cxlkv.clientd.reserve.ReservePool.take_for`), as started puts."""
        got = self.reserve.take_for([(specs[i].key, specs[i].size, specs[i].options,
                                      header_bytes_for(len(key_bytes[i]))) for i in todo])
        return {todo[j]: StartedPut(_OK_STATUS, r.put_token, r.put_token,
                                    (StartedExtent(r.segment_id, r.offset_bytes, r.length_bytes),), 1)
                for j, r in got.items()}

    async def _put_round(
        self, specs: list[PutSpec], todo: list[int], results: list[client_pb2.PutResult | None],
        key_bytes: dict[int, bytes], reserved: dict[int, StartedPut], gen: int, urgent: bool,
        retry_allowed: bool,
    ) -> list[int]:
        link = self.link
        started = [i for i in todo if i not in reserved]
        try:
            got = await link.put_start.submit([
                (specs[i].key, specs[i].size, specs[i].options, header_bytes_for(len(key_bytes[i])))
                for i in started
            ], urgent=urgent) if started else []
        except CxlkvError as exc:
            st = _err_status(exc)
            for i in started:
                results[i] = _PutResult(status=st)
            started, got = [], []
            todo = [i for i in todo if i in reserved]
            if not todo:
                return []
        by_pos = dict(zip(started, got))
        by_pos.update(reserved)
        todo = [i for i in todo if i in by_pos]
        starts = [by_pos[i] for i in todo]

        accepted: list[tuple[int, master_pb2.PutStartResult]] = []
        failed: dict[int, CxlkvError] = {}
        copies: list[_Copy] = []
        total = 0
        by_id = self.regions.by_segment_id
        for i, r in zip(todo, starts):
            code = r.status.code
            if code:
                if retry_allowed and code == _UNKNOWN_CLIENT:
                    continue  # re-registered meanwhile; handled below
                results[i] = _PutResult(status=r.status)
                continue
            s = specs[i]
            accepted.append((i, r))
            if not r.extents:
                failed[i] = CxlkvError(f"the master placed no replica for key {s.key!r}")
                continue
            for ext in r.extents:
                m = by_id(ext.segment_id)
                if m is None:
                    failed[i] = _unmapped(ext.segment_id)
                    break
                hb = header_bytes_for(len(key_bytes[i]))
                if ext.length_bytes < s.size + hb:
                    failed[i] = CxlkvError(
                        f"extent of {ext.length_bytes} bytes for a {s.size}-byte value and a "
                        f"{hb}-byte header (master bug)")
                    break
                if s.size:
                    copies.append(_Copy(i, m, ext.offset_bytes + hb, s.size, s.src, s.src_offset))
                    total += s.size
        retry = [i for i, r in zip(todo, starts) if r.status.code == _UNKNOWN_CLIENT] if retry_allowed else []

        hashed = [i for i, _ in accepted if i not in failed]
        checksums: dict[int, int] = {}
        faults_before = _guard_total_hits()
        if copies:
            live = [c for c in copies if c.index not in failed]
            if total >= self.large_copy_bytes:
                # Values copied whole are hashed by the copy itself (one pass over
                # memory, chunks hashed while in cache); values split over several
                # copy threads are hashed in another pool thread while they copy.
                fused = _fusable(live, specs)
                fused_positions = {c.index for c in live if id(c) in fused}
                rest = [i for i in hashed if i not in fused_positions]
                hashing = None
                if rest:
                    hashing = asyncio.get_running_loop().run_in_executor(
                        self.executor, _hash_sources, specs, rest)
                errs = await self._in_pool(
                    lambda job: self._copy_in_and_flush(job, fused, checksums), live)
                if hashing is not None:
                    checksums.update(await hashing)
            else:
                # One C call per source buffer and region copies and hashes.
                errs = self._copy_in_and_flush(live, checksums=checksums, hash_ranges=True)
                missing = [i for i in hashed if i not in checksums]
                if missing:
                    checksums.update(_hash_sources(specs, missing))
            for i, copy_error in errs.items():
                failed.setdefault(i, copy_error)
            self.counters["bytes_in"] += total
        else:
            checksums = _hash_sources(specs, hashed)
        # The header goes in after the value is in memory (flushed, in flush mode).
        failed.update(self._write_headers(
            [(i, r) for i, r in accepted if i not in failed], key_bytes, specs, checksums))
        if _guard_total_hits() != faults_before:  # a region or buffer file shrank under these copies
            self._fail_broken(accepted, failed, specs)

        ends: list[tuple[int, master_pb2.PutStartResult]] = []
        revokes: list[tuple[int, master_pb2.PutStartResult]] = []
        commits: list[tuple[int, Any]] = []
        for i, r in accepted:
            if i in reserved:
                if i in failed:  # the extent is still ours: back to the pool
                    self.reserve.give_back(header_bytes_for(len(key_bytes[i])) + specs[i].size,
                                           [_reservation(reserved[i])])
                    results[i] = _PutResult(status=_err_status(failed[i]))
                else:
                    commits.append((i, r))
                continue
            (revokes if i in failed else ends).append((i, r))
        commit_task: asyncio.Future[Any] | None = None
        if commits:  # runs beside the PutEnd call
            commit_task = asyncio.ensure_future(link.commit.submit([
                (specs[i].key, r.put_token, specs[i].size, header_bytes_for(len(key_bytes[i])),
                 checksums.get(i, 0), commit_flags(specs[i].options)) for i, r in commits
            ], urgent=urgent))
        revoke_task: asyncio.Future[Any] | None = None
        if revokes:  # runs beside the PutEnd call
            revoke_task = asyncio.ensure_future(link.put_revoke.submit([
                (specs[i].key, r.put_token, 0) for i, r in revokes
            ]))
        statuses: Any = ()
        end_error: CxlkvError | None = None
        if ends:
            try:
                statuses = await link.put_end.submit([
                    (specs[i].key, r.put_token, checksums.get(i, 0)) for i, r in ends
                ], urgent=urgent)
            except CxlkvError as exc:
                end_error = exc
        if revoke_task is not None:
            try:
                await revoke_task
            except CxlkvError as exc:  # the master reclaims it after put_timeout or our expiry
                log.warning("PutRevoke of %d put(s) failed: %s", len(revokes), exc.message)
            for i, _ in revokes:
                results[i] = _PutResult(status=_err_status(failed[i]))
        if ends:
            if end_error is not None:
                st = _err_status(end_error)
                for i, _ in ends:
                    results[i] = _PutResult(status=st)
                if link.generation == gen:  # not committed, or committed (then this changes nothing)
                    await self.release_fenced([(specs[i].key, r.put_token, 0) for i, r in ends])
                ends = []
            fenced: list[tuple[str, int, int]] = []
            for (i, r), st in zip(ends, statuses):
                if not st.code:
                    results[i] = _PutResult(version=r.version, replicas_placed=len(r.extents))
                elif st.code in (_STALE_TOKEN, _UNKNOWN_CLIENT) and retry_allowed and link.generation != gen:
                    retry.append(i)
                else:
                    results[i] = _PutResult(status=st)
                    if st.code == _STALE_TOKEN and link.generation == gen:
                        fenced.append((specs[i].key, r.put_token, 0))
            if fenced:
                await self.release_fenced(fenced)
        if commit_task is not None:
            try:
                cstatuses = await commit_task
            except CxlkvError as exc:
                st = _err_status(exc)
                for i, _ in commits:
                    results[i] = _PutResult(status=st)
            else:
                for (i, r), st in zip(commits, cstatuses):
                    if not st.code:
                        results[i] = _PutResult(version=r.version, replicas_placed=1)
                    elif st.code in (_STALE_TOKEN, _UNKNOWN_CLIENT) and retry_allowed and link.generation != gen:
                        retry.append(i)  # the registration ended meanwhile: its reservation is quarantined
                    else:
                        results[i] = _PutResult(status=st)
        return retry

    async def release_fenced(self, items: list[tuple[str, int, int]]) -> None:
        """End attempts the master revoked (put_timeout_s) while this daemon was still
        writing them: the master holds such ("fenced") extents until the writer
        says it is done, so no late copy lands in reused space. PutRevoke frees
        them; a token that was not fenced answers STALE_TOKEN and changes nothing.
        Never raises: the master also frees them when this registration ends."""
        try:
            await self.link.put_revoke.submit(items)
        except CxlkvError as exc:
            log.warning("PutRevoke of %d timed-out put(s) failed: %s", len(items), exc.message)

    async def _in_pool(
        self, fn: Callable[[list[_Copy]], dict[int, CxlkvError]], copies: list[_Copy]
    ) -> dict[int, CxlkvError]:
        """Run ``fn`` over ``copies`` in the copy threads, the bytes spread over
        ``copy_threads`` jobs (copies of twice :data:`SPLIT_COPY_BYTES` or more are split),
        so large values move with several cores while the event loop keeps serving."""
        loop = asyncio.get_running_loop()
        jobs = _partition(copies, self.copy_threads)
        if len(jobs) == 1:
            return await loop.run_in_executor(self.executor, fn, jobs[0])
        errs: dict[int, CxlkvError] = {}
        for part in await asyncio.gather(*(loop.run_in_executor(self.executor, fn, j) for j in jobs)):
            for i, exc in part.items():
                errs.setdefault(i, exc)
        return errs

    def _fail_broken(self, accepted: list[tuple[int, Any]], failed: dict[int, CxlkvError],
                     specs: list[PutSpec] | None = None) -> None:
        """After copies during which the SIGBUS guard absorbed a fault: retire the
        regions whose file shrank (:meth:`RegionSet.check_files`) and fail every put
        with a replica there (its bytes went to zero memory, not to the region), or
        whose source is a shared buffer whose file its owner truncated (the copy
        read zeros past the new end, not the value)."""
        from cxlkv.clientd.buffers import source_shrank
        from cxlkv.errors import OutOfRange

        for why in self.regions.check_files():
            log.error("%s", why)
        by_id = self.regions.by_segment_id
        for i, r in accepted:
            if i in failed:
                continue
            if specs is not None and source_shrank(specs[i].src):
                failed[i] = OutOfRange(f"key {specs[i].key!r}: its source buffer's file shrank under the daemon "
                                       "(truncated by its owner) while the value was copied; nothing was stored")
                continue
            for ext in r.extents:
                m = by_id(ext.segment_id)
                if m is not None and m.broken:
                    failed[i] = RegionError(m.broken, path=m.path)
                    break

    def _write_headers(
        self, items: list[tuple[int, Any]], key_bytes: dict[int, bytes], specs: list[PutSpec],
        checksums: dict[int, int],
    ) -> dict[int, CxlkvError]:
        """Write (and in flush mode flush) the headers of ``items`` (position, started
        put) on every replica, one ``Region.write_headers`` call per region; call
        only once the values are written (and flushed).

        Returns:
            Position → the error that stopped its header (a region that refused
            the batch is written item by item, so each item gets its own outcome).
        """
        errs: dict[int, CxlkvError] = {}
        groups: dict[int, tuple[MappedRegion, list[tuple[int, Any, Any]]]] = {}
        by_id = self.regions.by_segment_id
        for i, r in items:
            for ext in r.extents:
                m = by_id(ext.segment_id)
                if m is None:
                    errs[i] = _unmapped(ext.segment_id)
                    break
                groups.setdefault(id(m), (m, []))[1].append((i, r, ext))
        for m, group in groups.values():
            group = [g for g in group if g[0] not in errs]
            if group:
                self._write_header_batch(m, group, key_bytes, specs, checksums, errs)
        return errs

    def _write_header_batch(
        self, m: MappedRegion, group: list[tuple[int, Any, Any]], key_bytes: dict[int, bytes],
        specs: list[PutSpec], checksums: dict[int, int], errs: dict[int, CxlkvError],
    ) -> None:
        """One ``Region.write_headers`` call for ``(position, started put, extent)``
        entries of region ``m``; a refused batch is written again entry by entry,
        so each position gets its own outcome in ``errs``."""
        keys = [key_bytes[i] for i, _, _ in group]
        blob, key_offsets = _concat(keys)
        try:
            m.region.write_headers(
                [ext.offset_bytes for _, _, ext in group], [header_bytes_for(len(k)) for k in keys],
                blob, key_offsets, [len(k) for k in keys], [r.version for _, r, _ in group],
                [specs[i].size for i, _, _ in group], [checksums[i] for i, _, _ in group],
                flush=self.flush_mode)
        except CxlkvError as exc:
            if len(group) == 1:
                errs.setdefault(group[0][0], exc)
                return
            for entry in group:
                if entry[0] not in errs:
                    self._write_header_batch(m, [entry], key_bytes, specs, checksums, errs)

    def _copy_in_and_flush(
        self, copies: list[_Copy], fused: frozenset[int] = frozenset(),
        checksums: dict[int, int] | None = None, *, hash_ranges: bool = False,
    ) -> dict[int, CxlkvError]:
        """Copy values into their extents (in flush mode with the transport's
        non-coherent copies: in memory, out of this CPU's caches, on return).

        Runs inline or in a pool thread. Copies of one source buffer into one
        region go in one ``copy_in_ranges`` call (``copy_in_ranges_hashed`` with
        ``hash_ranges``, for copies of whole values: each value's xxh3_64 goes in
        ``checksums[position]``); the copies in ``fused`` (ids of :class:`_Copy`
        objects from :func:`_fusable`) go through ``Region.copy_in_hashed``
        instead and put the value's xxh3_64 in ``checksums[position]``. Pieces of
        a split value are never hashed here (their hash is not the value's).

        Returns:
            Position → error for the items whose copy failed.
        """
        nc = self.flush_mode
        if hash_ranges and checksums is not None:
            errs = _run_writes(copies, checksums, flush=nc)
        elif fused and checksums is not None:
            plain = []
            errs = {}
            for c in copies:
                if id(c) not in fused:
                    plain.append(c)
                    continue
                try:
                    view = memoryview(c.buf).cast("B")[c.buf_offset:c.buf_offset + c.length]
                    checksums[c.index] = c.mapped.region.copy_in_hashed(c.region_offset, view, flush=nc)
                except CxlkvError as exc:
                    errs[c.index] = exc
                except (TypeError, ValueError, BufferError) as exc:
                    errs[c.index] = CxlkvError(f"copy failed: {exc}")
            errs.update(_run_writes(plain, flush=nc))
        else:
            errs = _run_writes(copies, flush=nc)
        return errs

    # ================================================================= reads
    async def get(self, keys: list[str], targets: list[ReadTarget | None]) -> list[ReadOutcome]:
        """Read every key: inline (target ``None``) or into a shared-buffer target.

        Returns:
            One :class:`ReadOutcome` per key, in order; never raises for an item.
        """
        n = len(keys)
        out: list[ReadOutcome | None] = [None] * n
        todo: list[int] = []
        for i, k in enumerate(keys):
            why = key_error(k)
            if why is not None:
                out[i] = ReadOutcome(_INVALID_KEY, why)
            else:
                todo.append(i)
        self.counters["get_items"] += n
        if todo:
            todo = self._get_from_index(keys, targets, todo, out)
        # A large read makes its caller come back late: do not hold others for it.
        urgent = n == 1 and targets[0] is not None and targets[0].capacity >= URGENT_BYTES
        for attempt in range(2):
            if not todo:
                break
            try:
                located = await self.link.locate.submit([keys[i] for i in todo], urgent=urgent)
            except CxlkvError as exc:
                for i in todo:
                    out[i] = ReadOutcome(int(exc.code), exc.message)
                break
            todo = await self._read_located(
                todo, located, keys, targets, out, retry_allowed=attempt == 0)
        for i, o in enumerate(out):
            if o is None:
                out[i] = ReadOutcome(_INTERNAL, "read produced no outcome")
            elif o.code and o.code != _NOT_FOUND:
                self.counters[f"get_errors.{_code_name(o.code)}"] += 1
        return out  # type: ignore[return-value]

    def _get_from_index(self, keys: list[str], targets: list[ReadTarget | None], todo: list[int],
                        out: list[ReadOutcome | None]) -> list[int]:
        """Serve from the region's index what it can answer (hits, misses, values
        too large for their target); returns the positions left for the RPC path."""
        ix = self.index.reader()
        if ix is None:
            return todo
        rest: list[int] = []
        hits: list[str] = []
        inline_limit = self.max_inline_bytes
        for i in todo:
            key = keys[i]
            t = targets[i]
            if t is None:
                scratch = self._scratch
                if scratch is None:
                    scratch = self._scratch = bytearray(inline_limit)
                r = ix.get(key.encode(), scratch)
            else:
                r = ix.get(key.encode(), memoryview(t.buf)[t.offset:t.offset + t.capacity])
            oc = r.outcome
            if r.retries:  # the first copy did not verify (flush mode: a stale line)
                self.counters["reads_copied_again"] += 1
            if oc == IX_HIT:
                n = r.value_len_bytes
                self.counters["bytes_out"] += n
                o = ReadOutcome(size=n, version=r.version, tier=r.tier)
                if t is None:
                    o.value = bytes(memoryview(self._scratch)[:n])  # type: ignore[arg-type]
                out[i] = o
                hits.append(key)
            elif oc == IX_MISS:
                out[i] = ReadOutcome(_NOT_FOUND, f"key {key!r} not found")
            elif oc == IX_TOO_SMALL or (oc == IX_ELSEWHERE and r.value_len_bytes > (
                    inline_limit if t is None else t.capacity)):
                # The slot says how large the committed value is: a target it does not
                # fit is answered here, so a large get through the daemon costs one
                # master round trip (the GetInto that follows), not two.
                size = r.value_len_bytes
                if t is None:
                    out[i] = ReadOutcome(_TOO_LARGE, (
                        f"value of key {key!r} is {size} bytes, over the inline limit of "
                        f"{inline_limit} bytes: use GetInto with a shared buffer"), size)
                else:
                    out[i] = ReadOutcome(_OUT_OF_RANGE, (
                        f"value of key {key!r} is {size} bytes, the target holds {t.capacity}"), size)
            else:  # ELSEWHERE, UNSURE: the leased RPC path
                rest.append(i)
        self.counters["index_hits"] += len(hits)
        self.counters["index_lookups"] += len(todo)
        if hits:
            self.link.report_hits(hits)
        return rest

    async def _read_located(
        self,
        positions: list[int],
        located: Located,
        keys: list[str],
        targets: list[ReadTarget | None],
        out: list[ReadOutcome | None],
        *,
        retry_allowed: bool,
    ) -> list[int]:
        """Copy out located objects into ``out``; returns positions whose lease expired (to retry)."""
        copies: list[_Copy] = []
        meta: list[tuple[int, Location, float]] = []
        leases: list[int] = []
        total = 0
        t0 = located.t0
        plan = self._plan_read
        for i, loc in zip(positions, located.locations):
            lease = loc.lease_id
            if lease:
                leases.append(lease)
            c = plan(i, keys[i], loc, targets[i], out)
            if c is None:
                continue
            ttl_ms = loc.lease_ttl_ms
            meta.append((i, loc, t0 + ttl_ms / 1000.0 if ttl_ms else math.inf))
            copies.append(c)
            total += c.length
        retry: list[int] = []
        if copies:
            if total >= self.large_copy_bytes:
                errs = await self._in_pool(self._copy_out, copies)
            else:
                errs = self._copy_out(copies)
            checks = [(c, loc.header_bytes, keys[i], loc.version, loc.checksum)
                      for c, (i, loc, _) in zip(copies, meta) if i not in errs]
            if total >= self.large_copy_bytes and any(c.checksum is None for c, *_ in checks):
                # values still to hash (split copies): off the loop
                bad = await asyncio.get_running_loop().run_in_executor(
                    self.executor, self._verify_reads, checks)
            else:  # only headers left to check (one C call), or small values
                bad = self._verify_reads(checks)
            self.counters["reads_copied_again"] += sum(c.redone for c in copies)
            now = self.clock()
            for c, (i, loc, deadline) in zip(copies, meta):
                exc = errs.get(i)
                if exc is not None:
                    out[i] = ReadOutcome(int(exc.code), exc.message, loc.value_size_bytes)
                    continue
                if now > deadline:
                    if retry_allowed:
                        retry.append(i)
                    else:
                        out[i] = ReadOutcome(_LEASE_EXPIRED, (
                            f"the lease on key {keys[i]!r} ended before the copy finished "
                            f"(lease_ttl {loc.lease_ttl_ms} ms); bytes discarded"))
                    continue
                why = bad.get(i)
                if why is not None:
                    self.counters["checksum_failures"] += 1
                    log.warning("key %r: %s; answered as a miss", keys[i][:64], why)
                    # under a live lease the bytes cannot have been reused: destroyed. The
                    # master checks and drops it, so it is not listed forever — unless this
                    # mapping's file shrank (what it reads proves nothing then)
                    if not getattr(c.mapped.region, "guard_hits", 0):
                        self.link.report_damaged(keys[i], loc.version)
                    out[i] = ReadOutcome(_CHECKSUM_MISMATCH, (
                        f"key {keys[i]!r}: {why} (stale, torn or corrupt read; reported as a miss)"))
                    continue
                info = getattr(c.mapped, "info", None)
                o = ReadOutcome(size=loc.value_size_bytes, version=loc.version,
                                tier=info.tier if info is not None else 0)
                if targets[i] is None:
                    o.value = c.buf  # _copy_out made the inline bytes
                out[i] = o
            self.counters["bytes_out"] += total
        self.link.release_leases(leases)
        return retry

    def _plan_read(
        self,
        i: int,
        key: str,
        loc: Location,
        target: ReadTarget | None,
        out: list[ReadOutcome | None],
    ) -> _Copy | None:
        """Check one located object against its target; plan its copy or record its outcome."""
        code = loc.status.code
        if code:
            out[i] = ReadOutcome(code, loc.status.message)
            return None
        size = loc.value_size_bytes
        if target is None:
            if size > self.max_inline_bytes:
                out[i] = ReadOutcome(_TOO_LARGE, (
                    f"value of key {key!r} is {size} bytes, over the inline limit of "
                    f"{self.max_inline_bytes} bytes: use GetInto with a shared buffer"), size)
                return None
        elif size > target.capacity:
            out[i] = ReadOutcome(_OUT_OF_RANGE, (
                f"value of key {key!r} is {size} bytes, the target holds {target.capacity}"), size)
            return None
        mapped = None
        ext = None
        for rep in loc.replicas:
            mapped = self.regions.by_segment_id(rep.extent.segment_id)
            if mapped is not None:
                ext = rep.extent
                break
        if mapped is None or ext is None:
            if not loc.replicas:
                out[i] = ReadOutcome(_INTERNAL, f"the master returned no replica for key {key!r}")
            else:
                out[i] = ReadOutcome(_UNAVAILABLE, (
                    f"no replica of key {key!r} is on a segment mapped by this clientd"))
            return None
        checked = bool(loc.header_bytes or loc.checksum)  # flush mode may verify first
        if target is None:
            if size == 0:
                out[i] = ReadOutcome(size=0, version=loc.version, value=b"")
                return None
            return _Copy(i, mapped, ext.offset_bytes + loc.header_bytes, size, None, 0, checked=checked)
        if size == 0:
            out[i] = ReadOutcome(size=0, version=loc.version)
            return None
        return _Copy(i, mapped, ext.offset_bytes + loc.header_bytes, size, target.buf, target.offset,
                     FUSED_HASH_MIN_BYTES <= size < 2 * SPLIT_COPY_BYTES, checked=checked)

    def _copy_out(self, copies: list[_Copy], *, again: bool = False) -> dict[int, CxlkvError]:
        """Copy extents out; inline reads become bytes. Every copy is checked
        (:meth:`_verify_reads`) before its bytes are used, so in flush mode the
        first copy goes through the cache (``flush_reads = "verify_first"``,
        docs/transport.md); ``again`` (the retry of a copy that did not verify),
        ``invalidate_first`` or a copy nothing checks: with the transport's
        non-coherent copies, which drop each chunk's lines before reading it."""
        errs: dict[int, CxlkvError] = {}
        flush, first = self.flush_mode, self.verify_first and not again
        to_buffers: list[_Copy] = []
        strict_buffers: list[_Copy] = []
        for c in copies:
            nc = flush and not (first and c.checked)
            if c.buf is None:
                try:
                    if nc:  # read through a view: invalidated first
                        c.mapped.region.invalidate(c.region_offset, c.length)
                    c.buf = bytes(c.mapped.region.view(c.region_offset, c.length))
                    c.checksum = _xxh3(c.buf)  # of the bytes answered, for the batch check
                except CxlkvError as exc:
                    errs[c.index] = exc
            elif c.fuse:
                c.checksum = None
                try:
                    view = memoryview(c.buf)[c.buf_offset:c.buf_offset + c.length]
                    c.checksum = c.mapped.region.copy_out_hashed(c.region_offset, view, invalidate=nc)
                except CxlkvError as exc:
                    errs[c.index] = exc
                except (TypeError, ValueError, BufferError) as exc:
                    errs[c.index] = CxlkvError(f"copy failed: {exc}")
            else:
                c.checksum = None
                (strict_buffers if nc else to_buffers).append(c)
        if to_buffers:
            errs.update(_run_reads(to_buffers))
        if strict_buffers:
            errs.update(_run_reads(strict_buffers, invalidate=True))
        return errs

    def _verify_reads(self, checks: list[tuple[_Copy, int, str, int, int]]) -> dict[int, str]:
        """Check copied values against their object headers; re-read a mismatch once.

        Args:
            checks: per copied item ``(copy, header_bytes, key, version, master
                checksum or 0)``; ``header_bytes`` 0 marks a bare value (checked
                against the master's checksum only).

        Returns:
            Position → why the item is not the object asked for (after one retry
            that invalidates, in flush mode, and copies again). Runs inline or in
            a pool thread; touches no shared state but the copy's buffer.
        """
        bad: dict[int, str] = {}
        checks = self._verify_batch(checks)  # the ones it cannot vouch for, checked one by one
        for c, hb, key, version, expected in checks:
            why = self._check_object(c, hb, key, version, expected)
            if why is None:
                continue
            if isinstance(c.buf, bytes):
                c.buf = None  # an inline read: _copy_out makes fresh bytes
            c.redone = True
            try:  # once more, from memory: a stale line or a writer racing the lease
                errs = self._copy_out([c], again=True)
            except CxlkvError as exc:  # _copy_out reports per item; keep the first reason
                errs = {c.index: exc}
            if c.index in errs:
                bad[c.index] = why
                continue
            again = self._check_object(c, hb, key, version, expected)
            if again is not None:
                bad[c.index] = again
        return bad

    def _verify_batch(
        self, checks: list[tuple[_Copy, int, str, int, int]]
    ) -> list[tuple[_Copy, int, str, int, int]]:
        """Check in C (``Region.verify_headers``, one call per region) every item
        whose bytes were hashed as they were copied; returns the items not found
        valid there, or not checkable there, for :meth:`_check_object`."""
        rest: list[tuple[_Copy, int, str, int, int]] = []
        groups: dict[int, list[tuple[_Copy, int, str, int, int]]] = {}
        for chk in checks:
            c, hb, _, _, expected = chk
            if c.checksum is None or not hb or (expected and c.checksum != expected):
                rest.append(chk)
            else:
                groups.setdefault(id(c.mapped), []).append(chk)
        for group in groups.values():
            keys = [chk[2].encode("utf-8") for chk in group]
            blob, key_offsets = _concat(keys)
            try:
                ok = group[0][0].mapped.region.verify_headers(
                    [c.region_offset - hb for c, hb, _, _, _ in group], [chk[1] for chk in group],
                    blob, key_offsets, [len(k) for k in keys], [chk[3] for chk in group],
                    [chk[0].length for chk in group], [chk[0].checksum for chk in group],
                    invalidate=self.flush_mode)
            except CxlkvError:
                rest.extend(group)  # one by one: each gets its own reason
                continue
            rest.extend(chk for chk, good in zip(group, ok) if not good)
        return rest

    def _check_object(self, c: _Copy, hb: int, key: str, version: int, expected: int) -> str | None:
        """Why the bytes copied for ``c`` are not ``key`` at ``version`` (``None``: they
        are): :func:`cxlkv.objheader.check_copy`."""
        if c.checksum is not None:
            got = c.checksum  # hashed by the copy itself
        else:
            got = _xxh3(c.buf if isinstance(c.buf, bytes) else c.buf[c.buf_offset:c.buf_offset + c.length])
        return check_copy(c.mapped.region, c.region_offset - hb, hb, key.encode("utf-8"), version, c.length,
                          got, expected, invalidate=self.flush_mode)

    # ========================================================== prefix reads
    async def get_prefix(self, keys: list[str], targets: list[ReadTarget]) -> tuple[int, list[ReadOutcome]]:
        """The longest cached prefix of ``keys``, copied into ``targets``.

        A query longer than the master link's batch size (:data:`MAX_BATCH_ITEMS`
        keys) is asked part after part, as long as each part matches whole: no
        master call is over the master's ``max_batch_items``.

        Returns:
            ``(matched, outcomes)``: ``keys[:matched]`` were found and copied; one
            OK outcome per matched key.

        Raises:
            InvalidKey: a key is invalid (nothing is read).
            OutOfRange: a matched value is larger than its target (nothing is kept).
            Unavailable, NotReady: the master cannot be reached.
        """
        from cxlkv.errors import InvalidKey

        for k in keys:
            why = key_error(k)
            if why is not None:
                raise InvalidKey(why, key=k if isinstance(k, str) else None)
        self.counters["prefix_queries"] += 1
        self.counters["prefix_keys"] += len(keys)
        if not keys:
            return 0, []
        ix = self.index.reader()
        if ix is not None:
            first, outs, done = self._prefix_from_index(ix, keys, targets)
            if done:
                self.counters["prefix_hits"] += first
                return first, outs
            more, rest = await self._get_prefix_rpc(keys[first:], targets[first:])
            return first + more, outs + rest
        return await self._get_prefix_rpc(keys, targets)

    def _prefix_from_index(self, ix: Any, keys: list[str], targets: list[ReadTarget]
                           ) -> tuple[int, list[ReadOutcome], bool]:
        """The leading keys the index serves: ``(matched, outcomes, done)``; ``done``
        is false when the prefix stopped at a key the index cannot answer (the RPC
        path continues from ``matched``)."""
        from cxlkv.errors import OutOfRange

        views = [memoryview(t.buf)[t.offset:t.offset + t.capacity] for t in targets]
        results = ix.get_many([k.encode() for k in keys], views, prefix=True)
        outs: list[ReadOutcome] = []
        hits: list[str] = []
        done = True
        self.counters["reads_copied_again"] += sum(r.retries for r in results)
        for key, r in zip(keys, results):
            oc = r.outcome
            if oc == IX_HIT:
                outs.append(ReadOutcome(size=r.value_len_bytes, version=r.version, tier=r.tier))
                hits.append(key)
                self.counters["bytes_out"] += r.value_len_bytes
                continue
            if oc == IX_TOO_SMALL:
                raise OutOfRange(f"value of key {key!r} is {r.value_len_bytes} bytes, the target holds "
                                 f"{targets[len(outs)].capacity}", key=key, requested_bytes=r.value_len_bytes)
            done = oc == IX_MISS
            break
        self.counters["index_hits"] += len(hits)
        self.counters["index_lookups"] += len(results)
        if hits or done:  # a finished query names its chain for the eviction policy
            self.link.report_hits(hits, [(keys, len(outs))] if done else ())
        return len(outs), outs, done

    async def _get_prefix_rpc(self, keys: list[str], targets: list[ReadTarget]) -> tuple[int, list[ReadOutcome]]:
        """:meth:`get_prefix` through the master (leases), at most MAX_BATCH_ITEMS keys a call."""
        if not keys:
            return 0, []
        if len(keys) <= MAX_BATCH_ITEMS:
            return await self._get_prefix_part(keys, targets)
        matched, outcomes = 0, []
        for start in range(0, len(keys), MAX_BATCH_ITEMS):
            part = keys[start:start + MAX_BATCH_ITEMS]
            got, outs = await self._get_prefix_part(part, targets[start:start + MAX_BATCH_ITEMS])
            matched += got
            outcomes.extend(outs)
            if got < len(part):
                break
        return matched, outcomes

    async def _get_prefix_part(self, keys: list[str], targets: list[ReadTarget]) -> tuple[int, list[ReadOutcome]]:
        """:meth:`get_prefix` of at most :data:`MAX_BATCH_ITEMS` valid keys."""
        from cxlkv.errors import error_for

        for attempt in range(2):
            resp, t0 = (await self.link.match_prefix.submit([keys]))[0]
            matched = min(int(resp.matched), len(resp.locations), len(keys))
            positions = list(range(matched))
            located = Located(resp.locations[:matched], t0)
            # Leases beyond `matched` (none expected) are released too.
            extra = [loc.lease_id for loc in resp.locations[matched:] if loc.lease_id]
            self.link.release_leases(extra)
            out: list[ReadOutcome | None] = [None] * matched
            retry = await self._read_located(
                positions, located, keys, list(targets[:matched]), out, retry_allowed=attempt == 0)
            if retry:
                continue  # a lease ran out mid-copy: ask again once
            final = matched
            for i in range(matched):
                o = out[i]
                if o is None or o.code:
                    if o is not None and o.code == _OUT_OF_RANGE:
                        raise error_for(o.code, o.message, key=keys[i], requested_bytes=o.size)
                    final = i  # a miss (checksum, expired lease, unmapped): the prefix ends here
                    break
            self.counters["prefix_hits"] += final
            return final, [o for o in out[:final] if o is not None]
        return 0, []

    # ============================================= fencing of ended registrations
    def _registered(self, first: bool, old_epoch: int, old_gen: int) -> None:
        """The link registered again under the same client id: the old registration's
        space (quarantined by the master) is freed once its writers stopped."""
        if first or not old_epoch:
            return  # a new process: the daemon releases its predecessor's (clientd/writers.py)
        task = asyncio.get_running_loop().create_task(self.release_when_drained(old_epoch, old_gen))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def release_when_drained(self, upto_epoch: int, old_gen: int, keep: tuple[int, ...] = ()) -> int:
        """Wait until every put round this daemon began in generations up to
        ``old_gen`` is over, then tell the master that the registrations of this
        client id up to ``upto_epoch`` stopped writing — except the direct puts
        still pending (their writers free them by ending them, or by exiting).

        Returns:
            Bytes the master freed (0 when it could not be told: the space then
            waits for the next re-registration, which covers older epochs too).
        """
        while any(g <= old_gen for g in self._puts_in_flight):
            self.drained.clear()
            try:
                await asyncio.wait_for(self.drained.wait(), 1.0)
            except asyncio.TimeoutError:
                pass
        kept = sorted(set(keep) | set(self.direct_pending(old_gen)))
        link = self.link
        for pause in (0.0, 0.2, 1.0, 5.0):
            await asyncio.sleep(pause)
            if link.epoch <= upto_epoch:
                return 0
            try:
                resp = await link.call("ReleaseQuarantine", lambda: master_pb2.ReleaseQuarantineRequest(
                    client_id=link.client_id, epoch=link.epoch, upto_epoch=upto_epoch, keep_put_tokens=kept))
            except CxlkvError as exc:
                log.debug("ReleaseQuarantine up to epoch %d failed: %s", upto_epoch, exc.message)
                continue
            self.counters["quarantine_released_bytes"] += resp.freed_bytes
            if resp.freed_bytes:
                log.info("registrations up to epoch %d stopped writing: the master freed %d quarantined "
                         "bytes (%d direct put(s) kept for their writers)", upto_epoch, resp.freed_bytes, len(kept))
            return int(resp.freed_bytes)
        return 0

    # ================================================== existence and removal
    async def exist(self, keys: list[str]) -> list[tuple[bool, common_pb2.Status]]:
        """Whether each key is committed; invalid keys answer ``(False, INVALID_KEY)``.

        Raises:
            Unavailable, NotReady: the master cannot be reached.
        """
        out: list[tuple[bool, common_pb2.Status] | None] = [None] * len(keys)
        todo: list[int] = []
        for i, k in enumerate(keys):
            why = key_error(k)
            if why is not None:
                out[i] = (False, _status(_INVALID_KEY, why))
            else:
                todo.append(i)
        self.counters["exist_items"] += len(keys)
        ix = self.index.reader() if todo else None
        if ix is not None:
            rest = []
            for i, r in zip(todo, ix.probe_many([keys[i].encode() for i in todo])):
                if r.outcome == IX_MISS:
                    out[i] = (False, _OK_STATUS)
                elif r.outcome in (IX_HIT, IX_ELSEWHERE, IX_TOO_SMALL):
                    out[i] = (True, _OK_STATUS)
                else:
                    rest.append(i)
            todo = rest
        if todo:
            res = await self.link.exist.submit([keys[i] for i in todo])
            for i, r in zip(todo, res):
                out[i] = r
        return out  # type: ignore[return-value]

    async def remove(self, keys: list[str], force: bool) -> list[common_pb2.Status]:
        """Remove each key; one status per key.

        Raises:
            Unavailable, NotReady: the master cannot be reached.
        """
        out: list[common_pb2.Status | None] = [None] * len(keys)
        todo: list[int] = []
        for i, k in enumerate(keys):
            why = key_error(k)
            if why is not None:
                out[i] = _status(_INVALID_KEY, why)
            else:
                todo.append(i)
        self.counters["remove_items"] += len(keys)
        if todo:
            await self.link.flush_releases()
        delay = REMOVE_RETRY_FIRST_S
        waited = 0.0
        while todo:
            res = await self.link.remove[bool(force)].submit([keys[i] for i in todo])
            again: list[int] = []
            for i, r in zip(todo, res):
                out[i] = r
                if r.code == _HAS_LEASE and waited < REMOVE_LEASE_WAIT_S:
                    again.append(i)
            if again:
                # Reads hold their lease only while they copy; give them a moment.
                await asyncio.sleep(delay)
                waited += delay
                delay *= 2
            todo = again
        return out  # type: ignore[return-value]

    async def remove_all(self, force: bool, regex: str) -> master_pb2.RemoveAllResponse:
        """Remove every committed object, or those whose key matches ``regex``.

        Raises:
            InvalidArgument: ``regex`` does not compile.
            Unavailable, NotReady: the master cannot be reached.
        """
        from cxlkv.keys import compile_key_pattern

        if regex:
            compile_key_pattern(regex)  # RE2, as the master: a bad pattern fails here, with its reason
        await self.link.flush_releases()
        # The master removes by slices, answering other calls meanwhile: millions of
        # keys take seconds, longer than master_timeout_s allows an ordinary call.
        timeout = max(self.cfg.master_timeout_s, REMOVE_ALL_TIMEOUT_S)
        total = master_pb2.RemoveAllResponse()
        delay = REMOVE_RETRY_FIRST_S
        waited = 0.0
        while True:
            if regex:
                r = await self.link.call(
                    "RemoveByRegex", lambda: master_pb2.RemoveByRegexRequest(pattern=regex, force=force),
                    timeout=timeout)
            else:
                r = await self.link.call("RemoveAll", lambda: master_pb2.RemoveAllRequest(force=force),
                                         timeout=timeout)
            total.removed += r.removed
            total.skipped_leased = r.skipped_leased
            if not r.skipped_leased or waited >= REMOVE_LEASE_WAIT_S:
                return total
            # Reads hold their lease only while they copy; give them a moment.
            await asyncio.sleep(delay)
            waited += delay
            delay *= 2

    # ============================================================ inspection
    async def list_keys(self, prefix: str, page_size: int, page_token: str) -> master_pb2.ListKeysResponse:
        """One page of committed keys (master ListKeys).

        Raises:
            InvalidArgument: a bad page token.
            Unavailable, NotReady: the master cannot be reached.
        """
        return await self.link.call("ListKeys", lambda: master_pb2.ListKeysRequest(
            prefix=prefix, page_size=page_size, page_token=page_token))

    async def master_stat(self) -> master_pb2.StatResponse:
        """The master's Stat.

        Raises:
            Unavailable, NotReady: the master cannot be reached.
        """
        return await self.link.call("Stat", master_pb2.StatRequest)


def _reservation(r: StartedPut) -> Reservation:
    e = r.extents[0]
    return Reservation(r.put_token, e.segment_id, e.offset_bytes, e.length_bytes)


def _unmapped(segment_id: int) -> CxlkvError:
    from cxlkv.errors import Unavailable

    return Unavailable(f"segment {segment_id} is not mapped by this clientd (add it to [[regions]])")


def _hash_sources(specs: list[PutSpec], positions: list[int]) -> dict[int, int]:
    """xxh3_64 of each value at ``positions``, hashed from the caller's source buffer
    (the bytes being copied; the library releases the GIL on large inputs).

    Returns:
        Position → checksum (unsigned 64-bit).
    """
    out: dict[int, int] = {}
    for i in positions:
        s = specs[i]
        src = s.src if s.src is not None else b""
        if s.src_offset == 0 and len(src) == s.size and isinstance(src, bytes):
            out[i] = _xxh3(src)
        else:
            out[i] = _xxh3(memoryview(src).cast("B")[s.src_offset:s.src_offset + s.size])
    return out


def _fusable(copies: list[_Copy], specs: list[PutSpec]) -> frozenset[int]:
    """The copies (by ``id``) that hash their value while copying it: the first
    copy of each value that :func:`_partition` keeps whole (below twice
    :data:`SPLIT_COPY_BYTES`), from a caller's buffer."""
    out: set[int] = set()
    seen: set[int] = set()
    for c in copies:
        if c.index in seen:
            continue
        seen.add(c.index)
        if c.buf is not None and c.length == specs[c.index].size and c.length < 2 * SPLIT_COPY_BYTES:
            out.add(id(c))
    return frozenset(out)


def _partition(copies: list[_Copy], jobs: int) -> list[list[_Copy]]:
    """Spread copies over at most ``jobs`` lists of about equal bytes; copies into
    or out of shared buffers are cut first into cache-line-aligned pieces of at
    least :data:`SPLIT_COPY_BYTES`. Inline reads (``buf is None``) stay whole."""
    if jobs <= 1:
        return [copies]
    pieces: list[_Copy] = []
    for c in copies:
        n = min(jobs, c.length // SPLIT_COPY_BYTES)
        if c.buf is None or n < 2:
            pieces.append(c)
            continue
        step = -(-c.length // n)
        step = (step + 63) & ~63
        for off in range(0, c.length, step):
            pieces.append(_Copy(c.index, c.mapped, c.region_offset + off, min(step, c.length - off),
                                c.buf, c.buf_offset + off))
    if len(pieces) == 1:
        return [pieces]
    out: list[list[_Copy]] = [[] for _ in range(jobs)]
    load = [0] * jobs
    for p in sorted(pieces, key=lambda p: -p.length):
        j = load.index(min(load))
        out[j].append(p)
        load[j] += p.length
    return [j for j in out if j]


def _concat(keys: list[bytes]) -> tuple[bytes, list[int]]:
    """The keys concatenated (as the header batches take them) and each one's offset."""
    offsets = []
    pos = 0
    for k in keys:
        offsets.append(pos)
        pos += len(k)
    return b"".join(keys), offsets


def _by_region_and_buffer(copies: list[_Copy]) -> list[list[_Copy]]:
    """The copies grouped by (mapped region, caller buffer): one C call each."""
    groups: dict[tuple[int, int], list[_Copy]] = {}
    for c in copies:
        groups.setdefault((id(c.mapped), id(c.buf)), []).append(c)
    return list(groups.values())


def _run_writes(copies: list[_Copy], checksums: dict[int, int] | None = None, *,
                flush: bool = False) -> dict[int, CxlkvError]:
    """Copy values into their extents, grouping those from one buffer into one
    region into one C call (``copy_in_ranges``; ``copy_in_ranges_hashed`` with
    ``checksums``, which then receives each copied value's xxh3_64 by position);
    ``flush``: the transport's non-coherent copies (flush mode).

    Returns:
        Position → error for failed copies (a failed group is retried item by
        item, without the hash, so one bad item never fails the others).
    """
    errs: dict[int, CxlkvError] = {}
    for group in _by_region_and_buffer(copies):
        if len(group) == 1 and checksums is None:
            _copy_one(group[0], True, errs, flush)
            continue
        region = group[0].mapped.region
        cols = ([c.buf_offset for c in group], [c.region_offset for c in group], [c.length for c in group])
        try:
            if checksums is None:
                region.copy_in_ranges(group[0].buf, *cols, flush=flush)
            else:
                for c, h in zip(group, region.copy_in_ranges_hashed(group[0].buf, *cols, flush=flush)):
                    checksums[c.index] = h
        except CxlkvError:
            for c in group:
                _copy_one(c, True, errs, flush)
    return errs


def _run_reads(copies: list[_Copy], *, invalidate: bool = False) -> dict[int, CxlkvError]:
    """Copy extents out into shared buffers, one C call per (region, buffer) pair,
    hashing each value as it lands (``copy_out_ranges_hashed``: ``c.checksum``);
    ``invalidate``: the transport's non-coherent copies (flush mode).

    Returns:
        Position → error for failed copies (a failed group is retried item by
        item, without the hash, so one bad item never fails the others).
    """
    errs: dict[int, CxlkvError] = {}
    for group in _by_region_and_buffer(copies):
        try:
            hashes = group[0].mapped.region.copy_out_ranges_hashed(
                group[0].buf, [c.buf_offset for c in group], [c.region_offset for c in group],
                [c.length for c in group], invalidate=invalidate)
        except CxlkvError:
            for c in group:
                _copy_one(c, False, errs, invalidate)
            continue
        for c, h in zip(group, hashes):
            c.checksum = h
    return errs


def _copy_one(c: _Copy, into_region: bool, errs: dict[int, CxlkvError], nc: bool = False) -> None:
    try:
        view = memoryview(c.buf)[c.buf_offset:c.buf_offset + c.length]
        if into_region:
            c.mapped.region.copy_in(c.region_offset, view, flush=nc)
        else:
            c.mapped.region.copy_out(c.region_offset, view, invalidate=nc)
    except CxlkvError as exc:
        errs[c.index] = exc
    except (TypeError, ValueError, BufferError) as exc:
        errs[c.index] = CxlkvError(f"copy failed: {exc}")
