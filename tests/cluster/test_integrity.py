"""End-to-end integrity: object headers, corrupted bytes, safe reuse of freed space."""

from __future__ import annotations

import os
from typing import Any

import pytest

from cxlkv.clientd.master_link import Location
from cxlkv.config import MasterConfig, SegmentConfig
from cxlkv.errors import ChecksumMismatch, NotFound
from cxlkv.master.state import MasterState
from cxlkv.layout.objheader import (
    OBJECT_HEADER_BYTES,
    header_bytes_for,
    key_hash,
    pack_header,
    parse_header,
)
from cxlkv.transport import Region

from master_harness import locate

KiB, MiB = 1 << 10, 1 << 20


def _location(cl: Any, key: str) -> Location:
    return locate(cl.master_stub(), key, no_lease=True)


def _counters(client: Any) -> dict[str, int]:
    return {k: int(v) for k, v in client.stat()["counters"].items()}


# ----------------------------------------------------------------- header format
def test_header_round_trip_and_every_field_is_checked() -> None:
    key = "layer/7/block/42".encode()
    head = pack_header(key, 99, 12345, 0xDEADBEEF)
    assert len(head) == OBJECT_HEADER_BYTES
    h = parse_header(head, key)
    assert h is not None
    assert (h.version, h.value_len_bytes, h.value_checksum) == (99, 12345, 0xDEADBEEF)
    assert h.key_hash == key_hash(key) and h.header_bytes == header_bytes_for(len(key)) == 128
    assert header_bytes_for(64) == 128 and header_bytes_for(65) == 192
    for pos in range(OBJECT_HEADER_BYTES):  # any flipped bit in the header is caught
        bad = bytearray(head)
        bad[pos] ^= 0x10
        assert parse_header(bytes(bad), key) is None, pos
    assert parse_header(head, b"layer/7/block/43") is None  # another key's bytes
    assert parse_header(bytes(64), key) is None


def test_object_mismatch_names_what_differs() -> None:
    """The one check clientd reads, SDK direct reads and tier moves share."""
    from cxlkv.layout.objheader import header_bytes_for, object_mismatch, pack_header

    key = "blk/7".encode()
    hb = header_bytes_for(len(key))
    head = (pack_header(key, 9, 1000, 0xABC) + key).ljust(hb, b"\0")
    assert object_mismatch(head, key, 9, 1000, hb, 0xABC) is None
    assert "another key" in object_mismatch(head, b"blk/8", 9, 1000, hb, 0xABC)
    assert "version 9, expected 10" in object_mismatch(head, key, 10, 1000, hb, 0xABC)
    assert "1000-byte value" in object_mismatch(head, key, 9, 999, hb, 0xABC)
    assert "checksum" in object_mismatch(head, key, 9, 1000, hb, 0xABD)
    torn = bytearray(head)
    torn[30] ^= 1
    assert "no valid object header" in object_mismatch(bytes(torn), key, 9, 1000, hb, 0xABC)


# ------------------------------------------------------------- corrupted values
@pytest.mark.parametrize("coherence", ["coherent", "flush"])
def test_a_corrupted_byte_is_reported_never_returned(make_cluster, coherence: str) -> None:
    """A byte changed behind the store's back is a miss (CHECKSUM_MISMATCH), never data;
    the master, told of it, checks the object in the region and drops it (counted):
    later reads are plain misses, and the key can be written again."""
    cl = make_cluster(clientds=1, clientd_options={"coherence": coherence})
    value = os.urandom(300 * KiB)
    with cl.client(0) as c:
        for key, flip in (("corrupt/k", "value"), ("corrupt/h", "header")):
            c.put(key, value)
            c.put(key + "/next", b"x" * 100)
            loc = _location(cl, key)
            assert loc.header_bytes == header_bytes_for(len(key))
            ext = loc.replicas[0]
            with Region.open(cl.region_paths[0]) as r:
                at = ext.offset_bytes + loc.header_bytes + 1000 if flip == "value" else ext.offset_bytes + 24
                good = r.read(at, 1)
                r.copy_in(at, bytes([good[0] ^ 0xFF]))  # a value byte, or the header's version
                r.flush(at, 1)
            before = _counters(c).get("checksum_failures", 0)
            with pytest.raises(ChecksumMismatch, match="checksum" if flip == "value" else "header"):
                c.get(key)
            assert _counters(c)["checksum_failures"] >= before + 1
            cl.wait_until(lambda: cl.master_stat(check_invariants=False).counters["objects_damaged_dropped"]
                          >= (1 if flip == "value" else 2), what="the master to drop the damaged object")
            buf = c.buffer(MiB)
            with pytest.raises(NotFound):  # gone: a miss, not data
                c.get_into(key, buf)
            dsts = [c.buffer(MiB), c.buffer(KiB)]
            assert c.get_prefix_into([key, key + "/next"], dsts) == 0
            c.put(key, value)  # written again
            assert c.get(key) == value
    cl.assert_invariants()


# -------------------------------------------------------------------- safe reuse
def _state(size: int = 4 * MiB) -> tuple[MasterState, str, int]:
    config = MasterConfig(segments=[SegmentConfig(name="cxl0", size_bytes=size)])
    config.validate()
    st = MasterState(config)
    c = st.register_client("host", "clientd", 1, [], "", "", 0.0)
    return st, c.client_id, c.epoch


def _overlaps(a: tuple[int, int, int], b: tuple[int, int, int]) -> bool:
    return a[0] == b[0] and a[1] < b[1] + b[2] and b[1] < a[1] + a[2]


@pytest.mark.parametrize("how", ["remove", "upsert", "evict"])
def test_leased_space_is_not_handed_to_a_new_writer(how: str) -> None:
    """While a lease on a freed extent may still be read, no new put gets any of its bytes."""
    st, cid, ep = _state()
    hb = header_bytes_for(3)
    o = st.put_start(cid, ep, "old", MiB, 0.0, header_bytes=hb)
    st.put_end(cid, ep, "old", o.version, 0.0)
    leased = o.extents[0]
    assert leased[2] >= MiB + hb  # the extent holds header and value
    _, lease = st.get(cid, "old", 0.0)
    assert lease is not None
    if how == "remove":
        st.remove("old", 0.0, force=True)
    elif how == "upsert":
        n = st.put_start(cid, ep, "old", MiB, 0.0, upsert=True, header_bytes=hb)
        st.put_end(cid, ep, "old", n.version, 0.0)
        assert not _overlaps(n.extents[0], leased)
    else:
        st.remove_all(0.0, force=True)
    placed = []
    for n in range(3):  # fill the rest of the segment: never the leased bytes
        obj = st.put_start(cid, ep, f"new{n}", MiB - 4096, 0.0, header_bytes=hb)
        st.put_end(cid, ep, f"new{n}", obj.version, 0.0)
        placed.append(obj.extents[0])
    assert all(not _overlaps(e, leased) for e in placed)
    st.check_invariants()
    st.release_leases(cid, [lease.lease_id])
    assert st.deferred_count == 0
    st.check_invariants()


def test_remove_and_put_reusing_space_never_mixes_bytes(cluster) -> None:
    """A reader that raced a Remove + Put into the same space (its location is
    stale) finds another key's header and version: a miss, never the new bytes."""
    from cxlkv.clientd.copies import _Copy
    from cxlkv.clientd.core import ClientdCore

    size = 64 * KiB
    with cluster.client(0, direct=False) as a:  # through clientd: its puts' space, as the allocator hands it
        a.put("reuse/k", b"A" * size)
        old = _location(cluster, "reuse/k")
        a.remove("reuse/k")
        # same key, new version, likely the same space (upserts take PutStart: the
        # allocator hands out the extent just freed, where a reserved extent would not)
        a.put("reuse/k", b"B" * size, upsert=True)
        a.put("reuse/other", b"C" * size, upsert=True)
        new = _location(cluster, "reuse/k")
        assert new.version > old.version
        assert a.get("reuse/k") == b"B" * size
        with Region.open(cluster.region_paths[0]) as region:
            class _Mapped:
                pass

            mapped = _Mapped()
            mapped.region = region  # type: ignore[attr-defined]
            core = ClientdCore.__new__(ClientdCore)
            core.flush_mode = True
            core.verify_first = True
            ext = old.replicas[0]
            buf = bytearray(size)
            c = _Copy(0, mapped, ext.offset_bytes + old.header_bytes, size, buf, 0)  # type: ignore[arg-type]
            region.invalidate(c.region_offset, size)
            region.copy_out(c.region_offset, buf)
            why = core._check_object(c, old.header_bytes, "reuse/k", old.version, 0)
            assert why is not None  # whoever lives there now, it is not version `old`
            assert core._verify_reads([(c, old.header_bytes, "reuse/k", old.version, 0)])
            # the current location verifies
            ext2 = new.replicas[0]
            c2 = _Copy(0, mapped, ext2.offset_bytes + new.header_bytes, size, bytearray(size), 0)  # type: ignore[arg-type]
            region.copy_out(c2.region_offset, c2.buf)
            assert core._check_object(c2, new.header_bytes, "reuse/k", new.version, new.checksum) is None
    cluster.assert_invariants()


# ------------------------------------------------------------ scan and verify
def test_region_scan_and_verify(cluster) -> None:
    import json
    import subprocess
    import sys

    values = {f"scan/{n}": os.urandom(n) for n in (0, 10, 5000, 70 * KiB)}
    with cluster.client(0) as c:
        for k, v in values.items():
            c.put(k, v)
        c.put("scan/gone", b"x" * 100)
        c.remove("scan/gone")
        c.put("scan/10", b"y" * 10, upsert=True)
    values["scan/10"] = b"y" * 10
    path = cluster.region_paths[0]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cxlkv.cli", "region", *args, path],
                              capture_output=True, text=True, timeout=60)

    scan = cli("scan", "--json")
    assert scan.returncode == 0, scan.stderr
    listed = {o["key"]: o for o in json.loads(scan.stdout)}
    for k, v in values.items():
        assert listed[k]["value_len_bytes"] == len(v)
        assert _location(cluster, k).version == listed[k]["version"]  # the newest version
    ok = cli("verify")
    assert ok.returncode == 0 and "0 corrupt" in ok.stdout, ok.stdout + ok.stderr
    o = listed["scan/5000"]
    with Region.open(path) as r:
        at = o["offset_bytes"] + o["header_bytes"] + 17
        r.copy_in(at, bytes([r.read(at, 1)[0] ^ 1]))
        r.flush(at, 1)
    bad = cli("verify", "--json")
    assert bad.returncode == 1
    report = json.loads(bad.stdout)
    assert [x["key"] for x in report["corrupt"]] == ["scan/5000"]
