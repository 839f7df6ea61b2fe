"""clientd's put protocol (all items of one call, and of concurrent callers, coalesced).

``PutStart`` (asking for the value's size plus the object header's, see
:mod:`cxlkv.layout.objheader`) → copy the value into every replica's extent (C, GIL
released; large copies in a thread pool) while hashing the source (xxh3_64) →
in ``coherence = "flush"`` mode with the transport's non-coherent copies
(streaming stores, partial lines written back, SFENCE: in memory on return) →
write the header and key after the value (and flush them) → ``PutEnd``
with the checksum. An item whose copy failed is revoked (``PutRevoke``) so its
space is freed at once. Items the reserve pool has an extent for skip PutStart:
copy → ``Commit`` (one master round trip). A put whose ``PutEnd`` is
refused because the daemon re-registered meanwhile (new epoch) is retried once
from the start.

Answers are :class:`~cxlkv.clientd.results.Stored` records or the item's
:class:`~cxlkv.errors.CxlkvError` (:mod:`cxlkv.clientd.results`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable

from cxlkv.clientd.copies import URGENT_BYTES, CoreParts, SPLIT_COPY_BYTES, _Copy, _concat, _run_writes, _xxh3
from cxlkv.clientd.master_link import _OK_STATUS, StartedExtent, StartedPut
from cxlkv.clientd.regions import MappedRegion
from cxlkv.clientd.reserve import Reservation, commit_flags
from cxlkv.clientd.results import Outcome, PutSpec, Stored
from cxlkv.errors import (CxlkvError, ErrorCode, Internal, InvalidArgument, InvalidKey, OutOfRange, RegionError, Unavailable,
                          error_for)
from cxlkv.wire.keys import key_error, options_error
from cxlkv.layout.objheader import header_bytes_for
from cxlkv.transport.bindings import cxlkv_guard_total_hits as _guard_total_hits

__all__ = ["PutProtocol"]

log = logging.getLogger(__name__)

_ALREADY_EXISTS = ErrorCode.ALREADY_EXISTS
_STALE_TOKEN = int(ErrorCode.STALE_TOKEN)
_UNKNOWN_CLIENT = int(ErrorCode.UNKNOWN_CLIENT)


class PutProtocol(CoreParts):
    """The put protocol over the master link and the mapped regions (a part of
    :class:`~cxlkv.clientd.core.ClientdCore`).

    Thread-safety: event-loop confined; copies may run in ``executor``.
    """

    #: Put rounds running, per master-link generation (registration) they began in.
    _puts_in_flight: dict[int, int]
    #: Set whenever the last put round of an ended registration finishes.
    drained: asyncio.Event

    async def put(self, specs: list[PutSpec]) -> list[Outcome[Stored]]:
        """Put every value: one entry per spec, in order; never raises for an item.

        Returns:
            Per position, :class:`Stored` (version, replicas placed) or the item's
            :class:`~cxlkv.errors.CxlkvError` (InvalidKey, InvalidArgument,
            AlreadyExists, NoSpace, TooLarge, NotReady, Unavailable, …).
        """
        n = len(specs)
        results: list[Outcome[Stored] | None] = [None] * n
        todo: list[int] = []
        for i, s in enumerate(specs):
            why = key_error(s.key)
            if why is not None:
                results[i] = InvalidKey(why, key=s.key if isinstance(s.key, str) else None)
            elif s.options is not None and (why := options_error(s.options)) is not None:
                results[i] = InvalidArgument(why, key=s.key)
            else:
                todo.append(i)
        self.counters["put_items"] += n
        for attempt in range(2):
            if not todo:
                break
            todo = await self._put_attempt(specs, todo, results, retry_allowed=attempt == 0)
        for i, r in enumerate(results):
            if r is None:  # unreachable by construction; never answer nothing
                results[i] = Internal("put produced no result", key=specs[i].key)
            elif not isinstance(r, CxlkvError):
                continue
            elif r.code == _ALREADY_EXISTS:  # keys are immutable: a replay's put of a cached key
                self.counters["put_already_exists"] += 1
            else:
                self.counters[f"put_errors.{r.code.name}"] += 1
        return results  # type: ignore[return-value]

    async def _put_attempt(
        self,
        specs: list[PutSpec],
        todo: list[int],
        results: list[Outcome[Stored] | None],
        *,
        retry_allowed: bool,
    ) -> list[int]:
        """One round for ``todo``: reserved extents (copy → Commit: one master
        round trip) where the pool has them, PutStart → copy → PutEnd for the rest;
        returns the positions to retry."""
        link = self.link
        gen = link.generation
        urgent = sum(specs[i].size_bytes for i in todo) >= URGENT_BYTES
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
        got = self.reserve.take_for([(specs[i].key, specs[i].size_bytes, specs[i].options,
                                      header_bytes_for(len(key_bytes[i]))) for i in todo])
        return {todo[j]: StartedPut(_OK_STATUS, r.put_token, r.put_token,
                                    (StartedExtent(r.segment_id, r.offset_bytes, r.length_bytes),), 1)
                for j, r in got.items()}

    async def _put_round(
        self, specs: list[PutSpec], todo: list[int], results: list[Outcome[Stored] | None],
        key_bytes: dict[int, bytes], reserved: dict[int, StartedPut], gen: int, urgent: bool,
        retry_allowed: bool,
    ) -> list[int]:
        link = self.link
        if len(reserved) == len(todo):  # every item from a reservation: no PutStart
            starts = [reserved[i] for i in todo]
        else:
            started = [i for i in todo if i not in reserved]
            try:
                got = await link.put_start.submit([
                    (specs[i].key, specs[i].size_bytes, specs[i].options, header_bytes_for(len(key_bytes[i])))
                    for i in started
                ], urgent=urgent)
            except CxlkvError as exc:
                for i in started:
                    results[i] = exc
                started, got = [], []
                todo = [i for i in todo if i in reserved]
                if not todo:
                    return []
            by_pos = dict(zip(started, got))
            by_pos.update(reserved)
            todo = [i for i in todo if i in by_pos]
            starts = [by_pos[i] for i in todo]

        accepted: list[tuple[int, StartedPut]] = []
        failed: dict[int, CxlkvError] = {}
        copies: list[_Copy] = []
        total = 0
        by_id = self.regions.by_segment_id
        for i, r in zip(todo, starts):
            code = r.status.code
            if code:
                if retry_allowed and code == _UNKNOWN_CLIENT:
                    continue  # re-registered meanwhile; handled below
                results[i] = error_for(code, r.status.message, key=specs[i].key)
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
                if ext.length_bytes < s.size_bytes + hb:
                    failed[i] = CxlkvError(
                        f"extent of {ext.length_bytes} bytes for a {s.size_bytes}-byte value and a "
                        f"{hb}-byte header (master bug)")
                    break
                if s.size_bytes:
                    copies.append(_Copy(i, m, ext.offset_bytes + hb, s.size_bytes, s.src, s.src_offset_bytes))
                    total += s.size_bytes
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

        ends: list[tuple[int, StartedPut]] = []
        revokes: list[tuple[int, StartedPut]] = []
        commits: list[tuple[int, Any]] = []
        for i, r in accepted:
            if i in reserved:
                if i in failed:  # the extent is still ours: back to the pool
                    self.reserve.give_back(header_bytes_for(len(key_bytes[i])) + specs[i].size_bytes,
                                           [_reservation(reserved[i])])
                    results[i] = failed[i]
                else:
                    commits.append((i, r))
                continue
            (revokes if i in failed else ends).append((i, r))
        commit_task: asyncio.Future[Any] | Awaitable[Any] | None = None
        if commits:
            commit_call = link.commit.submit([
                (specs[i].key, r.put_token, specs[i].size_bytes, header_bytes_for(len(key_bytes[i])),
                 checksums.get(i, 0), commit_flags(specs[i].options)) for i, r in commits
            ], urgent=urgent)
            # beside the PutEnd and PutRevoke calls when there are any (a task); else
            # awaited below as it is (no task: the common put from a reservation)
            commit_task = asyncio.ensure_future(commit_call) if ends or revokes else commit_call
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
                results[i] = failed[i]
        if ends:
            if end_error is not None:
                for i, _ in ends:
                    results[i] = end_error
                if link.generation == gen:  # not committed, or committed (then this changes nothing)
                    await self.release_fenced([(specs[i].key, r.put_token, 0) for i, r in ends])
                ends = []
            fenced: list[tuple[str, int, int]] = []
            for (i, r), st in zip(ends, statuses):
                if not st.code:
                    results[i] = Stored(r.version, len(r.extents))
                elif st.code in (_STALE_TOKEN, _UNKNOWN_CLIENT) and retry_allowed and link.generation != gen:
                    retry.append(i)
                else:
                    results[i] = error_for(st.code, st.message, key=specs[i].key)
                    if st.code == _STALE_TOKEN and link.generation == gen:
                        fenced.append((specs[i].key, r.put_token, 0))
            if fenced:
                await self.release_fenced(fenced)
        if commit_task is not None:
            try:
                cstatuses = await commit_task
            except CxlkvError as exc:
                for i, _ in commits:
                    results[i] = exc
            else:
                for (i, r), st in zip(commits, cstatuses):
                    if not st.code:
                        results[i] = Stored(r.version, 1)
                    elif st.code in (_STALE_TOKEN, _UNKNOWN_CLIENT) and retry_allowed and link.generation != gen:
                        retry.append(i)  # the registration ended meanwhile: its reservation is quarantined
                    else:
                        results[i] = error_for(st.code, st.message, key=specs[i].key)
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

    def _fail_broken(self, accepted: list[tuple[int, Any]], failed: dict[int, CxlkvError],
                     specs: list[PutSpec] | None = None) -> None:
        """After copies during which the SIGBUS guard absorbed a fault: retire the
        regions whose file shrank (:meth:`RegionSet.check_files`) and fail every put
        with a replica there (its bytes went to zero memory, not to the region), or
        whose source is a shared buffer whose file its owner truncated (the copy
        read zeros past the new end, not the value)."""
        from cxlkv.clientd.buffers import source_shrank

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
                [specs[i].size_bytes for i, _, _ in group], [checksums[i] for i, _, _ in group],
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



def _reservation(r: StartedPut) -> Reservation:
    e = r.extents[0]
    return Reservation(r.put_token, e.segment_id, e.offset_bytes, e.length_bytes)


def _unmapped(segment_id: int) -> CxlkvError:
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
        if s.src_offset_bytes == 0 and len(src) == s.size_bytes and isinstance(src, bytes):
            out[i] = _xxh3(src)
        else:
            out[i] = _xxh3(memoryview(src).cast("B")[s.src_offset_bytes:s.src_offset_bytes + s.size_bytes])
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
        if c.buf is not None and c.length == specs[c.index].size_bytes and c.length < 2 * SPLIT_COPY_BYTES:
            out.add(id(c))
    return frozenset(out)


