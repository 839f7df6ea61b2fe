"""Copy while hashing (transport/c/copyhash.c): every kernel stores the source's
bytes exactly and returns xxhash's own xxh3_64 of them, for every length class
of xxh3 (short, mid-size, whole and partial 1 KiB blocks, the last stripe) and
for any alignment of either side."""

from __future__ import annotations

import os

import numpy as np
import pytest
import xxhash

from cxlkv.errors import InvalidArgument
from cxlkv.transport import bindings as b



def _supported(name: str) -> bool:
    current = b.cxlkv_copy_hash_kernel()
    try:
        b.cxlkv_set_copy_hash_kernel(name)
    except InvalidArgument:
        return False
    finally:
        b.cxlkv_set_copy_hash_kernel(current)
    return True


@pytest.fixture(params=["avx512", "avx2", "two-pass"])
def kernel(request: pytest.FixtureRequest):
    if not _supported(request.param):
        pytest.skip(f"this CPU has no {request.param}")
    current = b.cxlkv_copy_hash_kernel()
    b.cxlkv_set_copy_hash_kernel(request.param)
    yield request.param
    b.cxlkv_set_copy_hash_kernel(current)


# xxh3's length classes: 0..16, 17..128, 129..240 (short), 241.. (long: 64-byte
# stripes, 1 KiB blocks, a last stripe overlapping the one before), chunk edges.
LENGTHS = sorted({*range(0, 300), *range(1000, 1100), 2047, 2048, 2049, 4095, 4096, 4097, 65536 + 63,
                  262144 - 1, 262144, 262144 + 1, (1 << 20) + 17, 3 << 20})


def test_every_kernel_stores_the_bytes_and_returns_xxh3_of_them(kernel: str) -> None:
    src_all = np.frombuffer(os.urandom((3 << 20) + 4096), dtype=np.uint8)
    dst_all = np.zeros((3 << 20) + 4096, dtype=np.uint8)
    for n in LENGTHS:
        for s_off, d_off in ((0, 0), (1, 7), (13, 64), (63, 4095 - 64)):
            src, dst = src_all[s_off:s_off + n], dst_all[d_off:d_off + n + 8]
            dst[n:] = 0xAB  # nothing past n is written
            h = b.cxlkv_copy_hash(dst, src)
            assert h == xxhash.xxh3_64_intdigest(src.tobytes()), (kernel, n, s_off, d_off)
            assert np.array_equal(dst[:n], src) and (dst[n:] == 0xAB).all(), (kernel, n, s_off, d_off)


def test_copy_hash_refuses_overlap_and_short_destinations() -> None:
    buf = bytearray(8192)
    with pytest.raises(InvalidArgument):
        b.cxlkv_copy_hash(memoryview(buf)[100:4200], memoryview(buf)[0:4096])
    with pytest.raises(InvalidArgument):
        b.cxlkv_copy_hash(bytearray(10), b"x" * 11)
    with pytest.raises(InvalidArgument):
        b.cxlkv_set_copy_hash_kernel("nope")


def test_hashed_region_copies_use_the_kernel_and_agree_with_xxhash(kernel: str, tmp_path) -> None:
    """copy_in_hashed / copy_out_hashed and the batched ranges give the same hash
    as xxhash, whatever kernel runs under them."""
    path = str(tmp_path / "r")
    with open(path, "wb") as f:
        f.truncate(8 << 20)
    r = b.cxlkv_map(path, 8 << 20)
    try:
        for n in (0, 5, 240, 241, 1024, 1025, 70000, (1 << 20) + 3):
            val = os.urandom(n)
            assert b.cxlkv_copy_in_hashed(r, 4096, val) == xxhash.xxh3_64_intdigest(val)
            out = bytearray(n)
            assert b.cxlkv_copy_out_hashed(r, 4096, out) == xxhash.xxh3_64_intdigest(val) and out == val
    finally:
        b.cxlkv_unmap(r)
