"""A 1 GiB value round-trips from host A to host B (Mooncake's CXL mode caps objects below 16 MiB)."""

from __future__ import annotations

import numpy as np

MiB = 1 << 20
GiB = 1 << 30


def test_one_gib_value_round_trip(make_cluster) -> None:
    # under the low watermark (0.9: a sweep drains to it), with the index (0.8 %)
    cl = make_cluster(region_size_bytes=GiB + 256 * MiB)
    with cl.client(0, buffer_pool_bytes=64 * MiB) as a, cl.client(1, buffer_pool_bytes=64 * MiB) as b:
        src = a.buffer(GiB)
        words = np.frombuffer(src, dtype=np.uint64)
        rows = words.reshape(1024, -1)  # 1024 rows of 1 MiB
        rows[:] = np.random.default_rng(1).integers(0, 2**63, rows.shape[1], dtype=np.uint64)
        rows[:, 0] = np.arange(1024, dtype=np.uint64)  # every MiB differs
        version = a.put_from("large/1GiB", src)
        assert version > 0
        dst = b.buffer(GiB)
        assert b.get_into("large/1GiB", dst) == GiB
        assert np.array_equal(np.frombuffer(dst, dtype=np.uint64), words)
        info = [e for e in b.list("large/")]
        assert [(e.key, e.size_bytes) for e in info] == [("large/1GiB", GiB)]
        del words
        b.remove("large/1GiB")
    cl.assert_invariants()
