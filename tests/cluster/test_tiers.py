"""DRAM → CXL → SSD tiers on real processes (docs/tiers.md): demotion instead of
loss, promotion of hot SSD objects, host-local DRAM caching and its invalidation,
a clientd killed mid-move, and exact accounting over every segment after it all."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from cxlkv.errors import NotFound
from cxlkv.v1 import common_pb2

KiB = 1024
MiB = 1 << 20
BLOCK = 4 * KiB


def _value(i: int, version: int = 0) -> bytes:
    unit = i.to_bytes(8, "little") + version.to_bytes(8, "little")
    return unit * (BLOCK // 16)


def _counters(cl) -> dict[str, int]:
    return dict(cl.master_stat(check_invariants=False).counters)


def _tiers_of(cl, key: str) -> list[int]:
    for e in cl.list_master_keys():
        if e.key == key:
            return list(e.tiers)
    return []


def _cxl_bytes_for(blocks: int) -> int:
    from cxlkv.layout.region import REGION_HEADER_BYTES

    return REGION_HEADER_BYTES + blocks * (BLOCK + 128)


TIER_MASTER = {"high_watermark": 0.9, "low_watermark": 0.8, "promotion_threshold": 2,
               "dram_promotion_threshold": 2, "task_timeout_s": 2.0, "task_retries": 2}


@pytest.fixture()
def tiered(make_cluster):
    return make_cluster(clientds=2, region_size_bytes=_cxl_bytes_for(64), ssd_size_bytes=8 * MiB,
                        master_options=TIER_MASTER, clientd_options={"dram_tier_bytes": 2 * MiB})


def test_demotion_keeps_every_object_and_promotion_brings_hot_ones_back(tiered):
    cl = tiered
    n = 200  # about 3 × the CXL tier
    with cl.client(0) as c0, cl.client(1) as c1:
        keys = [f"t/{i}" for i in range(n)]
        for i in range(0, n, 20):
            res = c0.put_many([(keys[j], _value(j)) for j in range(i, i + 20)])
            assert all(r.ok for r in res), [r.error for r in res if not r.ok]
        cl.wait_until(lambda: _counters(cl)["demotions"] > 0, what="demotions")
        cl.wait_until(lambda: cl.master_stat(check_invariants=False).segments[0].used_bytes
                      <= 0.9 * cl.master_stat(check_invariants=False).segments[0].capacity_bytes,
                      what="CXL below the high watermark")
        # nothing was lost: every key reads back its bytes, from whatever tier
        stop = threading.Event()
        errors: list[str] = []

        def reader() -> None:  # concurrent reads with leases while objects move
            with cl.client(1) as c:
                while not stop.is_set():
                    for i in range(0, n, 7):
                        try:
                            if c.get(keys[i]) != _value(i):
                                errors.append(f"wrong bytes for {keys[i]}")
                        except Exception as exc:  # noqa: BLE001
                            errors.append(repr(exc))

        t = threading.Thread(target=reader)
        t.start()
        try:
            for i in range(n):
                assert c1.get(keys[i]) == _value(i)
            cold = next(k for k in keys if common_pb2.CXL not in _tiers_of(cl, k))
            assert _tiers_of(cl, cold) == [common_pb2.SSD]
            for _ in range(3):  # hot: promoted back into CXL
                assert c0.get(cold) == _value(keys.index(cold))
            cl.wait_until(lambda: common_pb2.CXL in _tiers_of(cl, cold), what="promotion")
        finally:
            stop.set()
            t.join(30)
        assert not errors, errors[:5]
        c = _counters(cl)
        assert c["promotions"] >= 1 and c["objects_lost"] == 0 and c["evictions"] == 0
        assert c["moves_failed"] == 0
    cl.wait_until(lambda: cl.master_stat(check_invariants=False).lease_count == 0, what="leases released")
    cl.assert_invariants()


def test_dram_cache_never_serves_removed_or_replaced_values(tiered):
    cl = tiered
    with cl.client(0) as c0, cl.client(1) as c1:
        c0.put("d/a", _value(1, 1))
        c0.put("d/b", _value(2, 1))
        for _ in range(3):
            assert c0.get("d/a") == _value(1, 1)
            assert c0.get("d/b") == _value(2, 1)
        cl.wait_until(lambda: common_pb2.DRAM in _tiers_of(cl, "d/a") and common_pb2.DRAM in _tiers_of(cl, "d/b"),
                      what="DRAM caching on host 0")
        # served from host 0's DRAM replica
        tiers: list[int] = []
        buf = bytearray(BLOCK)
        assert c0.get_prefix_into(["d/a"], [buf], tiers) == 1 and bytes(buf) == _value(1, 1)
        assert tiers == [common_pb2.DRAM]
        tiers.clear()
        assert c1.get_prefix_into(["d/a"], [buf], tiers) == 1 and tiers == [common_pb2.CXL]
        # upsert on host 1: host 0 reads the new value, never its cached old one
        c1.put("d/a", _value(1, 2), upsert=True)
        assert c0.get("d/a") == _value(1, 2)
        assert c1.get("d/a") == _value(1, 2)
        # remove on host 1: host 0 misses, never serves the cached bytes
        c1.remove("d/b")
        with pytest.raises(NotFound):
            c0.get("d/b")
        with pytest.raises(NotFound):
            c1.get("d/b")
    cl.wait_until(lambda: cl.master_stat(check_invariants=False).lease_count == 0, what="leases released")
    cl.assert_invariants()


def test_clientd_killed_mid_move_leaves_every_object_readable(make_cluster):
    # clientd 0 is the only one running moves (clientd 1 runs none: task_batch 0). It
    # is frozen (SIGSTOP) while more puts queue moves — its pending ExchangeTasks long
    # poll is answered with them, so they are given to it and never done — then
    # killed (SIGKILL). The moves it held time out and are given again once a task
    # runner is back; nothing is lost and the accounting is exact.
    cl = make_cluster(clientds=2, region_size_bytes=_cxl_bytes_for(64), ssd_size_bytes=8 * MiB,
                      master_options={**TIER_MASTER, "task_timeout_s": 0.5, "client_ttl_s": 2.0,
                                      "heartbeat_interval_s": 0.2, "task_retries": 5})
    cl.clientd_options["task_batch"] = 0
    cl.restart_clientd(1)
    n = 400
    keys = [f"k/{i}" for i in range(n)]
    with cl.client(1) as c1:
        for i in range(0, n // 2, 10):
            assert all(r.ok for r in c1.put_many([(keys[j], _value(j)) for j in range(i, i + 10)]))
        cl.wait_until(lambda: _counters(cl)["demotions"] + _counters(cl)["ssd_copies"] > 0, what="moves running")
        cl.clientds[0].signal(signal.SIGSTOP)
        for i in range(n // 2, n, 10):  # more moves, given to the frozen clientd 0...
            assert all(r.ok for r in c1.put_many([(keys[j], _value(j)) for j in range(i, i + 10)]))
        time.sleep(0.2)
        cl.kill_clientd(0)  # ...which dies holding them
        for i in range(n):  # every object stays readable, in one tier or another
            assert c1.get(keys[i]) == _value(i), keys[i]
        cl.wait_until(lambda: _counters(cl)["moves_retried"] > 0, what="timed-out moves given again")
        moved = _counters(cl)["demotions"] + _counters(cl)["ssd_copies"]
        cl.clientd_options["task_batch"] = 64
        cl.restart_clientd(1)  # a task runner again: the moves finish
    with cl.client(1) as c1:
        cl.wait_until(lambda: _counters(cl)["demotions"] + _counters(cl)["ssd_copies"] > moved,
                      what="moves after the kill")
        for i in range(n):
            assert c1.get(keys[i]) == _value(i), keys[i]
    cl.wait_until(lambda: cl.master_stat(check_invariants=False).lease_count == 0, what="leases released")
    st = cl.assert_invariants()
    assert st.counters["objects_lost"] == 0 and st.counters["evictions"] == 0


def test_a_corrupt_object_on_the_ssd_tier_is_dropped_not_kept_failing(tiered):
    """A byte of an SSD-only object changed behind the store's back: the read is a
    CHECKSUM_MISMATCH (never data), the clientd reports it, and the master — which does
    not read SSD tier files itself — drops the object, so it is not listed and failing
    every read and promotion forever; the key can be written again."""
    from cxlkv.errors import ChecksumMismatch
    from master_harness import locate

    cl = tiered
    n = 200
    with cl.client(0) as c0:
        keys = [f"bad/{i}" for i in range(n)]
        for i in range(0, n, 20):
            res = c0.put_many([(keys[j], _value(j)) for j in range(i, i + 20)])
            assert all(r.ok for r in res), [r.error for r in res if not r.ok]
        cl.wait_until(lambda: any(_tiers_of(cl, k) == [common_pb2.SSD] for k in keys[:50]), what="a demotion")
        victim = next(k for k in keys[:50] if _tiers_of(cl, k) == [common_pb2.SSD])
        loc = locate(cl.master_stub(), victim, no_lease=True)
        ext, hb = loc.replicas[0], loc.header_bytes
        fd = os.open(cl.ssd_path, os.O_RDWR)
        try:
            at = ext.offset_bytes + hb + 10
            b = os.pread(fd, 1, at)
            os.pwrite(fd, bytes([b[0] ^ 0xFF]), at)
        finally:
            os.close(fd)
        dropped = _counters(cl)["objects_damaged_dropped"]
        with pytest.raises(ChecksumMismatch):
            c0.get(victim)
        cl.wait_until(lambda: _counters(cl)["objects_damaged_dropped"] == dropped + 1,
                      what="the master to drop the corrupt SSD object")
        assert _counters(cl)["damage_reports_ssd"] >= 1
        with pytest.raises(NotFound):
            c0.get(victim)
        c0.put(victim, b"again")
        assert c0.get(victim) == b"again"
    cl.assert_invariants()
