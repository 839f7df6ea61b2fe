"""Allocation strategies: which segment(s) a new object's replicas go to.

A strategy *picks*; it never allocates, locks or mutates. The master calls
:meth:`AllocationStrategy.select` on its event-loop thread (so there is no
concurrent call and no lock to take), then allocates on the returned segments in
order until it has placed ``replica_num`` replicas on distinct segments.

Contract of ``select`` (best-effort, not all-or-nothing):

* It returns an ordered list of *distinct* candidate segments, most preferred
  first; it may return more than ``replica_num`` (the master moves on to the next
  candidate when one has no room) or fewer (then fewer replicas are placed).
* It must not return unmounted segments and must not keep references to
  segments between calls.
* It must be fast (it runs once per put, on the hot path): O(segments).

Third-party strategies subclass :class:`AllocationStrategy` and register an
entry point in the ``cxlkv.allocation_strategies`` group; ``allocation_strategy``
in the master config names it. See docs/master.md.
"""

from __future__ import annotations

import abc
from typing import NamedTuple, Sequence

from cxlkv.config import MasterConfig
from cxlkv.errors import ConfigError
from cxlkv.master.plugins import STRATEGY_GROUP, available, load_plugin
from cxlkv.master.segments import Segment

__all__ = ["PlacementRequest", "AllocationStrategy", "load_strategy", "available_strategies"]


class PlacementRequest(NamedTuple):
    """What a strategy is asked to place.

    Attributes:
        extent_bytes: bytes each replica needs (aligned).
        replica_num: replicas wanted, on distinct segments (>= 1).
        preferred_segment: segment name to try first, "" if none.
        tier: a :class:`~cxlkv.master.segments.Tier` value, or 0 for "strategy decides".
    """

    extent_bytes: int
    replica_num: int = 1
    preferred_segment: str = ""
    tier: int = 0


class AllocationStrategy(abc.ABC):
    """Base of allocation strategies (see the module docstring for the contract).

    Args:
        config: the master's configuration (read-only).
        seed: seed for strategies that use randomness (``None``: from the OS).
    """

    #: Entry-point name, for Stat and logs.
    name: str = ""

    def __init__(self, config: MasterConfig | None = None, seed: int | None = None) -> None:
        self.config = config

    @abc.abstractmethod
    def select(self, segments: Sequence[Segment], request: PlacementRequest) -> list[Segment]:
        """Ordered candidate segments for ``request``.

        Args:
            segments: every mounted segment that could hold one replica
                (capacity >= ``request.extent_bytes``), in segment-id order.
                Read-only.
            request: what to place.

        Returns:
            Distinct segments from ``segments``, most preferred first.
        """


def available_strategies() -> list[str]:
    """Names registered in the ``cxlkv.allocation_strategies`` entry-point group."""
    return available(STRATEGY_GROUP)


def load_strategy(name: str, config: MasterConfig | None = None, seed: int | None = None) -> AllocationStrategy:
    """Instantiate the strategy registered as ``name``.

    Raises:
        ConfigError: unknown name (the known ones are listed), a plugin that
            fails to import, or one that fails to construct.
    """
    cls = load_plugin(STRATEGY_GROUP, name, AllocationStrategy)
    try:
        strategy = cls(config, seed=seed)
    except Exception as exc:
        raise ConfigError(f"allocation strategy {name!r} failed to start: {type(exc).__name__}: {exc}") from exc
    strategy.name = name
    return strategy
