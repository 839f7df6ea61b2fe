"""Batch reads in C: ``copy_out_ranges_hashed`` and ``verify_headers`` agree with
the Python definitions (xxhash, :func:`cxlkv.layout.objheader.object_mismatch`) on every
kind of object, valid or not, in the plain and the emulated non-coherent region."""

from __future__ import annotations

import random

import pytest
import xxhash

from cxlkv.errors import InvalidArgument, OutOfRange, RegionError
from cxlkv.layout.objheader import header_bytes_for, object_mismatch, pack_header
from cxlkv.transport import Region

SIZE = 4 << 20
#: What a span outside the region raises: OutOfRange (mappings), RegionError (the SSD file).
OUTSIDE = (OutOfRange, RegionError)


@pytest.fixture(params=["plain", "noncoherent", "ssd_file"])
def region(request, tmp_path):
    if request.param == "ssd_file":  # the SSD tier's pread/pwrite region (cxlkv.transport.portable)
        from cxlkv.clientd.tiers import FileRegion

        r = FileRegion.open(str(tmp_path / "r"), SIZE, create=True)
    else:
        r = Region.open(tmp_path / "r", SIZE, create=True, emulate_noncoherent=request.param == "noncoherent")
    yield r
    r.close()


def test_object_header_constants_come_from_c() -> None:
    """The layout the C kernels use (CXLKV_OBJ_* through cffi) is cxlkv.layout.objheader's,
    name for name, and what pack_header writes sits at C's offsets."""
    from cxlkv.layout import objheader
    from cxlkv.transport import bindings

    c = {n[len("CXLKV_OBJ_"):]: int(getattr(bindings.lib, n)) for n in dir(bindings.lib) if n.startswith("CXLKV_OBJ_")}
    assert c == objheader.OBJECT_LAYOUT
    assert (bindings.OBJ_HEADER_BYTES, bindings.OBJ_FORMAT_VERSION, bindings.OBJ_MAX_KEY_BYTES) == (
        objheader.OBJECT_HEADER_BYTES, objheader.OBJECT_FORMAT_VERSION, objheader.MAX_KEY_BYTES)
    assert bindings.OBJ_MAGIC_U64.to_bytes(8, "little") == objheader.OBJECT_MAGIC
    key = b"k" * 70
    head = pack_header(key, 7, 1234, 99)
    u = lambda at, n: int.from_bytes(head[at:at + n], "little")  # noqa: E731
    assert u(c["KEY_LEN_OFFSET"], 4) == 70 and u(c["VERSION_OFFSET"], 8) == 7
    assert u(c["VALUE_LEN_OFFSET"], 8) == 1234 and u(c["VALUE_HASH_OFFSET"], 8) == 99
    assert u(c["HEADER_BYTES_OFFSET"], 4) == header_bytes_for(70) and u(c["FLAGS_OFFSET"], 2) == 0
    assert u(c["FORMAT_VERSION_OFFSET"], 2) == c["FORMAT_VERSION"]
    assert u(c["KEY_HASH_OFFSET"], 8) == xxhash.xxh3_64_intdigest(key)
    assert u(c["CHECKSUM_OFFSET"], 8) == xxhash.xxh3_64_intdigest(head[:c["CHECKSUM_OFFSET"]] + key)


def test_a_layout_that_differs_from_c_stops_the_transport_loading(monkeypatch) -> None:
    from cxlkv.transport import bindings

    monkeypatch.setattr(bindings, "OBJECT_LAYOUT", {**bindings.OBJECT_LAYOUT, "KEY_LEN_OFFSET": 13})
    with pytest.raises(ImportError, match="KEY_LEN_OFFSET"):
        bindings._check_object_layout()


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
    with pytest.raises(OUTSIDE, match="outside"):
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
    with pytest.raises(OUTSIDE):
        region.copy_out_ranges_hashed(buf, [0, 0], [0, SIZE - 100], [100, 200])
    with pytest.raises((*OUTSIDE, ValueError)):
        region.copy_out_ranges_hashed(buf, [4000], [0], [200])
    assert region.copy_out_ranges_hashed(buf, [], [], []) == []


def test_write_headers_writes_exactly_what_pack_header_describes(region: Region) -> None:
    """The C writer and the Python definition agree byte for byte, and what one
    writes the other verifies."""
    rng = random.Random(9)
    items = []
    off = 0
    for klen in (1, 5, 63, 64, 65, 200, 4096):
        key = bytes(rng.randrange(1, 256) for _ in range(klen))
        hb = header_bytes_for(klen)
        items.append((off, hb, key, rng.randrange(1 << 64), rng.randrange(1 << 40), rng.randrange(1 << 64)))
        off += hb + 4096
    keys = b"".join(it[2] for it in items)
    koffs = [sum(len(it[2]) for it in items[:i]) for i in range(len(items))]
    region.copy_in(0, b"\xff" * off)  # garbage where the padding goes
    region.write_headers([it[0] for it in items], [it[1] for it in items], keys, koffs,
                         [len(it[2]) for it in items], [it[3] for it in items], [it[4] for it in items],
                         [it[5] for it in items], flush=True)
    for o, hb, key, ver, vlen, vhash in items:
        want = pack_header(key, ver, vlen, vhash) + key + bytes(hb - 64 - len(key))
        assert region.read(o, hb) == want
    assert _verify(region, items) == b"\x01" * len(items)


def test_write_headers_checks_everything_before_writing(region: Region) -> None:
    region.copy_in(0, b"\x00" * 4096)
    good = ([0], [128], b"key", [0], [3], [1], [0], [0])
    for bad, exc in (
        (([SIZE - 64], [128], b"key", [0], [3], [1], [0], [0]), OUTSIDE),      # span outside
        (([0], [192], b"key", [0], [3], [1], [0], [0]), InvalidArgument),      # header_bytes != 64 + align64(3)
        (([0], [128], b"key", [1], [3], [1], [0], [0]), InvalidArgument),      # key range outside keys
        (([0], [64], b"", [0], [0], [1], [0], [0]), InvalidArgument),          # empty key
        (([0, 256], [128], b"key", [0], [3], [1], [0], [0]), InvalidArgument),  # ragged
    ):
        with pytest.raises(exc):
            region.write_headers(*bad[:2], bad[2], *bad[3:])
        assert region.read(0, 4096) == b"\x00" * 4096  # nothing written
    region.write_headers(*good[:2], good[2], *good[3:])
    assert region.read(0, 8) == b"CXLKVOB1"


@pytest.mark.parametrize("length", [0, 1, 4096, (256 << 10) + 7])
def test_copy_in_ranges_hashed_copies_and_hashes_the_source(region: Region, length: int) -> None:
    data = random.Random(length).randbytes(2 * length + 64)
    hashes = region.copy_in_ranges_hashed(data, [0, length + 64], [8192, 2 << 20], [length, length])
    region.flush(0, SIZE)
    assert region.read(8192, length) == data[:length]
    assert region.read(2 << 20, length) == data[length + 64:2 * length + 64]
    assert hashes == [xxhash.xxh3_64_intdigest(data[:length]),
                      xxhash.xxh3_64_intdigest(data[length + 64:2 * length + 64])]


def test_hashed_range_copies_refuse_overlapping_sides(tmp_path) -> None:
    """A hashed copy whose two sides overlap would hash bytes it has just
    overwritten: refused before any byte moves (the plain copies use memmove)."""
    r = Region.open(tmp_path / "r", SIZE, create=True)
    try:
        n = 1 << 20
        before = r.read(0, 2 * n)
        for fn in (r.copy_in_ranges_hashed, r.copy_out_ranges_hashed):
            with pytest.raises(InvalidArgument, match="overlaps"):
                fn(r.view(0, n + 64), [0], [64], [n])
        assert r.read(0, 2 * n) == before
    finally:
        r.close()


def test_portable_checks_values_and_key_ranges_like_c(tmp_path) -> None:
    from cxlkv.transport import portable

    r = Region.open(tmp_path / "r", SIZE, create=True)
    try:
        for bad in ([1 << 64], [-1]):
            with pytest.raises(OutOfRange):
                portable.write_headers(r, [0], [128], b"key", [0], [3], bad, [0], [0])
            with pytest.raises(OutOfRange):
                r.write_headers([0], [128], b"key", [0], [3], bad, [0], [0])
        for verify in (r.verify_headers, lambda *a: portable.verify_headers(r, *a)):
            with pytest.raises(InvalidArgument):
                verify([0], [128], b"key", [2], [3], [1], [0], [0])  # key range outside the keys
        r.write_headers([0], [128], bytearray(b"key"), [0], [3], [1], [0], [0])  # any bytes-like keys
        assert r.verify_headers([0], [128], memoryview(b"key"), [0], [3], [1], [0], [0]) == b"\x01"
    finally:
        r.close()


@pytest.mark.parametrize("flush", [False, True])
def test_copy_in_gather_hashed_copies_and_hashes_separate_sources(tmp_path, flush: bool) -> None:
    """Many separate buffers (bytes, numpy views) into many extents in one call; each
    hash is of its source's bytes; a zero length copies nothing and hashes b""."""
    import numpy as np

    r = Region.open(tmp_path / "r", 16 << 20, create=True)
    try:
        rnd = random.Random(7)
        lengths = [0, 1, 63, 4096, 65536, (256 << 10) + 7, 1 << 20]
        srcs: list[object] = [rnd.randbytes(n) for n in lengths]
        srcs[3] = np.frombuffer(rnd.randbytes(8192), dtype=np.uint8)[100:100 + 4096]  # a view, offset
        offsets = [64 + i * (1 << 20) + i * 4096 for i in range(len(lengths))]
        hashes = r.copy_in_gather_hashed(srcs, offsets, lengths, flush=flush)
        for src, off, n, h in zip(srcs, offsets, lengths, hashes):
            b = bytes(memoryview(src).cast("B"))[:n]
            assert r.read(off, n) == b
            assert h == xxhash.xxh3_64_intdigest(b)
        assert r.copy_in_gather_hashed([], [], []) == []
    finally:
        r.close()


def test_copy_in_gather_hashed_checks_every_range_before_copying(tmp_path) -> None:
    """A range outside the region, a length past its source, an overlap with the
    region, ragged arrays: refused, and no byte of the earlier sources moved."""
    r = Region.open(tmp_path / "r", SIZE, create=True)
    try:
        good = b"\x5a" * 4096
        before = r.read(0, 8192)
        with pytest.raises(OutOfRange, match="#1 of 2"):
            r.copy_in_gather_hashed([good, good], [0, SIZE - 100], [4096, 4096])
        with pytest.raises(OutOfRange, match="holds 4096 bytes"):
            r.copy_in_gather_hashed([good, good], [0, 4096], [4096, 5000])
        with pytest.raises(InvalidArgument, match="overlaps"):
            r.copy_in_gather_hashed([good, r.view(1 << 20, 8192)], [0, (1 << 20) + 64], [4096, 4096])
        with pytest.raises(InvalidArgument, match="same length"):
            r.copy_in_gather_hashed([good], [0, 4096], [4096])
        assert r.read(0, 8192) == before
    finally:
        r.close()
