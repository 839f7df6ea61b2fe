"""clientd's logic, independent of its front-ends: one object over its parts.

:class:`ClientdCore` joins

* the put protocol (:mod:`cxlkv.clientd.writes`, :class:`~cxlkv.clientd.writes.PutProtocol`),
* the read protocol, gets and prefix reads (:mod:`cxlkv.clientd.reads`,
  :class:`~cxlkv.clientd.reads.ReadProtocol`),
* the copies both share (:mod:`cxlkv.clientd.copies`),

and holds here what is neither: existence, removal, listing, the master's Stat,
and the release of an ended registration's space once its writers stopped.

The core answers plain records (:mod:`cxlkv.clientd.results`: ``Stored``,
``Read``, ``Removed``, ``KeyPage``, ``MasterStat``), one entry per item with the
item's :class:`~cxlkv.errors.CxlkvError` in place of a failed one; it builds no
ClientService message. The front-ends (:mod:`cxlkv.clientd.api` for gRPC and
the lean socket, :mod:`cxlkv.clientd.direct` for direct mode) turn requests
into these calls and the answers into messages.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from concurrent.futures import Executor
from typing import Any, Callable

from cxlkv.clientd.copies import LARGE_COPY_BYTES
from cxlkv.clientd.index_reads import IndexReads
from cxlkv.clientd.master_link import MasterLink
from cxlkv.clientd.reads import ReadProtocol
from cxlkv.clientd.regions import RegionSet
from cxlkv.clientd.reserve import ReservePool
from cxlkv.clientd.results import KeyEntry, KeyPage, MasterStat, Outcome, Removed, valid_positions
from cxlkv.clientd.writes import PutProtocol
from cxlkv.config import ClientdConfig
from cxlkv.errors import CxlkvError, ErrorCode, error_for
from cxlkv.transport.index import IX_ELSEWHERE, IX_HIT, IX_MISS, IX_TOO_SMALL
from cxlkv.v1 import master_pb2

__all__ = ["ClientdCore"]

log = logging.getLogger(__name__)

#: seconds: reads hold their lease only while they copy.
REMOVE_LEASE_WAIT_S = 0.05
REMOVE_RETRY_FIRST_S = 0.002
#: Deadline of a RemoveAll call to the master, in seconds (it runs by slices).
REMOVE_ALL_TIMEOUT_S = 120.0

_HAS_LEASE = int(ErrorCode.HAS_LEASE)


class ClientdCore(PutProtocol, ReadProtocol):
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
    async def exist(self, keys: list[str]) -> list[Outcome[bool]]:
        """Whether each key is committed: per key, in order, ``True``/``False`` or
        the item's error (InvalidKey, …).

        Raises:
            Unavailable, NotReady: the master cannot be reached.
        """
        out: list[Outcome[bool] | None] = [None] * len(keys)
        todo = valid_positions(keys, out)
        self.counters["exist_items"] += len(keys)
        ix = self.index.reader() if todo else None
        if ix is not None:
            rest = []
            for i, r in zip(todo, ix.probe_many([keys[i].encode() for i in todo])):
                if r.outcome == IX_MISS:
                    out[i] = False
                elif r.outcome in (IX_HIT, IX_ELSEWHERE, IX_TOO_SMALL):
                    out[i] = True
                else:
                    rest.append(i)
            todo = rest
        if todo:
            res = await self.link.exist.submit([keys[i] for i in todo])
            for i, (exists, st) in zip(todo, res):
                out[i] = error_for(st.code, st.message, key=keys[i]) if st.code else bool(exists)
        return out  # type: ignore[return-value]

    async def remove(self, keys: list[str], force: bool) -> list[CxlkvError | None]:
        """Remove each key: per key, in order, ``None`` (removed) or the item's
        error (NotFound, HasLease without ``force`` once reads held it past
        :data:`REMOVE_LEASE_WAIT_S`, InvalidKey, …).

        Raises:
            Unavailable, NotReady: the master cannot be reached.
        """
        out: list[CxlkvError | None] = [None] * len(keys)
        todo = valid_positions(keys, out)
        self.counters["remove_items"] += len(keys)
        if todo:
            await self.link.flush_releases()
        delay = REMOVE_RETRY_FIRST_S
        waited = 0.0
        while todo:
            res = await self.link.remove[bool(force)].submit([keys[i] for i in todo])
            again: list[int] = []
            for i, r in zip(todo, res):
                out[i] = error_for(r.code, r.message, key=keys[i]) if r.code else None
                if r.code == _HAS_LEASE and waited < REMOVE_LEASE_WAIT_S:
                    again.append(i)
            if again:
                # Reads hold their lease only while they copy; give them a moment.
                await asyncio.sleep(delay)
                waited += delay
                delay *= 2
            todo = again
        return out

    async def remove_all(self, force: bool, regex: str) -> Removed:
        """Remove every committed object, or those whose key matches ``regex`` (RE2).

        Returns:
            Objects removed, and those left leased (without ``force``, after
            retrying for :data:`REMOVE_LEASE_WAIT_S`).

        Raises:
            InvalidArgument: ``regex`` does not compile.
            Unavailable, NotReady: the master cannot be reached.
        """
        from cxlkv.wire.keys import compile_key_pattern

        if regex:
            compile_key_pattern(regex)  # RE2, as the master: a bad pattern fails here, with its reason
        await self.link.flush_releases()
        # The master removes by slices, answering other calls meanwhile: millions of
        # keys take seconds, longer than master_timeout_s allows an ordinary call.
        timeout = max(self.cfg.master_timeout_s, REMOVE_ALL_TIMEOUT_S)
        removed = 0
        delay = REMOVE_RETRY_FIRST_S
        waited = 0.0
        while True:
            r = await self.link.call("RemoveAll", lambda: master_pb2.RemoveAllRequest(force=force, pattern=regex),
                                     timeout=timeout)
            removed += int(r.removed)
            if not r.skipped_leased or waited >= REMOVE_LEASE_WAIT_S:
                return Removed(removed, int(r.skipped_leased))
            # Reads hold their lease only while they copy; give them a moment.
            await asyncio.sleep(delay)
            waited += delay
            delay *= 2

    # ============================================================ inspection
    async def list_keys(self, prefix: str, page_size: int, page_token: str) -> KeyPage:
        """One page of committed keys starting with ``prefix`` (master ListKeys), at
        most ``page_size`` entries after ``page_token``.

        Raises:
            InvalidArgument: a bad page token.
            Unavailable, NotReady: the master cannot be reached.
        """
        r = await self.link.call("ListKeys", lambda: master_pb2.ListKeysRequest(
            prefix=prefix, page_size=page_size, page_token=page_token))
        return KeyPage([KeyEntry(e.key, e.value_size_bytes, e.version, e.replica_count) for e in r.entries],
                       r.next_page_token)

    async def master_stat(self) -> MasterStat:
        """The master's totals (master Stat).

        Raises:
            Unavailable, NotReady: the master cannot be reached.
        """
        r = await self.link.call("Stat", master_pb2.StatRequest)
        return MasterStat(int(r.key_count), int(r.capacity_bytes), int(r.used_bytes), list(r.segments),
                          int(r.reserved_bytes), int(r.quarantined_bytes))
