"""Mooncake Store's Python API on cxlkv: ``MooncakeDistributedStore`` and friends.

A program written for Mooncake runs on cxlkv with one import line changed::

    # from mooncake.store import MooncakeDistributedStore
    from cxlkv.compat.mooncake import MooncakeDistributedStore

    store = MooncakeDistributedStore()
    store.setup("node-a", "P2PHANDSHAKE", 512 << 20, 128 << 20, "tcp", "", "master:50051")
    store.put("k", b"v")
    assert store.get("k") == b"v"

or with no line changed at all, through :mod:`cxlkv.compat.mooncake_alias`
(``CXLKV_AS_MOONCAKE=1``). docs/compat-mooncake.md has the details.
"""

from __future__ import annotations

from cxlkv.compat.mooncake.allocator import MooncakeHostMemAllocator
from cxlkv.compat.mooncake.config import ReplicateConfig, SoftPinAction
from cxlkv.compat.mooncake.errors import MOONCAKE_CODES, ErrorCode, mooncake_code
from cxlkv.compat.mooncake.memory import BufferHandle
from cxlkv.compat.mooncake.numa import bind_to_numa_node
from cxlkv.compat.mooncake.replicas import (
    Descriptor,
    DiskDescriptor,
    MemoryDescriptor,
    ReplicaDescriptor,
    ReplicaStatus,
)
from cxlkv.compat.mooncake.store import MooncakeDistributedStore

__all__ = [
    "MooncakeDistributedStore",
    "ReplicateConfig",
    "SoftPinAction",
    "BufferHandle",
    "MooncakeHostMemAllocator",
    "bind_to_numa_node",
    "ReplicaDescriptor",
    "ReplicaStatus",
    "Descriptor",
    "MemoryDescriptor",
    "DiskDescriptor",
    "ErrorCode",
    "MOONCAKE_CODES",
    "mooncake_code",
]
