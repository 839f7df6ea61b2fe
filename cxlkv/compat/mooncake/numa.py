"""``bind_to_numa_node``: Mooncake's module-level NUMA binding, for cxlkv's shim.

LMCache calls ``mooncake.store.bind_to_numa_node(node)`` before ``setup`` so the
store's threads and buffers sit on the NUMA node of the engine's GPU. The same
makes sense on cxlkv (the SDK's staging pool and the host pool are then local to
that node), so it is done the way Mooncake does it: the calling thread is pinned
to the node's CPUs (``sched_setaffinity``, the list from
``/sys/devices/system/node/node<N>/cpulist``) and its memory policy prefers the
node (``set_mempolicy(MPOL_PREFERRED)``, Linux ``mempolicy.h``; through libnuma's
``numa_set_preferred`` when libnuma is loadable, else the raw syscall).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform
from pathlib import Path

from cxlkv.errors import InvalidArgument

__all__ = ["bind_to_numa_node", "node_cpus"]

NODE_DIR = Path("/sys/devices/system/node")
#: ``MPOL_PREFERRED`` of Linux's ``include/uapi/linux/mempolicy.h``.
_MPOL_PREFERRED = 1
#: ``set_mempolicy`` syscall numbers (Linux ``arch/*/syscall*.tbl``).
_SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237}
logger = logging.getLogger("cxlkv.compat.mooncake")


def _parse_cpulist(text: str) -> set[int]:
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def node_cpus(node: int) -> set[int]:
    """The CPUs of NUMA node ``node``.

    Raises:
        InvalidArgument: ``node`` is not an int >= 0, or the machine has no such node.
    """
    if isinstance(node, bool) or not isinstance(node, int) or node < 0:
        raise InvalidArgument(f"NUMA node must be an int >= 0, got {node!r}")
    path = NODE_DIR / f"node{node}" / "cpulist"
    try:
        return _parse_cpulist(path.read_text())
    except FileNotFoundError:
        if node == 0 and not NODE_DIR.exists():  # a kernel without NUMA: one node, every CPU
            return set(os.sched_getaffinity(0))
        raise InvalidArgument(f"this machine has no NUMA node {node} ({path} does not exist)") from None


def _prefer_node(node: int) -> bool:
    """Set the calling thread's memory policy to prefer ``node``; whether it was set."""
    lib = ctypes.util.find_library("numa")
    if lib:
        try:
            numa = ctypes.CDLL(lib)
            if numa.numa_available() >= 0:
                numa.numa_set_preferred(ctypes.c_int(node))
                return True
        except OSError:
            pass
    nr = _SET_MEMPOLICY.get(platform.machine())
    if nr is None or node >= 64:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    mask = ctypes.c_ulong(1 << node)
    return libc.syscall(nr, _MPOL_PREFERRED, ctypes.byref(mask), ctypes.c_ulong(64)) == 0


def bind_to_numa_node(node: int) -> None:
    """Bind the calling thread's CPUs and memory allocation preference to NUMA ``node``.

    Args:
        node: the node number (as in ``/sys/devices/system/node/node<N>``).

    Raises:
        InvalidArgument: no such node, or it has no CPUs.
        OSError: the kernel refused the CPU affinity (e.g. the node's CPUs are all
            outside this process's cpuset).
    """
    cpus = node_cpus(node)
    if not cpus:
        raise InvalidArgument(f"NUMA node {node} has no CPUs")
    os.sched_setaffinity(0, cpus)  # 0: the calling thread
    if not _prefer_node(node):
        logger.warning("bind_to_numa_node(%d): CPUs bound; the memory policy could not be set", node)
