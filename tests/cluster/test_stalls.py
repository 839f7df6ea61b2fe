"""No call stalls a daemon (issue 18, item 2), on real processes.

* RemoveAll of many keys runs by slices: the master answers heartbeats meanwhile
  (probed from outside) and its own stall metric stays bounded;
* a batch over ``max_batch_items`` or a request over ``max_request_bytes`` is
  refused with its own error (LimitExceeded, TOO_LARGE) on clientd (gRPC and lean
  framings) and on the master, and the daemon goes on answering; the SDK splits
  larger batches by itself;
* pattern removal runs on RE2: a pathological pattern finishes at once.

Timing bounds leave room for a loaded 2-core machine: the contract is 100 ms, the
asserts are a few times that, well below what an unsliced call takes (the 200k-key
RemoveAll below holds the loop 0.7-1 s in one piece).
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time

import grpc
import pytest

from cxlkv.client.framing import METHODS_BY_NAME
from cxlkv.errors import ErrorCode, InvalidArgument, LimitExceeded, from_rpc_error
from cxlkv.config import ClientdConfig, MasterConfig
from cxlkv.v1 import client_pb2, client_pb2_grpc, common_pb2, master_pb2
from master_harness import Writer
from ops_helpers import scrape

MiB = 1 << 20
#: Heartbeat/Stat answer bound asserted while a long call runs (the contract is
#: 100 ms; the rest is margin for a loaded machine and the probe's own gRPC cost).
PROBE_BOUND_S = 0.2
#: Bound on the daemon's own measure of its longest event-loop stall.
STALL_BOUND_S = 0.25


def _insert_through_master(cluster, n: int, prefix: str, batch: int = 2048, **options) -> None:
    """Commit ``n`` empty values straight through the master's batch put path."""
    w = Writer(cluster.master_stub(), name="bulk")
    for start in range(0, n, batch):
        keys = [f"{prefix}{i:09d}" for i in range(start, min(n, start + batch))]
        statuses = w.batch_put(keys, 0, **options)
        assert all(s.code == 0 for s in statuses), [s for s in statuses if s.code][:3]


class _Probe:
    """A thread that calls ``fn`` every 10 ms and keeps the longest answer time."""

    def __init__(self, fn) -> None:
        self.fn = fn
        self.latencies: list[float] = []
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.perf_counter()
            try:
                self.fn()
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                self.errors.append(exc)
            self.latencies.append(time.perf_counter() - t0)
            time.sleep(0.01)

    def __enter__(self) -> "_Probe":
        self._thread.start()
        time.sleep(0.2)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    @property
    def worst_s(self) -> float:
        return max(self.latencies)


def _stalls_over(url: str, bound_s: float) -> tuple[int, float]:
    """(event-loop stalls longer than ``bound_s`` so far, the window's longest stall in s)."""
    deadline = time.monotonic() + 10
    while True:
        sc = scrape(url)
        total = sc.value("cxlkv_event_loop_stall_seconds_count")
        if total > 0:
            break
        assert time.monotonic() < deadline, "no stall samples: the monitor does not run"
        time.sleep(0.1)  # a daemon that just started: its first wake-up is 50 ms away
    within = sc.value("cxlkv_event_loop_stall_seconds_bucket", le=repr(float(bound_s)))
    return int(total - within), sc.value("cxlkv_event_loop_stall_max_seconds")


def test_remove_all_of_many_keys_keeps_the_master_answering(make_cluster) -> None:
    # CXLKV_STALL_KEYS=2000000 measures the 2M keys (~2 min of inserts first)
    n = int(os.environ.get("CXLKV_STALL_KEYS", "200000"))
    cluster = make_cluster(clientds=1, region_size_bytes=max(128 * MiB, n * 128 + 64 * MiB),
                           master_options={"client_ttl_s": 3.0, "heartbeat_interval_s": 0.5})
    _insert_through_master(cluster, n, "many/")
    assert cluster.master_stat(False).key_count == n
    master_url = cluster.master_stat(False).metrics_url
    # The probe is a registered client heartbeating, as a clientd does.
    probe_client = Writer(cluster.master_stub(), name="probe")
    with cluster.client(0, timeout_s=max(30.0, n / 50_000)) as c:
        over_before, _ = _stalls_over(master_url, STALL_BOUND_S)
        with _Probe(probe_client.heartbeat) as probe:
            t0 = time.perf_counter()
            removed = c.remove_all()
            took = time.perf_counter() - t0
        assert removed == n
        assert not probe.errors, probe.errors[:3]
        over_after, window_max = _stalls_over(master_url, STALL_BOUND_S)
        lat = sorted(probe.latencies)
        print(f"remove_all of {n} keys: {took:.2f} s; heartbeats p50 {lat[len(lat) // 2] * 1000:.1f} ms, "
              f"p99 {lat[int(len(lat) * 0.99)] * 1000:.1f} ms, worst {probe.worst_s * 1000:.1f} ms over "
              f"{len(probe.latencies)} probes; master stalls over {STALL_BOUND_S} s: {over_after - over_before}; "
              f"longest stall of the last minute {window_max * 1000:.1f} ms")
        assert len(probe.latencies) >= 10  # the probe ran throughout
        assert probe.worst_s < PROBE_BOUND_S, sorted(probe.latencies)[-5:]
        assert over_after == over_before  # no stall past the bound while it ran
        # nobody expired meanwhile (client_ttl_s = 3 s), and the daemon still works
        st = cluster.master_stat()
        assert st.key_count == 0
        assert all(cl.alive for cl in st.clients if cl.name == "clientd-0")
        c.put("many/after", b"x")
        assert c.get("many/after") == b"x"
    cluster.assert_invariants()


def test_unmounting_a_segment_of_many_objects_keeps_the_master_answering(make_cluster) -> None:
    n = 100_000
    cluster = make_cluster(clientds=1, segments=2, master_options={"client_ttl_s": 3.0})
    _insert_through_master(cluster, n, "seg/", preferred_segment="cxl0")
    master_url = cluster.master_stat(False).metrics_url
    probe_client = Writer(cluster.master_stub(), name="probe")
    over_before, _ = _stalls_over(master_url, STALL_BOUND_S)
    with _Probe(probe_client.heartbeat) as probe:
        t0 = time.perf_counter()
        r = cluster.master_stub().UnmountSegment(master_pb2.UnmountSegmentRequest(name="cxl0"), timeout=120)
        took = time.perf_counter() - t0
    over_after, _ = _stalls_over(master_url, STALL_BOUND_S)
    print(f"unmount of a segment of {n} objects: {took:.2f} s; heartbeat worst {probe.worst_s * 1000:.1f} ms; "
          f"stalls over {STALL_BOUND_S} s: {over_after - over_before}")
    assert (r.replicas_lost, r.objects_lost) == (n, n)
    assert not probe.errors and probe.worst_s < PROBE_BOUND_S, sorted(probe.latencies)[-5:]
    assert over_after == over_before
    st = cluster.assert_invariants()
    assert st.key_count == 0 and [s.name for s in st.segments if s.mounted] == ["cxl1"]
    with cluster.client(0) as c:  # the cluster goes on in the other segment
        c.put("seg/after", b"x")
        assert c.get("seg/after") == b"x"


def test_pathological_pattern_finishes_at_once(cluster) -> None:
    with cluster.client(0) as c:
        long_keys = [f"patho/{i}/" + "a" * 4000 + "b" for i in range(20)]
        c.put_many([(k, b"v") for k in long_keys])
        c.put("patho/aaaa", b"w")
        t0 = time.perf_counter()
        assert c.remove_all(regex="(a+)+$") == 1  # only the key ending in a's (backtracking: minutes)
        took = time.perf_counter() - t0
        assert took < 2.0, took
        assert c.remove_all(regex=r"^patho/1\d/") == 10
        with pytest.raises(InvalidArgument, match="look-around"):
            c.remove_all(regex="(?=a)")  # RE2 has no look-ahead: refused with the reason
        with pytest.raises(InvalidArgument, match="missing"):
            c.remove_all(regex="[")
        assert c.stat()  # the daemon answers
        assert sum(c.exists_many(long_keys)) == 10
    # the master's own Pattern path (gRPC, as a tool would call it)
    stub = cluster.master_stub()
    assert stub.RemoveAll(master_pb2.RemoveAllRequest(pattern="(a+)+$"), timeout=10).removed == 0
    cluster.assert_invariants()


def _lean_call(path: str, method: str, request, rid: int = 1) -> tuple[int, bytes]:
    """One raw lean frame on clientd's socket: (code, payload)."""
    m = METHODS_BY_NAME[method]
    payload = request.SerializeToString()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(path)
        s.sendall(struct.pack("<IHHQ", 12 + len(payload), m.number, 0, rid) + payload)
        head = b""
        while len(head) < 16:
            chunk = s.recv(16 - len(head))
            assert chunk, "connection closed"
            head += chunk
        length, code, _flags, got = struct.unpack("<IHHQ", head)
        assert got == rid
        body = b""
        while len(body) < length - 12:
            chunk = s.recv(length - 12 - len(body))
            assert chunk, "connection closed"
            body += chunk
    return code, body


def test_oversized_calls_get_their_own_error_and_the_daemons_go_on(make_cluster) -> None:
    cluster = make_cluster(clientds=1, clientd_options={"max_request_bytes": 17 * MiB})
    limit = ClientdConfig().max_batch_items
    too_many = [f"big/{i}" for i in range(limit + 1)]
    (clientd_url,) = [cl.metrics_url for cl in cluster.master_stat(False).clients if cl.name == "clientd-0"]
    clientd_over_before, _ = _stalls_over(clientd_url, STALL_BOUND_S)
    # clientd, gRPC framing
    with grpc.insecure_channel(f"unix:{cluster.socket_path(0)}") as ch:
        stub = client_pb2_grpc.ClientServiceStub(ch)
        with pytest.raises(grpc.RpcError) as info:
            stub.BatchExist(client_pb2.BatchExistRequest(keys=too_many), timeout=30)
        err = from_rpc_error(info.value)
        assert err.code == ErrorCode.TOO_LARGE and "max_batch_items" in err.message, err
        assert f"{limit + 1} items in one call is over the limit of {limit}" in err.message
        # over max_request_bytes (17 MiB here): gRPC's own limit, read as LimitExceeded
        with pytest.raises(grpc.RpcError) as info:
            stub.Put(client_pb2.PutRequest(key="big/v", value=b"x" * (18 * MiB)), timeout=30)
        err = from_rpc_error(info.value)
        assert isinstance(err, LimitExceeded) and "max_request_bytes" in err.message, err
        assert stub.Stat(client_pb2.ClientStatRequest(), timeout=10).name == "clientd-0"
    # clientd, lean framing: the same error as a frame
    code, body = _lean_call(cluster.lean_socket_path(0), "BatchRemove",
                            client_pb2.ClientBatchRemoveRequest(keys=too_many))
    detail = common_pb2.ErrorDetail.FromString(body)
    assert code == int(ErrorCode.TOO_LARGE) and "max_batch_items" in detail.message, detail
    code, body = _lean_call(cluster.lean_socket_path(0), "Exist", client_pb2.ExistRequest(key="big/x"))
    assert code == 0 and client_pb2.ExistResponse.FromString(body).exists is False
    # refused before any work: clientd's loop was never held meanwhile
    assert _stalls_over(clientd_url, STALL_BOUND_S)[0] == clientd_over_before
    # the master refuses the same way (gRPC; its lean port shares the handler)
    with pytest.raises(grpc.RpcError) as info:
        cluster.master_stub().ExistKey(master_pb2.ExistKeyRequest(keys=too_many), timeout=30)
    err = from_rpc_error(info.value)
    assert err.code == ErrorCode.TOO_LARGE and "max_batch_items" in err.message, err
    # nested items count too: two queries of a MatchPrefix, each under the limit
    half = MasterConfig().max_batch_items // 2 + 1
    queries = [master_pb2.PrefixQuery(keys=[f"q/{i}" for i in range(half)]) for _ in range(2)]
    with pytest.raises(grpc.RpcError) as info:
        cluster.master_stub().MatchPrefix(master_pb2.MatchPrefixRequest(queries=queries), timeout=30)
    assert f"{2 * half} items" in from_rpc_error(info.value).message
    assert cluster.master_stat().key_count == 0  # the master answers
    # the SDK splits a larger batch into calls under the limit: the user never sees it
    with cluster.client(0) as c:
        keys = [f"big/sdk/{i}" for i in range(limit + 10)]
        results = c.put_many([(k, b"") for k in keys[:3000]])
        assert all(r.ok for r in results)
        found = c.exists_many(keys)
        assert sum(found) == 3000 and found[:3000] == [True] * 3000
        # a long prefix query: the SDK asks 1,024 keys at a time, prefix after prefix …
        dsts = [bytearray(1) for _ in range(3010)]
        assert c.get_prefix_into(keys[:3010], dsts) == 3000
        # … and clientd does the same towards the master when a caller sends it more
        import cxlkv.client._daemon as sdk

        sdk_batch, sdk.BATCH_ITEMS = sdk.BATCH_ITEMS, 4096
        try:
            assert c.get_prefix_into(keys[:3010], dsts) == 3000
        finally:
            sdk.BATCH_ITEMS = sdk_batch
        assert all(r.ok for r in c.remove_many(keys[:3000]))
    cluster.assert_invariants()
    assert cluster.clientds[0].alive() and cluster.master.alive()


# ------------------------------------------------------- the cursors, pure state


def _state_with(n: int, segments: int = 1):
    from cxlkv.config import SegmentConfig
    from cxlkv.master.state import MasterState

    cfg = MasterConfig(segments=[SegmentConfig(name=f"cxl{i}", size_bytes=16 * MiB) for i in range(segments)])
    cfg.validate()
    clock = [0.0]
    st = MasterState(cfg, work_clock=lambda: clock[0])
    c = st.register_client("h", "w", 1, [], "", "", 0.0)
    keys = [f"k/{i:05d}" for i in range(n)]
    for j, seg in enumerate(f"cxl{i}" for i in range(segments)):
        part = keys[j::segments]
        for k in part:
            obj = st.put_start(c.client_id, c.epoch, k, 10, 0.0, preferred_segment=seg)
            st.put_end(c.client_id, c.epoch, k, obj.version, 0.0)
    return st, c, clock


def test_remove_all_cursor_runs_by_budget_and_sees_changes_between_slices() -> None:
    st, c, clock = _state_with(1000)
    cursor = st.remove_all_start(pattern=r"^k/0")  # every key
    # a work clock that advances 1 ms per look: a 2 ms budget ends a slice at the second look
    ticking = iter(range(10**6))
    st._work_clock = lambda: next(ticking) * 1e-3
    assert cursor.step(0.0, 0.002) is False and 0 < cursor.removed < 1000
    first = cursor.removed
    # between slices: one key removed, one replaced (upsert), one new key committed
    st.remove("k/00999", 0.0)
    obj = st.put_start(c.client_id, c.epoch, "k/00998", 5, 0.0, upsert=True)
    st.put_end(c.client_id, c.epoch, "k/00998", obj.version, 0.0)
    new = st.put_start(c.client_id, c.epoch, "k/0new", 1, 0.0)
    st.put_end(c.client_id, c.epoch, "k/0new", new.version, 0.0)
    st.check_invariants()  # consistent between slices
    while not cursor.step(0.0, 0.002):
        st.check_invariants()
    assert cursor.removed == 998 and cursor.removed > first  # not the removed, replaced or new ones
    assert st.key_count == 2 and st.exists("k/00998") and st.exists("k/0new")
    st.check_invariants()


def test_unmount_cursor_keeps_reads_and_accounting_right_between_slices() -> None:
    from cxlkv.errors import NotReady

    st, c, clock = _state_with(2000, segments=2)
    ticking = iter(range(10**6))
    st._work_clock = lambda: next(ticking) * 1e-3
    cursor = st.unmount_start("cxl0", 0.0)
    assert cursor.step(0.0, 0.002) is False
    # between slices: no new extents there, its name cannot be mounted again, the
    # objects not reached yet are still readable (their bytes are untouched)
    assert all(s.name != "cxl0" for s in st.segments())
    with pytest.raises(NotReady):
        st.mount_segment(c.client_id, c.epoch, "cxl0", 1, 16 * MiB, "", "", 0.0)
    assert st.get_object("k/01998") is not None
    st.remove("k/01998", 0.0, force=True)  # removed mid-unmount: freed where it can be
    st.check_invariants()
    while not cursor.step(0.0, 0.002):
        st.check_invariants()
    assert (cursor.replicas_lost, cursor.objects_lost) == (999, 999)
    assert st.key_count == 1000 and all(st.get_object(f"k/{i:05d}") is not None for i in range(1, 2000, 2))
    st.check_invariants()


def test_coalescer_counts_weights_against_its_item_limit() -> None:
    """clientd's prefix queries are coalesced by their keys, not by queries: a call
    to the master never holds more keys than its max_batch_items."""
    import asyncio

    from cxlkv.clientd.batcher import Coalescer

    calls: list[list[list[str]]] = []

    async def send(queries: list[list[str]]) -> list[int]:
        calls.append(queries)
        await asyncio.sleep(0)
        return [len(q) for q in queries]

    async def scenario() -> list:
        co: Coalescer = Coalescer("q", send, max_items=100, weight=len)
        sizes = [60, 30, 30, 5, 100, 150]
        return await asyncio.gather(*(co.submit([[f"k{i}"] * n]) for i, n in enumerate(sizes)))

    results = asyncio.run(scenario())
    assert [r[0] for r in results] == [60, 30, 30, 5, 100, 150]  # every query answered, in order
    assert all(sum(map(len, c)) <= 100 or len(c) == 1 for c in calls), [list(map(len, c)) for c in calls]
    assert sum(len(c) for c in calls) == 6
