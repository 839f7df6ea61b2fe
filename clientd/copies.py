"""Copies between region extents and callers' memory, shared by clientd's put
and read protocols (:mod:`cxlkv.clientd.writes`, :mod:`cxlkv.clientd.reads`).

A copy is planned as a :class:`_Copy` (which value, which extent, which bytes of
the caller's buffer); copies of one buffer into or out of one region run as one
C call (``copy_in_ranges`` / ``copy_out_ranges_hashed``), and large batches are
spread over the copy threads (:meth:`CoreParts._in_pool`, :func:`_partition`).
Each helper answers per position: a failed copy is an entry ``position →
CxlkvError`` and never fails the others.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Callable

import xxhash

from cxlkv.clientd.index_reads import IndexReads
from cxlkv.clientd.master_link import MasterLink
from cxlkv.clientd.regions import MappedRegion, RegionSet
from cxlkv.clientd.reserve import ReservePool
from cxlkv.config import ClientdConfig
from cxlkv.errors import CxlkvError

__all__ = ["CoreParts", "LARGE_COPY_BYTES", "URGENT_BYTES", "SPLIT_COPY_BYTES", "FUSED_HASH_MIN_BYTES"]

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

_xxh3 = xxhash.xxh3_64_intdigest


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


class CoreParts:
    """The state the put and read protocols share (set by :class:`cxlkv.clientd.core.ClientdCore`).

    Attributes:
        cfg: daemon configuration.
        regions: the mapped regions.
        link: the master session.
        executor: thread pool for large copies.
        clock: monotonic clock in seconds (lease deadlines).
        large_copy_bytes: copies of a call totalling at least this many bytes run in ``executor``.
        copy_threads: threads of ``executor``; large copies are spread over them.
        flush_mode: ``coherence = "flush"``: the transport's non-coherent copies.
        verify_first: flush mode reads copy through the cache first, then check.
        max_inline_bytes: largest inline value, in bytes.
        counters: operation and byte counters (reported by Stat and /metrics).
        index: reads from the region's index.
        reserve: extents reserved ahead of need.

    Thread-safety: event-loop confined; copies may run in ``executor``.
    """

    cfg: ClientdConfig
    regions: RegionSet
    link: MasterLink
    executor: Executor
    clock: Callable[[], float]
    large_copy_bytes: int
    copy_threads: int
    flush_mode: bool
    verify_first: bool
    max_inline_bytes: int
    counters: Counter[str]
    index: IndexReads
    reserve: ReservePool

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
