"""The master as a real subprocess over real gRPC: the issue's scenarios.

Every scenario ends with :func:`assert_invariant` (used == sum of live extents,
no overlap, free + used == capacity, key count == live objects).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cxlkv.errors import CxlkvError, ErrorCode
from cxlkv.layout.region import REGION_HEADER_BYTES
from cxlkv.v1 import master_pb2

from master_harness import (KiB, MiB, MasterProcess, Writer, all_keys, assert_invariant, exists, locate, remove,
                            rpc_error, stat)

CAPACITY = 64 * MiB - REGION_HEADER_BYTES


@pytest.fixture
def master(tmp_path: Path):
    with MasterProcess(tmp_path) as m:
        yield m


def _wait_for(cond, timeout_s: float = 10.0, every_s: float = 0.05, step=None) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        if step is not None:
            step()
        time.sleep(every_s)


# ------------------------------------------------------------------ writer death

_DYING_WRITER = textwrap.dedent("""
    import json, sys, time, grpc
    from cxlkv.v1 import master_pb2 as m, master_pb2_grpc as g
    stub = g.MasterServiceStub(grpc.insecure_channel(sys.argv[1]))
    r = stub.RegisterClient(m.RegisterClientRequest(hostname="doomed", name="writer"))
    p = stub.PutStart(m.PutStartRequest(client_id=r.client_id, epoch=r.epoch,
        keys=[sys.argv[2]], value_size_bytes=[int(sys.argv[3])]))
    print(json.dumps({"client_id": r.client_id, "epoch": r.epoch, "token": p.put_tokens[0]}), flush=True)
    while True:
        stub.Heartbeat(m.HeartbeatRequest(client_id=r.client_id, epoch=r.epoch))
        time.sleep(0.1)
""")


def test_writer_killed_between_put_start_and_put_end(tmp_path: Path) -> None:
    cfg = {"client_ttl_s": 2.0, "heartbeat_interval_s": 0.5}  # slack for a loaded machine
    with MasterProcess(tmp_path, cfg) as m:
        writer = subprocess.Popen([sys.executable, "-c", _DYING_WRITER, m.address, "blk", str(4 * MiB)],
                                  stdout=subprocess.PIPE, text=True)
        try:
            dead = json.loads(writer.stdout.readline())
            other = Writer(m.stub, "survivor")
            # Invisible while PROCESSING; a second put waits for the live writer.
            assert not exists(m.stub, "blk")
            assert rpc_error(locate, m.stub, "blk").code == ErrorCode.NOT_FOUND
            assert rpc_error(other.start, "blk", MiB).code == ErrorCode.NOT_READY
            assert stat(m.stub).used_bytes == 4 * MiB
            writer.send_signal(signal.SIGKILL)
            writer.wait(5)
        finally:
            if writer.poll() is None:
                writer.kill()
                writer.wait(5)
            writer.stdout.close()
        # Once the writer expires its put is revoked; its space is quarantined (a
        # stopped writer may still be copying) until someone vouches it is gone.
        _wait_for(lambda: stat(m.stub).counters["clients_expired"] >= 1, step=other.heartbeat)
        st = stat(m.stub)
        assert st.processing_count == 0 and st.counters["puts_reclaimed"] >= 1
        assert st.used_bytes == st.quarantined_bytes == 4 * MiB and st.quarantined_count == 1
        freed = m.stub.ReleaseQuarantine(master_pb2.ReleaseQuarantineRequest(
            client_id=dead["client_id"], writers_gone=True))
        assert freed.freed_bytes == 4 * MiB  # an operator: that writer is gone
        assert stat(m.stub).used_bytes == 0
        res = other.put("blk", MiB)
        assert res.version > dead["token"]
        # The dead attempt's PutEnd, arriving late, is refused.
        late = m.stub.PutEnd(master_pb2.PutEndRequest(
            client_id=dead["client_id"], epoch=dead["epoch"], keys=["blk"], put_tokens=[dead["token"]]))
        assert list(late.codes) == [ErrorCode.STALE_TOKEN]
        loc = locate(m.stub, "blk", no_lease=True)
        assert loc.version == res.version and loc.value_size_bytes == MiB
        assert_invariant(m.stub)


def test_put_timeout_revokes_abandoned_put(tmp_path: Path) -> None:
    with MasterProcess(tmp_path, {"put_timeout_s": 0.3}) as m:
        w = Writer(m.stub)
        res = w.start("slow", MiB)
        _wait_for(lambda: stat(m.stub).processing_count == 0)
        assert rpc_error(w.end, "slow", res.put_token).code == ErrorCode.STALE_TOKEN
        # The writer is alive and may still be copying: its space is held ("fenced")
        # until it ends the attempt.
        assert stat(m.stub).used_bytes == MiB
        assert_invariant(m.stub)
        assert rpc_error(w.revoke, "slow", res.put_token).code == ErrorCode.STALE_TOKEN
        assert stat(m.stub).used_bytes == 0
        assert_invariant(m.stub)


# --------------------------------------------------------------- fragmentation

def test_small_objects_then_large_objects_use_the_whole_region(tmp_path: Path) -> None:
    # No watermark eviction, and hard pins so a full region answers NO_SPACE.
    with MasterProcess(tmp_path, {"high_watermark": 1.0, "low_watermark": 1.0}) as m:
        w = Writer(m.stub)
        n_small = CAPACITY // (4 * KiB)
        placed = 0
        for i in range(0, n_small + 128, 512):
            statuses = w.batch_put([f"s{j}" for j in range(i, i + 512)], 4 * KiB, hard_pin=True)
            placed += sum(1 for s in statuses if s.code == 0)
            assert all(s.code in (0, ErrorCode.NO_SPACE) for s in statuses)
        assert placed == n_small
        assert_invariant(m.stub)
        removed = m.stub.RemoveAll(master_pb2.RemoveAllRequest()).removed
        assert removed == n_small and stat(m.stub).used_bytes == 0
        big = 0
        while True:
            try:
                w.put(f"b{big}", 8 * MiB, hard_pin=True)
            except CxlkvError:
                break
            big += 1
        err = rpc_error(w.start, "b-last", 8 * MiB, hard_pin=True)
        assert err.code == ErrorCode.NO_SPACE and "largest free extent" in err.message
        assert big == CAPACITY // (8 * MiB)
        # What is left is one contiguous block: the whole region is usable.
        w.put("tail", CAPACITY - big * 8 * MiB, hard_pin=True)
        st = assert_invariant(m.stub)
        assert st.used_bytes == CAPACITY and st.used_bytes >= 0.95 * 64 * MiB


def test_large_put_into_fragmented_region_evicts(tmp_path: Path) -> None:
    with MasterProcess(tmp_path, {"high_watermark": 1.0, "low_watermark": 1.0}) as m:
        w = Writer(m.stub)
        keys = [f"k{i:04d}" for i in range(1000)]
        for i in range(0, 1000, 250):
            assert all(s.code == 0 for s in w.batch_put(keys[i:i + 250], 60 * KiB))
        res = m.stub.Remove(master_pb2.RemoveRequest(keys=keys[::2]))
        assert all(s.code == 0 for s in res.results)
        assert_invariant(m.stub)
        before = stat(m.stub)
        assert before.used_bytes == 500 * 60 * KiB
        w.put("big", 10 * MiB)
        after = assert_invariant(m.stub)
        evicted = after.counters["evictions"] - before.counters["evictions"]
        assert 0 < evicted < 500
        assert after.key_count == 500 - evicted + 1


# ------------------------------------------------------------------------ removal

def test_remove_lease_force_missing_and_remove_all_twice(master: MasterProcess) -> None:
    stub = master.stub
    w = Writer(stub)
    w.put("a", 1000)
    w.put("b", 1000)
    loc = locate(stub, "a", w.client_id)
    assert loc.lease_id and loc.lease_ttl_ms == 5000
    assert rpc_error(remove, stub, "a").code == ErrorCode.HAS_LEASE
    remove(stub, "a", force=True)
    assert not exists(stub, "a")
    # The forced remove keeps the leased bytes until the lease ends.
    assert stat(stub).used_bytes == 2 * 1024
    assert rpc_error(remove, stub, "a").code == ErrorCode.NOT_FOUND
    assert rpc_error(remove, stub, "").code == ErrorCode.INVALID_KEY
    assert stub.ReleaseLeases(master_pb2.ReleaseLeasesRequest(
        client_id=w.client_id, lease_ids=[loc.lease_id, 424242])).released == 1
    assert stat(stub).used_bytes == 1024
    assert stub.RemoveAll(master_pb2.RemoveAllRequest()).removed == 1
    assert stub.RemoveAll(master_pb2.RemoveAllRequest()).removed == 0
    assert_invariant(stub)


def test_remove_all_by_pattern_and_list_keys_paging(master: MasterProcess) -> None:
    stub = master.stub
    w = Writer(stub)
    w.batch_put([f"x/{i:03d}" for i in range(30)] + ["y/0", "y/1"], 100)
    page = stub.ListKeys(master_pb2.ListKeysRequest(prefix="x/", page_size=7))
    assert [e.key for e in page.entries] == [f"x/{i:03d}" for i in range(7)]
    assert [e.key for e in all_keys(stub, "x/")] == [f"x/{i:03d}" for i in range(30)]
    assert page.entries[0].replica_count == 1 and page.entries[0].value_size_bytes == 100
    assert rpc_error(stub.ListKeys, master_pb2.ListKeysRequest(page_token="%%%")).code \
        == ErrorCode.INVALID_ARGUMENT
    assert rpc_error(stub.RemoveAll, master_pb2.RemoveAllRequest(pattern="(")).code \
        == ErrorCode.INVALID_ARGUMENT
    assert stub.RemoveAll(master_pb2.RemoveAllRequest(pattern=r"^x/0[01]")).removed == 20
    assert stat(stub).key_count == 32 - 20
    assert_invariant(stub)


# ------------------------------------------------------------------ values, sizes

def test_zero_length_value_and_missing_key(master: MasterProcess) -> None:
    stub = master.stub
    w = Writer(stub)
    res = w.put("empty", 0)
    assert len(res.extents) == 1 and res.extents[0].length_bytes == 64
    loc = locate(stub, "empty", no_lease=True)
    assert loc.value_size_bytes == 0 and loc.version == res.version and loc.lease_id == 0
    assert exists(stub, "empty")
    err = rpc_error(locate, stub, "nothing")
    assert err.code == ErrorCode.NOT_FOUND and err.key == "nothing"
    assert_invariant(stub)


def test_too_large_evicts_nothing_and_just_under_region_evicts_all(tmp_path: Path) -> None:
    with MasterProcess(tmp_path, {"high_watermark": 1.0, "low_watermark": 1.0}) as m:
        w = Writer(m.stub)
        n = CAPACITY // MiB
        assert all(s.code == 0 for s in w.batch_put([f"m{i}" for i in range(n)], MiB))
        before = stat(m.stub)
        err = rpc_error(w.start, "huge", 64 * MiB)
        assert err.code == ErrorCode.TOO_LARGE and str(64 * MiB) in err.message
        after = stat(m.stub)
        assert after.counters["evictions"] == before.counters["evictions"] == 0
        assert after.key_count == n and after.used_bytes == before.used_bytes
        w.put("whole", CAPACITY)
        st = assert_invariant(m.stub)
        assert st.counters["evictions"] == n and st.key_count == 1 and st.used_bytes == CAPACITY


def test_no_space_when_everything_is_leased(tmp_path: Path) -> None:
    with MasterProcess(tmp_path, {"high_watermark": 1.0, "low_watermark": 1.0}) as m:
        w = Writer(m.stub)
        keys = [f"l{i}" for i in range(CAPACITY // (8 * MiB))]
        assert all(s.code == 0 for s in w.batch_put(keys, 8 * MiB))
        m.stub.GetReplicaList(master_pb2.GetReplicaListRequest(client_id=w.client_id, keys=keys))
        err = rpc_error(w.start, "more", 16 * MiB)
        assert err.code == ErrorCode.NO_SPACE and "leased" in err.message and str(16 * MiB) in err.message
        assert stat(m.stub).counters["evictions"] == 0
        assert_invariant(m.stub)


# --------------------------------------------------------------- clients, epochs

def test_stale_epoch_is_fenced(master: MasterProcess) -> None:
    stub = master.stub
    old = Writer(stub)
    pending = old.start("k", 100)
    new = Writer(stub, previous_client_id=old.client_id)
    assert new.client_id == old.client_id and new.epoch > old.epoch
    assert rpc_error(old.start, "k2", 100).code == ErrorCode.STALE_TOKEN
    assert rpc_error(old.end, "k", pending.put_token).code == ErrorCode.STALE_TOKEN
    assert rpc_error(old.heartbeat).code == ErrorCode.STALE_TOKEN
    assert stat(stub).processing_count == 0
    new.put("k", 100)
    unknown = rpc_error(stub.Heartbeat, master_pb2.HeartbeatRequest(client_id="nobody", epoch=1))
    assert unknown.code == ErrorCode.UNKNOWN_CLIENT
    assert_invariant(stub)


def test_register_checks_region_identity(master: MasterProcess) -> None:
    stub = master.stub

    def register(uuid: str, size: int, name: str = "cxl0") -> master_pb2.RegisterClientResponse:
        return stub.RegisterClient(master_pb2.RegisterClientRequest(
            hostname="h", name="c", regions=[master_pb2.RegionIdentity(
                segment_name=name, region_uuid=uuid, size_bytes=size, device_path="/dev/shm/r0")]))

    first = register("uuid-1", 64 * MiB)
    assert first.segments[0].region_uuid == "uuid-1"  # adopted
    register("uuid-1", 64 * MiB)
    err = rpc_error(register, "uuid-2", 64 * MiB)
    assert err.code == ErrorCode.INVALID_ARGUMENT
    assert "cxl0" in err.message and "uuid-1" in err.message and "uuid-2" in err.message
    assert "/dev/shm/r0" in err.message
    err = rpc_error(register, "uuid-1", 32 * MiB)
    assert err.code == ErrorCode.INVALID_ARGUMENT and str(32 * MiB) in err.message
    assert rpc_error(register, "uuid-1", 64 * MiB, "cxl9").code == ErrorCode.INVALID_ARGUMENT
    assert_invariant(stub)


# -------------------------------------------------------------- upsert, leases

def test_upsert_keeps_old_extent_until_its_lease_ends(master: MasterProcess) -> None:
    stub = master.stub
    w = Writer(stub)
    v1 = w.put("k", MiB)
    assert rpc_error(w.start, "k", MiB).code == ErrorCode.ALREADY_EXISTS
    lease = locate(stub, "k", w.client_id)
    v2 = w.put("k", 2 * MiB, upsert=True)
    assert v2.version > v1.version
    assert v2.extents[0].offset_bytes != v1.extents[0].offset_bytes
    st = stat(stub)
    assert st.used_bytes == 3 * MiB and st.counters["upserts"] == 1
    now = locate(stub, "k", no_lease=True)
    assert now.version == v2.version and now.value_size_bytes == 2 * MiB
    assert_invariant(stub)
    stub.ReleaseLeases(master_pb2.ReleaseLeasesRequest(client_id=w.client_id, lease_ids=[lease.lease_id]))
    st = assert_invariant(stub)
    assert st.used_bytes == 2 * MiB and st.counters["deferred_frees"] == 1


def test_leases_expire_and_deferred_extent_is_freed(tmp_path: Path) -> None:
    with MasterProcess(tmp_path, {"lease_ttl_s": 1.0}) as m:
        w = Writer(m.stub)
        w.put("k", MiB)
        locate(m.stub, "k")
        remove(m.stub, "k", force=True)
        assert stat(m.stub).used_bytes == MiB
        _wait_for(lambda: stat(m.stub).lease_count == 0)
        st = assert_invariant(m.stub)
        assert st.used_bytes == 0 and st.counters["lease_expiries"] == 1


def test_match_prefix_one_and_several_queries(master: MasterProcess) -> None:
    stub = master.stub
    w = Writer(stub)
    w.batch_put(["p0", "p1", "p2", "q0"], 4096)
    r = stub.MatchPrefix(master_pb2.MatchPrefixRequest(client_id=w.client_id, queries=[
        master_pb2.PrefixQuery(keys=["p0", "p1", "zz", "p2"])]))
    assert list(r.matched) == [2] and [lease > 0 for lease in r.locations.lease_ids] == [True, True]
    b = stub.MatchPrefix(master_pb2.MatchPrefixRequest(
        client_id=w.client_id, release_lease_ids=list(r.locations.lease_ids),
        queries=[master_pb2.PrefixQuery(keys=["p0", "p1", "p2"]), master_pb2.PrefixQuery(keys=["x"]),
                 master_pb2.PrefixQuery(keys=["q0", ""])], no_lease=True))
    assert list(b.matched) == [3, 0, 1] and list(b.locations.lease_ids) == [0] * 4
    st = stat(stub)
    assert st.lease_count == 0 and st.counters["lease_releases"] == 2
    assert_invariant(stub)


# ------------------------------------------------------------------------ replicas

def test_replicas_on_two_segments_survive_an_unmount(tmp_path: Path) -> None:
    segs = [{"name": "cxl0", "size_bytes": 16 * MiB}, {"name": "cxl1", "size_bytes": 16 * MiB}]
    with MasterProcess(tmp_path, {"segments": segs}) as m:
        w = Writer(m.stub)
        two = w.put("two", MiB, replica_num=2)
        assert len({e.segment_id for e in two.extents}) == 2
        three = w.put("three", MiB, replica_num=3)
        assert len(three.extents) == 2 and three.replicas_wanted == 3  # best effort
        only0 = w.put("only0", MiB, preferred_segment="cxl0")
        cxl0 = w.segments["cxl0"].segment_id
        assert only0.extents[0].segment_id == cxl0
        assert_invariant(m.stub)
        lost = m.stub.UnmountSegment(master_pb2.UnmountSegmentRequest(name="cxl0"))
        assert lost.replicas_lost == 3 and lost.objects_lost == 1
        for key in ("two", "three"):
            loc = locate(m.stub, key, no_lease=True)
            assert [r.segment_id for r in loc.replicas] == [w.segments["cxl1"].segment_id]
        assert rpc_error(locate, m.stub, "only0").code == ErrorCode.NOT_FOUND
        st = assert_invariant(m.stub)
        assert st.counters["replicas_lost"] == 3 and st.counters["objects_lost"] == 1
        assert [s.mounted for s in st.segments] == [False, True]
        assert rpc_error(m.stub.UnmountSegment, master_pb2.UnmountSegmentRequest(name="cxl0")).code \
            == ErrorCode.NOT_FOUND
        # A remount comes back empty, under a new segment id.
        seg = m.stub.MountSegment(master_pb2.MountSegmentRequest(
            client_id=w.client_id, epoch=w.epoch, name="cxl0", tier=1, size_bytes=16 * MiB)).segment
        assert seg.mounted and seg.used_bytes == 0 and seg.segment_id != cxl0
        assert len(w.put("again", MiB, replica_num=2).extents) == 2
        assert_invariant(m.stub)


# --------------------------------------------------------------------- batches

def test_batch_results_per_position_with_duplicates(master: MasterProcess) -> None:
    stub = master.stub
    w = Writer(stub)
    started = stub.PutStart(master_pb2.PutStartRequest(
        client_id=w.client_id, epoch=w.epoch, keys=["a", "a", "", "b", "c"], value_size_bytes=[100] * 5))
    assert list(started.codes) == [0, ErrorCode.NOT_READY, ErrorCode.INVALID_KEY, 0, 0]
    ta, tb, tc = started.put_tokens[0], started.put_tokens[3], started.put_tokens[4]
    ended = stub.PutEnd(master_pb2.PutEndRequest(
        client_id=w.client_id, epoch=w.epoch, keys=["a", "a", "b", "b"], put_tokens=[ta, ta, tc, tb]))
    assert list(ended.codes) == [0, ErrorCode.STALE_TOKEN, ErrorCode.STALE_TOKEN, 0]
    revoked = stub.PutRevoke(master_pb2.PutEndRequest(
        client_id=w.client_id, epoch=w.epoch, keys=["c", "c"], put_tokens=[tc, tc]))
    assert list(revoked.codes) == [0, ErrorCode.STALE_TOKEN]
    got = stub.GetReplicaList(master_pb2.GetReplicaListRequest(
        client_id=w.client_id, keys=["a", "a", "c", "\x00", "b"]))
    assert list(got.codes) == [0, 0, ErrorCode.NOT_FOUND, ErrorCode.INVALID_KEY, 0]
    assert got.lease_ids[0] != got.lease_ids[1]
    ex = stub.ExistKey(master_pb2.ExistKeyRequest(keys=["a", "zz", "", "a"]))
    assert list(ex.exists) == [True, False, False, True]
    assert [s.code for s in ex.results] == [0, 0, ErrorCode.INVALID_KEY, 0]
    rm = stub.Remove(master_pb2.RemoveRequest(keys=["b", "b", "zz"], force=False))
    assert [s.code for s in rm.results] == [ErrorCode.HAS_LEASE, ErrorCode.HAS_LEASE, ErrorCode.NOT_FOUND]
    rm = stub.Remove(master_pb2.RemoveRequest(keys=["b", "b", "a"], force=True))
    assert [s.code for s in rm.results] == [0, ErrorCode.NOT_FOUND, 0]
    assert_invariant(stub)


def test_bad_input_never_crashes_the_master(master: MasterProcess) -> None:
    stub = master.stub
    w = Writer(stub)
    assert rpc_error(w.start, "k" * 5000, 10).code == ErrorCode.INVALID_KEY
    assert rpc_error(w.start, "k", 10, preferred_segment="nope").code == ErrorCode.INVALID_ARGUMENT
    assert rpc_error(w.end, "k", 12345).code == ErrorCode.STALE_TOKEN
    assert rpc_error(exists, stub, "").code == ErrorCode.INVALID_KEY
    assert list(stub.PutStart(master_pb2.PutStartRequest(
        client_id="ghost", epoch=1, keys=["k"], value_size_bytes=[1])).codes) == [ErrorCode.UNKNOWN_CLIENT]
    assert rpc_error(stub.PutStart, master_pb2.PutStartRequest(
        client_id=w.client_id, epoch=w.epoch, keys=["k"])).code == ErrorCode.INVALID_ARGUMENT
    assert rpc_error(stub.MountSegment, master_pb2.MountSegmentRequest(
        client_id=w.client_id, epoch=w.epoch, name="d", tier=0, size_bytes=MiB)).code == ErrorCode.INVALID_ARGUMENT
    health = health_pb2_grpc.HealthStub(master.channel)
    assert health.Check(health_pb2.HealthCheckRequest(service="cxlkv.v1.MasterService")).status \
        == health_pb2.HealthCheckResponse.SERVING
    assert_invariant(stub)
    assert "Traceback" not in master.log()


# ------------------------------------------------------------------- process

def test_sigterm_drains_and_exits_zero(tmp_path: Path) -> None:
    m = MasterProcess(tmp_path).start()
    Writer(m.stub).put("k", 10)
    assert m.stop() == 0
    assert not m.address_file.exists()


def _run_master_expecting_failure(tmp_path: Path, config: dict, *extra: str) -> subprocess.CompletedProcess:
    m = MasterProcess(tmp_path, config)
    m.config_path.write_text(__import__("tomli_w").dumps(m.config))
    return subprocess.run(m.argv() + list(extra), capture_output=True, text=True, timeout=60)


def test_unknown_strategy_fails_start_up_listing_names(tmp_path: Path) -> None:
    out = _run_master_expecting_failure(tmp_path, {"allocation_strategy": "nope"})
    assert out.returncode == 2
    assert "nope" in out.stderr and "cxl_first" in out.stderr and "free_ratio_first" in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_config_error_and_port_in_use_exit_2(tmp_path: Path) -> None:
    out = _run_master_expecting_failure(tmp_path, {"lease_ttl_s": "soon"})
    assert out.returncode == 2 and "lease_ttl_s" in out.stderr and "Traceback" not in out.stderr
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with MasterProcess(tmp_path / "a") as m:
        out = _run_master_expecting_failure(tmp_path / "b", {}, "--listen", m.address)
        assert out.returncode == 2 and m.address in out.stderr and "Traceback" not in out.stderr


def test_env_overrides_toml(tmp_path: Path) -> None:
    env = {"CXLKV_MASTER_LEASE_TTL_S": "250ms", "CXLKV_MASTER_EVICTION_POLICY": "arc"}
    with MasterProcess(tmp_path, {"lease_ttl_s": 9}, env=env) as m:
        w = Writer(m.stub)
        w.put("k", 1)
        loc = locate(m.stub, "k")
        assert loc.lease_ttl_ms == 250
        assert stat(m.stub).eviction_policy == "arc"
