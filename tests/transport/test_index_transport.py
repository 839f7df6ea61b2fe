"""The region index's transport kernels (issue 17): the master's slot writes and the
readers' lock-free lookups, in C and in the pure-Python reference, on real mapped
files; a stress test of the read/reuse discipline on the non-coherent emulator."""

from __future__ import annotations

import os
import random
import struct
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import xxhash

from cxlkv.errors import InvalidArgument, OutOfRange, RegionError
from cxlkv.layout.objheader import header_bytes_for
from cxlkv.transport import Region, portable
from cxlkv.transport.bindings import (
    INDEX_BUCKET_SLOTS,
    INDEX_HEADER_BYTES,
    INDEX_MAX_REGIONS,
    INDEX_SLOT_BYTES,
    IX_ELSEWHERE,
    IX_FLAG_ELSEWHERE,
    IX_FLAG_LIVE,
    IX_HIT,
    IX_MISS,
    IX_TOO_SMALL,
    IX_UNSURE,
    lib,
)
from cxlkv.transport.emulate import NoncoherentRegion
from cxlkv.transport.index import IndexReader, IndexResult, PortableIndexReader, read_index_header

KiB, MiB = 1 << 10, 1 << 20
h3 = xxhash.xxh3_64_intdigest
U64 = struct.Struct("<Q")


def test_constants_come_from_c() -> None:
    assert (IX_HIT, IX_MISS, IX_ELSEWHERE, IX_TOO_SMALL, IX_UNSURE) == (
        lib.CXLKV_IX_HIT, lib.CXLKV_IX_MISS, lib.CXLKV_IX_ELSEWHERE, lib.CXLKV_IX_TOO_SMALL, lib.CXLKV_IX_UNSURE)
    assert (INDEX_HEADER_BYTES, INDEX_SLOT_BYTES, INDEX_BUCKET_SLOTS, INDEX_MAX_REGIONS) == (4096, 64, 8, 32)
    assert (IX_FLAG_LIVE, IX_FLAG_ELSEWHERE) == (1, 2)
    index = pytest.importorskip("cxlkv.layout.index")  # the lead's layout module agrees
    assert (index.INDEX_HEADER_BYTES, index.SLOT_BYTES, index.BUCKET_SLOTS, index.MAX_REGIONS) == (4096, 64, 8, 32)
    assert (index.SLOT_LIVE, index.SLOT_ELSEWHERE) == (IX_FLAG_LIVE, IX_FLAG_ELSEWHERE)


# -- a test-side master: header page, placement, object writes, slot publishes ----------

def buckets_of(h: int, buckets: int) -> list[int]:
    mask = buckets - 1
    b1 = h & mask
    if buckets == 1:
        return [b1]
    b2 = (h >> 32) & mask
    return [b1, (b1 + 1) & mask if b2 == b1 else b2]


class MiniMaster:
    """The master's discipline on one region: the object (value, then header) is
    written and, in flush mode, written back before its slot is published; a slot
    is tombstoned or republished before its old extent is reused."""

    def __init__(self, region: Any, header_offset: int, buckets: int, *, flush: bool = False) -> None:
        self.r = region
        self.ho = header_offset
        self.to = header_offset + INDEX_HEADER_BYTES
        self.buckets = buckets
        self.flush = flush
        self.store = region.index_store  # the slot writer (tests swap in the reference one)
        self.slot_of: dict[bytes, int] = {}
        self.used: set[int] = set()
        static = struct.pack("<8sIIQQ", b"CXLKVIX1", 1, INDEX_BUCKET_SLOTS, buckets, self.to)
        self.poke(header_offset, static + U64.pack(h3(static)) + bytes(24) + struct.pack("<QQ", 0, 0))
        self.poke(self.to, bytes(buckets * INDEX_BUCKET_SLOTS * INDEX_SLOT_BYTES))
        self.set_publish(1)

    def poke(self, offset: int, data: bytes) -> None:
        self.r.copy_in(offset, data)
        if self.flush:
            self.r.flush(offset, len(data))

    def set_publish(self, epoch: int) -> None:
        self.poke(self.ho + 64, U64.pack(epoch))

    def set_overflow(self, n: int) -> None:
        self.poke(self.ho + 72, U64.pack(n))

    def slot_offset(self, key: bytes) -> int:
        return self.to + self.slot_of[key] * INDEX_SLOT_BYTES

    def place(self, key: bytes) -> int:
        if key in self.slot_of:
            return self.slot_of[key]
        for b in buckets_of(h3(key), self.buckets):
            for j in range(INDEX_BUCKET_SLOTS):
                s = b * INDEX_BUCKET_SLOTS + j
                if s not in self.used:
                    self.used.add(s)
                    self.slot_of[key] = s
                    return s
        raise AssertionError("both buckets full")

    def write_object(self, key: bytes, value: bytes, version: int, ext: int, region: Any = None) -> int:
        r = region or self.r
        hb = header_bytes_for(len(key))
        r.copy_in(ext + hb, value)
        if self.flush:
            r.flush(ext + hb, max(1, len(value)))
        r.write_headers([ext], [hb], key, [0], [len(key)], [version], [len(value)], [h3(value)], flush=self.flush)
        return hb

    def publish(self, key: bytes, ext: int, vlen: int, version: int, vhash: int, hb: int, *,
                flags: int = IX_FLAG_LIVE, region_no: int = 0, tier: int = 1) -> None:
        s = self.place(key)
        self.store(self.to, self.buckets * INDEX_BUCKET_SLOTS, [s], [h3(key)], [ext], [vlen], [version],
                           [vhash], [hb], [flags | region_no << 16 | tier << 24], self.flush)

    def put(self, key: bytes, value: bytes, version: int, ext: int, *, region: Any = None, **kw: Any) -> None:
        hb = self.write_object(key, value, version, ext, region)
        self.publish(key, ext, len(value), version, h3(value), hb, **kw)

    def remove(self, key: bytes) -> None:
        s = self.slot_of.pop(key)
        self.store(self.to, self.buckets * INDEX_BUCKET_SLOTS, [s], [0], [0], [0], [0], [0], [0], [0],
                           self.flush)
        self.used.discard(s)


SIZE = 2 * MiB
HO = SIZE - 64 * KiB  # index header page; 8 buckets of slots after it


@pytest.fixture
def region(tmp_path: Path):
    with Region.open(tmp_path / "region", size=SIZE, create=True) as r:
        yield r


# -- the slot bytes ---------------------------------------------------------------------

def test_slot_bytes_c_and_reference_agree(region: Region) -> None:
    to, nslots = HO + 4096, 64
    cols = dict(key_hashes=[h3(b"a"), 2**64 - 1, 0], extent_offsets=[8192, 2**40, 0], value_lens=[4096, 1, 0],
                versions=[7, 2**63, 0], value_hashes=[h3(b"v"), 5, 0], header_bytes=[128, 4160, 0],
                meta=[1 | 3 << 16 | 2 << 24, 3 | 31 << 16 | 255 << 24, 0])
    region.index_store(to, nslots, [0, 1, 2], **cols)
    portable.index_store(region, to, nslots, [8, 9, 10], **cols)
    for i in range(3):
        c = region.read(to + i * 64, 64)
        py = region.read(to + (8 + i) * 64, 64)
        assert c == py  # the same bytes from both writers
        row = [cols[k][i] for k in cols]
        assert c == portable.pack_slot(2, *row)
        assert portable.unpack_slot(c) == (2, *row)
        index = pytest.importorskip("cxlkv.layout.index")  # and the lead's layout module reads them alike
        slot = index.unpack_slot(c)
        assert slot is not None and slot.seq == 2 and slot.key_hash == row[0] and slot.header_bytes == row[5]
        assert (slot.flags, slot.region_no, slot.tier) == (row[6] & 0xFFFF, (row[6] >> 16) & 0xFF, row[6] >> 24)
        assert index.pack_slot(slot) == c
    # seq: +2 per store; an odd seq (a writer that died mid-write) is rounded up first
    region.index_store(to, nslots, [0], **{k: v[:1] for k, v in cols.items()})
    assert U64.unpack(region.read(to, 8))[0] == 4
    region.copy_in(to, U64.pack(5))
    region.index_store(to, nslots, [0], **{k: v[:1] for k, v in cols.items()})
    portable.index_store(region, to, nslots, [8], **{k: v[:1] for k, v in cols.items()})
    assert U64.unpack(region.read(to, 8))[0] == 8 and U64.unpack(region.read(to + 512, 8))[0] == 4
    assert portable.unpack_slot(region.read(to, 64))[0] == 8


def test_slots_of_the_reference_writer_read_by_c(region: Region) -> None:
    m = MiniMaster(region, HO, 8)
    m.store = lambda *a: portable.index_store(region, *a)  # the reference writer's slots
    vals = {f"ref-{i}".encode(): os.urandom(500 + i) for i in range(20)}
    for i, (k, v) in enumerate(vals.items()):
        m.put(k, v, i + 1, 8192 + i * 4096)
    m.remove(b"ref-3")
    rd = IndexReader(region, HO, HO + 4096, 8, [region])
    assert not rd.is_portable
    for i, (k, v) in enumerate(vals.items()):
        buf = bytearray(1024)
        res = rd.get(k, buf)
        if k == b"ref-3":
            assert res.outcome == IX_MISS
        else:
            assert (res.outcome, res.version, bytes(buf[:res.value_len_bytes])) == (IX_HIT, i + 1, v)


def test_index_store_checks_before_writing(region: Region) -> None:
    to = HO + 4096
    one = dict(key_hashes=[1, 2], extent_offsets=[0, 0], value_lens=[0, 0], versions=[0, 0], value_hashes=[0, 0],
               header_bytes=[0, 0], meta=[0, 0])
    with pytest.raises(OutOfRange, match="slot #1 of 2 is number 64"):
        region.index_store(to, 64, [0, 64], **one)
    assert region.read(to, 64) == bytes(64)  # nothing written
    with pytest.raises(OutOfRange, match="outside the region"):
        region.index_store(SIZE - 64, 2, [0, 1], **one)
    with pytest.raises(InvalidArgument, match="multiple of 64"):
        region.index_store(to + 8, 8, [0, 1], **one)
    with pytest.raises(InvalidArgument, match="same length"):
        region.index_store(to, 64, [0], **one)
    with pytest.raises(OutOfRange):
        region.index_store(to, 64, [0, 1], **{**one, "meta": [0, 2**32]})
    np = pytest.importorskip("numpy")  # numpy columns, zero-copy
    region.index_store(to, 64, np.array([3], np.uint64), np.array([9], np.uint64), *(np.zeros(1, np.uint64),) * 4,
                       np.zeros(1, np.uint32), np.array([1], np.uint32), True)
    assert portable.unpack_slot(region.read(to + 3 * 64, 64))[1] == 9
    region.close()
    with pytest.raises(RegionError):
        region.index_store(to, 64, [0], **{k: v[:1] for k, v in one.items()})


# -- every outcome, C and reference alike ----------------------------------------------------

def find_key(prefix: str, pred) -> bytes:
    for i in range(100000):
        k = f"{prefix}-{i}".encode()
        if pred(h3(k)):
            return k
    raise AssertionError("no key found")


def build_scenario(m: MiniMaster, other: Any) -> dict[bytes, tuple]:
    """Lay out one key per case; returns key -> (dst bytes, get outcome, retries,
    probe outcome, value or None)."""
    rnd = random.Random(17)
    val = lambda n: rnd.randbytes(n)  # noqa: E731
    cases: dict[bytes, tuple] = {}
    ext = iter(range(8192, HO - 128 * KiB, 80 * KiB))
    v4 = val(4096)
    m.put(b"hit-4k", v4, 3, next(ext))
    cases[b"hit-4k"] = (8192, IX_HIT, 0, IX_HIT, v4)
    v64 = val(64 * KiB)
    m.put(b"hit-64k", v64, 4, next(ext))
    cases[b"hit-64k"] = (64 * KiB, IX_HIT, 0, IX_HIT, v64)
    m.put(b"empty", b"", 5, next(ext))
    cases[b"empty"] = (0, IX_HIT, 0, IX_HIT, b"")
    m.put("ключ-üñí".encode(), b"utf8", 6, next(ext))
    cases["ключ-üñí".encode()] = (4, IX_HIT, 0, IX_HIT, b"utf8")
    m.put(b"too-small", v4, 7, next(ext))
    cases[b"too-small"] = (100, IX_TOO_SMALL, 0, IX_HIT, None)
    m.put(b"elsewhere", v4, 8, next(ext), flags=IX_FLAG_LIVE | IX_FLAG_ELSEWHERE, tier=3)
    cases[b"elsewhere"] = (8192, IX_ELSEWHERE, 0, IX_ELSEWHERE, None)
    e = next(ext)
    m.put(b"in-region-1", v4, 9, e, region=other, region_no=1)  # readers map region 1 or not
    cases[b"in-region-1"] = (8192, "region1", 0, "region1", v4)
    m.put(b"region-40", v4, 9, next(ext), region_no=40)
    cases[b"region-40"] = (8192, IX_UNSURE, 0, IX_UNSURE, None)
    # a slot pointing outside its region
    m.publish(b"outside", SIZE - 64, 4096, 1, h3(v4), 128)
    cases[b"outside"] = (8192, IX_UNSURE, 0, IX_UNSURE, None)
    # the object header says another version / the extent holds another key
    e = next(ext)
    hb = m.write_object(b"version", v4, 10, e)
    m.publish(b"version", e, 4096, 11, h3(v4), hb)
    cases[b"version"] = (8192, IX_UNSURE, 1, IX_UNSURE, None)
    e = next(ext)
    hb = m.write_object(b"other-key", v4, 12, e)
    m.publish(b"key-stolen", e, 4096, 12, h3(v4), hb)
    cases[b"key-stolen"] = (8192, IX_UNSURE, 1, IX_UNSURE, None)
    # the value changed under its slot and header: hash mismatch (a probe reads no value: HIT)
    e = next(ext)
    m.put(b"changed", v4, 13, e)
    m.poke(e + header_bytes_for(len(b"changed")) + 100, b"X")
    cases[b"changed"] = (8192, IX_UNSURE, 1, IX_HIT, None)
    # torn slots: odd seq; stable seq with a wrong checksum
    m.put(b"odd-seq", v4, 14, next(ext))
    off = m.slot_offset(b"odd-seq")
    m.poke(off, U64.pack(U64.unpack(m.r.read(off, 8))[0] | 1))
    cases[b"odd-seq"] = (8192, IX_UNSURE, 0, IX_UNSURE, None)
    m.put(b"bad-sum", v4, 15, next(ext))
    off = m.slot_offset(b"bad-sum")
    m.poke(off + 24, U64.pack(4095))
    cases[b"bad-sum"] = (8192, IX_UNSURE, 0, IX_UNSURE, None)
    # a key behind the torn slot in its bucket is still found; a missing key whose
    # bucket holds the torn slot cannot be told apart from it: UNSURE
    torn_bucket = m.slot_of[b"odd-seq"] // INDEX_BUCKET_SLOTS
    behind = find_key("behind", lambda h: buckets_of(h, m.buckets)[0] == torn_bucket)
    vb = val(300)
    m.put(behind, vb, 16, next(ext))
    assert m.slot_of[behind] > m.slot_of[b"odd-seq"]
    cases[behind] = (300, IX_HIT, 0, IX_HIT, vb)
    near = find_key("near-miss", lambda h: torn_bucket in buckets_of(h, m.buckets))
    cases[near] = (8192, IX_UNSURE, 0, IX_UNSURE, None)
    bad_bucket = m.slot_of[b"bad-sum"] // INDEX_BUCKET_SLOTS
    far = find_key("far-miss", lambda h: torn_bucket not in buckets_of(h, m.buckets)
                   and bad_bucket not in buckets_of(h, m.buckets))
    cases[far] = (8192, IX_MISS, 0, IX_MISS, None)
    if bad_bucket != torn_bucket:  # a stable slot of another key hash is skipped unread: its checksum never matters
        past_bad = find_key("past-bad", lambda h: bad_bucket in buckets_of(h, m.buckets)
                            and torn_bucket not in buckets_of(h, m.buckets))
        cases[past_bad] = (8192, IX_MISS, 0, IX_MISS, None)
    # removed: tombstone, then the extent reused by another key
    e = next(ext)
    m.put(b"removed", v4, 17, e)
    m.remove(b"removed")
    vr = val(2000)
    m.put(b"reuser", vr, 18, e)
    cases[b"removed"] = (8192, IX_MISS, 0, IX_MISS, None)
    cases[b"reuser"] = (8192, IX_HIT, 0, IX_HIT, vr)
    # upsert: the new version in a new extent, then the slot republished
    m.put(b"upserted", val(100), 19, next(ext))
    vu = val(5000)
    m.put(b"upserted", vu, 20, next(ext))
    cases[b"upserted"] = (8192, IX_HIT, 0, IX_HIT, vu)
    return cases


@pytest.mark.parametrize("emulated", [False, True], ids=["mapped", "emulated"])
def test_every_outcome_c_and_reference_agree(tmp_path: Path, emulated: bool) -> None:
    path, path1 = tmp_path / "r0", tmp_path / "r1"
    Region.open(path, size=SIZE, create=True).close()
    Region.open(path1, size=SIZE, create=True).close()
    w0 = Region.open(path, emulate_noncoherent=emulated)
    w1 = Region.open(path1, emulate_noncoherent=emulated)
    r0 = Region.open(path, emulate_noncoherent=emulated)  # the reading host
    r1 = Region.open(path1, emulate_noncoherent=emulated)
    try:
        m = MiniMaster(w0, HO, 8, flush=emulated)
        cases = build_scenario(m, w1)
        kinds = {"portable": dict(portable=True)} if emulated else {"c": {}, "portable": dict(portable=True)}
        answers: dict[str, list] = {}
        for name, extra in kinds.items():
            got = answers[name] = []
            for mapped in (False, True):
                rd = IndexReader(r0, HO, HO + 4096, 8, [r0, r1] if mapped else [r0], invalidate=emulated, **extra)
                assert rd.is_portable == (name == "portable" or emulated)
                for key, (dst_n, get_out, retries, probe_out, value) in cases.items():
                    dst = bytearray(dst_n)
                    res = rd.get(key, dst)
                    if get_out == "region1":
                        want = (IX_HIT if mapped else IX_ELSEWHERE)
                    else:
                        want = get_out
                    assert res.outcome == want, (name, key, res)
                    assert res.retries == retries, (name, key, res)
                    if res.outcome == IX_HIT:
                        assert bytes(dst[:res.value_len_bytes]) == value and res.value_len_bytes == len(value)
                    if res.outcome in (IX_HIT, IX_ELSEWHERE, IX_TOO_SMALL):
                        assert res.version > 0 and res.tier in (1, 3)
                    else:
                        assert res.value_len_bytes == res.version == 0
                    p = rd.probe(key)
                    want_p = (IX_HIT if mapped else IX_ELSEWHERE) if probe_out == "region1" else probe_out
                    assert p.outcome == want_p, (name, key, p)
                    got.append((key, mapped, tuple(res), tuple(p)))
                # too large for this reader: ELSEWHERE (a probe still verifies the header)
                big = IndexReader(r0, HO, HO + 4096, 8, [r0], max_value_bytes=32 * KiB, invalidate=emulated, **extra)
                res = big.get(b"hit-64k", bytearray(64 * KiB))
                assert (res.outcome, res.value_len_bytes, res.version) == (IX_ELSEWHERE, 64 * KiB, 4)
                assert big.probe(b"hit-64k").outcome == IX_HIT
                assert big.get(b"hit-4k", bytearray(4096)).outcome == IX_HIT
            # overflow > 0: a key not found is UNSURE, a found one still a hit
            m.set_overflow(3)
            rd = IndexReader(r0, HO, HO + 4096, 8, [r0], invalidate=emulated, **extra)
            far = next(k for k, c in cases.items() if c[1] == IX_MISS and k.startswith(b"far"))
            assert rd.get(far, bytearray(10)).outcome == IX_UNSURE
            assert rd.probe(b"removed").outcome == IX_UNSURE
            assert rd.get(b"hit-4k", bytearray(4096)).outcome == IX_HIT
            m.set_overflow(0)
            # inactive index (no master publishes): UNSURE for every key
            m.set_publish(0)
            assert {rd.get(k, bytearray(c[0])).outcome for k, c in cases.items()} == {IX_UNSURE}
            assert {r.outcome for r in rd.probe_many(list(cases))} == {IX_UNSURE}
            m.set_publish(9)
            assert rd.get(b"hit-4k", bytearray(4096)).outcome == IX_HIT
        if not emulated:
            assert answers["c"] == answers["portable"]
    finally:
        for r in (w0, w1, r0, r1):
            r.close()


@pytest.mark.parametrize("portable_reader,invalidate", [(False, False), (False, True), (True, False)],
                         ids=["c", "c-invalidate", "portable"])
def test_batches_prefix_and_ranges(region: Region, portable_reader: bool, invalidate: bool) -> None:
    m = MiniMaster(region, HO, 8)
    vals = {f"blk-{i}".encode(): os.urandom(1000 + i) for i in range(6)}
    for i, (k, v) in enumerate(vals.items()):
        if i != 3:
            m.put(k, v, i + 1, 8192 + i * 8192)
    keys = list(vals)
    rd = IndexReader(region, HO, HO + 4096, 8, [region], portable=portable_reader, invalidate=invalidate)
    dsts = [bytearray(2048) for _ in keys]
    res = rd.get_many(keys, dsts)
    assert [r.outcome for r in res] == [IX_HIT] * 3 + [IX_MISS] + [IX_HIT] * 2
    assert all(bytes(d[:len(vals[k])]) == vals[k] for k, d, r in zip(keys, dsts, res) if r.outcome == IX_HIT)
    pre = rd.get_many(keys, [bytearray(2048) for _ in keys], prefix=True)
    assert [r.outcome for r in pre] == [IX_HIT] * 3 + [IX_MISS]  # stopped after the first non-hit
    assert [r.outcome for r in rd.probe_many(keys, prefix=True)] == [IX_HIT] * 3 + [IX_MISS]
    assert [r.outcome for r in rd.probe_many(keys)] == [r.outcome for r in res]
    assert rd.get_many([], []) == [] and rd.probe_many([]) == []
    # duplicates answered per position
    dup = rd.get_many([keys[0], keys[0]], [bytearray(2048), bytearray(10)])
    assert [r.outcome for r in dup] == [IX_HIT, IX_TOO_SMALL]
    buf = bytearray(6 * 2048)
    res = rd.get_ranges(keys, buf, [i * 2048 for i in range(6)], [2048] * 6)
    assert [r.outcome for r in res] == [IX_HIT] * 3 + [IX_MISS] + [IX_HIT] * 2
    for i, k in enumerate(keys):
        if i != 3:
            assert bytes(buf[i * 2048:i * 2048 + len(vals[k])]) == vals[k]
    assert len(rd.get_ranges(keys, buf, [i * 2048 for i in range(6)], [2048] * 6, prefix=True)) == 4
    with pytest.raises(OutOfRange, match="destination #1 of 2"):
        rd.get_ranges(keys[:2], bytearray(4096), [0, 3000], [2048, 2048])
    with pytest.raises(InvalidArgument):
        rd.get_ranges(keys[:2], bytearray(4096), [0], [2048, 2048])
    with pytest.raises(InvalidArgument, match="key #1"):
        rd.get_many([b"a", b"", b"c"], [bytearray(1)] * 3)
    with pytest.raises(InvalidArgument):
        rd.get_many(keys[:2], [bytearray(1)])


@pytest.mark.parametrize("portable_reader", [False, True], ids=["c", "portable"])
def test_bad_arguments_raise(region: Region, portable_reader: bool) -> None:
    m = MiniMaster(region, HO, 8)
    m.put(b"k", b"v" * 100, 1, 8192)
    rd = IndexReader(region, HO, HO + 4096, 8, [region], portable=portable_reader)
    for bad in (b"", b"x" * 4097, "str-key"):
        with pytest.raises(InvalidArgument):
            rd.get(bad, bytearray(10))  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument):
            rd.probe(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        rd.get(b"k", b"read-only bytes")
    assert rd.get(b"x" * 4096, bytearray(10)).outcome == IX_MISS  # the longest key
    if not portable_reader:
        with pytest.raises(InvalidArgument, match="overlapping"):
            rd.get(b"k", region.view(8192 + 64, 200))  # the destination is the value itself
    for args in ((region, HO, HO + 4096, 6, [region]), (region, HO + 8, HO + 4096, 8, [region]),
                 (region, HO, HO + 4096, 8, [None] * 33)):
        with pytest.raises(InvalidArgument):
            IndexReader(*args)
    with pytest.raises(OutOfRange):
        IndexReader(region, HO, HO + 4096, 1024, [region])
    with pytest.raises(RegionError, match="no index"):
        IndexReader.from_header(region, 0, [region])
    rd2 = IndexReader.from_header(region, HO, [region], portable=portable_reader)
    assert (rd2.buckets, rd2.table_offset) == (8, HO + 4096)
    assert read_index_header(region, HO).publish_epoch == 1
    region.close()
    with pytest.raises(RegionError):
        rd.get(b"k", bytearray(100))
    with pytest.raises(RegionError):
        rd.probe_many([b"k"])


@pytest.mark.parametrize("portable_reader", [False, True], ids=["c", "portable"])
def test_values_over_one_hash_chunk(region: Region, portable_reader: bool) -> None:
    """Values past CXLKV_HASH_CHUNK_BYTES (256 KiB) are copied and hashed in chunks;
    a byte changed in the last chunk is still caught."""
    m = MiniMaster(region, HO, 8)
    big = os.urandom(600 * KiB + 3)
    m.put(b"big", big, 1, 8192)
    m.put(b"big2", big, 2, 8192 + 640 * KiB)
    m.poke(8192 + 640 * KiB + 128 + len(big) - 1, b"\0" if big[-1] else b"\1")
    rd = IndexReader(region, HO, HO + 4096, 8, [region], portable=portable_reader)
    buf = bytearray(1 * MiB)
    assert rd.get(b"big", buf) == IndexResult(IX_HIT, 1, len(big), 1, 0) and bytes(buf[:len(big)]) == big
    assert rd.get(b"big2", buf) == IndexResult(IX_UNSURE, 0, 0, 0, 1)
    assert rd.probe(b"big2").outcome == IX_HIT  # the header is right; only the bytes are not


def test_one_bucket_table_and_closed_data_region(tmp_path: Path) -> None:
    with Region.open(tmp_path / "a", size=SIZE, create=True) as a, Region.open(tmp_path / "b", size=SIZE,
                                                                             create=True) as b:
        m = MiniMaster(a, HO, 1)
        for i in range(8):
            m.put(f"k{i}".encode(), bytes([i]) * 10, i + 1, 8192 + i * 4096)
        for pr in (False, True):
            rd = IndexReader(a, HO, HO + 4096, 1, [a, b], portable=pr)
            assert all(rd.get(f"k{i}".encode(), bytearray(10)).outcome == IX_HIT for i in range(8))
            assert rd.get(b"k9", bytearray(10)).outcome == IX_MISS
        m.remove(b"k0")
        hb = m.write_object(b"in-b", b"bbb", 9, 8192, b)
        m.publish(b"in-b", 8192, 3, 9, h3(b"bbb"), hb, region_no=1)
        rds = [IndexReader(a, HO, HO + 4096, 1, [a, b], portable=pr) for pr in (False, True)]
        assert [rd.get(b"in-b", bytearray(3)).outcome for rd in rds] == [IX_HIT, IX_HIT]
        b.close()  # a closed data region reads as not mapped here
        assert [rd.get(b"in-b", bytearray(3)).outcome for rd in rds] == [IX_ELSEWHERE, IX_ELSEWHERE]


def test_the_leads_index_writer_is_read(tmp_path: Path) -> None:
    """cxlkv.layout.index's IndexWriter (the master's) publishes through Region.index_store;
    these readers find what it wrote."""
    index = pytest.importorskip("cxlkv.layout.index")
    with Region.open(tmp_path / "r", size=4 * MiB, create=True) as r:
        g = index.index_geometry(4 * MiB)
        index.format_index(r, g, uuid.uuid4())
        index.set_publish_word(r, g, 3)
        w = index.IndexWriter(r, g, flush=False)
        v = os.urandom(3000)
        hb = header_bytes_for(3)
        r.copy_in(8192 + hb, v)
        r.write_headers([8192], [hb], b"key", [0], [3], [5], [len(v)], [h3(v)])
        assert w.publish("key", h3(b"key"), extent_offset_bytes=8192, value_len_bytes=len(v), version=5,
                         value_checksum=h3(v), header_bytes=hb, region_no=0, tier=1, elsewhere=False)
        w.sync()  # slot writes are queued until the master answers the call that made them
        for pr in (False, True):
            rd = IndexReader.from_header(r, g.index_offset_bytes, [r], portable=pr)
            buf = bytearray(4096)
            assert rd.get(b"key", buf) == IndexResult(IX_HIT, 1, len(v), 5, 0) and bytes(buf[:len(v)]) == v
        w.retire("key", h3(b"key"))
        w.sync()
        assert IndexReader.from_header(r, g.index_offset_bytes, [r]).get(b"key", buf).outcome == IX_MISS


def test_reservations_never_crowd_keys_out_of_the_index(tmp_path: Path) -> None:
    """Grant slots handed out ahead of need (reservations) hold at most 1/8 of the table,
    a previous master's grants count against that share, and a table sized for N objects
    then takes N keys with no overflow however much the writers ask to reserve."""
    index = pytest.importorskip("cxlkv.layout.index")
    with Region.open(tmp_path / "r", size=4 * MiB, create=True) as r:
        g = index.index_geometry(4 * MiB, expected_objects=4096)
        index.format_index(r, g, uuid.uuid4())
        w = index.IndexWriter(r, g, flush=False)
        assert w.ahead_limit == g.slots // index.AHEAD_GRANT_SHARE == 1024

        def grant(token: int, ahead: bool) -> bool:
            return w.grant(token, "writer-a", extent_offset_bytes=8192 + 256 * token, length_bytes=256,
                           region_no=0, ahead=ahead)

        granted = [t for t in range(1, 5001) if grant(t, True)]  # writers asking for 5000
        assert granted == list(range(1, 1025)) and w.ahead_slots == 1024
        assert not grant(6000, True)
        assert grant(6001, False)  # a put in flight is still recorded
        w.ungrant(1)
        assert grant(6002, True) and not grant(6003, True)  # a given-back reservation frees its share
        keys = [f"k/{i}" for i in range(4096)]
        for k in keys:
            w.publish(k, h3(k.encode()), extent_offset_bytes=8192, value_len_bytes=1, version=7,
                      value_checksum=1, header_bytes=128, region_no=0, tier=1, elsewhere=False)
        w.sync()
        assert w.overflow == 0 and w.live_slots == 4096 + 1024 + 1
        # a master taking over adopts the grants and counts them all as ahead of need
        w2 = index.IndexWriter(r, g, flush=False)
        for gr in index.read_grants(r, g):
            w2.adopt_grant(gr)
        assert w2.ahead_slots == 1025 and w2.grants == 1025
        assert not w2.grant(7000, "writer-b", extent_offset_bytes=0, length_bytes=256, region_no=0, ahead=True)
        w2.ungrant(6001)
        w2.ungrant(2)
        assert w2.ahead_slots == 1023
        assert w2.grant(7001, "writer-b", extent_offset_bytes=0, length_bytes=256, region_no=0, ahead=True)


def test_a_write_in_flight_always_finds_a_grant_slot(tmp_path: Path) -> None:
    """Keys hold at most 3/4 of the slots (the rest overflow to the RPC path) and
    reservations 1/8, so a put's or move's grant always has a slot, even when its own
    buckets are full: grants may take any free slot (they are found by scanning)."""
    index = pytest.importorskip("cxlkv.layout.index")
    with Region.open(tmp_path / "r", size=4 * MiB, create=True) as r:
        g = index.index_geometry(4 * MiB, expected_objects=256)  # 64 buckets, 512 slots
        index.format_index(r, g, uuid.uuid4())
        w = index.IndexWriter(r, g, flush=False)
        assert (w.key_limit, w.ahead_limit) == (384, 64)
        placed = [k for k in (f"k/{i}" for i in range(1000))
                  if w.publish(k, h3(k.encode()), extent_offset_bytes=8192, value_len_bytes=1, version=1,
                               value_checksum=1, header_bytes=128, region_no=0, tier=1, elsewhere=False)]
        assert len(placed) == w.key_slots == 384 and w.overflow == 1000 - 384
        ahead = sum(w.grant(t, "a", extent_offset_bytes=0, length_bytes=256, region_no=0, ahead=True)
                    for t in range(1, 200))
        assert ahead == 64
        # every remaining slot goes to writes in flight, wherever their hash points
        in_flight = [t for t in range(1000, 1200)
                     if w.grant(t, "a", extent_offset_bytes=0, length_bytes=256, region_no=0)]
        assert len(in_flight) == 512 - 384 - 64 and w.live_slots == 512
        assert not w.grant(5000, "a", extent_offset_bytes=0, length_bytes=256, region_no=0)
        w.sync()
        assert {gr.put_token for gr in index.read_grants(r, g)} == set(range(1, 65)) | set(in_flight)
        w.ungrant(in_flight[0])
        assert w.grant(5000, "a", extent_offset_bytes=0, length_bytes=256, region_no=0)
        for k in placed[:10]:
            w.retire(k, h3(k.encode()))
        assert w.key_slots == 374


def test_emulated_slots_visible_only_once_flushed(tmp_path: Path) -> None:
    path = tmp_path / "r"
    Region.open(path, size=SIZE, create=True).close()
    a = Region.open(path, emulate_noncoherent=True)
    b = Region.open(path, emulate_noncoherent=True)
    try:
        assert isinstance(a, NoncoherentRegion)
        m = MiniMaster(a, HO, 8, flush=True)
        rd = IndexReader(b, HO, HO + 4096, 8, [b], invalidate=True)
        assert isinstance(rd, PortableIndexReader)
        m.put(b"k", b"v1" * 50, 1, 8192)
        assert rd.get(b"k", bytearray(100)).outcome == IX_HIT
        m.flush = False  # a master that forgets to write the slot back: readers never see it
        m.put(b"k2", b"v2" * 50, 2, 16384)
        assert rd.get(b"k2", bytearray(100)).outcome == IX_MISS
        a.flush()
        assert rd.get(b"k2", bytearray(100)).outcome == IX_HIT
    finally:
        a.close()
        b.close()


# -- stress: lock-free reads against a master overwriting, upserting, removing, reusing ----

class Ledger:
    """What the writer committed: per (key, version) the value; per key its last
    completed event (version, live, count), updated after the slot is written, and
    a count of events begun, raised before."""

    def __init__(self) -> None:
        self.values: dict[tuple[bytes, int], bytes] = {}
        self.state: dict[bytes, tuple[int, bool, int]] = {}  # key -> (version, live, events done)
        self.begun: dict[bytes, int] = {}


def run_writer(m: MiniMaster, keys: list[bytes], ledger: Ledger, stop: threading.Event, *, extents: int,
               extent_bytes: int, seed: int) -> int:
    rnd = random.Random(seed)
    free = [8192 + i * extent_bytes for i in range(extents)]
    where: dict[bytes, int] = {}
    version = 0
    ops = 0
    order = list(keys)  # every key put once first, then random operations
    while not stop.is_set():
        key = order.pop() if order else rnd.choice(keys)
        events = ledger.state.get(key, (0, False, 0))[2]
        ledger.begun[key] = events + 1
        if key in where and not order and rnd.random() < 0.3:  # remove: tombstone first, then the extent is free
            m.remove(key)
            ledger.state[key] = (ledger.state[key][0], False, events + 1)
            free.append(where.pop(key))
        else:  # put / upsert / re-put: a new version in a free (often just reused) extent
            version += 1
            value = rnd.randbytes(rnd.choice((0, 64, 1000, 3000, extent_bytes - 256)))
            ext = free.pop()
            ledger.values[(key, version)] = value
            m.put(key, value, version, ext)
            ledger.state[key] = (version, True, events + 1)
            old = where.get(key)
            where[key] = ext
            if old is not None:
                free.append(old)  # republished first: the old extent may be reused now
        ops += 1
    return ops


def run_reader(rd: IndexReader, keys: list[bytes], ledger: Ledger, stop: threading.Event, counts: dict,
               *, fresh: bool, seed: int, evict_lines: list[int] = ()) -> None:
    rnd = random.Random(seed)
    buf = bytearray(16 * KiB)
    while not stop.is_set():
        key = rnd.choice(keys)
        for _ in range(8 if evict_lines else 0):  # a real cache evicts lines now and then
            rd.table_region.invalidate(rnd.choice(evict_lines), 64)
        v0, live0, ev0 = ledger.state.get(key, (0, False, 0))
        res = rd.get(key, buf)
        ev1 = ledger.begun.get(key, 0)  # an event begun meanwhile may have removed it
        counts["reads"] += 1
        counts["retries"] += res.retries
        if res.outcome == IX_HIT:
            counts["hits"] += 1
            if bytes(buf[:res.value_len_bytes]) != ledger.values.get((key, res.version)):
                counts["wrong"] += 1  # torn, mixed or another object's bytes: never allowed
            if fresh and (res.version < v0 or (res.version == v0 and not live0 and ev0)):
                counts["stale"] += 1  # older than what was committed before the read began
        elif res.outcome == IX_MISS:
            counts["misses"] += 1
            if live0 and ev1 == ev0:
                counts["false_miss"] += 1  # live all along
        elif res.outcome == IX_UNSURE:
            counts["unsure"] += 1
        else:
            counts["other"] += 1


def stress(writer_region: Any, reader_regions: list[Any], *, invalidate: bool, flush: bool, seconds: float,
           fresh: bool, evict: bool = False, verify_first: bool = False) -> tuple[dict, int]:
    keys = [f"stress-{i}".encode() for i in range(6)]
    m = MiniMaster(writer_region, HO, 4, flush=flush)
    ledger = Ledger()
    stop = threading.Event()
    counts = {k: 0 for k in ("reads", "hits", "misses", "unsure", "retries", "wrong", "stale", "false_miss",
                             "other")}
    readers = [IndexReader(r, HO, HO + 4096, 4, [r], invalidate=invalidate, verify_first=verify_first)
               for r in reader_regions]
    ops: list[int] = []
    wt = threading.Thread(target=lambda: ops.append(run_writer(m, keys, ledger, stop, extents=12,
                                                               extent_bytes=16 * KiB, seed=1)))
    lines = [*range(8192, 8192 + 12 * 16 * KiB, 64), *range(HO + 4096, HO + 4096 + 4 * 512, 64)] if evict else []
    rts = [threading.Thread(target=run_reader, args=(rd, keys, ledger, stop, counts),
                            kwargs=dict(fresh=fresh, seed=10 + i, evict_lines=lines)) for i, rd in enumerate(readers)]
    wt.start()
    while len(ledger.state) < len(keys) and wt.is_alive():
        time.sleep(0.001)
    for t in rts:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in [wt, *rts]:
        t.join(30)
    return counts, ops[0]


def _regions(path: Path, n: int, emulated: bool) -> list[Region]:
    return [Region.open(path, emulate_noncoherent=emulated) for _ in range(n)]


@pytest.mark.parametrize("mode", ["invalidate", "verify-first", "no-invalidate"])
def test_stress_noncoherent_emulator(tmp_path: Path, mode: str) -> None:
    """Three emulated hosts: one master writing with flush, two readers. With
    invalidation (every line dropped, or verify first: slot and header lines
    dropped, the value's first copy through the cache and checked against the
    slot's checksum): no wrong bytes, nothing older than what was committed
    before the read began, no false miss; verify first reads stale value lines
    (the emulated caches keep every line) and every one is caught and read again.
    Without (and the readers' caches evicting random lines, so they hold old and
    new lines mixed): the stale lines are caught (UNSURE, retries, misses), never
    returned as wrong bytes."""
    invalidate = mode != "no-invalidate"
    path = tmp_path / "r"
    Region.open(path, size=SIZE, create=True).close()
    hosts = _regions(path, 3, emulated=True)
    try:
        counts, ops = stress(hosts[0], hosts[1:], invalidate=invalidate, flush=True, seconds=2.5,
                             fresh=invalidate, evict=not invalidate, verify_first=mode == "verify-first")
    finally:
        stale_lines = sum(h.stale_line_reads for h in hosts[1:])
        for h in hosts:
            h.close()
    print(f"\nemulator {mode}: {ops} writer ops, {counts}, stale line reads {stale_lines}")
    assert ops > 50 and counts["reads"] > 100
    assert counts["wrong"] == 0 and counts["other"] == 0
    if invalidate:
        assert counts["hits"] > 10
        assert counts["stale"] == 0 and counts["false_miss"] == 0
    if mode == "verify-first":  # stale first copies happened, and each was redone
        assert stale_lines > 0 and counts["retries"] > 0
    else:
        assert stale_lines > 0
        assert counts["unsure"] + counts["retries"] + counts["false_miss"] > 0


def test_stress_c_readers_on_a_coherent_mapping(tmp_path: Path) -> None:
    """The C kernels with real parallelism (the GIL is released for each lookup):
    readers race the master's slot writes and extent reuse; every hit is the
    committed bytes of the version it reports, and nothing is stale."""
    path = tmp_path / "r"
    Region.open(path, size=SIZE, create=True).close()
    regions = _regions(path, 3, emulated=False)
    try:
        counts, ops = stress(regions[0], regions[1:], invalidate=False, flush=False, seconds=2.0, fresh=True)
    finally:
        for r in regions:
            r.close()
    print(f"\nC readers: {ops} writer ops, {counts}")
    assert ops > 100 and counts["hits"] > 100
    assert counts["wrong"] == 0 and counts["stale"] == 0 and counts["false_miss"] == 0 and counts["other"] == 0
