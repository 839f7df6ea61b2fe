"""Batch reads in C: ``copy_out_ranges_hashed`` and ``verify_headers`` agree with
the Python definitions (xxhash, :func:`cxlkv.objheader.object_mismatch`) on every
kind of object, valid or not, in the plain and the emulated non-coherent region."""

from __future__ import annotations

import random

import pytest
import xxhash

from cxlkv.errors import InvalidArgument, OutOfRange
from cxlkv.objheader import header_bytes_for, object_mismatch, pack_header
from cxlkv.transport import Region

SIZE = 4 << 20


@pytest.fixture(params=["plain", "noncoherent"])
def region(request, tmp_path):
    r = Region.open(tmp_path / "r", SIZE, create=True, emulate_noncoherent=request.param == "noncoherent")
    yield r
    r.close()


def _write(region: Region, offset: int, key: bytes, version: int, value: bytes) -> int:
    """Write one object as clientd does; returns its header_bytes."""
    hb = header_bytes_for(len(key))
    head = pack_header(key, version, len(value), xxhash.xxh3_64_intdigest(value)) + key
    region.copy_in(offset + hb, value)
    region.copy_in(offset, head + bytes(hb - len(head)))
    region.flush(offset, hb + len(value))
    return hb


def _verify(region: Region, items: list[tuple[int, int, bytes, int, int, int]], *, invalidate: bool = False) -> bytes:
    keys = b"".join(it[2] for it in items)
    offs, pos = [], 0
    for it in items:
        offs.append(pos)
        pos += len(it[2])
    return region.verify_headers(
        [it[0] for it in items], [it[1] for it in items], keys, offs, [len(it[2]) for it in items],
        [it[3] for it in items], [it[4] for it in items], [it[5] for it in items], invalidate=invalidate)


def _python(region: Region, it: tuple[int, int, bytes, int, int, int]) -> bool:
    off, hb, key, version, vlen, vhash = it
    return len(key) <= hb - 64 and object_mismatch(region.read(off, hb), key, version, vlen, hb, vhash) is None


def test_verify_headers_matches_object_mismatch_case_by_case(region: Region) -> None:
    value = bytes(range(256)) * 16
    vh = xxhash.xxh3_64_intdigest(value)
    key = "blk/é/42".encode()
    hb = _write(region, 0, key, 7, value)
    other = _write(region, 65536, b"x" * 200, 9, b"")  # a longer key, an empty value
    good = (0, hb, key, 7, len(value), vh)
    cases = {
        "valid": good,
        "valid, empty value, 200-byte key": (65536, other, b"x" * 200, 9, 0, xxhash.xxh3_64_intdigest(b"")),
        "wrong version": (0, hb, key, 8, len(value), vh),
        "wrong length": (0, hb, key, 7, len(value) - 1, vh),
        "wrong checksum": (0, hb, key, 7, len(value), vh ^ 1),
        "another key, same length": (0, hb, b"blk/\xc3\xa9/43", 7, len(value), vh),
        "another key length": (0, hb, b"blk/e/42", 7, len(value), vh),
        "wrong header_bytes": (0, hb + 64, key, 7, len(value), vh),
        "never written": (1 << 20, hb, key, 7, len(value), vh),
        "key longer than the header span": (65536, 128, b"x" * 200, 9, 0, 0),
    }
    got = _verify(region, list(cases.values()))
    for (name, it), ok in zip(cases.items(), got):
        assert bool(ok) == _python(region, it), name
        assert bool(ok) == name.startswith("valid"), name
    assert _verify(region, list(cases.values()), invalidate=True) == got


def test_verify_headers_catches_every_flipped_bit_of_header_and_key(region: Region) -> None:
    """Fuzz: any flipped bit in the header or the stored key makes the object invalid,
    exactly when the Python check says so."""
    rng = random.Random(5)
    key = b"prefix/0123456789"
    value = rng.randbytes(3000)
    it = (0, header_bytes_for(len(key)), key, 3, len(value), xxhash.xxh3_64_intdigest(value))
    for _ in range(300):
        _write(region, 0, key, 3, value)
        bit = rng.randrange(8 * (64 + len(key)))
        byte = bytearray(region.read(bit // 8, 1))
        byte[0] ^= 1 << (bit % 8)
        region.copy_in(bit // 8, bytes(byte))
        region.flush(bit // 8, 1)
        (ok,) = _verify(region, [it])
        assert ok == _python(region, it) == 0, bit
    _write(region, 0, key, 3, value)
    assert _verify(region, [it]) == b"\x01"


def test_verify_headers_refuses_bad_arguments(region: Region) -> None:
    with pytest.raises(OutOfRange, match="outside"):
        region.verify_headers([SIZE - 32], [64], b"k", [0], [1], [1], [0], [0])
    with pytest.raises(OutOfRange):
        region.verify_headers([0], [32], b"k", [0], [1], [1], [0], [0])  # under one header
    with pytest.raises(InvalidArgument):
        region.verify_headers([0, 64], [64], b"k", [0], [1], [1], [0], [0])
    if type(region) is Region:  # the emulation slices keys like Python does
        with pytest.raises(InvalidArgument):
            region.verify_headers([0], [128], b"k", [0], [2], [1], [0], [0])  # key range outside keys
    assert region.verify_headers([], [], b"", [], [], [], [], []) == b""


@pytest.mark.parametrize("length", [0, 1, 63, 4096, 65536, (256 << 10) + 7, 1 << 20])
def test_copy_out_ranges_hashed_delivers_and_hashes(region: Region, length: int) -> None:
    rng = random.Random(length)
    data = rng.randbytes(length)
    region.copy_in(4096, data)
    region.copy_in(2 << 20, data[::-1])
    region.flush(0, SIZE)
    buf = bytearray(2 * length + 128)
    hashes = region.copy_out_ranges_hashed(buf, [0, length + 64], [4096, 2 << 20], [length, length])
    assert bytes(buf[:length]) == data and bytes(buf[length + 64:2 * length + 64]) == data[::-1]
    assert hashes == [xxhash.xxh3_64_intdigest(data), xxhash.xxh3_64_intdigest(data[::-1])]


def test_copy_out_ranges_hashed_checks_bounds_first(region: Region) -> None:
    buf = bytearray(4096)
    with pytest.raises(OutOfRange):
        region.copy_out_ranges_hashed(buf, [0, 0], [0, SIZE - 100], [100, 200])
    with pytest.raises(OutOfRange):
        region.copy_out_ranges_hashed(buf, [4000], [0], [200])
    assert region.copy_out_ranges_hashed(buf, [], [], []) == []
