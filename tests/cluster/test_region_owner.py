"""A region has one owner, and a destroyed object does not stay listed (real processes).

* A second master on a region another master owns waits for the owner lease to
  lapse, then exits with one line naming the owner; once the first master stops,
  a new one takes the region over at once (a clean stop lets the lease lapse).
* An object whose bytes were destroyed in the region (not by cxlkv: a stray write)
  is found by the next read, reported by clientd, checked by the master in the
  region, and dropped (counted) instead of being listed and ``exists()`` forever.
"""

from __future__ import annotations

import time

from cxlkv.deploy.cluster import ManagedProcess, wait_for_file
from cxlkv.errors import NotFound
from cxlkv.transport import Region

from master_harness import locate

KiB = 1 << 10


def test_a_second_master_on_an_owned_region_refuses_it_with_one_line(make_cluster) -> None:
    cl = make_cluster(clientds=1, master_options={"owner_lease_ttl_s": 1.0})
    assert cl.master is not None
    second = ManagedProcess("master-2", list(cl.master.argv), cl.run_dir / "master-2.log")
    # the same configuration: same region, and the address file too (it must not be taken over)
    second.start()
    assert second.proc is not None
    deadline = time.monotonic() + 20
    while second.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert second.proc.returncode == 2, (cl.run_dir / "master-2.log").read_text()
    text = (cl.run_dir / "master-2.log").read_text()
    assert "is owned by another master" in text and "a region has one master" in text, text
    assert "Traceback" not in text
    with cl.client(0) as c:  # the first master is untouched
        c.put("own/k", b"v")
        assert c.get("own/k") == b"v"
    # a clean stop lets the lease lapse: the next master takes the region over at once
    cl.master.stop()
    (cl.run_dir / "master.address").unlink(missing_ok=True)
    third = ManagedProcess("master-3", list(cl.master.argv), cl.run_dir / "master-3.log")
    t0 = time.monotonic()
    third.start()
    try:
        wait_for_file(cl.run_dir / "master.address", 20, third)
        assert time.monotonic() - t0 < 10
        assert "epoch 2" in (cl.run_dir / "master-3.log").read_text()
    finally:
        third.stop()


def test_an_object_whose_bytes_were_destroyed_is_dropped_not_listed_forever(make_cluster) -> None:
    cl = make_cluster(clientds=1)
    with cl.client(0) as w, cl.client(0, direct=False) as r:
        w.put("heal/bad", b"A" * (8 * KiB))
        w.put("heal/good", b"B" * (8 * KiB))
        loc = locate(cl.master_stub(), "heal/bad", no_lease=True)
        ext = loc.replicas[0]
        with Region.open(cl.region_paths[0]) as region:  # a stray write over the value, not cxlkv's
            region.copy_in(ext.offset_bytes + loc.header_bytes + 100, b"\xff" * 64)
        try:
            r.get("heal/bad")
            raise AssertionError("destroyed bytes were returned")
        except NotFound:
            raise AssertionError("answered as absent before anyone checked")
        except Exception as exc:  # CHECKSUM_MISMATCH: a miss, never data
            assert type(exc).__name__ == "ChecksumMismatch", exc

        def dropped() -> bool:
            return cl.master_stat(check_invariants=False).counters["objects_damaged_dropped"] >= 1

        cl.wait_until(dropped, timeout_s=10, what="the master to drop the destroyed object")
        assert not r.exists("heal/bad") and not w.exists("heal/bad")
        assert [e.key for e in cl.list_master_keys()] == ["heal/good"]
        assert r.get("heal/good") == b"B" * (8 * KiB)
        w.put("heal/bad", b"C" * (8 * KiB))  # the key can be written again
        assert r.get("heal/bad") == b"C" * (8 * KiB)
    cl.assert_invariants()
