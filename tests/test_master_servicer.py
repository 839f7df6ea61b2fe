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
