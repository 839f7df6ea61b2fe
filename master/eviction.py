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
"""

from __future__ import annotations

import abc
import itertools
import math
from collections import OrderedDict
from typing import Sequence

from cxlkv.config import MasterConfig
from cxlkv.errors import ConfigError
from cxlkv.master.plugins import POLICY_GROUP, available, load_plugin

__all__ = ["EvictionPolicy", "LruPolicy", "ArcPolicy", "load_policy", "available_policies"]


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
        ``matched`` of them cached. Reported asynchronously (``ReportHits``), so it may
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
