"""``ReplicateConfig`` and ``SoftPinAction``: Mooncake's per-put options, mapped to cxlkv's.

Mooncake passes a :class:`ReplicateConfig` to every write call. cxlkv honours
``replica_num`` (replicas on distinct segments, best effort), soft pins
(``with_soft_pin`` or ``soft_pin_action = SoftPinAction.ENABLE``) and hard pins
(``with_hard_pin``). Placement hints (``preferred_segment``,
``preferred_segments``, ``prefer_alloc_in_same_node``) and ``soft_pin_ttl_ms``
are accepted and validated as Mooncake validates them, then left to the master:
its allocation strategy chooses the segment and its configuration the soft-pin
lifetime (docs/compat-mooncake.md).
"""

from __future__ import annotations

import enum
import operator
from typing import Any

from cxlkv.errors import InvalidArgument
from cxlkv.wire.keys import validate_replica_num

__all__ = ["SoftPinAction", "ReplicateConfig", "put_options"]


class SoftPinAction(enum.IntEnum):
    """What a write does to the object's soft pin (Mooncake's enum, same values)."""

    PRESERVE = 0  # follow ``with_soft_pin`` (cxlkv carries no pin over from a replaced version)
    ENABLE = 1    # soft-pin the object
    DISABLE = 2   # no soft pin, even if ``with_soft_pin`` is set


class ReplicateConfig:
    """Replication and pinning options of one write call (Mooncake's class, same fields).

    Attributes:
        replica_num: total replicas to place (>= 1), on distinct segments, best effort.
        with_soft_pin: soft-pin the object (evicted last; the pin expires).
        with_hard_pin: hard-pin the object (never evicted).
        preferred_segment: Mooncake placement hint (``"host:port"``); accepted, not used.
        preferred_segments: one placement hint per replica; accepted, not used, but as
            in Mooncake a non-empty list must hold exactly ``replica_num`` entries.
        prefer_alloc_in_same_node: Mooncake placement hint; accepted, not used.
        soft_pin_action: a :class:`SoftPinAction`; ``ENABLE`` soft-pins, ``DISABLE``
            clears ``with_soft_pin``.
        soft_pin_ttl_ms: Mooncake's soft-pin lifetime in milliseconds; accepted, not
            used (the master's configuration sets it).
        group_ids: Mooncake's object groups (one group name per key of a batch write,
            objects of a group kept and evicted together); accepted and checked (a
            list of str), not used: cxlkv's master evicts objects one by one.

    Unknown attribute names raise ``AttributeError``, as on Mooncake's class.
    """

    __slots__ = ("replica_num", "with_soft_pin", "with_hard_pin", "preferred_segment",
                 "preferred_segments", "prefer_alloc_in_same_node", "soft_pin_action", "soft_pin_ttl_ms", "group_ids")

    def __init__(self) -> None:
        self.replica_num: int = 1
        self.with_soft_pin: bool = False
        self.with_hard_pin: bool = False
        self.preferred_segment: str = ""
        self.preferred_segments: list[str] = []
        self.prefer_alloc_in_same_node: bool = False
        self.soft_pin_action: SoftPinAction = SoftPinAction.PRESERVE
        self.soft_pin_ttl_ms: int = 0
        self.group_ids: list[str] = []

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"ReplicateConfig({fields})"

    __str__ = __repr__


def put_options(config: ReplicateConfig | None) -> dict[str, Any]:
    """The ``cxlkv.Client`` put keywords for a Mooncake ``config``.

    Args:
        config: a :class:`ReplicateConfig`, or ``None`` for the defaults.

    Returns:
        ``{"replica_num": int, "soft_pin": bool, "hard_pin": bool}``.

    Raises:
        InvalidArgument: ``config`` is not a ``ReplicateConfig``, ``replica_num`` not an int in 1..16,
            ``preferred_segments`` is non-empty and not ``replica_num`` long, or
            ``group_ids`` is not a list of str.
    """
    if config is None:
        return {}
    if not isinstance(config, ReplicateConfig):
        raise InvalidArgument(f"config must be a ReplicateConfig, got {type(config).__name__}")
    try:
        replica_num = operator.index(config.replica_num)
    except TypeError:
        raise InvalidArgument(f"replica_num must be an int, got {type(config.replica_num).__name__}") from None
    validate_replica_num(replica_num)
    if config.preferred_segments and len(config.preferred_segments) != replica_num:
        raise InvalidArgument(
            f"preferred_segments holds {len(config.preferred_segments)} entries; replica_num is {replica_num}")
    groups = config.group_ids
    if not isinstance(groups, (list, tuple)) or not all(isinstance(g, str) for g in groups):
        raise InvalidArgument(f"group_ids must be a list of str, got {groups!r}")
    try:
        action = SoftPinAction(int(config.soft_pin_action))
    except (TypeError, ValueError):
        raise InvalidArgument(f"soft_pin_action must be a SoftPinAction, got {config.soft_pin_action!r}") from None
    soft_pin = action == SoftPinAction.ENABLE or (bool(config.with_soft_pin) and action != SoftPinAction.DISABLE)
    return {"replica_num": replica_num, "soft_pin": soft_pin, "hard_pin": bool(config.with_hard_pin)}
