"""The servicer in-process: error mapping, INTERNAL for bugs, per-item statuses."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import grpc
import pytest
from google.rpc import status_pb2

from cxlkv.config import MasterConfig, SegmentConfig
from cxlkv.errors import ErrorCode, error_for
from cxlkv.master.service import MasterServicer
from cxlkv.master.state import MasterState
from cxlkv.v1 import common_pb2, master_pb2

MiB = 1 << 20


class Aborted(Exception):
    """What the fake context raises, like grpc.aio's AbortError."""


class FakeContext:
    def __init__(self) -> None:
        self.status: grpc.Status | None = None

    async def abort_with_status(self, status: grpc.Status) -> None:
        self.status = status
        raise Aborted()


def call(servicer: MasterServicer, method: str, request: Any) -> tuple[Any, FakeContext]:
    ctx = FakeContext()

    async def run() -> Any:
        try:
            return await getattr(servicer, method)(request, ctx)
        except Aborted:
            return None

    return asyncio.run(run()), ctx


def detail(ctx: FakeContext) -> common_pb2.ErrorDetail:
    assert ctx.status is not None
    st = status_pb2.Status.FromString(dict(ctx.status.trailing_metadata)["grpc-status-details-bin"])
    d = common_pb2.ErrorDetail()
    assert st.details[0].Unpack(d)
    return d


@pytest.fixture
def servicer() -> MasterServicer:
    clock = [100.0]
    st = MasterState(MasterConfig(segments=[SegmentConfig(name="cxl0", size_bytes=8 * MiB)]))
    return MasterServicer(st, clock=lambda: clock[0])


def test_a_refused_call_carries_the_cxlkv_detail_and_positions_their_codes(servicer: MasterServicer) -> None:
    # A call refused as a whole: a gRPC status with the ErrorDetail.
    resp, ctx = call(servicer, "Heartbeat", master_pb2.HeartbeatRequest(client_id="nobody", epoch=1))
    assert resp is None and ctx.status.code == grpc.StatusCode.UNAUTHENTICATED
    assert detail(ctx).code == ErrorCode.UNKNOWN_CLIENT and detail(ctx).message
    # A batch call: every position answers its own code and message.
    locs, ctx = call(servicer, "GetReplicaList", master_pb2.GetReplicaListRequest(keys=["missing"]))
    assert ctx.status is None and list(locs.codes) == [ErrorCode.NOT_FOUND] and "not found" in locs.messages[0]
    reg, _ = call(servicer, "RegisterClient", master_pb2.RegisterClientRequest(hostname="h"))
    started, ctx = call(servicer, "PutStart", master_pb2.PutStartRequest(
        client_id=reg.client_id, epoch=reg.epoch, keys=["k"], value_size_bytes=[9 * MiB]))
    assert ctx.status is None and list(started.codes) == [ErrorCode.TOO_LARGE]
    assert error_for(started.codes[0], started.messages[0]).code == ErrorCode.TOO_LARGE


def test_unexpected_exception_becomes_one_line_internal(servicer: MasterServicer, monkeypatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    def boom(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("bad\nthing")

    monkeypatch.setattr(servicer.state, "remove", boom)
    with caplog.at_level(logging.ERROR, logger="cxlkv.master.service"):
        _, ctx = call(servicer, "Remove", master_pb2.RemoveRequest(keys=["k"]))
    assert ctx.status.code == grpc.StatusCode.INTERNAL
    d = detail(ctx)
    assert d.code == ErrorCode.INTERNAL and "\n" not in d.message and "RuntimeError: bad thing" in d.message
    assert sum("Remove failed" in r.getMessage() for r in caplog.records) == 1
    assert caplog.records[-1].exc_info is not None  # the traceback goes to the log


def test_puts_answer_per_position(servicer: MasterServicer) -> None:
    from cxlkv.clientd.master_link import unpack_put_starts

    reg, _ = call(servicer, "RegisterClient", master_pb2.RegisterClientRequest(hostname="h"))
    cid, ep = reg.client_id, reg.epoch
    resp, ctx = call(servicer, "PutStart", master_pb2.PutStartRequest(
        client_id=cid, epoch=ep, keys=["a", "", "b", "a"], value_size_bytes=[10, 10, 0, 10],
        header_bytes=[128, 128, 64, 128],
        options=[common_pb2.PutOptions(), common_pb2.PutOptions(), common_pb2.PutOptions(replica_num=2),
                 common_pb2.PutOptions()]))
    assert ctx.status is None
    a, bad, b, dup = unpack_put_starts(resp)
    from cxlkv.clientd.master_link import StartedExtent, StartedPut

    assert all(len(x) == len(StartedPut._fields) for x in (a, bad, b, dup))
    assert all(len(e) == len(StartedExtent._fields) for x in (a, b, dup) for e in x[3])
    assert a.status.code == 0 and a.put_token == a.version and len(a.extents) == 1
    assert a.extents[0].length_bytes == 192  # 128 B header + 10 B value, 64-aligned
    assert bad.status.code == ErrorCode.INVALID_KEY and bad.extents == () and bad.status.message
    assert b.replicas_wanted == 2 and len(b.extents) == 1  # best effort: one segment
    assert dup.status.code == ErrorCode.NOT_READY  # "a" is in flight from position 0
    assert list(resp.error_positions) == [1, 3]
    # End: a good token, a stale one, a wrong key; checksums ride along.
    end, ctx = call(servicer, "PutEnd", master_pb2.PutEndRequest(
        client_id=cid, epoch=ep, keys=["a", "b", "zzz"], put_tokens=[a.put_token, b.put_token + 99, b.put_token],
        checksums=[7, 8, 9]))
    assert ctx.status is None and list(end.codes) == [0, ErrorCode.STALE_TOKEN, ErrorCode.STALE_TOKEN]
    assert list(end.error_positions) == [1, 2] and all(end.messages)
    assert servicer.state.get(cid, "a", servicer.clock())[0].checksum == 7
    rev, _ = call(servicer, "PutRevoke", master_pb2.PutEndRequest(
        client_id=cid, epoch=ep, keys=["b"], put_tokens=[b.put_token]))
    assert list(rev.codes) == [0]
    assert servicer.state.segment_table.mounted[0].used_bytes == 192  # only "a" holds space
    # An expired client's batch: every position answers, the call does not fail.
    servicer.clock = lambda: 10_000.0
    resp, ctx = call(servicer, "PutStart", master_pb2.PutStartRequest(
        client_id=cid, epoch=ep, keys=["c", "d"], value_size_bytes=[1, 1]))
    assert ctx.status is None and list(resp.codes) == [ErrorCode.UNKNOWN_CLIENT] * 2


@pytest.mark.parametrize("fields", [
    {"value_size_bytes": [1]},                                   # fewer sizes than keys
    {"value_size_bytes": [1, 2], "header_bytes": [64]},          # header_bytes neither empty nor one per key
    {"value_size_bytes": [1, 2], "options": [common_pb2.PutOptions()]},
])
def test_put_start_refuses_ragged_columns(servicer: MasterServicer, fields: dict) -> None:
    reg, _ = call(servicer, "RegisterClient", master_pb2.RegisterClientRequest(hostname="h"))
    resp, ctx = call(servicer, "PutStart", master_pb2.PutStartRequest(
        client_id=reg.client_id, epoch=reg.epoch, keys=["a", "b"], **fields))
    assert resp is None and detail(ctx).code == ErrorCode.INVALID_ARGUMENT
    assert servicer.state.segment_table.mounted[0].used_bytes == 0  # nothing was placed
    resp, ctx = call(servicer, "PutEnd", master_pb2.PutEndRequest(
        client_id=reg.client_id, epoch=reg.epoch, keys=["a", "b"], put_tokens=[1]))
    assert resp is None and detail(ctx).code == ErrorCode.INVALID_ARGUMENT


def test_unpacking_a_ragged_answer_is_an_internal_error() -> None:
    from cxlkv.clientd.master_link import unpack_put_starts
    from cxlkv.errors import Internal

    with pytest.raises(Internal, match="disagree"):
        unpack_put_starts(master_pb2.PutStartResponse(
            codes=[0], put_tokens=[1], versions=[1], replicas_wanted=[1], extent_counts=[2],
            segment_ids=[1], offsets_bytes=[0], lengths_bytes=[64]))


def _commit(servicer: MasterServicer, cid: str, ep: int, keys: list[str], replica_num: int = 1) -> None:
    resp, _ = call(servicer, "PutStart", master_pb2.PutStartRequest(
        client_id=cid, epoch=ep, keys=keys, value_size_bytes=[100] * len(keys), header_bytes=[128] * len(keys),
        options=[common_pb2.PutOptions(replica_num=replica_num)] * len(keys)))
    end, _ = call(servicer, "PutEnd", master_pb2.PutEndRequest(
        client_id=cid, epoch=ep, keys=keys, put_tokens=list(resp.put_tokens), checksums=[11] * len(keys)))
    assert list(end.codes) == [0] * len(keys)


def _as_tuple(loc: Any) -> tuple:
    """The fields a reader uses from a clientd Location, the lease as granted or not."""
    return (loc.status.code, loc.value_size_bytes, loc.version, bool(loc.lease_id), loc.lease_ttl_ms,
            loc.checksum, loc.header_bytes,
            [(r.segment_id, r.offset_bytes, r.length_bytes, int(r.tier)) for r in loc.replicas])


def test_reads_answer_per_position_with_leases_and_replicas_best_first() -> None:
    """GetReplicaList and MatchPrefix: a location (and a lease) per found key, the
    error of the others, replicas best first; MatchPrefix's locations are those of
    each query's matched keys, concatenated."""
    from cxlkv.clientd.master_link import unpack_locations

    st = MasterState(MasterConfig(segments=[SegmentConfig(name="cxl0", size_bytes=8 * MiB),
                                            SegmentConfig(name="cxl1", size_bytes=8 * MiB)]))
    servicer = MasterServicer(st, clock=lambda: 100.0)
    reg, _ = call(servicer, "RegisterClient", master_pb2.RegisterClientRequest(hostname="h"))
    cid, ep = reg.client_id, reg.epoch
    _commit(servicer, cid, ep, ["a", "b"])
    _commit(servicer, cid, ep, ["two"], replica_num=2)
    ttl_ms = int(st.config.lease_ttl_s * 1000)

    def expected(key: str) -> tuple:
        obj = st.get(cid, key, 100.0, no_lease=True)[0]
        return (0, 100, obj.version, True, ttl_ms, 11, 128,
                [(sid, off, n, int(st.segment(sid).tier)) for sid, off, n in obj.extents])

    keys = ["a", "missing", "", "two", "b", "a"]
    packed, ctx = call(servicer, "GetReplicaList", master_pb2.GetReplicaListRequest(client_id=cid, keys=keys))
    assert ctx.status is None
    locs = unpack_locations(packed)
    assert [x.status.code for x in locs] == [0, ErrorCode.NOT_FOUND, ErrorCode.INVALID_KEY, 0, 0, 0]
    assert [_as_tuple(locs[i]) for i in (0, 3, 4, 5)] == [expected(k) for k in ("a", "two", "b", "a")]
    assert locs[1].status.message and locs[1].replicas == () and locs[1].lease_id == 0
    assert len(locs[3].replicas) == 2 and locs[0].checksum == 11 and locs[0].header_bytes == 128
    assert len({x.lease_id for x in locs if x.lease_id}) == 4  # a lease per located key
    # Built without NamedTuple's own __new__ (hot path): every field is there.
    from cxlkv.clientd.master_link import Location, LocatedReplica

    assert all(len(x) == len(Location._fields) for x in locs)
    assert all(len(r) == len(LocatedReplica._fields) for x in locs for r in x.replicas)
    # Prefix: per query, the matched keys' locations, concatenated.
    preq = master_pb2.MatchPrefixRequest(client_id=cid, queries=[
        master_pb2.PrefixQuery(keys=["a", "b", "missing", "two"]), master_pb2.PrefixQuery(keys=["missing"]),
        master_pb2.PrefixQuery(keys=["two", "a"])])
    packed, ctx = call(servicer, "MatchPrefix", preq)
    assert ctx.status is None and list(packed.matched) == [2, 0, 2]
    assert [_as_tuple(x) for x in unpack_locations(packed.locations)] == [
        expected(k) for k in ("a", "b", "two", "a")]
    # No lease asked: none granted.
    nolease, _ = call(servicer, "GetReplicaList", master_pb2.GetReplicaListRequest(
        client_id=cid, keys=["a"], no_lease=True))
    assert list(nolease.lease_ids) == [0] and list(nolease.lease_ttl_ms) == [0]
    # Leases ride along to be released before the answer.
    held = [x.lease_id for x in locs if x.lease_id]
    assert len(st.leases) == 4 + 4
    call(servicer, "GetReplicaList", master_pb2.GetReplicaListRequest(
        client_id=cid, keys=["b"], no_lease=True, release_lease_ids=held))
    assert len(st.leases) == 4


def test_unpacking_ragged_locations_is_an_internal_error() -> None:
    from cxlkv.clientd.master_link import unpack_locations
    from cxlkv.errors import Internal

    with pytest.raises(Internal, match="disagree"):
        unpack_locations(master_pb2.Locations(
            codes=[0], value_size_bytes=[1], versions=[1], lease_ids=[0], lease_ttl_ms=[0], checksums=[0],
            header_bytes=[64], replica_counts=[2], segment_ids=[1], offsets_bytes=[0], lengths_bytes=[64],
            tiers=[1]))


@pytest.mark.parametrize("codes,positions,messages", [
    ([0, 5], [], []),            # a failed position not listed
    ([0, 5], [1], []),           # a position without its message
    ([0, 5], [2], ["x"]),        # a position out of range
    ([0, 5], [0], ["x"]),        # a listed position whose code is OK
])
def test_unpacking_inconsistent_error_columns_is_an_internal_error(codes, positions, messages) -> None:
    from cxlkv.clientd.master_link import unpack_locations
    from cxlkv.errors import Internal

    n = len(codes)
    with pytest.raises(Internal, match="packed answer"):
        unpack_locations(master_pb2.Locations(
            codes=codes, value_size_bytes=[0] * n, versions=[0] * n, lease_ids=[0] * n, lease_ttl_ms=[0] * n,
            checksums=[0] * n, header_bytes=[0] * n, replica_counts=[0] * n,
            error_positions=positions, messages=messages))


def test_remove_all_takes_an_optional_pattern(servicer: MasterServicer) -> None:
    reg, _ = call(servicer, "RegisterClient", master_pb2.RegisterClientRequest(hostname="h"))
    _commit(servicer, reg.client_id, reg.epoch, ["doc/1", "doc/2", "img/1"])
    resp, ctx = call(servicer, "RemoveAll", master_pb2.RemoveAllRequest(pattern="^doc/"))
    assert ctx.status is None and resp.removed == 2 and servicer.state.key_count == 1
    resp, ctx = call(servicer, "RemoveAll", master_pb2.RemoveAllRequest())
    assert ctx.status is None and resp.removed == 1 and servicer.state.key_count == 0
    _, ctx = call(servicer, "RemoveAll", master_pb2.RemoveAllRequest(pattern="("))
    assert detail(ctx).code == ErrorCode.INVALID_ARGUMENT


def test_exist_and_remove_answer_per_key(servicer: MasterServicer) -> None:
    reg, _ = call(servicer, "RegisterClient", master_pb2.RegisterClientRequest(hostname="h"))
    _commit(servicer, reg.client_id, reg.epoch, ["a"])
    ex, _ = call(servicer, "ExistKey", master_pb2.ExistKeyRequest(keys=["a", "b", ""]))
    assert list(ex.exists) == [True, False, False]
    assert [r.code for r in ex.results] == [0, 0, ErrorCode.INVALID_KEY]
    rm, _ = call(servicer, "Remove", master_pb2.RemoveRequest(keys=["a", "a", "b"]))
    assert [r.code for r in rm.results] == [0, ErrorCode.NOT_FOUND, ErrorCode.NOT_FOUND]


def test_reserve_gives_back_before_it_grants(servicer: MasterServicer) -> None:
    reg, _ = call(servicer, "RegisterClient", master_pb2.RegisterClientRequest(hostname="h"))
    cid, ep = reg.client_id, reg.epoch
    got, ctx = call(servicer, "Reserve", master_pb2.ReserveRequest(
        client_id=cid, epoch=ep, need_bytes=[4096], counts=[3]))
    assert ctx.status is None and list(got.granted) == [3] and len(got.put_tokens) == 3
    assert servicer.state.reserved_count == 3 and not got.unreserved.codes
    back, ctx = call(servicer, "Reserve", master_pb2.ReserveRequest(
        client_id=cid, epoch=ep, unreserve_put_tokens=[got.put_tokens[0], got.put_tokens[1], 12345]))
    assert ctx.status is None and list(back.granted) == []
    assert list(back.unreserved.codes)[:2] == [0, 0] and back.unreserved.codes[2] != 0
    assert list(back.unreserved.error_positions) == [2] and servicer.state.reserved_count == 1
    resp, ctx = call(servicer, "Commit", master_pb2.CommitRequest(
        client_id=cid, epoch=ep, keys=["k"], put_tokens=[got.put_tokens[2]], value_size_bytes=[4096 - 128],
        header_bytes=[128], checksums=[0]))
    assert ctx.status is None and list(resp.codes) == [0] and servicer.state.exists("k")
    _, ctx = call(servicer, "Reserve", master_pb2.ReserveRequest(client_id=cid, epoch=ep, need_bytes=[1]))
    assert detail(ctx).code == ErrorCode.INVALID_ARGUMENT


def test_release_quarantine_by_the_operator_only_for_a_client_that_is_gone(servicer: MasterServicer) -> None:
    reg, _ = call(servicer, "RegisterClient", master_pb2.RegisterClientRequest(hostname="h"))
    _, ctx = call(servicer, "ReleaseQuarantine", master_pb2.ReleaseQuarantineRequest(
        client_id=reg.client_id, writers_gone=True))
    assert detail(ctx).code == ErrorCode.INVALID_ARGUMENT and "alive" in detail(ctx).message
    resp, ctx = call(servicer, "ReleaseQuarantine", master_pb2.ReleaseQuarantineRequest(
        client_id="gone", writers_gone=True))
    assert ctx.status is None and resp.freed_bytes == 0


def test_report_reads_carries_hits_and_damage(servicer: MasterServicer) -> None:
    reg, _ = call(servicer, "RegisterClient", master_pb2.RegisterClientRequest(hostname="h"))
    _commit(servicer, reg.client_id, reg.epoch, ["a"])
    resp, ctx = call(servicer, "ReportReads", master_pb2.ReportReadsRequest(
        client_id=reg.client_id, keys=["a", "a", "gone"]))
    assert ctx.status is None and resp.applied == 2 and resp.dropped == 0
    _, ctx = call(servicer, "ReportReads", master_pb2.ReportReadsRequest(
        client_id=reg.client_id, damaged_keys=["a"]))
    assert detail(ctx).code == ErrorCode.INVALID_ARGUMENT and servicer.state.exists("a")


def test_exchange_tasks_reports_without_waiting_when_it_asks_for_none(servicer: MasterServicer) -> None:
    reg, _ = call(servicer, "RegisterClient", master_pb2.RegisterClientRequest(hostname="h"))
    req = master_pb2.ExchangeTasksRequest(client_id=reg.client_id, epoch=reg.epoch, max_tasks=0, wait_ms=5000,
                                          results=[master_pb2.TaskResult(task_id=999)])
    t0 = time.monotonic()
    resp, ctx = call(servicer, "ExchangeTasks", req)
    assert ctx.status is None and time.monotonic() - t0 < 1.0
    assert not resp.tasks and len(resp.results) == 1  # the unknown task's outcome answered
    req = master_pb2.ExchangeTasksRequest(client_id=reg.client_id, epoch=reg.epoch, max_tasks=8, wait_ms=50)
    t0 = time.monotonic()
    resp, ctx = call(servicer, "ExchangeTasks", req)
    assert ctx.status is None and not resp.tasks and not resp.results and time.monotonic() - t0 >= 0.04
