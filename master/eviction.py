"""Eviction policies: which committed objects to evict first.

A policy only *nominates*: the master tells it about puts, hits and removals and
asks for candidates; the master decides what is actually evicted (never leased,
PROCESSING or hard-pinned objects; soft-pinned ones last) and enforces the time
budget. The master reports only evictable objects: hard-pinned objects are never
given to the policy.

Policies register through entry points in the ``cxlkv.eviction_policies`` group
(built-ins too) and are chosen by ``eviction_policy`` in the master config. All
methods are called on the master's event-loop thread and must be O(1) or O(log n)
per call (``candidates(n)``: O(n); ``on_prefix``: O(len(keys)), times log n at most). The prefix-aware policy
``prefix`` lives in :mod:`cxlkv.master.prefix_policy`; docs/master.md "Choosing an
eviction policy" compares them.

:class:`Evictor` is the other half: the master's eviction loop, which asks the
policy for candidates, skips what may not go and evicts (or, with an SSD tier,
demotes) under the time budget.
"""

from __future__ import annotations

import abc
import itertools
import math
from collections import OrderedDict
from typing import TYPE_CHECKING, Callable, Sequence

from cxlkv.config import MasterConfig
from cxlkv.errors import ConfigError
from cxlkv.master.plugins import POLICY_GROUP, available, load_plugin
from cxlkv.master.segments import Tier

if TYPE_CHECKING:
    from cxlkv.master.objects import ObjectVersion
    from cxlkv.master.segments import Segment
    from cxlkv.master.state import MasterState

__all__ = ["EvictionPolicy", "LruPolicy", "ArcPolicy", "Evictor", "load_policy", "available_policies"]


class EvictionPolicy(abc.ABC):
    """Base of eviction policies.

    Args:
        config: the master's configuration (read-only), or ``None`` in tests.
    """

    #: Entry-point name, for Stat and logs.
    name: str = ""

    def __init__(self, config: MasterConfig | None = None) -> None:
        self.config = config

    @abc.abstractmethod
    def on_put(self, key: str) -> None:
        """``key`` was committed (a new object, or a new version of one)."""

    @abc.abstractmethod
    def on_hit(self, key: str) -> None:
        """``key`` was read (a lease was granted on it)."""

    @abc.abstractmethod
    def on_remove(self, key: str, evicted: bool = False) -> None:
        """``key`` left the cache; ``evicted`` is True when the master evicted it.

        Unknown keys are ignored.
        """

    def on_prefix(self, keys: Sequence[str], matched: int) -> None:
        """A reader asked for the longest cached prefix of ``keys`` (one prefix chain,
        head first: ``keys[i - 1]`` comes before ``keys[i]``) and found the first
        ``matched`` of them cached. Reported asynchronously (``ReportReads``), so it may
        arrive before or after the puts of the misses and after the hits themselves
        (which come through :meth:`on_hit`). Optional: the default ignores it."""

    @abc.abstractmethod
    def candidates(self, n: int) -> list[str]:
        """Up to ``n`` keys, the best eviction candidates first.

        Must not change the policy's state: the master may skip candidates it
        cannot evict (leased, pinned) and ask again.
        """

    @abc.abstractmethod
    def __len__(self) -> int:
        """Number of keys tracked (resident ones; ghost entries excluded)."""


class LruPolicy(EvictionPolicy):
    """Least recently used first (a put or a hit makes a key most recent)."""

    def __init__(self, config: MasterConfig | None = None) -> None:
        super().__init__(config)
        self._order: OrderedDict[str, None] = OrderedDict()

    def on_put(self, key: str) -> None:
        """See :meth:`EvictionPolicy.on_put`."""
        order = self._order
        order[key] = None
        order.move_to_end(key)

    def on_hit(self, key: str) -> None:
        """See :meth:`EvictionPolicy.on_hit`."""
        if key in self._order:
            self._order.move_to_end(key)

    def on_remove(self, key: str, evicted: bool = False) -> None:
        """See :meth:`EvictionPolicy.on_remove`."""
        self._order.pop(key, None)

    def candidates(self, n: int) -> list[str]:
        """See :meth:`EvictionPolicy.candidates`."""
        return list(itertools.islice(self._order, n))

    def __len__(self) -> int:
        return len(self._order)


class ArcPolicy(EvictionPolicy):
    """Adaptive Replacement Cache (Megiddo & Modha, FAST'03), by object count.

    ``T1`` holds keys seen once recently, ``T2`` keys seen at least twice; the
    ghost lists ``B1``/``B2`` remember recently evicted keys of each. A put of a
    key found in ``B1`` grows the target size ``p`` of ``T1`` (recency was
    undervalued), one found in ``B2`` shrinks it (frequency was undervalued).
    Candidates come from the LRU end of ``T1`` while ``|T1| > p``, else of
    ``T2``. The cache size ``c`` is the number of resident keys (the master
    evicts by bytes, not by a fixed count); ghost lists are trimmed to ``c``.
    """

    def __init__(self, config: MasterConfig | None = None) -> None:
        super().__init__(config)
        self._t1: OrderedDict[str, None] = OrderedDict()
        self._t2: OrderedDict[str, None] = OrderedDict()
        self._b1: OrderedDict[str, None] = OrderedDict()
        self._b2: OrderedDict[str, None] = OrderedDict()
        self._p = 0.0  # target size of T1, in keys

    @property
    def target_t1(self) -> float:
        """The adaptive target size of ``T1`` (keys)."""
        return self._p

    def on_put(self, key: str) -> None:
        """See :meth:`EvictionPolicy.on_put`."""
        t1, t2, b1, b2 = self._t1, self._t2, self._b1, self._b2
        if key in t1:
            del t1[key]
            t2[key] = None
        elif key in t2:
            t2.move_to_end(key)
        elif key in b1:
            self._p = min(self._p + max(1.0, len(b2) / len(b1)), float(len(t1) + len(t2) + 1))
            del b1[key]
            t2[key] = None
        elif key in b2:
            self._p = max(self._p - max(1.0, len(b1) / len(b2)), 0.0)
            del b2[key]
            t2[key] = None
        else:
            t1[key] = None
        self._trim_ghosts()

    def on_hit(self, key: str) -> None:
        """See :meth:`EvictionPolicy.on_hit`."""
        if key in self._t1:
            del self._t1[key]
            self._t2[key] = None
        elif key in self._t2:
            self._t2.move_to_end(key)

    def on_remove(self, key: str, evicted: bool = False) -> None:
        """See :meth:`EvictionPolicy.on_remove`."""
        if key in self._t1:
            del self._t1[key]
            if evicted:
                self._b1[key] = None
        elif key in self._t2:
            del self._t2[key]
            if evicted:
                self._b2[key] = None
        else:
            self._b1.pop(key, None)
            self._b2.pop(key, None)
            return
        self._trim_ghosts()

    def _trim_ghosts(self) -> None:
        c = max(len(self._t1) + len(self._t2), 1)
        while len(self._b1) > c:
            self._b1.popitem(last=False)
        while len(self._b2) > c:
            self._b2.popitem(last=False)

    def candidates(self, n: int) -> list[str]:
        """See :meth:`EvictionPolicy.candidates` (ARC's REPLACE, repeated ``n`` times).

        REPLACE takes from ``T1`` while ``|T1| > p`` (``|T1|`` counting down as it
        takes), then from ``T2``, then what is left of ``T1``: three slices.
        """
        t1, t2 = self._t1, self._t2
        k1 = min(n, len(t1), max(0, math.ceil(len(t1) - self._p)))
        out = list(itertools.islice(t1, k1))
        if len(out) < n:
            out.extend(itertools.islice(t2, n - len(out)))
            if len(out) < n:
                out.extend(itertools.islice(t1, k1, k1 + n - len(out)))
        return out

    def __len__(self) -> int:
        return len(self._t1) + len(self._t2)


def available_policies() -> list[str]:
    """Names registered in the ``cxlkv.eviction_policies`` entry-point group."""
    return available(POLICY_GROUP)


def load_policy(name: str, config: MasterConfig | None = None) -> EvictionPolicy:
    """Instantiate the eviction policy registered as ``name``.

    Raises:
        ConfigError: unknown name (the known ones are listed), a plugin that
            fails to import, or one that fails to construct.
    """
    cls = load_plugin(POLICY_GROUP, name, EvictionPolicy)
    try:
        policy = cls(config)
    except Exception as exc:
        raise ConfigError(f"eviction policy {name!r} failed to start: {type(exc).__name__}: {exc}") from exc
    policy.name = name
    return policy


class Evictor:
    """The master's eviction loop: a part of :class:`~cxlkv.master.state.MasterState`.

    The policy nominates (:meth:`EvictionPolicy.candidates`); the evictor skips
    what may not go (leased, hard-pinned, moving; soft-pinned only in a second
    pass), drops the rest through the state (``_drop_committed``) or, into an SSD
    tier, demotes them (:class:`~cxlkv.master.tiering.Tiering`), and watches the
    work-clock budget. The state calls :meth:`until_fits` (a put found no room),
    :meth:`drain` (a put passed the high watermark), :meth:`to_watermark`
    (sweeps) and marks segments in :attr:`draining`. Pure, ``now`` passed in; the
    budget is measured on the state's ``_work_clock``. Event-loop thread only.
    """

    def __init__(self, state: "MasterState") -> None:
        self._st = state
        self.config = state.config
        self.counters = state.counters
        #: Segment ids evicting down to the low watermark (over several sweeps if needed).
        self.draining: set[int] = set()

    def _evictable(self, obj: ObjectVersion, now: float, soft_ok: bool,
                   segment_ids: frozenset[int] | None) -> bool:
        st = self._st
        if obj.leases or obj.hard_pin:
            return False
        if obj.version in st.tiering.tasks.by_version:
            return False  # a move is reading or writing it
        if not soft_ok and obj.soft_pin_until > now:
            return False
        return segment_ids is None or any(e[0] in segment_ids for e in obj.extents)

    def evict(self, now: float, done: Callable[[], bool], segment_ids: frozenset[int] | None,
               deadline: float | None, *, cold: bool = False, demote: bool = False,
               sync_only: bool = False) -> int:
        """Evict policy candidates until ``done()`` or the deadline (work clock).

        Unpinned objects go first; soft-pinned ones only in a second pass.
        Never leased, PROCESSING, hard-pinned or moving objects.

        Args:
            cold: take candidates from the SSD-only objects (least recently used
                first) instead of the eviction policy.
            demote: move each candidate to the SSD tier instead of dropping it
                (:meth:`Tiering.demote <cxlkv.master.tiering.Tiering.demote>`); an object is dropped only when the SSD tier
                has no room even after its own eviction.
            sync_only: with ``demote``, only candidates that already have an
                SSD replica (their CXL replica is freed at once); others are skipped.

        Returns:
            Objects evicted or demoted.
        """
        st = self._st
        evicted = 0
        policy = st.policy
        objects = st._objects
        cold_keys = st.tiering.cold
        source = (lambda n: list(itertools.islice(cold_keys, n))) if cold else policy.candidates
        for soft_ok in (False, True):
            # A put usually needs one victim (same-sized blocks): ask for a few
            # candidates first, more each round (the policies build the list per call).
            base = 4
            n = base
            while not done():
                cands = source(n)
                skipped = 0
                progressed = False
                for key in cands:
                    obj = objects.get(key)
                    if obj is None or not self._evictable(obj, now, soft_ok, segment_ids) or (
                            sync_only and not st.tiering.has_tier(obj, Tier.SSD)):
                        skipped += 1
                        continue
                    if demote and st.tiering.demote(obj, now):
                        evicted += 1
                        progressed = True
                        if done():
                            return evicted
                        continue
                    if cold:
                        self.counters["ssd_evictions"] += 1
                    self.counters["evicted_bytes"] += sum(e[2] for e in obj.extents)
                    st._drop_committed(obj, evicted=True)
                    self.counters["evictions"] += 1
                    evicted += 1
                    progressed = True
                    if done():
                        return evicted
                    if deadline is not None and evicted % 16 == 0 and st._work_clock() > deadline:
                        return evicted
                if deadline is not None and st._work_clock() > deadline:
                    return evicted
                base = min(2 * base, 64)
                if progressed:
                    n = skipped + base  # the skipped ones stay at the front: look past them
                elif len(cands) < n:
                    break  # the policy has nothing more to offer in this pass
                else:
                    n *= 2
        return evicted

    def until_fits(self, candidates: Sequence[Segment], need: int, now: float, count: int = 1) -> int:
        """Evict in ``candidates`` until one has a free extent of ``need`` bytes (a put
        that found no room: not limited by the budget). SSD-only objects go first
        when an SSD segment is among them. Returns objects evicted.

        Args:
            count: extents of ``need`` bytes wanted (a batch of reservations):
                evicts until ``count * need`` bytes are free in all, in one pass
                over the policy's candidates instead of one call per extent. With
                objects of one size that is room for all ``count``; otherwise the
                caller evicts again for an extent that still does not fit.
        """
        st = self._st
        if not candidates:
            return 0
        ids = frozenset(s.segment_id for s in candidates)
        # What alloc would do, not "a block is large enough": alloc's slow path looks
        # at a bounded number of blocks of the request's own class (allocator.can_alloc).
        if count <= 1:
            fits = lambda: any(s.allocator.free_bytes >= need and s.allocator.can_alloc(need)  # noqa: E731
                               for s in candidates)
        else:
            total = count * need
            fits = lambda: (sum(s.allocator.free_bytes for s in candidates) >= total  # noqa: E731
                            and any(s.allocator.can_alloc(need) for s in candidates))
        n = 0
        if st.tiering.cold and any(s.tier == Tier.SSD for s in candidates):
            n = self.evict(now, fits, ids, None, cold=True)  # SSD-only objects first
        return n + self.evict(now, fits, ids, None)

    def to_watermark(self, now: float, budget_s: float | None = None) -> int:
        """Evict in each segment above ``high_watermark`` down to ``low_watermark``.

        A segment that crossed the high watermark keeps draining in later
        calls (when the budget cut a pass short) until it is at or below the
        low watermark, or nothing in it is evictable.

        Args:
            now: master clock, seconds.
            budget_s: most work-clock time to spend (default ``evict_budget_s``).

        Returns:
            Objects evicted.
        """
        st = self._st
        budget = self.config.evict_budget_s if budget_s is None else budget_s
        deadline = st._work_clock() + budget
        high, low = self.config.high_watermark, self.config.low_watermark
        evicted = 0
        draining = self.draining
        for seg in list(st.segment_table.mounted):
            cap = seg.capacity_bytes
            sid = seg.segment_id
            if sid not in draining:
                if not cap or seg.used_bytes <= high * cap:
                    continue
                draining.add(sid)  # above high: drain down to low, over several passes if needed
            if seg.tier == Tier.DRAM or (seg.tier == Tier.SSD and st.tiering.has_ssd):
                # DRAM caches make room on demand (_cache); the SSD tier drops objects
                # only when full (_alloc_in, _evict_until_fits), never at a watermark
                draining.discard(sid)
                continue
            evicted += self.drain(seg, now, deadline)
            if seg.allocator.used_bytes - st.tiering.moving_out.get(sid, 0) <= low * cap:
                draining.discard(sid)
            if st._work_clock() > deadline:
                break
        draining.intersection_update(s.segment_id for s in st.segment_table.mounted)
        return evicted

    def drain(self, seg: Segment, now: float, deadline: float) -> int:
        """Evict (CXL with an SSD tier: demote) in ``seg`` down to ``low_watermark``,
        counting bytes already being demoted as gone."""
        st = self._st
        sid = seg.segment_id
        alloc = seg.allocator
        target = self.config.low_watermark * seg.capacity_bytes
        moving = st.tiering.moving_out
        done = lambda: alloc.used_bytes - moving.get(sid, 0) <= target  # noqa: E731
        if seg.tier == Tier.SSD:
            return self.evict(now, done, frozenset((sid,)), deadline, cold=True)
        return self.evict(now, done, frozenset((sid,)), deadline, demote=st.tiering.has_ssd)
