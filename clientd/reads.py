"""clientd's read protocol: gets (inline or into shared buffers) and prefix reads.

``GetReplicaList`` (or ``MatchPrefix``) grants a lease → copy out of
a replica mapped on this host → check that the lease had not ended before the
copy finished (else the space may have been reused: the read is retried once,
then answered LEASE_EXPIRED — never wrong bytes) → verify the object header
(magic, key hash, version, length, header checksum) and the value's checksum,
in both coherence modes (flush mode verifies first: the first copy goes through
the cache, the headers' lines are dropped before they are checked, and a stale
line fails the check); a mismatch is retried once with the transport's
non-coherent copy (every line dropped before it is read), then answered
CHECKSUM_MISMATCH (a miss) and counted in ``checksum_failures`` → release the
lease. Keys the region's index answers (hits, misses, values too large for
their target) take no master call (:mod:`cxlkv.clientd.index_reads`).

Answers are :class:`~cxlkv.clientd.results.Read` records or the item's
:class:`~cxlkv.errors.CxlkvError` (:mod:`cxlkv.clientd.results`).
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any

from cxlkv.clientd.copies import (
    FUSED_HASH_MIN_BYTES, SPLIT_COPY_BYTES, URGENT_BYTES, CoreParts, _Copy, _concat, _run_reads, _xxh3,
)
from cxlkv.clientd.master_link import MAX_BATCH_ITEMS, Located, Location
from cxlkv.clientd.results import Outcome, Read, ReadTarget, valid_positions
from cxlkv.errors import (
    ChecksumMismatch, CxlkvError, ErrorCode, Internal, InvalidKey, LeaseExpired, NotFound, OutOfRange, TooLarge,
    Unavailable,
    error_for,
)
from cxlkv.wire.keys import key_error
from cxlkv.layout.objheader import check_copy
from cxlkv.transport.index import IX_ELSEWHERE, IX_HIT, IX_MISS, IX_TOO_SMALL

__all__ = ["ReadProtocol"]

log = logging.getLogger(__name__)

_NOT_FOUND = ErrorCode.NOT_FOUND


class ReadProtocol(CoreParts):
    """The read protocol over the master link and the mapped regions (a part of
    :class:`~cxlkv.clientd.core.ClientdCore`).

    Thread-safety: event-loop confined; copies and checks may run in ``executor``.
    """

    #: Inline index reads land here first (``max_inline_bytes``, made on first use).
    _scratch: bytearray | None

    async def get(self, keys: list[str], targets: list[ReadTarget | None]) -> list[Outcome[Read]]:
        """Read every key: inline (target ``None``) or into a shared-buffer target.

        Returns:
            Per key, in order, a :class:`Read` or the item's error: NotFound,
            InvalidKey, TooLarge (inline; ``requested_bytes`` = the value's size),
            OutOfRange (larger than its target; ``requested_bytes`` likewise),
            LeaseExpired, ChecksumMismatch (a miss), Unavailable, …; never raises
            for an item.
        """
        n = len(keys)
        out: list[Outcome[Read] | None] = [None] * n
        todo = valid_positions(keys, out)
        self.counters["get_items"] += n
        if todo:
            todo = self._get_from_index(keys, targets, todo, out)
        # A large read makes its caller come back late: do not hold others for it.
        urgent = n == 1 and targets[0] is not None and targets[0].capacity_bytes >= URGENT_BYTES
        for attempt in range(2):
            if not todo:
                break
            try:
                located = await self.link.locate.submit([keys[i] for i in todo], urgent=urgent)
            except CxlkvError as exc:
                for i in todo:
                    out[i] = exc
                break
            todo = await self._read_located(
                todo, located, keys, targets, out, retry_allowed=attempt == 0)
        for i, o in enumerate(out):
            if o is None:
                out[i] = Internal("read produced no outcome", key=keys[i])
            elif isinstance(o, CxlkvError) and o.code != _NOT_FOUND:
                self.counters[f"get_errors.{o.code.name}"] += 1
        return out  # type: ignore[return-value]

    def _get_from_index(self, keys: list[str], targets: list[ReadTarget | None], todo: list[int],
                        out: list[Outcome[Read] | None]) -> list[int]:
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
                r = ix.get(key.encode(), memoryview(t.buf)[t.offset_bytes:t.offset_bytes + t.capacity_bytes])
            oc = r.outcome
            if r.retries:  # the first copy did not verify (flush mode: a stale line)
                self.counters["reads_copied_again"] += 1
            if oc == IX_HIT:
                n = r.value_len_bytes
                self.counters["bytes_out"] += n
                o = Read(n, r.version, tier=r.tier)
                if t is None:
                    o.value = bytes(memoryview(self._scratch)[:n])  # type: ignore[arg-type]
                out[i] = o
                hits.append(key)
            elif oc == IX_MISS:
                out[i] = NotFound(f"key {key!r} not found", key=key)
            elif oc == IX_TOO_SMALL or (oc == IX_ELSEWHERE and r.value_len_bytes > (
                    inline_limit if t is None else t.capacity_bytes)):
                # The slot says how large the committed value is: a target it does not
                # fit is answered here, so a large get through the daemon costs one
                # master round trip (the GetInto that follows), not two.
                size = r.value_len_bytes
                if t is None:
                    out[i] = TooLarge(
                        f"value of key {key!r} is {size} bytes, over the inline limit of "
                        f"{inline_limit} bytes: use GetInto with a shared buffer", key=key, requested_bytes=size)
                else:
                    out[i] = OutOfRange(f"value of key {key!r} is {size} bytes, the target holds {t.capacity_bytes}",
                                        key=key, requested_bytes=size)
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
        out: list[Outcome[Read] | None],
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
                    out[i] = exc
                    continue
                if now > deadline:
                    if retry_allowed:
                        retry.append(i)
                    else:
                        out[i] = LeaseExpired(
                            f"the lease on key {keys[i]!r} ended before the copy finished "
                            f"(lease_ttl {loc.lease_ttl_ms} ms); bytes discarded", key=keys[i])
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
                    out[i] = ChecksumMismatch(
                        f"key {keys[i]!r}: {why} (stale, torn or corrupt read; reported as a miss)", key=keys[i])
                    continue
                info = getattr(c.mapped, "info", None)
                o = Read(loc.value_size_bytes, loc.version, tier=info.tier if info is not None else 0)
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
        out: list[Outcome[Read] | None],
    ) -> _Copy | None:
        """Check one located object against its target; plan its copy or record its outcome."""
        code = loc.status.code
        if code:
            out[i] = error_for(code, loc.status.message, key=key)
            return None
        size = loc.value_size_bytes
        if target is None:
            if size > self.max_inline_bytes:
                out[i] = TooLarge(
                    f"value of key {key!r} is {size} bytes, over the inline limit of "
                    f"{self.max_inline_bytes} bytes: use GetInto with a shared buffer", key=key, requested_bytes=size)
                return None
        elif size > target.capacity_bytes:
            out[i] = OutOfRange(f"value of key {key!r} is {size} bytes, the target holds {target.capacity_bytes}",
                                key=key, requested_bytes=size)
            return None
        mapped = None
        ext = None
        for rep in loc.replicas:
            mapped = self.regions.by_segment_id(rep.segment_id)
            if mapped is not None:
                ext = rep
                break
        if mapped is None or ext is None:
            if not loc.replicas:
                out[i] = Internal(f"the master returned no replica for key {key!r}", key=key)
            else:
                out[i] = Unavailable(f"no replica of key {key!r} is on a segment mapped by this clientd", key=key)
            return None
        checked = bool(loc.header_bytes or loc.checksum)  # flush mode may verify first
        if target is None:
            if size == 0:
                out[i] = Read(0, loc.version, b"")
                return None
            return _Copy(i, mapped, ext.offset_bytes + loc.header_bytes, size, None, 0, checked=checked)
        if size == 0:
            out[i] = Read(0, loc.version)
            return None
        return _Copy(i, mapped, ext.offset_bytes + loc.header_bytes, size, target.buf, target.offset_bytes,
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
        are): :func:`cxlkv.layout.objheader.check_copy`."""
        if c.checksum is not None:
            got = c.checksum  # hashed by the copy itself
        else:
            got = _xxh3(c.buf if isinstance(c.buf, bytes) else c.buf[c.buf_offset:c.buf_offset + c.length])
        return check_copy(c.mapped.region, c.region_offset - hb, hb, key.encode("utf-8"), version, c.length,
                          got, expected, invalidate=self.flush_mode)

    # ========================================================== prefix reads
    async def get_prefix(self, keys: list[str], targets: list[ReadTarget]) -> tuple[int, list[Read]]:
        """The longest cached prefix of ``keys``, copied into ``targets``.

        A query longer than the master link's batch size (:data:`MAX_BATCH_ITEMS`
        keys) is asked part after part, as long as each part matches whole: no
        master call is over the master's ``max_batch_items``.

        Returns:
            ``(matched, reads)``: ``keys[:matched]`` were found and copied; one
            :class:`Read` per matched key.

        Raises:
            InvalidKey: a key is invalid (nothing is read).
            OutOfRange: a matched value is larger than its target (nothing is kept).
            Unavailable, NotReady: the master cannot be reached.
        """
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
                           ) -> tuple[int, list[Read], bool]:
        """The leading keys the index serves: ``(matched, outcomes, done)``; ``done``
        is false when the prefix stopped at a key the index cannot answer (the RPC
        path continues from ``matched``)."""
        views = [memoryview(t.buf)[t.offset_bytes:t.offset_bytes + t.capacity_bytes] for t in targets]
        results = ix.get_many([k.encode() for k in keys], views, prefix=True)
        outs: list[Read] = []
        hits: list[str] = []
        done = True
        self.counters["reads_copied_again"] += sum(r.retries for r in results)
        for key, r in zip(keys, results):
            oc = r.outcome
            if oc == IX_HIT:
                outs.append(Read(r.value_len_bytes, r.version, tier=r.tier))
                hits.append(key)
                self.counters["bytes_out"] += r.value_len_bytes
                continue
            if oc == IX_TOO_SMALL:
                raise OutOfRange(f"value of key {key!r} is {r.value_len_bytes} bytes, the target holds "
                                 f"{targets[len(outs)].capacity_bytes}", key=key, requested_bytes=r.value_len_bytes)
            done = oc == IX_MISS
            break
        self.counters["index_hits"] += len(hits)
        self.counters["index_lookups"] += len(results)
        if hits or done:  # a finished query names its chain for the eviction policy
            self.link.report_hits(hits, [(keys, len(outs))] if done else ())
        return len(outs), outs, done

    async def _get_prefix_rpc(self, keys: list[str], targets: list[ReadTarget]) -> tuple[int, list[Read]]:
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

    async def _get_prefix_part(self, keys: list[str], targets: list[ReadTarget]) -> tuple[int, list[Read]]:
        """:meth:`get_prefix` of at most :data:`MAX_BATCH_ITEMS` valid keys."""
        for attempt in range(2):
            resp, t0 = (await self.link.match_prefix.submit([keys]))[0]
            matched = min(int(resp.matched), len(resp.locations), len(keys))
            positions = list(range(matched))
            located = Located(resp.locations[:matched], t0)
            # Leases beyond `matched` (none expected) are released too.
            extra = [loc.lease_id for loc in resp.locations[matched:] if loc.lease_id]
            self.link.release_leases(extra)
            out: list[Outcome[Read] | None] = [None] * matched
            retry = await self._read_located(
                positions, located, keys, list(targets[:matched]), out, retry_allowed=attempt == 0)
            if retry:
                continue  # a lease ran out mid-copy: ask again once
            final = matched
            for i in range(matched):
                o = out[i]
                if o is None or isinstance(o, CxlkvError):
                    if isinstance(o, OutOfRange):
                        raise o
                    final = i  # a miss (checksum, expired lease, unmapped): the prefix ends here
                    break
            self.counters["prefix_hits"] += final
            return final, [o for o in out[:final] if o is not None]
        return 0, []
