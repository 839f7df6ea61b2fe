"""Direct mode: the SDK maps the region itself and asks clientd only for metadata.

Real processes (tests/conftest.py clusters). Covered: a direct writer on host A
read through the daemon path on host B and the other way round, byte for byte;
batch forms; the fallbacks (the daemon's setting off, a region this process may
not open, a file that is not the daemon's region); corruption and bad headers
answered as misses; a writer SIGKILLed between DirectPutStart and DirectPutEnd
reclaimed at once; remove and upsert while a direct reader holds a lease; flush
mode on the non-coherent emulator.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from cxlkv.errors import AlreadyExists, ChecksumMismatch, HasLease, NotFound, NotReady, OutOfRange, RegionError
from cxlkv.v1 import client_pb2

MiB = 1 << 20
KiB = 1 << 10


def _value(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def _counters(client) -> dict[str, int]:
    return {k: int(v) for k, v in client.stat()["counters"].items()}


def test_direct_writer_daemon_reader_and_back(cluster) -> None:
    sizes = [0, 1, 4 * KiB + 3, 70 * KiB, 3 * MiB + 17]
    with cluster.client(0, direct_threshold_bytes=0) as a, cluster.client(1, direct=False) as b, \
            cluster.client(1, direct_threshold_bytes=0) as b_direct:
        assert a.direct and b_direct.direct, (a.direct_status, b_direct.direct_status)
        assert not b.direct and "direct=False" in b.direct_status
        before = _counters(a)
        for n in sizes:
            v = _value(n, n)
            # direct put on A -> daemon-path read on B (and a direct read on B)
            assert a.put_from(f"ab/{n}", v) >= 1
            assert b.get(f"ab/{n}") == v.tobytes()
            out = np.zeros(n + 5, np.uint8)
            assert b_direct.get_into(f"ab/{n}", out) == n
            assert out[:n].tobytes() == v.tobytes() and not out[n:].any()
            # daemon-path put on B -> direct read on A
            b.put_from(f"ba/{n}", v)
            out2 = bytearray(n)
            assert a.get_into(f"ba/{n}", out2) == n
            assert bytes(out2) == v.tobytes()
            assert a.get(f"ba/{n}") == v.tobytes()
        # value kinds: bytes (put), bytearray, memoryview, a non-uint8 numpy array, a slice
        f32 = np.arange(300_000, dtype=np.float32)
        a.put("kinds/bytes", bytes(range(256)) * 1024)
        a.put_from("kinds/bytearray", bytearray(b"x" * 100_000))
        a.put_from("kinds/memoryview", memoryview(f32.tobytes()))
        a.put_from("kinds/f32", f32)
        a.put_from("kinds/strided", f32[::2])  # not contiguous: copied first
        assert b.get("kinds/bytes") == bytes(range(256)) * 1024
        assert b.get("kinds/bytearray") == b"x" * 100_000
        back = np.zeros_like(f32)
        assert a.get_into("kinds/f32", back) == f32.nbytes and (back == f32).all()
        assert b.get("kinds/memoryview") == f32.tobytes()
        assert b.get("kinds/strided") == f32[::2].tobytes()
        a._direct.commits._report()  # what A committed itself reaches the daemon's counters now
        after = _counters(a)
        assert after.get("direct_put_items", 0) - before.get("direct_put_items", 0) >= len(sizes) + 4
        # the daemon copied none of A's direct values in
        assert after.get("bytes_in", 0) == before.get("bytes_in", 0)
        # errors as on the daemon path
        with pytest.raises(AlreadyExists):
            a.put_from(f"ab/{sizes[-1]}", _value(sizes[-1], 1))
        with pytest.raises(NotFound):
            a.get_into("absent", np.zeros(10, np.uint8))
        with pytest.raises(OutOfRange) as exc:
            a.get_into(f"ab/{sizes[-1]}", np.zeros(10, np.uint8))
        assert exc.value.requested_bytes == sizes[-1]
        v2 = _value(2 * MiB, 99)
        ver1 = a.put_from("up", _value(2 * MiB, 98))
        ver2 = a.put_from("up", v2, upsert=True)
        assert ver2 > ver1
        assert b.get("up") == v2.tobytes()
    cluster.assert_invariants()


def test_direct_batches(cluster) -> None:
    with cluster.client(0, direct_threshold_bytes=64 * KiB) as a, cluster.client(1) as b, \
            cluster.client(1, direct=False) as d:
        vals = [_value(64 * KiB + i * 4099, i) for i in range(40)]
        small = [_value(100, 1000 + i).tobytes() for i in range(5)]
        items = [(f"batch/{i}", v) for i, v in enumerate(vals)] + [(f"small/{i}", s) for i, s in enumerate(small)]
        items.append(("batch/0", vals[1]))        # duplicate: answered per position (in flight or committed)
        items.append(("bad\0key", vals[2]))        # invalid key fails only itself
        res = a.put_many(items)
        assert [r.ok for r in res[:45]] == [True] * 45, [r.error for r in res if not r.ok]
        assert isinstance(res[45].error, (AlreadyExists, NotReady)), res[45]
        assert not res[46].ok
        keys = [f"batch/{i}" for i in range(40)] + ["missing", "batch/3"]
        dsts = [np.zeros(v.nbytes, np.uint8) for v in vals] + [np.zeros(70 * KiB, np.uint8),
                                                               np.zeros(vals[3].nbytes, np.uint8)]
        got = b.get_into_many(keys, dsts)
        for i in range(40):
            assert got[i].ok and got[i].value == vals[i].nbytes, got[i]
            assert dsts[i].tobytes() == vals[i].tobytes()
        assert isinstance(got[40].error, NotFound)
        assert got[41].ok and dsts[41].tobytes() == vals[3].tobytes()
        # a destination too small fails only itself
        got = b.get_into_many(["batch/5", "batch/6"], [np.zeros(10, np.uint8), np.zeros(vals[6].nbytes, np.uint8)])
        assert isinstance(got[0].error, OutOfRange) and got[1].ok
        # the daemon path reads what direct mode wrote, and get_many fetches large values directly
        assert [r.value for r in d.get_many(keys[:40])] == [v.tobytes() for v in vals]
        assert [r.value for r in b.get_many(keys[:40])] == [v.tobytes() for v in vals]
        assert [r.value for r in b.get_many([f"small/{i}" for i in range(5)])] == small
        res = a.put_from_many([f"pfm/{i}" for i in range(3)], vals[:3])
        assert all(r.ok for r in res)
        assert d.get("pfm/2") == vals[2].tobytes()
    cluster.assert_invariants()


def test_direct_over_grpc(cluster) -> None:
    with cluster.client(0, protocol="grpc") as a, cluster.client(1, protocol="grpc", direct=False) as b:
        assert a.direct
        v = _value(300 * KiB, 5)
        a.put_from("grpc/1", v)
        assert b.get("grpc/1") == v.tobytes()
        out = np.zeros_like(v)
        assert a.get_into("grpc/1", out) == v.nbytes and (out == v).all()


def test_fallback_when_the_daemon_does_not_offer_it(make_cluster) -> None:
    cl = make_cluster(clientd_options={"direct_mode": False})
    with cl.client(0) as a, cl.client(1) as b:
        assert not a.direct
        assert "direct_mode = false" in a.direct_status
        v = _value(2 * MiB, 3)
        a.put_from("off/1", v)
        out = np.zeros_like(v)
        assert b.get_into("off/1", out) == v.nbytes and (out == v).all()
        with pytest.raises(Exception) as exc:
            a._call("DirectGet", client_pb2.DirectGetRequest(keys=["off/1"]))
        assert "not offered" in str(exc.value)
    cl.assert_invariants()


def test_fallback_when_the_region_cannot_be_opened(cluster, monkeypatch) -> None:
    import errno

    from cxlkv.transport import Region

    def denied(path, *args, **kwargs):
        raise RegionError(f"no permission to open region {path} read-write", path=str(path), errno=errno.EACCES)

    path = cluster.region_paths[0]
    if os.geteuid() == 0:  # root opens any file: make the open fail as for another user
        monkeypatch.setattr(Region, "open", staticmethod(denied))
    else:  # a real permission-denied: the daemons mapped it already
        mode = os.stat(path).st_mode
        os.chmod(path, 0)
        monkeypatch.setattr(os, "_cxlkv_restore", lambda: os.chmod(path, mode), raising=False)
    with cluster.client(0) as a:
        assert not a.direct
        assert "no permission" in a.direct_status, a.direct_status
        v = _value(2 * MiB, 4)
        a.put_from("denied/1", v)
        assert a.get("denied/1") == v.tobytes()
    if os.geteuid() != 0:
        os._cxlkv_restore()  # type: ignore[attr-defined]
    monkeypatch.undo()
    # a region file that is gone from this process's view (another mount namespace)
    os.rename(path, path + ".moved")
    try:
        with cluster.client(1) as b:
            assert not b.direct and "does not exist" in b.direct_status, b.direct_status
            assert b.get("denied/1") == v.tobytes()
    finally:
        os.rename(path + ".moved", path)
    cluster.assert_invariants()


def test_identity_mismatch_is_refused(cluster) -> None:
    from cxlkv.layout.region import format_region, read_identity
    from cxlkv.transport import Region

    path = cluster.region_paths[0]
    os.rename(path, path + ".real")  # the daemons keep their mapping of the real region
    try:
        size = os.path.getsize(path + ".real")
        with Region.open(path + ".real") as real:
            name = read_identity(real).segment_name
        with Region.open(path, size=size, create=True) as impostor:
            format_region(impostor, name)  # same name and size, another uuid
        with cluster.client(0) as a, cluster.client(1, direct=False) as b:
            assert not a.direct
            assert "not the same region" in a.direct_status, a.direct_status
            v = _value(2 * MiB, 6)
            a.put_from("ident/1", v)   # through the daemon, into the real region
            assert b.get("ident/1") == v.tobytes()
            assert a.get("ident/1") == v.tobytes()
    finally:
        os.unlink(path)
        os.rename(path + ".real", path)
    cluster.assert_invariants()


def test_corruption_is_a_miss_and_a_bad_header_is_refused(cluster) -> None:
    from cxlkv.transport import Region

    with cluster.client(0) as a, cluster.client(1) as b:
        v = _value(1 * MiB, 7)
        a.put_from("corrupt/1", v)
        (r,) = b._call("DirectGet", client_pb2.DirectGetRequest(keys=["corrupt/1"])).results
        b._call("DirectRelease", client_pb2.DirectReleaseRequest(lease_ids=[r.lease_id]))
        ext = r.replicas[0].extent
        with Region.open(cluster.region_paths[0]) as reg:
            reg.copy_in(ext.offset_bytes + r.header_bytes + 1000, b"\xff\x00\xff")
        with pytest.raises(ChecksumMismatch):
            b.get_into("corrupt/1", np.zeros(v.nbytes, np.uint8))
        assert not b.get_into_many(["corrupt/1"], [np.zeros(v.nbytes, np.uint8)])[0].ok
        with cluster.client(1, direct=False) as d:  # the daemon agrees
            with pytest.raises(ChecksumMismatch):
                d.get("corrupt/1")
        # a writer that ends a put without writing the header: refused, revoked
        (s,) = a._call("DirectPutStart", client_pb2.DirectPutStartRequest(
            pid=os.getpid(), items=[client_pb2.DirectPutStartItem(key="noheader", value_size_bytes=10)])).results
        assert s.put_token and not s.fallback
        (st,) = a._call("DirectPutEnd", client_pb2.DirectPutEndRequest(items=[
            client_pb2.DirectPutEndItem(key="noheader", put_token=s.put_token, checksum=123)])).results
        assert st.code == int(ChecksumMismatch.code)
        assert not a.exists("noheader")
        # a token not handed out (or already ended) is stale
        (st,) = a._call("DirectPutEnd", client_pb2.DirectPutEndRequest(items=[
            client_pb2.DirectPutEndItem(key="noheader", put_token=s.put_token, checksum=123)])).results
        assert st.code == int(ErrorCodeStale)
    cluster.assert_invariants()


from cxlkv.errors import ErrorCode  # noqa: E402

ErrorCodeStale = ErrorCode.STALE_TOKEN

_KILLED_WRITER = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    from cxlkv import Client
    c = Client(sys.argv[1])
    assert c.direct, c.direct_status
    from cxlkv.v1 import client_pb2
    r = c._call("DirectPutStart", client_pb2.DirectPutStartRequest(pid=os.getpid(), items=[
        client_pb2.DirectPutStartItem(key="killed/1", value_size_bytes=4 << 20)])).results[0]
    assert r.put_token and r.status.code == 0
    region = c._direct.regions[r.extents[0].extent.segment_id]
    region.copy_in(r.extents[0].extent.offset_bytes + r.header_bytes, np.ones(1 << 20, np.uint8))
    print("started", flush=True)
    time.sleep(60)
""")


def test_writer_killed_mid_put_is_reclaimed(cluster) -> None:
    p = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, cluster.socket_path(0)],
                         stdout=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()  # type: ignore[union-attr]
        assert line.strip() == "started", line
        st = cluster.master_stat()
        assert st.processing_count == 1
        with cluster.client(1) as other:
            with pytest.raises(Exception):  # another put of the key is refused while it is in flight
                other.put_from("killed/1", _value(2 * MiB, 8))
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(10)
    t0 = time.monotonic()
    # the daemon revokes the dead writer's put (the master's put_timeout_s is 60 s)
    cluster.wait_until(lambda: cluster.master_stat().processing_count == 0, timeout_s=10,
                       what="the killed writer's put to be revoked")
    assert time.monotonic() - t0 < 10
    cluster.assert_invariants()
    with cluster.client(0) as a, cluster.client(1) as b:
        assert not b.exists("killed/1")
        assert _counters(a).get("direct_puts_reaped") == 1
        v = _value(4 * MiB, 9)
        a.put_from("killed/1", v)  # the key is free again
        assert b.get("killed/1") == v.tobytes()
    cluster.assert_invariants()


_KILLED_RESERVED_WRITER = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    from cxlkv import Client
    c = Client(sys.argv[1])
    assert c.direct, c.direct_status
    from cxlkv.v1 import client_pb2
    r = c._call("DirectPutStart", client_pb2.DirectPutStartRequest(pid=os.getpid(), items=[
        client_pb2.DirectPutStartItem(key="killed/r", value_size_bytes=int(sys.argv[2]))])).results[0]
    assert r.put_token and r.status.code == 0
    region = c._direct.regions[r.extents[0].extent.segment_id]
    region.copy_in(r.extents[0].extent.offset_bytes + r.header_bytes, np.ones(int(sys.argv[2]) // 2, np.uint8))
    print("started", flush=True)
    time.sleep(60)
""")


def _reservations(cluster) -> tuple[int, int]:
    """(reservations the master counts, reservations the clientds hold in their pools)."""
    held = 0
    for i in range(2):
        with cluster.client(i, direct=False) as c:
            held += _counters(c).get("reservations_held", 0)
    return cluster.master_stat().reserved_count, held


def test_a_direct_put_costs_one_master_round_trip(make_cluster) -> None:
    """Direct puts of a size the daemon holds reservations for, direct commit off:
    DirectPutStart answers from the pool (no master call), DirectPutEnd is one Commit."""
    cluster = make_cluster(clientd_options={"direct_commit": False})
    size = 200 * KiB
    with cluster.client(0, direct_threshold_bytes=64 * KiB) as a, cluster.client(1) as b:
        for i in range(30):  # the pool learns the size
            a.put_from(f"rt/warm/{i}", _value(size, i))
        before = _counters(a)
        for i in range(30):
            a.put_from(f"rt/{i}", _value(size, 100 + i))
        after = _counters(a)
        for i in range(30):
            assert b.get(f"rt/{i}") == _value(size, 100 + i).tobytes()
    grew = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    assert grew["direct_put_reserved"] == 30, grew
    assert grew.get("master_calls.PutStart", 0) == 0 and grew.get("master_calls.PutEnd", 0) == 0, grew
    assert 1 <= grew["master_calls.Commit"] <= 30, grew
    cluster.assert_invariants()


def test_a_writer_killed_with_a_reserved_extent_gives_it_back(cluster) -> None:
    size = 128 * KiB
    with cluster.client(0, direct_threshold_bytes=64 * KiB) as a:
        for i in range(8):
            a.put_from(f"kr/warm/{i}", _value(size, i))
        assert _counters(a).get("reservations_held", 0) >= 1
    p = subprocess.Popen([sys.executable, "-c", _KILLED_RESERVED_WRITER, cluster.socket_path(0), str(size)],
                         stdout=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()  # type: ignore[union-attr]
        assert line.strip() == "started", line
        # from the pool: no two-phase put is in flight at the master
        assert cluster.master_stat().processing_count == 0
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(10)
    with cluster.client(0, direct=False) as c:
        cluster.wait_until(lambda: _counters(c).get("direct_puts_reaped") == 1, timeout_s=10,
                           what="the killed writer's reserved put to be reaped")
    # nothing leaked: every reservation the master counts is in a pool again (or used)
    cluster.wait_until(lambda: (lambda m, h: m == h)(*_reservations(cluster)), timeout_s=10,
                       what="the master's reservations to equal the pools'")
    cluster.assert_invariants()
    with cluster.client(0) as a, cluster.client(1) as b:
        assert not b.exists("killed/r")
        v = _value(size, 77)
        a.put_from("killed/r", v)
        assert b.get("killed/r") == v.tobytes()
    cluster.assert_invariants()


def test_remove_and_upsert_while_a_direct_reader_holds_a_lease(cluster) -> None:
    with cluster.client(0) as a, cluster.client(1) as b:
        old = _value(2 * MiB, 10)
        new = _value(3 * MiB, 11)
        a.put_from("leased/1", old)
        path = b._direct
        assert path is not None
        # a reader between its DirectGet (lease granted) and the end of its copy
        (r,) = b._call("DirectGet", client_pb2.DirectGetRequest(keys=["leased/1"])).results
        assert r.lease_id
        with pytest.raises(HasLease):
            a.remove("leased/1")
        a.put_from("leased/1", new, upsert=True)  # a new version; the reader keeps the old bytes
        out = np.zeros(old.nbytes, np.uint8)
        got = path._read_one("leased/1", r, r.replicas[0], out)
        assert got[:2] == (old.nbytes, r.version) and out.tobytes() == old.tobytes()
        b._call("DirectRelease", client_pb2.DirectReleaseRequest(lease_ids=[r.lease_id]))
        assert b.get("leased/1") == new.tobytes()
        # force remove under a lease: the reader still reads its bytes
        (r,) = b._call("DirectGet", client_pb2.DirectGetRequest(keys=["leased/1"])).results
        a.remove("leased/1", force=True)
        out = np.zeros(new.nbytes, np.uint8)
        got = path._read_one("leased/1", r, r.replicas[0], out)
        assert out.tobytes() == new.tobytes()
        b._call("DirectRelease", client_pb2.DirectReleaseRequest(lease_ids=[r.lease_id]))
        with pytest.raises(NotFound):
            b.get_into("leased/1", out)
    cluster.wait_until(lambda: cluster.master_stat().lease_count == 0, what="leases released")
    cluster.assert_invariants()


def test_flush_mode_on_the_noncoherent_emulator(make_cluster, monkeypatch) -> None:
    monkeypatch.setenv("CXLKV_TRANSPORT_EMULATE_NONCOHERENT", "1")
    cl = make_cluster(clientd_options={"coherence": "flush"})
    with cl.client(0) as a, cl.client(1) as b, cl.client(1, direct=False) as d:
        assert a.direct and b.direct
        from cxlkv.transport.emulate import NoncoherentRegion

        assert all(isinstance(r, NoncoherentRegion) for r in a._direct.regions.values())
        for i, n in enumerate([70 * KiB, 2 * MiB + 5]):
            v = _value(n, 20 + i)
            a.put_from(f"flush/{i}", v)       # written through this process's emulated cache
            assert d.get(f"flush/{i}") == v.tobytes()   # seen by the other host: flushed before PutEnd
            out = np.zeros(n, np.uint8)
            assert b.get_into(f"flush/{i}", out) == n and out.tobytes() == v.tobytes()
            w = _value(n, 40 + i)
            d.put_from(f"flush/{i}", w, upsert=True)     # the other host replaces it
            assert b.get_into(f"flush/{i}", out) == n and out.tobytes() == w.tobytes()  # invalidated first
            assert a.get(f"flush/{i}") == w.tobytes()
    cl.assert_invariants()
