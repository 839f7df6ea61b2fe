"""Mooncake's replica descriptors (``get_replica_desc`` / ``batch_get_replica_desc``) on cxlkv.

Mooncake describes each replica of an object by where its bytes are: a memory
replica names the buffer (address, size, the transport endpoint of the segment
that holds it) so a client can read it by RDMA; a disk replica names a file.
cxlkv's readers never address a replica themselves — every read goes through the
clientd, which picks a replica and copies from the CXL region — so the shim
reports what the master's key index knows of a committed object: one descriptor
per replica placed, each a memory replica in ``COMPLETE`` state whose buffer
descriptor carries the value's size, ``buffer_address`` 0 (no address is
exposed) and ``transport_endpoint`` ``"cxlkv"``. The tier of each replica (CXL
or SSD) is not exposed to the SDK, so SSD replicas are reported as memory
replicas too (docs/compat-mooncake.md).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

__all__ = ["ReplicaStatus", "Descriptor", "MemoryDescriptor", "DiskDescriptor", "ReplicaDescriptor",
           "replica_descriptors"]

#: What a descriptor names as the transport endpoint of a replica's segment.
TRANSPORT_ENDPOINT = "cxlkv"


class ReplicaStatus(enum.IntEnum):
    """A replica's state (Mooncake's enum, same names and order)."""

    UNDEFINED = 0
    INITIALIZED = 1
    PROCESSING = 2
    COMPLETE = 3
    REMOVED = 4
    FAILED = 5


class Descriptor:
    """An allocated buffer (Mooncake's ``AllocatedBuffer::Descriptor``).

    Attributes:
        size: bytes.
        buffer_address: address of the buffer; 0 on cxlkv (not exposed).
        transport_endpoint: ``"cxlkv"``.
    """

    __slots__ = ("size", "buffer_address", "transport_endpoint")

    def __init__(self, size: int = 0, buffer_address: int = 0, transport_endpoint: str = "") -> None:
        self.size = size
        self.buffer_address = buffer_address
        self.transport_endpoint = transport_endpoint

    def __repr__(self) -> str:
        return (f"<Descriptor size={self.size} buffer_address={self.buffer_address} "
                f"transport_endpoint={self.transport_endpoint}>")


class MemoryDescriptor:
    """A memory replica's buffer (``buffer_descriptor``: a :class:`Descriptor`)."""

    __slots__ = ("buffer_descriptor",)

    def __init__(self, buffer_descriptor: Descriptor) -> None:
        self.buffer_descriptor = buffer_descriptor


class DiskDescriptor:
    """A disk replica's file (never produced on cxlkv: see the module docstring)."""

    __slots__ = ("file_path", "object_size")

    def __init__(self, file_path: str = "", object_size: int = 0) -> None:
        self.file_path = file_path
        self.object_size = object_size


class ReplicaDescriptor:
    """One replica of an object (Mooncake's ``ReplicaDescriptor``)."""

    __slots__ = ("status", "_memory")

    def __init__(self, status: ReplicaStatus, memory: MemoryDescriptor) -> None:
        self.status = status
        self._memory = memory

    def is_memory_replica(self) -> bool:
        """True: on cxlkv every replica is reported as a memory replica."""
        return True

    def is_disk_replica(self) -> bool:
        """False (see :meth:`is_memory_replica`)."""
        return False

    def get_memory_descriptor(self) -> MemoryDescriptor:
        """The replica's buffer descriptor."""
        return self._memory

    def get_disk_descriptor(self) -> DiskDescriptor:
        """Raises ``RuntimeError``, as Mooncake does for a memory replica."""
        raise RuntimeError("not a disk replica")

    def __repr__(self) -> str:
        return f"<ReplicaDescriptor {self.status.name} {self._memory.buffer_descriptor!r}>"


def replica_descriptors(client: Any, keys: Sequence[str]) -> dict[str, list[ReplicaDescriptor]]:
    """Descriptors of each committed key of ``keys`` (missing keys are left out).

    Args:
        client: the store's client (:class:`~cxlkv.compat.mooncake.tenants.TenantClient`).
        keys: valid keys.

    Returns:
        ``{key: [descriptor per replica]}``, from one key-index lookup per key.

    Raises:
        CxlkvError: the daemon or master could not answer.
    """
    out: dict[str, list[ReplicaDescriptor]] = {}
    for key in keys:
        it = client.list(key, page_size=1)
        try:
            info = next(it, None)
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()
        if info is None or info.key != key:
            continue
        out[key] = [ReplicaDescriptor(ReplicaStatus.COMPLETE,
                                      MemoryDescriptor(Descriptor(info.size_bytes, 0, TRANSPORT_ENDPOINT)))
                    for _ in range(max(1, info.replica_count))]
    return out
