"""A small program written for Mooncake Store's Python API, running on cxlkv.

It is an ordinary Mooncake client — configuration from the same environment
variables vLLM's Mooncake connector reads, ``setup`` with Mooncake's seven
positional arguments, bytes and batch calls, zero-copy calls on registered
memory, and a remove that waits out the read lease — with one line changed: the
import. On cxlkv, set ``CXLKV_SOCKET`` to the clientd socket of this host (or
leave the daemon's default path), then::

    python examples/mooncake_app.py

It prints ``mooncake_app: all checks passed`` and exits 0, or names the failed
check and exits 1.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time

import numpy as np

# from mooncake.store import MooncakeDistributedStore
from cxlkv.compat.mooncake import MooncakeDistributedStore

OBJECT_HAS_LEASE = -706  # Mooncake's ErrorCode: a reader still holds a lease
LEASE_WAIT_S = 10.0      # Mooncake's default lease is 5 s; wait up to twice that
MiB = 1 << 20


def check(ok: bool, what: str) -> None:
    if not ok:
        print(f"mooncake_app: FAILED: {what}", file=sys.stderr)
        sys.exit(1)


def remove_after_lease(store: MooncakeDistributedStore, key: str) -> int:
    """Remove ``key``, retrying while a reader's lease protects it."""
    deadline = time.monotonic() + LEASE_WAIT_S
    while True:
        rc = store.remove(key)
        if rc != OBJECT_HAS_LEASE or time.monotonic() > deadline:
            return rc
        time.sleep(0.1)


def main() -> None:
    prefix = os.environ.get("MOONCAKE_APP_PREFIX", f"mooncake-app-{os.getpid()}")
    store = MooncakeDistributedStore()
    rc = store.setup(
        os.environ.get("MOONCAKE_LOCAL_HOSTNAME", "localhost"),
        os.environ.get("MOONCAKE_METADATA_SERVER", "P2PHANDSHAKE"),
        512 * MiB,                                   # global_segment_size
        128 * MiB,                                   # local_buffer_size
        os.environ.get("MOONCAKE_PROTOCOL", "tcp"),
        os.environ.get("MOONCAKE_DEVICE", ""),
        os.environ.get("MOONCAKE_MASTER", "localhost:50051"),
    )
    check(rc == 0, f"setup returned {rc}")

    # --- bytes API -------------------------------------------------------
    key = f"{prefix}/hello"
    check(store.put(key, b"Hello, Mooncake Store!") == 0, "put")
    check(store.get(key) == b"Hello, Mooncake Store!", "get after put")
    check(store.is_exist(key) == 1, "is_exist of a stored key")
    check(store.get_size(key) == len(b"Hello, Mooncake Store!"), "get_size")
    check(store.get(f"{prefix}/absent") == b"", "get of a missing key returns b''")
    check(store.is_exist(f"{prefix}/absent") == 0, "is_exist of a missing key")

    weights = np.random.default_rng(7).standard_normal((512, 512)).astype(np.float32)  # 1 MiB
    check(store.put(f"{prefix}/weights", weights.tobytes()) == 0, "put of a 1 MiB value")
    back = np.frombuffer(store.get(f"{prefix}/weights"), dtype=np.float32).reshape(512, 512)
    check(np.array_equal(back, weights), "1 MiB value round trip")

    # --- batch API -------------------------------------------------------
    keys = [f"{prefix}/batch/{i}" for i in range(8)]
    values = [f"value-{i}".encode() * (i + 1) for i in range(8)]
    check(store.put_batch(keys, values) == 0, "put_batch")
    check(store.get_batch(keys) == values, "get_batch")
    check(store.batch_is_exist(keys + [f"{prefix}/absent"]) == [1] * 8 + [0], "batch_is_exist")

    # --- zero-copy API on registered memory ----------------------------
    size = 4 * MiB
    src = np.random.default_rng(11).integers(0, 256, size, dtype=np.uint8)
    dst = np.zeros(size, dtype=np.uint8)
    check(store.register_buffer(src.ctypes.data, size) == 0, "register_buffer(src)")
    check(store.register_buffer(dst.ctypes.data, size) == 0, "register_buffer(dst)")
    check(store.put_from(f"{prefix}/zc", src.ctypes.data, size) == 0, "put_from")
    n = store.get_into(f"{prefix}/zc", dst.ctypes.data, size)
    check(n == size and np.array_equal(src, dst), f"get_into returned {n}")

    block = 64 << 10
    zc_keys = [f"{prefix}/zc/{i}" for i in range(4)]
    page = ctypes.create_string_buffer(4 * block)
    base = ctypes.addressof(page)
    ctypes.memset(base, 0x5A, 4 * block)
    check(store.register_buffer(base, 4 * block) == 0, "register_buffer(page)")
    rcs = store.batch_put_from(zc_keys, [base + i * block for i in range(4)], [block] * 4)
    check(rcs == [0, 0, 0, 0], f"batch_put_from returned {rcs}")
    ctypes.memset(base, 0, 4 * block)
    got = store.batch_get_into(zc_keys, [base + i * block for i in range(4)], [block] * 4)
    check(got == [block] * 4 and page.raw == b"\x5a" * (4 * block), f"batch_get_into returned {got}")
    for ptr in (src.ctypes.data, dst.ctypes.data, base):
        check(store.unregister_buffer(ptr) == 0, "unregister_buffer")

    # --- remove after the lease -----------------------------------------
    check(store.get(key) != b"", "get before remove")  # takes a read lease
    rc = remove_after_lease(store, key)
    check(rc == 0, f"remove after the lease returned {rc}")
    check(store.is_exist(key) == 0 and store.get(key) == b"", "key gone after remove")
    removed = store.remove_by_regex(f"^{prefix}/")
    check(removed == 1 + 8 + 1 + 4, f"remove_by_regex removed {removed}")

    store.close()
    print("mooncake_app: all checks passed")


if __name__ == "__main__":
    main()
