"""Index recovery from a region scan, without processes: ExtentAllocator.claim,
MasterState.restore_objects, and cxlkv.master.recovery over a region file written
the way clientds write it (object header + key + value at master-chosen extents)."""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import pytest
import xxhash

from cxlkv.config import MasterConfig, SegmentConfig, load_config
from cxlkv.errors import ConfigError
from cxlkv.master.allocator import ExtentAllocator
from cxlkv.master.objects import ObjState, RestoredObject
from cxlkv.master.recovery import parse_recover_spec, recover_region, recover_regions
from cxlkv.master.state import MasterState
from cxlkv.layout.objheader import header_bytes_for, pack_header
from cxlkv.layout.region import format_region
from cxlkv.transport import Region

KiB, MiB = 1 << 10, 1 << 20
BASE = 4096


# ------------------------------------------------------------------------- claim

def test_claim_takes_exactly_the_extent_and_splits_the_free_block() -> None:
    a = ExtentAllocator(BASE, BASE + MiB, 64)
    assert a.claim(BASE + 640, 100) == 128  # aligned like alloc
    assert a.claim(BASE, 0) == 64  # an empty value takes one unit, at the range start
    assert a.length_of(BASE + 640) == 128 and a.length_of(BASE) == 64
    assert a.used_bytes == 192 and a.free_bytes == MiB - 192 and a.free_blocks == 2
    a.check()
    # the gap between them and the tail are free and allocatable; nothing overlaps
    assert a.claim(BASE + 64, 576) == 576
    assert a.free_blocks == 1 and a.largest_free_bytes == MiB - 768
    a.check()
    off = a.alloc(64)
    assert off == BASE + MiB - 64
    a.free(BASE + 640)
    assert a.used_bytes == 64 + 576 + 64
    a.check()


def test_claim_refuses_overlap_misalignment_and_out_of_range_without_changes() -> None:
    a = ExtentAllocator(BASE, BASE + 64 * KiB, 64)
    a.claim(BASE + 1024, 1024)
    before = (a.used_bytes, a.free_blocks, sorted(a.extents()))
    for off, n in [(BASE + 1024, 64), (BASE + 960, 128), (BASE + 2048 - 64, 64), (BASE + 32, 64),
                   (BASE - 64, 64), (BASE + 64 * KiB - 64, 65), (BASE, -1)]:
        with pytest.raises(ValueError):
            a.claim(off, n)
    assert (a.used_bytes, a.free_blocks, sorted(a.extents())) == before
    a.check()


def test_claim_in_any_order_matches_what_alloc_handed_out() -> None:
    rng = random.Random(7)
    src = ExtentAllocator(BASE, BASE + 4 * MiB, 64)
    live = {}
    for _ in range(2000):
        if live and rng.random() < 0.4:
            src.free(live.pop(rng.choice(list(live))))
        else:
            off = src.alloc(rng.randrange(0, 20 * KiB))
            if off >= 0:
                live[off] = off
    extents = sorted(src.extents())
    for order in (extents, list(reversed(extents)), rng.sample(extents, len(extents))):
        dst = ExtentAllocator(BASE, BASE + 4 * MiB, 64)
        for off, n in order:
            assert dst.claim(off, n) == n
        dst.check()
        assert sorted(dst.extents()) == extents and dst.used_bytes == src.used_bytes
        assert dst.free_blocks == src.free_blocks


# ---------------------------------------------------------------- restore_objects

def _state(size: int = 4 * MiB, segments: int = 1, **cfg: Any) -> MasterState:
    config = MasterConfig(segments=[SegmentConfig(name=f"cxl{i}", size_bytes=size) for i in range(segments)], **cfg)
    config.validate()
    return MasterState(config)


def test_restore_objects_commits_complete_objects_and_versions_continue_above() -> None:
    st = _state()
    sid = st.segments()[0].segment_id
    hb = header_bytes_for(1)
    objs = [
        RestoredObject("a", BASE, 100, hb, 50, 11),
        RestoredObject("b", BASE + 4096, 0, hb, 70, 12),
        RestoredObject("a", BASE + 8192, 10, hb, 40, 13),  # older version of "a": superseded
        RestoredObject("c\x00", BASE + 12288, 1, hb, 5, 14),  # a key the master refuses
        RestoredObject("d", BASE + 64, 200, hb, 60, 15),  # overlaps "a"'s extent
    ]
    rep = st.restore_objects(sid, objs, now=3.0)
    assert (rep.restored, rep.superseded, rep.invalid, rep.conflicts) == (2, 1, 1, 1)
    a, b = st.get_object("a"), st.get_object("b")
    assert a is not None and b is not None and st.get_object("d") is None
    assert a.state == ObjState.COMPLETE and (a.version, a.size_bytes, a.checksum) == (50, 100, 11)
    assert a.extents == [(sid, BASE, st.extent_bytes(hb + 100))] and a.header_bytes == hb
    assert b.extents == [(sid, BASE + 4096, st.extent_bytes(hb))] and b.leases == 0
    assert st.key_count == 2 and rep.restored_bytes == st.segments()[0].used_bytes
    assert st.counters["objects_recovered"] == 2
    st.check_invariants()
    # new puts get versions above every restored one and never overlap restored extents
    c = st.register_client("h", "clientd", 1, [], "", "", 3.0)
    new = st.put_start(c.client_id, c.epoch, "new", 5000, 3.0)
    assert new.version > 70
    assert not (new.extents[0][1] < BASE + 4096 + 128 and new.extents[0][1] + new.extents[0][2] > BASE)
    st.put_end(c.client_id, c.epoch, "new", new.version, 3.0)
    st.remove("a", 3.0)
    st.check_invariants()


def test_restore_across_segments_newest_wins_and_equal_versions_become_replicas() -> None:
    st = _state(segments=2)
    s0, s1 = (s.segment_id for s in st.segments())
    hb = header_bytes_for(1)
    st.restore_objects(s0, [RestoredObject("k", BASE, 10, hb, 5, 1), RestoredObject("r", BASE + 4096, 10, hb, 9, 2),
                            RestoredObject("o", BASE + 8192, 10, hb, 3, 3)], 0.0)
    rep = st.restore_objects(s1, [RestoredObject("k", BASE, 10, hb, 8, 4), RestoredObject("r", BASE + 4096, 10, hb, 9, 2),
                                  RestoredObject("o", BASE + 8192, 10, hb, 2, 3)], 0.0)
    n = st.extent_bytes(hb + 10)
    assert (rep.restored, rep.replicas, rep.superseded) == (1, 1, 1)
    assert st.get_object("k").version == 8 and st.get_object("k").extents == [(s1, BASE, n)]
    assert sorted(st.get_object("r").extents) == [(s0, BASE + 4096, n), (s1, BASE + 4096, n)]
    assert st.get_object("o").extents == [(s0, BASE + 8192, n)]
    assert st.segments()[0].object_count == 2 and st.segments()[1].object_count == 2
    st.check_invariants()


# --------------------------------------------------------- recovery from a region

class _Writer:
    """Writes objects into a region the way a clientd does, at extents a master chose."""

    def __init__(self, region: Region, st: MasterState) -> None:
        self.region, self.st = region, st
        c = st.register_client("h", "clientd", 1, [], "", "", 0.0)
        self.cid, self.epoch = c.client_id, c.epoch

    def put(self, key: str, value: bytes, upsert: bool = False):
        kb = key.encode()
        hb = header_bytes_for(len(kb))
        obj = self.st.put_start(self.cid, self.epoch, key, len(value), 0.0, upsert=upsert, header_bytes=hb)
        off = obj.extents[0][1]
        self.region.copy_in(off + 64, kb)
        self.region.copy_in(off + hb, value)
        checksum = xxhash.xxh3_64_intdigest(value)
        self.region.copy_in(off, pack_header(kb, obj.version, len(value), checksum))
        return self.st.put_end(self.cid, self.epoch, key, obj.version, 0.0, checksum)


@pytest.fixture()
def region_file(tmp_path: Path):
    path = tmp_path / "region"
    with Region.open(path, size=8 * MiB, create=True) as region:
        format_region(region, "cxl0")
        yield path, region


def test_recover_region_rebuilds_the_index_exactly(region_file, caplog) -> None:
    path, region = region_file
    src = _state(size=8 * MiB)
    w = _Writer(region, src)
    rng = random.Random(1)
    values = {f"k/{i}": rng.randbytes(rng.choice([0, 1, 63, 64, 4096, 100_000])) for i in range(40)}
    for k, v in values.items():
        w.put(k, v)
    w.put("k/0", b"newer", upsert=True)
    values["k/0"] = b"newer"
    src.remove("k/1", 0.0)  # not reused: comes back (documented)
    values["bad"] = b"abc" * 100
    corrupt = w.put("bad", values["bad"])
    region.copy_in(corrupt.extents[0][1] + corrupt.header_bytes + 7, b"X")  # one value byte

    dst = _state(size=8 * MiB)
    caplog.set_level(logging.INFO, logger="cxlkv.master")
    (rep,) = recover_regions(dst, [str(path)], now=1.0)
    assert rep.segment == "cxl0" and rep.skipped == 1 and rep.restored == len(values) - 1
    assert dst.segments()[0].region_uuid == rep.region_uuid != ""
    for k in values:
        got, want = dst.get_object(k), src.get_object(k)
        if k == corrupt.key:
            assert got is None
            continue
        if k == "k/1":
            assert got is not None and want is None and got.size_bytes == len(values[k])
            continue
        assert (got.version, got.size_bytes, got.checksum, got.header_bytes, got.extents) == (
            want.version, want.size_bytes, want.checksum, want.header_bytes, want.extents)
    dst.check_invariants()
    assert sum(1 for r in caplog.records if "skipped 1 object" in r.getMessage()) == 1
    assert any("recovery: rebuilt the index" in r.getMessage() and "40 object(s)" in r.getMessage()
               for r in caplog.records)
    # recovering the same segment twice is refused
    with pytest.raises(ConfigError, match="twice"):
        recover_region(dst, f"{path}=cxl0", 1.0)


def test_recover_region_checks_identity_and_mounts_unconfigured_segments(region_file, tmp_path) -> None:
    path, region = region_file
    st = _state(size=8 * MiB)
    with pytest.raises(ConfigError, match="formatted as segment 'cxl0', not 'other'"):
        recover_region(st, f"{path}=other", 0.0)
    wrong = MasterConfig(segments=[SegmentConfig(name="cxl0", size_bytes=8 * MiB, region_uuid="nope")])
    with pytest.raises(ConfigError, match="configured with region_uuid nope"):
        recover_region(MasterState(wrong), str(path), 0.0)
    small = MasterConfig(segments=[SegmentConfig(name="cxl0", size_bytes=4 * MiB)])
    with pytest.raises(ConfigError, match="is 8388608 B but segment 'cxl0' is 4194304 B"):
        recover_region(MasterState(small), str(path), 0.0)
    with pytest.raises(ConfigError, match="recover_from_region"):
        recover_region(st, str(tmp_path / "missing"), 0.0)
    bare = MasterState(MasterConfig())
    rep = recover_region(bare, str(path), 0.0)
    (seg,) = bare.segments()
    assert (seg.name, seg.size_bytes, seg.region_uuid, rep.restored) == ("cxl0", 8 * MiB, rep.region_uuid, 0)
    bare.check_invariants()


def test_recover_spec_parsing_and_config_key(tmp_path) -> None:
    assert parse_recover_spec("/dev/shm/r") == ("/dev/shm/r", "")
    assert parse_recover_spec("/dev/shm/r=cxl1") == ("/dev/shm/r", "cxl1")
    assert parse_recover_spec("/a=b/c") == ("/a=b/c", "")
    with pytest.raises(ConfigError):
        parse_recover_spec("/dev/shm/r=")
    conf = tmp_path / "m.toml"
    conf.write_text('recover_from_region = ["/dev/shm/a", "/dev/shm/b=cxl1"]\n')
    cfg = load_config(MasterConfig, conf)
    assert cfg.recover_from_region == ["/dev/shm/a", "/dev/shm/b=cxl1"]
    cfg = load_config(MasterConfig, conf, overrides={"recover_from_region": ["/x"]})
    assert cfg.recover_from_region == ["/x"]
    with pytest.raises(ConfigError, match="recover_from_region"):
        load_config(MasterConfig, None, overrides={"recover_from_region": ["=cxl0"]})


def test_recovery_tells_stale_copies_from_skipped_ones(tmp_path: Path, caplog) -> None:
    """Two regions (a tiered cluster's CXL and SSD): a copy whose value fails its
    checksum while the same version is intact in the other region (a freed CXL
    extent an unfinished move was rewriting), and an older leftover version
    superseded by the other region's newer one, are counted ``stale`` — never
    "skipped … checksum failed" — and nothing is lost."""
    pa, pb = tmp_path / "a", tmp_path / "b"
    with Region.open(pa, size=8 * MiB, create=True) as ra, Region.open(pb, size=8 * MiB, create=True) as rb:
        format_region(ra, "cxl0")
        format_region(rb, "cxl1")
        src = _state(size=8 * MiB)
        w = _Writer(ra, src)
        m = w.put("m", b"moved" * 100)
        x = w.put("x", b"newer" * 10)
        ra.copy_in(m.extents[0][1] + m.header_bytes + 3, b"Z")  # an unfinished write over m's value
        for off, key, version, value in ((BASE, "m", m.version, b"moved" * 100),
                                         (BASE + 64 * KiB, "x", x.version - 1, b"older")):
            kb = key.encode()
            hb = header_bytes_for(len(kb))
            rb.copy_in(off + 64, kb)
            rb.copy_in(off + hb, value)
            rb.copy_in(off, pack_header(kb, version, len(value), xxhash.xxh3_64_intdigest(value)))
    dst = _state(size=8 * MiB)
    caplog.set_level(logging.INFO, logger="cxlkv.master")
    ra_rep, rb_rep = recover_regions(dst, [str(pa), str(pb)], now=1.0)
    assert (ra_rep.skipped, ra_rep.stale) == (0, 1)
    assert (rb_rep.skipped, rb_rep.stale) == (0, 1)
    got_m, got_x = dst.get_object("m"), dst.get_object("x")
    assert got_m is not None and got_m.version == m.version and len(got_m.extents) == 1
    assert got_x is not None and got_x.version == x.version
    msgs = [r.getMessage() for r in caplog.records]
    assert not any("checksum" in t and "skipped" in t and "region" in t for t in msgs), msgs
    assert any("0 skipped, 2 stale" in t for t in msgs), msgs
    dst.check_invariants()


def test_recovery_restores_the_shared_ssd_tier_file(tmp_path: Path) -> None:
    """The SSD tier file is recovered like a region when its segment is declared with
    tier = "ssd": an object in CXL and on SSD at the same version gets both replicas,
    an SSD-only one comes back on SSD (docs/master.md, what recovery restores)."""
    from cxlkv.master.segments import Tier

    pc, ps = tmp_path / "cxl", tmp_path / "ssd"
    cfg = MasterConfig(segments=[SegmentConfig(name="cxl0", size_bytes=4 * MiB),
                                 SegmentConfig(name="ssd0", size_bytes=4 * MiB, tier="ssd")])
    cfg.validate()
    with Region.open(pc, size=4 * MiB, create=True) as rc, Region.open(ps, size=4 * MiB, create=True) as rs:
        format_region(rc, "cxl0")
        format_region(rs, "ssd0")
        for region, objs in ((rc, [("both", 7)]), (rs, [("both", 7), ("cold", 3)])):
            off = BASE
            for key, version in objs:
                kb, value = key.encode(), key.encode() * 50
                hb = header_bytes_for(len(kb))
                region.copy_in(off + 64, kb)
                region.copy_in(off + hb, value)
                region.copy_in(off, pack_header(kb, version, len(value), xxhash.xxh3_64_intdigest(value)))
                off += 64 * KiB
    dst = MasterState(cfg)
    reps = recover_regions(dst, [str(pc), str(ps)], now=1.0)
    assert [(r.segment, r.skipped, r.stale) for r in reps] == [("cxl0", 0, 0), ("ssd0", 0, 0)]
    tier = {s.segment_id: s.tier for s in dst.segments()}
    both, cold = dst.get_object("both"), dst.get_object("cold")
    assert both is not None and sorted(tier[e[0]] for e in both.extents) == sorted([Tier.CXL, Tier.SSD])
    assert cold is not None and [tier[e[0]] for e in cold.extents] == [Tier.SSD]
    dst.check_invariants()
