"""Extents taken ahead of need: a put costs one master round trip (docs/clientd.md).

clientd keeps, per object size (object header + value, as the master sizes an
extent), a small stack of extents the master reserved for this registration
(``Reserve``). A put takes one, copies the value and writes the object
header into it, and names it with ``Commit``: one master round trip per
put or batch of puts instead of two (PutStart, PutEnd). The stack is refilled
in the background when it runs below half its target. A size seen for the first
time gets a target of two batches; every refill doubles it, up to
:data:`RESERVE_BYTES` and :data:`RESERVE_MAX_EXTENTS` of that size, and all sizes
together hold at most the daemon's budget (:data:`RESERVE_BUDGET_BYTES`, and never
more than 1/64 of the CXL capacity the master offers), so odd sizes reserve little
and a full cache holds little space idle. Sizes not seen recently, values over
:data:`MAX_RESERVED_BYTES`, and puts with replicas or a preferred segment go
through PutStart/PutEnd.

A reservation belongs to the registration that took it: after a re-registration
the stacks are dropped (the master quarantined them with the old registration,
:meth:`cxlkv.master.state.MasterState.release_quarantine`), and a stopping
daemon gives its stacks back (``Reserve`` with ``unreserve_put_tokens``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import TYPE_CHECKING, NamedTuple, Sequence

from cxlkv.errors import CxlkvError
from cxlkv.v1 import common_pb2, master_pb2

if TYPE_CHECKING:
    from cxlkv.clientd.master_link import MasterLink

__all__ = ["Reservation", "ReservePool", "RESERVE_BYTES", "MAX_RESERVED_BYTES", "commit_flags"]

log = logging.getLogger(__name__)

#: Most bytes held reserved per object size (the stack's target is bounded by it):
#: room for two batches of 256 values of 4 KiB, so that batched small puts keep to
#: one master round trip (a 256-item batch with 1 MiB here went through
#: PutStart/PutEnd for most of its items: 15.8k-31k keys/s), and for ~125 blocks of
#: 64 KiB, so that two replay workers' bursts of ~17 puts each keep to it while a
#: refill is in flight (at 4 MiB, 55k of the replay's 206k puts went through
#: PutStart/PutEnd; at 8 MiB, 24k).
RESERVE_BYTES = 8 << 20
#: Most extents held reserved per object size (two batches of 256): tiny values
#: would otherwise take thousands of extents, each a grant slot in the region's
#: index (the master also bounds all reservations to 1/8 of the index's slots).
RESERVE_MAX_EXTENTS = 512
#: Most bytes one daemon holds reserved over all sizes (and at most
#: :data:`CAPACITY_SHARE` of the CXL capacity).
RESERVE_BUDGET_BYTES = 16 << 20
#: The reserved bytes' bound as a share of the CXL capacity the master offers.
CAPACITY_SHARE = 1 / 64
#: Objects (header + value) larger than this are put with PutStart/PutEnd: the
#: copy then dominates, and a large reservation would sit idle. Values of 1 MiB
#: with any key (a header of up to 64 + 4096 bytes) still take reservations.
MAX_RESERVED_BYTES = (1 << 20) + 64 + 4096
#: Object sizes kept at once (least recently used sizes are given back).
MAX_SIZES = 8
#: Smallest target of a stack, in extents.
MIN_TARGET = 2


def commit_flags(o: common_pb2.PutOptions | None) -> int:
    """Commit flags of put options: bit 0 upsert, 1 soft pin, 2 hard pin."""
    if o is None:
        return 0
    return (1 if o.upsert else 0) | (2 if o.soft_pin else 0) | (4 if o.hard_pin else 0)


class Reservation(NamedTuple):
    """One reserved extent: its token (the object's version) and where it is."""

    put_token: int
    segment_id: int
    offset_bytes: int
    length_bytes: int


class ReservePool:
    """This daemon's reserved extents, per object size.

    Args:
        link: the master session.
        enabled: ``False`` sends every put through PutStart/PutEnd.

    Thread-safety: event-loop confined.
    """

    def __init__(self, link: "MasterLink", *, enabled: bool = True) -> None:
        self.link = link
        self.enabled = enabled
        self._stacks: OrderedDict[int, list[Reservation]] = OrderedDict()
        self._target: dict[int, int] = {}
        self._refilling: set[int] = set()
        self._generation = -1
        self._tasks: set[asyncio.Task[None]] = set()
        self._budget_of: object = None  # the segment list budget_bytes was computed from
        self._budget_bytes = 0
        #: Reservations taken, given back, dropped with an ended registration.
        self.taken = 0
        self.returned = 0
        self.dropped = 0

    @property
    def held(self) -> int:
        """Reserved extents not yet used."""
        return sum(len(s) for s in self._stacks.values())

    def _check_generation(self) -> None:
        gen = self.link.generation
        if gen != self._generation:
            self.dropped += self.held  # the master quarantined them with the old registration
            self._stacks.clear()
            self._generation = gen

    def take(self, need_bytes: int, n: int) -> list[Reservation]:
        """Up to ``n`` reservations for objects of ``need_bytes`` (header + value);
        schedules a refill. An empty answer means: use PutStart/PutEnd."""
        if not self.enabled or need_bytes > MAX_RESERVED_BYTES or need_bytes <= 0 or not self.link.registered:
            return []
        self._check_generation()
        stack = self._stacks.get(need_bytes)
        if stack is None:
            stack = self._stacks[need_bytes] = []
            while len(self._stacks) > MAX_SIZES:
                old, rest = self._stacks.popitem(last=False)
                self._target.pop(old, None)
                self._give_back_later(rest)
        else:
            self._stacks.move_to_end(need_bytes)
        budget = self.budget_bytes()
        bound = max(1, min(RESERVE_MAX_EXTENTS, min(RESERVE_BYTES, budget) // need_bytes))
        target = min(bound, max(self._target.get(need_bytes, MIN_TARGET), 2 * n))
        got = stack[:n]  # oldest first: a key's successive puts through this daemon get growing versions
        del stack[:len(got)]
        self.taken += len(got)
        if len(stack) <= target // 2 and need_bytes not in self._refilling:
            self._refilling.add(need_bytes)
            self._spawn(self._refill(need_bytes, target, budget))
            target = min(bound, 2 * target)  # refilled often: hold more of this size
        self._target[need_bytes] = target
        return got

    def budget_bytes(self) -> int:
        """Bytes this daemon may hold reserved over all sizes: :data:`RESERVE_BUDGET_BYTES`,
        at most :data:`CAPACITY_SHARE` of the mounted CXL segments' capacity."""
        segments = self.link.segments  # a new list whenever the master's listing changes
        if segments is not self._budget_of:
            cxl = sum(s.capacity_bytes for s in segments if s.tier == common_pb2.CXL and s.mounted)
            self._budget_bytes = min(RESERVE_BUDGET_BYTES, int(cxl * CAPACITY_SHARE))
            self._budget_of = segments
        return self._budget_bytes

    @property
    def held_bytes(self) -> int:
        """Bytes of the reservations held (not yet used)."""
        return sum(need * len(s) for need, s in self._stacks.items())

    def take_for(self, items: "Sequence[tuple[str, int, common_pb2.PutOptions | None, int]]") -> dict[int, Reservation]:
        """Reservations for the items of one put call that may use one, by position.

        Args:
            items: per position ``(key, value_size_bytes, options, header_bytes)``.

        Returns:
            Position → its reservation. Items with replicas, a preferred segment or
            ``upsert`` take none (upserts go through PutStart, so a key's versions
            keep growing: a reservation may be older than the committed version),
            nor do keys that appear more than once in the call (PutStart answers
            the first one; the others NOT_READY or ALREADY_EXISTS). The rest go
            through PutStart/PutEnd.
        """
        if not self.enabled:
            return {}
        seen: dict[str, int] = {}
        for key, _, _, _ in items:
            seen[key] = seen.get(key, 0) + 1
        want: dict[int, list[int]] = {}
        for i, (key, size, o, hb) in enumerate(items):
            if (o is not None and (o.replica_num > 1 or o.preferred_segment or o.upsert)) or seen[key] > 1:
                continue
            want.setdefault(hb + size, []).append(i)
        out: dict[int, Reservation] = {}
        for need, positions in want.items():
            for i, r in zip(positions, self.take(need, len(positions))):
                out[i] = r
        return out

    def give_back(self, need_bytes: int, items: list[Reservation]) -> None:
        """Return unused reservations (a copy that failed: the extent is still ours)."""
        if not items:
            return
        self._check_generation()
        if self.link.generation != self._generation:
            return
        self._stacks.setdefault(need_bytes, []).extend(items)

    async def _refill(self, need_bytes: int, target: int, budget_bytes: int) -> None:
        try:
            gen = self.link.generation
            want = min(target - len(self._stacks.get(need_bytes, ())),
                       (budget_bytes - self.held_bytes) // need_bytes)
            if want <= 0:
                return
            resp = await self.link.call("Reserve", lambda: master_pb2.ReserveRequest(
                client_id=self.link.client_id, epoch=self.link.epoch, need_bytes=[need_bytes], counts=[want]))
            got = [Reservation(t, s, o, n) for t, s, o, n in zip(
                resp.put_tokens, resp.segment_ids, resp.offsets_bytes, resp.lengths_bytes)]
            if self.link.generation != gen or self._generation != gen:
                self.dropped += len(got)  # granted to a registration that has ended: quarantined there
                return
            self._stacks.setdefault(need_bytes, []).extend(got)
        except CxlkvError as exc:
            log.debug("Reserve of %d-byte extents failed: %s", need_bytes, exc.message)
        finally:
            self._refilling.discard(need_bytes)

    def _give_back_later(self, items: list[Reservation]) -> None:
        if items:
            self._spawn(self._unreserve(items))

    async def _unreserve(self, items: list[Reservation]) -> None:
        gen = self.link.generation
        if gen != self._generation:
            return
        try:
            await self.link.call("Reserve", lambda: master_pb2.ReserveRequest(
                client_id=self.link.client_id, epoch=self.link.epoch,
                unreserve_put_tokens=[r.put_token for r in items]))
            self.returned += len(items)
        except CxlkvError as exc:
            log.debug("giving back %d reserved extent(s) failed: %s", len(items), exc.message)

    def _spawn(self, coro: "asyncio.Future[None] | asyncio.coroutines.Coroutine[None, None, None]") -> None:
        try:
            task = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        except RuntimeError:  # no loop: nothing to schedule (tests of the pure parts)
            coro.close()  # type: ignore[union-attr]
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Give every reservation back (a clean stop) and wait for refills."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._check_generation()
        items = [r for s in self._stacks.values() for r in s]
        self._stacks.clear()
        if items and self.link.registered:
            await self._unreserve(items)
