"""Faults with real processes: a host (clientd) killed mid-load, a master restart,
and daemons pointed at the wrong region.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import tomli_w

from cxlkv.errors import CxlkvError, Unavailable
from cxlkv.layout.region import format_region
from cxlkv.transport import Region

MiB = 1 << 20
FAST_FAULTS = {"client_ttl_s": 1.5, "heartbeat_interval_s": 0.25, "put_timeout_s": 30}


def _value(i: int, size: int) -> bytes:
    return (i.to_bytes(8, "little") * (size // 8 + 1))[:size]


def test_host_killed_mid_load_loses_only_unfinished_puts(make_cluster) -> None:
    cl = make_cluster(master_options=FAST_FAULTS)
    committed: list[tuple[str, int]] = []
    stop = threading.Event()
    lock = threading.Lock()

    def writer(t: int) -> None:
        from cxlkv import Client

        size = 256 << 10  # large enough that copies are often in flight
        try:
            with Client(cl.socket_path(0), timeout_s=5) as a:
                i = 0
                while not stop.is_set():
                    key = f"kill/{t}/{i}"
                    try:
                        a.put(key, _value(i, size))
                    except Unavailable:
                        return  # the host died
                    with lock:
                        committed.append((key, i))
                    i += 1
        except CxlkvError:
            return

    threads = [threading.Thread(target=writer, args=(t,), daemon=True) for t in range(4)]
    for t in threads:
        t.start()
    cl.wait_until(lambda: len(committed) >= 40, what="some puts to commit")
    cl.kill_clientd(0)
    stop.set()
    for t in threads:
        t.join(10)
        assert not t.is_alive()
    with lock:
        done = list(committed)
    assert done

    # B reads every object A committed, byte for byte, and never blocks.
    with cl.client(1, timeout_s=5) as b:
        t0 = time.monotonic()
        res = b.get_many([k for k, _ in done])
        assert time.monotonic() - t0 < 5
        for (key, i), r in zip(done, res):
            assert r.ok, (key, r.error)
            assert r.value == _value(i, 256 << 10), key
        # A's unfinished puts are reclaimed once its registration expires; B keeps working meanwhile.
        deadline = time.monotonic() + 15
        while cl.master_stat(False).processing_count:
            t1 = time.monotonic()
            b.put(f"kill/b/{t1}", b"alive")
            assert time.monotonic() - t1 < 2
            assert time.monotonic() < deadline, "A's PROCESSING puts were never reclaimed"
            time.sleep(0.1)
    # A may have had no put in flight when killed: then nothing above waited for its expiry.
    cl.wait_until(lambda: cl.master_stat(False).counters["clients_expired"] >= 1, timeout_s=15,
                  what="clientd-0's registration to expire")
    st = cl.assert_invariants()
    assert st.counters["clients_expired"] >= 1
    assert not [c for c in st.clients if c.name == "clientd-0" and c.alive]
    # every committed key is still listed, nothing else of A's is
    listed = {e.key for e in cl.list_master_keys()}
    assert {k for k, _ in done} <= listed


def test_clientd_reregisters_after_master_restart(make_cluster) -> None:
    cl = make_cluster(master_options={"heartbeat_interval_s": 0.2, "client_ttl_s": 2})
    with cl.client(0) as a, cl.client(1) as b:
        a.put("restart/before", b"x")
        old_id = cl.master_stat(False).master_id
        cl.restart_master()
        assert cl.master_stat(False).master_id != old_id

        def works() -> bool:
            try:
                a.put(f"restart/after/{time.monotonic_ns()}", b"y")
                return True
            except CxlkvError:
                return False

        cl.wait_until(works, timeout_s=15, what="clientd-0 to re-register")
        a.put("restart/new", b"new value")
        cl.wait_until(lambda: _safe_get(b, "restart/new") == b"new value", timeout_s=15,
                      what="clientd-1 to re-register")
        cl.wait_until(lambda: sorted(c.name for c in cl.master_stat(False).clients if c.alive)
                      == ["clientd-0", "clientd-1"], timeout_s=15, what="both clientds registered again")
        assert b.stat()["master_connected"] is True
    cl.assert_invariants()


def _safe_get(client, key: str) -> bytes | None:
    try:
        return client.get(key)
    except CxlkvError:
        return None


def test_grpc_sdk_keeps_working_across_a_clientd_restart(make_cluster) -> None:
    """The same over the gRPC framing: the channel reconnects by itself and tells
    the SDK, which checks its buffers at the next call (the call that meets the
    restart may still fail)."""
    cl = make_cluster(clientds=1)
    big = os.urandom(200_000)
    with cl.client(0, protocol="grpc", direct=False) as c:
        c.put("rg/a", big)
        cl.restart_clientd(0)
        for attempt in range(20):  # until the channel has reconnected and the SDK checked
            try:
                c.put(f"rg/probe{attempt}", big)
                break
            except CxlkvError:
                time.sleep(0.1)
        for i in range(3):
            c.put(f"rg/c{i}", big)
            out = bytearray(len(big))
            assert c.get_into(f"rg/c{i}", out) == len(big) and out == big
        assert c.get("rg/a") == big
    cl.assert_invariants(processing=None)


@pytest.mark.parametrize("direct", [False, True])
def test_sdk_keeps_working_across_a_clientd_restart(make_cluster, direct: bool) -> None:
    """`systemctl restart cxlkv-clientd` under an open Client: the call in flight
    may fail (Unavailable), every later one works — the SDK notices that the new
    daemon does not know its pool's buffers (BufferStatus on reconnect) and
    replaces them instead of failing with UNKNOWN_BUFFER forever. A view from
    `buffer()` taken before keeps working (staged now), and nothing leaks."""
    import numpy as np

    cl = make_cluster(clientds=1)
    big = os.urandom(200_000)  # over the inline threshold: through the pool
    with cl.client(0, direct=direct) as c:
        c.put("rs/a", big)
        old_view = c.buffer(len(big))
        old_view[:] = big
        c.put_from("rs/b", old_view)
        cl.restart_clientd(0)
        c.put("rs/probe", b"x")  # the idle connection's end is seen first: no error
        for i in range(3):
            c.put(f"rs/c{i}", big)
            out = bytearray(len(big))
            assert c.get_into(f"rs/c{i}", out) == len(big) and out == big
        assert c.get("rs/a") == big and c.get("rs/b") == big
        c.put_from("rs/d", old_view)  # the pre-restart view: staged through a new segment
        dst = np.zeros(len(big), dtype=np.uint8)
        assert c.get_into("rs/d", dst) == len(big) and dst.tobytes() == big
        fresh = c.buffer(len(big))  # a new segment, registered with the new daemon
        assert c.get_into("rs/a", fresh) == len(big) and bytes(fresh) == big
        res = c.put_from_many([f"rs/m{i}" for i in range(4)], [big] * 4)
        assert all(r.ok for r in res), res
        assert all(r.ok for r in c.get_into_many([f"rs/m{i}" for i in range(4)],
                                                 [bytearray(len(big)) for _ in range(4)]))
        del fresh, old_view
        # A thread whose first connection comes after another restart checks the
        # pool too (connections are per thread).
        c.put("rs/e", big)
        cl.restart_clientd(0)
        outcome: list[object] = []

        def late_thread() -> None:
            try:
                outcome.extend(r.ok for r in c.put_from_many([f"rs/t{i}" for i in range(3)], [big] * 3))
            except Exception as exc:  # noqa: BLE001 - reported below
                outcome.append(exc)

        t = threading.Thread(target=late_thread)
        t.start()
        t.join(30)
        assert outcome == [True] * 3, outcome
    cl.assert_invariants()


@pytest.mark.parametrize("protocol", ["lean", "grpc"])
def test_reads_ride_out_clientd_restarts_with_retry_s(make_cluster, protocol: str) -> None:
    """With `retry_s`, reads in a loop keep answering — right bytes, no error —
    across a graceful restart and a SIGKILL of their clientd: a read whose
    daemon went away (before or during the call) is tried again on a new
    connection."""
    import signal

    import numpy as np

    from cxlkv.errors import DaemonUnreachable

    cl = make_cluster(clientds=1)
    big = os.urandom(200_000)  # through the pool: the restarted daemon must get new buffers
    keys = [f"rr/{i}" for i in range(8)]
    with cl.client(0) as w:
        for i, k in enumerate(keys):
            w.put(k, big if i % 2 else _value(i, 1000))
    want = {k: (big if i % 2 else _value(i, 1000)) for i, k in enumerate(keys)}
    stop = threading.Event()
    done: list[int] = []
    failures: list[BaseException] = []

    def reader() -> None:
        n = 0
        try:
            with cl.client(0, retry_s=60, protocol=protocol) as c:
                while not stop.is_set():
                    k = keys[n % len(keys)]
                    assert c.get(k) == want[k]
                    assert c.exists(k)
                    dst = np.zeros(len(want[k]), dtype=np.uint8)
                    assert c.get_into(k, dst) == len(want[k]) and dst.tobytes() == want[k]
                    assert [r.value for r in c.get_many(keys[:3])] == [want[x] for x in keys[:3]]
                    assert c.get_prefix_into(keys[:2], [bytearray(len(want[x])) for x in keys[:2]]) == 2
                    n += 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)
        done.append(n)

    t = threading.Thread(target=reader)
    t.start()
    try:
        time.sleep(0.3)
        cl.restart_clientd(0)  # SIGTERM, then a new daemon
        time.sleep(0.3)
        cl.clientds[0].signal(signal.SIGKILL)  # mid-call, most likely
        time.sleep(0.5)  # reads keep trying while nothing listens
        cl.restart_clientd(0)
        time.sleep(0.5)
    finally:
        stop.set()
        t.join(90)
    assert not failures, failures
    assert done and done[0] > 0
    # Without retry_s a read through the daemon fails at once, as DaemonUnreachable
    # (an Unavailable); a read from the region's index needs no daemon. First the
    # restarted daemon must serve and be registered (its clients then learn of the index).
    with cl.client(0, protocol=protocol, retry_s=20, direct=False) as w:
        assert w.get(keys[0]) == want[keys[0]]
    with cl.client(0, protocol=protocol, direct=False) as c, cl.client(0, protocol=protocol) as ix:
        assert ix.get(keys[0]) == want[keys[0]]
        cl.clientds[0].stop()
        t0 = time.monotonic()
        with pytest.raises(DaemonUnreachable) as info:
            c.get(keys[0])
        assert isinstance(info.value, Unavailable) and time.monotonic() - t0 < 5
        assert ix.get(keys[0]) == want[keys[0]] and ix.exists(keys[0])
    cl.restart_clientd(0)
    cl.assert_invariants()


def test_retry_s_gives_up_and_never_retries_writes(make_cluster) -> None:
    """A read tries for retry_s and then raises DaemonUnreachable; a write raises
    it at once whatever retry_s says (whether it took effect is unknown)."""
    from cxlkv.errors import DaemonUnreachable

    cl = make_cluster(clientds=1)
    # direct=False: reads from the region's index need no daemon at all
    with cl.client(0, retry_s=0.6, direct=False) as c, cl.client(0, retry_s=60) as patient:
        c.put("gv/a", b"a")
        cl.clientds[0].stop()
        t0 = time.monotonic()
        with pytest.raises(DaemonUnreachable, match="clientd"):
            c.get("gv/a")
        assert 0.6 <= time.monotonic() - t0 < 5
        t0 = time.monotonic()
        for write in (lambda: patient.put("gv/b", b"b"), lambda: patient.remove("gv/a"),
                      lambda: patient.put_many([("gv/c", b"c")])):
            with pytest.raises(DaemonUnreachable):
                write()
        assert time.monotonic() - t0 < 5
        cl.restart_clientd(0)
        assert c.get("gv/a") == b"a" and not patient.exists("gv/b")
    cl.assert_invariants()


@pytest.mark.parametrize("protocol", ["lean", "grpc"])
def test_retried_reads_recover_soon_after_a_long_outage(make_cluster, protocol: str) -> None:
    """A daemon away for seconds, then back: reads waiting under retry_s answer
    within about a second of its return — also on gRPC, whose channel would
    otherwise wait out a growing reconnect backoff — and a batch of values too
    large to travel inline (read one by one inside get_many) and a direct-mode
    get_into_many come back whole."""
    import numpy as np

    cl = make_cluster(clientds=1, region_size_bytes=128 * MiB)
    large = [os.urandom(2 * MiB + i) for i in range(3)]  # over the daemon's 1 MiB inline limit
    with cl.client(0) as w:
        for i, v in enumerate(large):
            w.put(f"lo/{i}", v)
    keys = [f"lo/{i}" for i in range(3)]
    got: dict[str, object] = {}
    with cl.client(0, retry_s=60, protocol=protocol) as c:
        assert c.exists("lo/0")
        cl.clientds[0].stop()

        def read() -> None:
            try:
                got["many"] = [r.value if r.ok else r.error for r in c.get_many(keys)]
                dsts = [np.zeros(len(v), dtype=np.uint8) for v in large]
                res = c.get_into_many(keys, dsts)
                got["into"] = [d.tobytes() if r.ok else r.error for r, d in zip(res, dsts)]
                got["exists"] = c.exists_many(keys)
                got["stat"] = c.stat()["buffers_registered"]
            except BaseException as exc:  # noqa: BLE001 - reported below
                got["error"] = exc
            got["at"] = time.monotonic()

        t = threading.Thread(target=read)
        t.start()
        time.sleep(6.0)  # gRPC's default backoff would now wait about 4 s between attempts
        cl.restart_clientd(0)
        ready = time.monotonic()
        t.join(60)
    assert "error" not in got, got.get("error")
    assert got["many"] == large and got["into"] == large and got["exists"] == [True] * 3
    assert got["at"] - ready < 3.0, got["at"] - ready


def test_retry_budget_is_shared_and_per_item_losses_retry_the_batch(make_cluster) -> None:
    """A get_many whose large values are read one by one does not give each its own
    retry_s: with the daemon gone for good it ends after about retry_s in all."""
    from cxlkv.errors import DaemonUnreachable

    cl = make_cluster(clientds=1, region_size_bytes=128 * MiB)
    keys = [f"sb/{i}" for i in range(4)]
    with cl.client(0, retry_s=1.0, direct=False) as c:
        for k in keys:
            c.put(k, os.urandom(2 * MiB))
        real = c._call_many

        def batch_then_vanish(name, requests):  # the daemon stops after answering BatchGet
            out = real(name, requests)
            if name == "BatchGet" and cl.clientds[0].alive():
                cl.clientds[0].stop()
            return out

        c._call_many = batch_then_vanish
        t0 = time.monotonic()
        try:
            res = c.get_many(keys)
        except DaemonUnreachable:
            pass
        else:
            assert all(isinstance(r.error, DaemonUnreachable) for r in res), res
        assert time.monotonic() - t0 < 3.0  # one budget, not one per large value
        cl.restart_clientd(0)


def test_direct_read_then_restart_leaves_no_stale_connection(make_cluster) -> None:
    """A direct-mode read leaves the answer to its lease release unread on the
    connection; a restart after it is still noticed before the next call, so even
    a write (never retried) goes through, and close() from a thread whose
    connection predates the restart still unregisters the pool's buffers."""
    import numpy as np

    cl = make_cluster(clientds=1)
    big = os.urandom(200_000)
    with cl.client(0) as c:
        c.put("ds/a", big)
        dst = np.zeros(len(big), dtype=np.uint8)
        assert c.get_into("ds/a", dst) == len(big) and dst.tobytes() == big
        cl.restart_clientd(0)
        assert c.upsert("ds/a", b"new") > 0
        assert c.get("ds/a") == b"new"
    with cl.client(0, direct=False) as c:
        c.put("ds/b", big)  # staged: registers a pool segment
        cl.restart_clientd(0)
        t = threading.Thread(target=lambda: c.put("ds/c", big))  # its own, new connection
        t.start()
        t.join(30)
        with cl.client(0) as probe:
            assert probe.stat()["buffers_registered"] >= 1
    with cl.client(0) as probe:
        st = probe.stat()
    assert st["buffers_registered"] == 0 and st["buffer_bytes"] == 0, st
    cl.assert_invariants()


def test_pool_revalidation_leaves_ranges_in_use_alone() -> None:
    """Dropping a segment the daemon forgot only unlists it: a range another thread
    is copying through keeps its memory, and frees queued by finalizers (which may
    run inside the pool's own calls) are applied later, never re-entered."""
    import numpy as np

    from cxlkv.client._pool import BufferPool

    ids = iter(range(100, 200))
    pool = BufferPool(lambda path, size, pid: next(ids), lambda bid: None, 1 << 20)
    seg, off = pool.alloc(4096)
    seg.array[off:off + 4] = np.frombuffer(b"abcd", dtype=np.uint8)
    assert pool.revalidate(lambda bids: [False] * len(bids)) == 1
    assert pool.segments == [] and bytes(seg.array[off:off + 4]) == b"abcd"  # still mapped for its user
    pool.free(seg, off)  # a dropped segment: a no-op
    seg2, off2 = pool.alloc(4096)
    assert seg2 is not seg and seg2.buffer_id == 101
    pool.free_later(seg2, off2)  # as a finalizer would
    assert off2 in seg2.used
    seg3, _ = pool.alloc(4096)  # applies the queued free first
    assert seg3 is seg2 and off2 in seg2.used  # the same range, handed out again
    pool.close()




def test_clientd_waits_for_a_late_master_then_serves(make_cluster) -> None:
    cl = make_cluster(clientds=1, master_options={"heartbeat_interval_s": 0.2})
    assert cl.master is not None
    cl.master.stop()
    with cl.client(0, timeout_s=5) as a:
        with pytest.raises(CxlkvError) as exc:
            a.put("late/x", b"x")
        assert exc.value.code.name in ("UNAVAILABLE", "NOT_READY")
        cl.restart_master()
        cl.wait_until(lambda: _try_put(a, "late/y"), timeout_s=15, what="the daemon to register again")
        assert a.get("late/y") == b"v"


def _try_put(client, key: str) -> bool:
    try:
        client.put(key, b"v")
        return True
    except CxlkvError:
        return False


# ------------------------------------------------------- wrong region at start
def _run_clientd(tmp_path: Path, master: str, region_path: str, segment: str = "cxl0") -> subprocess.CompletedProcess:
    conf = tmp_path / "bad-clientd.toml"
    conf.write_text(tomli_w.dumps({
        "name": "bad", "master_address": master,
        "socket_path": str(tmp_path / "bad.sock"),
        "regions": [{"segment": segment, "path": region_path}],
    }))
    return subprocess.run([sys.executable, "-m", "cxlkv.cli", "clientd", "--config", str(conf)],
                          capture_output=True, text=True, timeout=60)


def test_daemon_refuses_wrong_regions_at_start(make_cluster, tmp_path: Path) -> None:
    cl = make_cluster(clientds=1)
    bad: list[tuple[str, str, str]] = []
    # 1. a missing file
    bad.append((str(tmp_path / "missing"), "cxl0", "missing"))
    # 2. an unformatted file of the right size
    unformatted = f"/dev/shm/cxlkv-test-{os.getpid()}-unformatted"
    with Region.open(unformatted, size=64 * MiB, create=True):
        pass
    bad.append((unformatted, "cxl0", "not formatted"))
    # 3. a formatted region of another size (the master's cxl0 is 64 MiB)
    other_size = f"/dev/shm/cxlkv-test-{os.getpid()}-othersize"
    with Region.open(other_size, size=32 * MiB, create=True) as r:
        format_region(r, "cxl0")
    bad.append((other_size, "cxl0", "33554432"))
    # 4. the right size, formatted for cxl0, but another device (another uuid)
    other_uuid = f"/dev/shm/cxlkv-test-{os.getpid()}-otheruuid"
    with Region.open(other_uuid, size=64 * MiB, create=True) as r:
        format_region(r, "cxl0")
    bad.append((other_uuid, "cxl0", "uuid"))
    # 5. the cluster's region, but mapped as another segment
    bad.append((cl.region_paths[0], "cxl7", "cxl0"))
    try:
        for path, segment, needle in bad:
            p = _run_clientd(tmp_path, cl.master_address, path, segment)
            assert p.returncode == 2, (path, p.returncode, p.stderr)
            errors = [ln for ln in p.stderr.splitlines() if "ERROR" in ln or ln.startswith("error")]
            assert len(errors) == 1, p.stderr
            assert needle in errors[0], errors[0]
            assert "Traceback" not in p.stderr
            assert not (tmp_path / "bad.sock").exists()
    finally:
        for path in (unformatted, other_size, other_uuid):
            Path(path).unlink(missing_ok=True)
    # the cluster is unharmed
    with cl.client(0) as a:
        a.put("wrong/ok", b"ok")
    cl.assert_invariants()


def test_daemon_refuses_a_socket_in_use(make_cluster, tmp_path: Path) -> None:
    cl = make_cluster(clientds=1)
    conf = tmp_path / "dup.toml"
    conf.write_text(tomli_w.dumps({
        "name": "dup", "master_address": cl.master_address, "socket_path": cl.socket_path(0),
        "regions": [{"segment": "cxl0", "path": cl.region_paths[0]}],
    }))
    p = subprocess.run([sys.executable, "-m", "cxlkv.cli", "clientd", "--config", str(conf)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "in use" in p.stderr and "Traceback" not in p.stderr
    with cl.client(0) as a:
        a.put("dup/ok", b"ok")  # the first daemon still serves


def test_replica_on_a_segment_this_host_does_not_map_is_revoked(tmp_path: Path) -> None:
    from conftest import TestCluster

    cl = TestCluster(tmp_path / "partial", clientds=1, segments=2, region_size_bytes=16 * MiB,
                     master_options={"sweep_interval_s": 0.05})
    cl.clientd_options["regions"] = [{"segment": "cxl0", "path": cl.region_paths[0]}]  # not cxl1
    cl.start()
    try:
        with cl.client(0) as a:
            with pytest.raises(Unavailable, match="not mapped"):
                a.put("partial/two", b"x" * 1000, replica_num=2)
            assert not a.exists("partial/two")
            res = a.put_many([(f"partial/{i}", b"y" * 100) for i in range(4)], replica_num=2)
            assert all(not r.ok and isinstance(r.error, Unavailable) for r in res)
        st = cl.assert_invariants()
        assert st.used_bytes == 0 and st.key_count == 0
        assert st.counters["puts_revoked"] >= 5
    finally:
        assert cl.stop() == []


def test_direct_mode_turns_off_when_the_daemon_returns_on_another_region(tmp_path: Path) -> None:
    """A Client whose daemon comes back mapping another region (reformatted, or
    another device) under the same socket: direct mode notices at the reconnection
    and turns itself off — reads go through the daemon and return the new bytes —
    instead of failing every direct read against the old mapping."""
    import numpy as np

    from cxlkv.deploy.cluster import LocalCluster

    run_dir = tmp_path / "same"
    a = LocalCluster(run_dir, clientds=1, region_size_bytes=64 * MiB)
    a.start()
    b = None
    try:
        c = __import__("cxlkv").Client(a.socket_path(0), retry_s=30)
        try:
            assert c.direct, c.direct_status
            c.put("rg/k", b"old" * 100_000)
            a.stop()
            b = LocalCluster(run_dir, clientds=1, region_size_bytes=64 * MiB)
            b.start()
            assert b.socket_path(0) == a.socket_path(0)
            new = os.urandom(300_000)
            with __import__("cxlkv").Client(b.socket_path(0)) as w:
                w.put("rg/k", new)
            dst = np.zeros(len(new), dtype=np.uint8)
            assert c.get_into("rg/k", dst) == len(new) and dst.tobytes() == new
            assert not c.direct and "make a new Client" in c.direct_status
            c.put("rg/k2", new)  # puts take the daemon's path too
            assert c.get("rg/k2") == new
        finally:
            c.close()
    finally:
        if b is not None:
            b.stop()
        a.stop()


def test_grpc_idle_restart_costs_no_unknown_buffer(make_cluster) -> None:
    """gRPC learns of a reconnection only after the first call on it: a call that
    the restarted daemon refuses with UNKNOWN_BUFFER (the pool's buffers are
    forgotten) is made once more with new buffers — even without retry_s, as the
    daemon did nothing with it."""
    import numpy as np

    cl = make_cluster(clientds=1)
    big = os.urandom(200_000)
    with cl.client(0, protocol="grpc", direct=False) as c:
        c.put("gi/a", big)  # staged through a pool segment
        dst = np.zeros(len(big), dtype=np.uint8)
        assert c.get_into("gi/a", dst) == len(big)
        for _ in range(2):
            cl.restart_clientd(0)
            dst[:] = 0
            assert c.get_into("gi/a", dst) == len(big) and dst.tobytes() == big
            c.put_from("gi/b", dst, upsert=True)  # a write too
            assert c.get("gi/b") == big
    cl.assert_invariants()


def test_direct_mode_stays_on_across_a_restart_before_registration(make_cluster) -> None:
    """A clientd restarted on the same region answers DirectInfo with no region
    until it has registered with its master; a Client reconnecting in that window
    cannot tell yet, asks again later, and keeps direct mode."""
    import signal

    import numpy as np

    from cxlkv.deploy.cluster import wait_for_file

    cl = make_cluster(clientds=1)
    big = os.urandom(300_000)
    with cl.client(0, retry_s=60) as c:
        assert c.direct, c.direct_status
        c.put("dr/a", big)
        cl.clientds[0].stop()
        cl.master.signal(signal.SIGSTOP)  # the new daemon cannot register meanwhile
        try:
            p = cl._make_clientd(0)
            p.start()
            cl.clientds[0] = p
            deadline = time.monotonic() + 30
            while not Path(cl.lean_socket_path(0)).exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            threading.Timer(1.0, cl.master.signal, args=(signal.SIGCONT,)).start()
            dst = np.zeros(len(big), dtype=np.uint8)
            assert c.get_into("dr/a", dst) == len(big) and dst.tobytes() == big
        finally:
            cl.master.signal(signal.SIGCONT)
        wait_for_file(cl.run_dir / "clientd-0.ready", 60, p)
        assert c.get_into("dr/a", dst) == len(big)
        assert c.direct, c.direct_status
    cl.assert_invariants()


def test_a_master_stopped_past_client_ttl_expires_no_clientd(make_cluster) -> None:
    """SIGSTOP of the master for longer than client_ttl_s, then SIGCONT: every clientd
    used to be expired at once ("sweep: 2 client(s) expired"; in-flight puts revoked,
    reservations quarantined, every daemon registering again) although all of them
    heartbeated all along. The master's own stall is credited to them now."""
    import signal

    cl = make_cluster(master_options={"client_ttl_s": 2.0, "heartbeat_interval_s": 0.3})
    with cl.client(0) as c:
        c.put("stall/k", b"v" * 4096)
        assert cl.master is not None
        before = dict(cl.master_stat().counters)
        cl.master.signal(signal.SIGSTOP)
        try:
            time.sleep(4.0)  # twice client_ttl_s
            assert c.get("stall/k") == b"v" * 4096  # reads go on meanwhile (the index)
        finally:
            cl.master.signal(signal.SIGCONT)
        time.sleep(2.0)
        after = dict(cl.master_stat().counters)
        assert after["clients_expired"] == before["clients_expired"], after
        assert after["clients_registered"] == before["clients_registered"], after
        c.put("stall/after", b"w")
        assert c.get("stall/after") == b"w"
    assert "did not run for" in (cl.run_dir / "master.log").read_text()
    cl.assert_invariants()
