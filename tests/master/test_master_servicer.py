"""The servicer in-process: error mapping, INTERNAL for bugs, per-item statuses."""

from __future__ import annotations

import asyncio
import logging
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


def test_single_item_errors_carry_the_cxlkv_detail(servicer: MasterServicer) -> None:
    resp, ctx = call(servicer, "GetReplicaList", master_pb2.GetReplicaListRequest(key="missing"))
    assert resp is None and ctx.status.code == grpc.StatusCode.NOT_FOUND
    d = detail(ctx)
    assert d.code == ErrorCode.NOT_FOUND and d.key == "missing" and "not found" in d.message
    reg, _ = call(servicer, "RegisterClient", master_pb2.RegisterClientRequest(hostname="h"))
    _, ctx = call(servicer, "PutStart", master_pb2.PutStartRequest(
        client_id=reg.client_id, epoch=reg.epoch, item=master_pb2.PutStartItem(key="k", value_size_bytes=9 * MiB)))
    assert ctx.status.code == grpc.StatusCode.OUT_OF_RANGE
    assert detail(ctx).code == ErrorCode.TOO_LARGE and detail(ctx).requested_bytes == 9 * MiB


def test_unexpected_exception_becomes_one_line_internal(servicer: MasterServicer, monkeypatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    def boom(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("bad\nthing")

    monkeypatch.setattr(servicer.state, "remove", boom)
    with caplog.at_level(logging.ERROR, logger="cxlkv.master.service"):
        _, ctx = call(servicer, "Remove", master_pb2.RemoveRequest(key="k"))
    assert ctx.status.code == grpc.StatusCode.INTERNAL
    d = detail(ctx)
    assert d.code == ErrorCode.INTERNAL and "\n" not in d.message and "RuntimeError: bad thing" in d.message
    assert sum("Remove failed" in r.getMessage() for r in caplog.records) == 1
    assert caplog.records[-1].exc_info is not None  # the traceback goes to the log


def test_batch_success_leaves_status_unset_and_errors_are_per_item(servicer: MasterServicer) -> None:
    reg, _ = call(servicer, "RegisterClient", master_pb2.RegisterClientRequest(hostname="h"))
    req = master_pb2.BatchPutStartRequest(client_id=reg.client_id, epoch=reg.epoch)
    req.items.add(key="a", value_size_bytes=10)
    req.items.add(key="", value_size_bytes=10)
    req.items.add(key="b", value_size_bytes=10, options=common_pb2.PutOptions(replica_num=2, hard_pin=True))
    resp, ctx = call(servicer, "BatchPutStart", req)
    assert ctx.status is None
    ok, bad, pinned = resp.results
    assert not ok.HasField("status") and ok.status.code == 0 and ok.put_token == ok.version
    assert len(ok.extents) == 1 and ok.extents[0].length_bytes == 64 and ok.replicas_wanted == 1
    assert bad.status.code == ErrorCode.INVALID_KEY and bad.put_token == 0
    assert pinned.replicas_wanted == 2 and len(pinned.extents) == 1  # best effort: one segment
    assert error_for(bad.status.code, bad.status.message).code == ErrorCode.INVALID_KEY
    # An expired client's batch: every item answers, none raises.
    servicer.clock = lambda: 10_000.0
    resp, ctx = call(servicer, "BatchPutStart", req)
    assert ctx.status is None and [r.status.code for r in resp.results] == [ErrorCode.UNKNOWN_CLIENT] * 3


def test_packed_puts_answer_per_position_like_the_item_forms(servicer: MasterServicer) -> None:
    from cxlkv.clientd.master_link import unpack_put_starts

    reg, _ = call(servicer, "RegisterClient", master_pb2.RegisterClientRequest(hostname="h"))
    cid, ep = reg.client_id, reg.epoch
    resp, ctx = call(servicer, "PackedPutStart", master_pb2.PackedPutStartRequest(
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
    end, ctx = call(servicer, "PackedPutEnd", master_pb2.PackedPutEndRequest(
        client_id=cid, epoch=ep, keys=["a", "b", "zzz"], put_tokens=[a.put_token, b.put_token + 99, b.put_token],
        checksums=[7, 8, 9]))
    assert ctx.status is None and list(end.codes) == [0, ErrorCode.STALE_TOKEN, ErrorCode.STALE_TOKEN]
    assert list(end.error_positions) == [1, 2] and all(end.messages)
    assert servicer.state.get(cid, "a", servicer.clock())[0].checksum == 7
    rev, _ = call(servicer, "PackedPutRevoke", master_pb2.PackedPutEndRequest(
        client_id=cid, epoch=ep, keys=["b"], put_tokens=[b.put_token]))
    assert list(rev.codes) == [0]
    assert servicer.state.segment_table.mounted[0].used_bytes == 192  # only "a" holds space


@pytest.mark.parametrize("fields", [
    {"value_size_bytes": [1]},                                   # fewer sizes than keys
    {"value_size_bytes": [1, 2], "header_bytes": [64]},          # header_bytes neither empty nor one per key
    {"value_size_bytes": [1, 2], "options": [common_pb2.PutOptions()]},
])
def test_packed_put_start_refuses_ragged_columns(servicer: MasterServicer, fields: dict) -> None:
    reg, _ = call(servicer, "RegisterClient", master_pb2.RegisterClientRequest(hostname="h"))
    resp, ctx = call(servicer, "PackedPutStart", master_pb2.PackedPutStartRequest(
        client_id=reg.client_id, epoch=reg.epoch, keys=["a", "b"], **fields))
    assert resp is None and detail(ctx).code == ErrorCode.INVALID_ARGUMENT
    assert servicer.state.segment_table.mounted[0].used_bytes == 0  # nothing was placed
    resp, ctx = call(servicer, "PackedPutEnd", master_pb2.PackedPutEndRequest(
        client_id=reg.client_id, epoch=reg.epoch, keys=["a", "b"], put_tokens=[1]))
    assert resp is None and detail(ctx).code == ErrorCode.INVALID_ARGUMENT


def test_unpacking_a_ragged_answer_is_an_internal_error() -> None:
    from cxlkv.clientd.master_link import unpack_put_starts
    from cxlkv.errors import Internal

    with pytest.raises(Internal, match="disagree"):
        unpack_put_starts(master_pb2.PackedPutStartResponse(
            codes=[0], put_tokens=[1], versions=[1], replicas_wanted=[1], extent_counts=[2],
            segment_ids=[1], offsets_bytes=[0], lengths_bytes=[64]))


def _commit(servicer: MasterServicer, cid: str, ep: int, keys: list[str], replica_num: int = 1) -> None:
    resp, _ = call(servicer, "PackedPutStart", master_pb2.PackedPutStartRequest(
        client_id=cid, epoch=ep, keys=keys, value_size_bytes=[100] * len(keys), header_bytes=[128] * len(keys),
        options=[common_pb2.PutOptions(replica_num=replica_num)] * len(keys)))
    end, _ = call(servicer, "PackedPutEnd", master_pb2.PackedPutEndRequest(
        client_id=cid, epoch=ep, keys=keys, put_tokens=list(resp.put_tokens), checksums=[11] * len(keys)))
    assert list(end.codes) == [0] * len(keys)


def _as_tuple(loc: Any) -> tuple:
    """The fields a reader uses, from an ObjectLocation or a clientd Location."""
    return (loc.status.code, loc.value_size_bytes, loc.version, bool(loc.lease_id), loc.lease_ttl_ms,
            loc.checksum, loc.header_bytes,
            [(r.extent.segment_id, r.extent.offset_bytes, r.extent.length_bytes, int(r.tier)) for r in loc.replicas])


def test_packed_reads_answer_like_the_message_forms() -> None:
    """PackedGetReplicaList and PackedMatchPrefix: the same locations, leases and
    errors as BatchGetReplicaList and BatchMatchPrefix, replicas best first."""
    from cxlkv.clientd.master_link import unpack_locations

    st = MasterState(MasterConfig(segments=[SegmentConfig(name="cxl0", size_bytes=8 * MiB),
                                            SegmentConfig(name="cxl1", size_bytes=8 * MiB)]))
    servicer = MasterServicer(st, clock=lambda: 100.0)
    reg, _ = call(servicer, "RegisterClient", master_pb2.RegisterClientRequest(hostname="h"))
    cid, ep = reg.client_id, reg.epoch
    _commit(servicer, cid, ep, ["a", "b"])
    _commit(servicer, cid, ep, ["two"], replica_num=2)
    keys = ["a", "missing", "", "two", "b", "a"]
    req = master_pb2.BatchGetReplicaListRequest(client_id=cid, keys=keys)
    items, _ = call(servicer, "BatchGetReplicaList", req)
    packed, ctx = call(servicer, "PackedGetReplicaList", req)
    assert ctx.status is None
    locs = unpack_locations(packed)
    assert [_as_tuple(x) for x in locs] == [_as_tuple(x) for x in items.locations]
    assert [x.status.code for x in locs] == [0, ErrorCode.NOT_FOUND, ErrorCode.INVALID_KEY, 0, 0, 0]
    assert locs[1].status.message and locs[1].replicas == () and locs[1].lease_id == 0
    assert len(locs[3].replicas) == 2 and locs[0].checksum == 11 and locs[0].header_bytes == 128
    assert len({x.lease_id for x in locs if x.lease_id}) == 4  # a lease per located key
    # Built without NamedTuple's own __new__ (hot path): every field is there.
    from cxlkv.clientd.master_link import Location, LocatedReplica

    assert all(len(x) == len(Location._fields) for x in locs)
    assert all(len(r) == len(LocatedReplica._fields) for x in locs for r in x.replicas)
    # Prefix: per query, the matched keys' locations, concatenated.
    preq = master_pb2.BatchMatchPrefixRequest(client_id=cid, queries=[
        master_pb2.PrefixQuery(keys=["a", "b", "missing", "two"]), master_pb2.PrefixQuery(keys=["missing"]),
        master_pb2.PrefixQuery(keys=["two", "a"])])
    items, _ = call(servicer, "BatchMatchPrefix", preq)
    packed, ctx = call(servicer, "PackedMatchPrefix", preq)
    assert ctx.status is None and list(packed.matched) == [r.matched for r in items.results] == [2, 0, 2]
    flat = [_as_tuple(x) for r in items.results for x in r.locations]
    assert [_as_tuple(x) for x in unpack_locations(packed.locations)] == flat
    # No lease asked: none granted.
    nolease, _ = call(servicer, "PackedGetReplicaList", master_pb2.BatchGetReplicaListRequest(
        client_id=cid, keys=["a"], no_lease=True))
    assert list(nolease.lease_ids) == [0] and list(nolease.lease_ttl_ms) == [0]


def test_unpacking_ragged_locations_is_an_internal_error() -> None:
    from cxlkv.clientd.master_link import unpack_locations
    from cxlkv.errors import Internal

    with pytest.raises(Internal, match="disagree"):
        unpack_locations(master_pb2.PackedLocations(
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
        unpack_locations(master_pb2.PackedLocations(
            codes=codes, value_size_bytes=[0] * n, versions=[0] * n, lease_ids=[0] * n, lease_ttl_ms=[0] * n,
            checksums=[0] * n, header_bytes=[0] * n, replica_counts=[0] * n,
            error_positions=positions, messages=messages))
