"""What clientd's core takes and answers: plain records, no protobuf.

The core (:class:`cxlkv.clientd.core.ClientdCore`) works on these records; only
the front-end modules (:mod:`cxlkv.clientd.api`, :mod:`cxlkv.clientd.direct`)
turn them into ClientService messages, as ``master/service.py`` does for the
master's state.

**One per-item error form.** A batch call of the core answers one entry per
item, in order, and never raises for one item: an entry is either the item's
record (:class:`Stored`, :class:`Read`, ``bool`` …) or the
:class:`~cxlkv.errors.CxlkvError` subclass that item failed with (not raised;
``isinstance(entry, CxlkvError)`` tells them apart, ``entry.code`` says which
error). Fields an error carries (``key``, ``requested_bytes`` on TOO_LARGE /
OUT_OF_RANGE reads: the value's size) are set on it. Whole-call failures
(master unreachable, a bad regex) are raised.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Sequence, TypeVar, Union

from cxlkv.errors import CxlkvError, InvalidKey
from cxlkv.wire.keys import key_error

__all__ = ["PutSpec", "ReadTarget", "Stored", "Read", "Removed", "KeyEntry", "KeyPage", "MasterStat",
           "Outcome", "valid_positions"]

T = TypeVar("T")
#: One item's answer: its record, or the error it failed with.
Outcome = Union[T, CxlkvError]


def valid_positions(keys: Sequence[Any], out: list[Any]) -> list[int]:
    """The positions of the valid keys; each invalid key's entry in ``out`` (one
    per key) becomes its :class:`~cxlkv.errors.InvalidKey`."""
    todo: list[int] = []
    for i, k in enumerate(keys):
        why = key_error(k)
        if why is None:
            todo.append(i)
        else:
            out[i] = InvalidKey(why, key=k if isinstance(k, str) else None)
    return todo


@dataclass(slots=True)
class PutSpec:
    """One value to put.

    Attributes:
        key: the key (validated by the core).
        size_bytes: value size in bytes.
        options: put options, a ``cxlkv.v1.PutOptions`` as received (``None``: defaults).
        src: a bytes-like object holding the value at ``src_offset_bytes`` (the
            inline value itself, or a shared buffer's view).
        src_offset_bytes: where the value starts in ``src``, in bytes.
    """

    key: str
    size_bytes: int
    options: Any
    src: Any
    src_offset_bytes: int = 0


@dataclass(slots=True)
class ReadTarget:
    """Where a read's bytes go: ``buf[offset_bytes : offset_bytes + capacity_bytes]``
    (a shared buffer's view)."""

    buf: Any
    offset_bytes: int
    capacity_bytes: int


class Stored(NamedTuple):
    """A committed put.

    Attributes:
        version: the new object's version.
        replicas_placed: replicas written (1 for a reserved extent).
    """

    version: int
    replicas_placed: int


@dataclass(slots=True)
class Read:
    """One value read.

    Attributes:
        size_bytes: the value's size in bytes.
        version: the version read.
        value: the bytes, for inline reads (``None`` for reads into a target).
        tier: ``cxlkv.v1.Tier`` number of the replica that served it (0: none copied).
    """

    size_bytes: int
    version: int
    value: bytes | None = None
    tier: int = 0


class Removed(NamedTuple):
    """The outcome of a remove-all (or remove by pattern).

    Attributes:
        removed: objects removed.
        skipped_leased: objects left because a read held a lease (without ``force``).
    """

    removed: int
    skipped_leased: int


class KeyEntry(NamedTuple):
    """One committed key of a listing."""

    key: str
    value_size_bytes: int
    version: int
    replica_count: int


class KeyPage(NamedTuple):
    """One page of committed keys, in key order; ``next_page_token`` "" on the last page."""

    entries: list[KeyEntry]
    next_page_token: str


class MasterStat(NamedTuple):
    """The master's totals.

    Attributes:
        key_count: committed objects.
        capacity_bytes: bytes of every mounted segment.
        used_bytes: bytes allocated.
        reserved_bytes: of ``used_bytes``, held ahead of need by clientds.
        quarantined_bytes: of ``used_bytes``, held for writers of ended registrations.
        segments: the master's segment descriptions as it sent them (``cxlkv.v1.SegmentInfo``).
    """

    key_count: int
    capacity_bytes: int
    used_bytes: int
    segments: Sequence[Any]
    reserved_bytes: int = 0
    quarantined_bytes: int = 0
