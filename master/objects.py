"""Metadata records of the master: object versions, clients, and the records its calls take.

Plain ``__slots__`` classes, no behaviour beyond small helpers: the rules live in
:class:`~cxlkv.master.state.MasterState`.
"""

from __future__ import annotations

import enum
from typing import NamedTuple, Protocol

from cxlkv.v1 import common_pb2

__all__ = [
    "ObjState", "ObjectVersion", "ClientRecord", "Extent", "RegionReport", "RestoredObject",
    "RestoreReport", "MAX_HEADER_BYTES", "short_key",
]

#: ``(segment_id, offset_bytes, length_bytes)`` of one replica.
Extent = tuple[int, int, int]


#: Largest per-extent header a writer may ask for, in bytes (object header + a 4096-byte key).
MAX_HEADER_BYTES = 64 + 4096


def short_key(key: str) -> str:
    """``key`` for a message: quoted, cut at 80 characters."""
    return repr(key if len(key) <= 80 else key[:80] + "…")


class ObjState(enum.IntEnum):
    """State of one object version (its replicas share it; values match ``ReplicaState``)."""

    PROCESSING = common_pb2.PROCESSING  # space reserved, bytes being written; invisible to reads
    COMPLETE = common_pb2.COMPLETE      # committed: readable, evictable when unleased and unpinned
    FAILED = common_pb2.FAILED          # put revoked, timed out or its writer died; space reclaimed
    REMOVED = common_pb2.REMOVED        # removed, evicted or superseded; freed when no lease remains


class ObjectVersion:
    """One version of one key: a put attempt, then (after PutEnd) the committed object.

    Attributes:
        key: the key.
        size_bytes: value size (0 is a valid, empty value).
        version: from the master's one increasing counter; also the put token.
        extents: one :data:`Extent` per placed replica, on distinct segments.
        state: an :class:`ObjState`.
        client_id, epoch: the writer (for fencing and writer-death reclaim).
        started_at: ``now`` of PutStart (seconds, master clock).
        checksum: xxh3-64 given at PutEnd (0: none).
        header_bytes: bytes before the value in each extent (object header and
            key, written by the clientd; 0: a bare value). Extents hold
            ``header_bytes + size_bytes`` bytes, aligned.
        hard_pin: never evicted.
        soft_pin_until: evicted last until this time (seconds; 0: not pinned).
        leases: live read leases on this version.
        replicas_wanted: ``replica_num`` asked for (>= 1).
        detached: replicas dropped from ``extents`` (demoted, uncached) while the
            version was leased: no longer handed to readers, freed when the last
            lease ends (docs/tiers.md).
    """

    __slots__ = (
        "key", "size_bytes", "version", "extents", "state", "client_id", "epoch",
        "started_at", "checksum", "hard_pin", "soft_pin_until", "leases", "replicas_wanted",
        "header_bytes", "detached",
    )

    def __init__(
        self,
        key: str,
        size_bytes: int,
        version: int,
        extents: list[Extent],
        client_id: str,
        epoch: int,
        started_at: float,
        hard_pin: bool = False,
        soft_pin_until: float = 0.0,
        replicas_wanted: int = 1,
        header_bytes: int = 0,
    ) -> None:
        self.key = key
        self.size_bytes = size_bytes
        self.version = version
        self.extents = extents
        self.state = ObjState.PROCESSING
        self.client_id = client_id
        self.epoch = epoch
        self.started_at = started_at
        self.checksum = 0
        self.hard_pin = hard_pin
        self.soft_pin_until = soft_pin_until
        self.leases = 0
        self.replicas_wanted = replicas_wanted
        self.header_bytes = header_bytes
        self.detached: list[Extent] = []

    @property
    def put_token(self) -> int:
        """The put attempt's token (equal to the version it commits)."""
        return self.version

    def __repr__(self) -> str:
        return (
            f"ObjectVersion({self.key!r}, v{self.version}, {self.size_bytes} B, "
            f"{ObjState(self.state).name}, extents={self.extents}, leases={self.leases})"
        )


class ClientRecord:
    """A registered clientd.

    Attributes:
        client_id: stable across re-registrations that pass ``previous_client_id``.
        epoch: fencing epoch of the current registration.
        hostname, name, pid, metrics_url: as reported at registration.
        registered_at, last_heartbeat: master clock, seconds.
        alive: False once expired.
        puts: in-flight put attempts of this registration, token → version.
        reserved: extents this registration took ahead of need (``reserve``),
            token → a keyless PROCESSING version; ``commit`` names one.
        mapped: names of the segments this clientd maps (its registered regions
            and its own DRAM tier): the move tasks it may run.
    """

    __slots__ = (
        "client_id", "epoch", "hostname", "name", "pid", "metrics_url",
        "registered_at", "last_heartbeat", "alive", "puts", "reserved", "reserved_bytes", "mapped",
    )

    def __init__(
        self, client_id: str, epoch: int, hostname: str, name: str, pid: int,
        metrics_url: str, now: float,
    ) -> None:
        self.client_id = client_id
        self.epoch = epoch
        self.hostname = hostname
        self.name = name
        self.pid = pid
        self.metrics_url = metrics_url
        self.registered_at = now
        self.last_heartbeat = now
        self.alive = True
        self.puts: dict[int, ObjectVersion] = {}
        self.reserved: dict[int, ObjectVersion] = {}
        #: Bytes of the extents in :attr:`reserved` (kept with it: bounded by ``reserve_max_ratio``).
        self.reserved_bytes = 0
        self.mapped: set[str] = set()


class RegionReport(Protocol):
    """A region a clientd maps (duck-typed: ``cxlkv.v1.RegionIdentity`` fits)."""

    segment_name: str
    region_uuid: str
    size_bytes: int
    device_path: str


class RestoredObject(NamedTuple):
    """One committed object found in a region, for :meth:`MasterState.restore_objects`.

    Attributes:
        key: the key.
        offset_bytes: the extent's offset in the region, in bytes.
        value_size_bytes: value length in bytes.
        header_bytes: bytes before the value in the extent (object header and key).
        version: the version the writer recorded (readers check it).
        checksum: xxh3_64 of the value the writer recorded.
    """

    key: str
    offset_bytes: int
    value_size_bytes: int
    header_bytes: int
    version: int
    checksum: int


class RestoreReport(NamedTuple):
    """What :meth:`MasterState.restore_objects` did with one segment's objects.

    Attributes:
        restored: objects committed under their key (new keys or newer versions).
        replicas: extents added as another replica of an already restored
            version (the same version found in another segment).
        superseded: objects dropped because a newer version of the key was
            already restored (from another segment).
        conflicts: objects dropped because their extent is misaligned, outside
            the segment or overlaps an extent already claimed.
        invalid: objects dropped for a key or size the master would refuse.
        restored_bytes: bytes of the extents claimed (restored and replicas).
    """

    restored: int
    replicas: int
    superseded: int
    conflicts: int
    invalid: int
    restored_bytes: int
