"""Leader election's pure parts: the fence, the fenced index, the etcd records, config (docs/ha.md).

No network: the clock is passed in. tests/cluster/test_ha.py runs the real thing.
"""

from __future__ import annotations

from typing import Any

import pytest

from cxlkv.config import ClientdConfig, MasterConfig
from cxlkv.errors import ConfigError, NotLeader, Unavailable
from cxlkv.master.election import VALIDITY_FRACTION, ClusterMeta, FencedIndex, LeaderFence, MasterInfo


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_renewal_buys_less_than_the_ttl_counted_from_when_it_was_sent() -> None:
    clock = Clock()
    f = LeaderFence(clock)
    f.extend(sent_at=100.0, ttl_s=1.0)
    assert f.valid_until == pytest.approx(100.0 + VALIDITY_FRACTION)
    clock.t = 100.0 + VALIDITY_FRACTION - 0.01
    f.check()
    clock.t = 100.0 + VALIDITY_FRACTION
    with pytest.raises(NotLeader, match="not renewed in time"):
        f.check_fast()
    assert isinstance(NotLeader("x"), Unavailable)  # clientds try the next master


def test_a_closed_fence_never_reopens_and_counts_refusals() -> None:
    clock = Clock()
    f = LeaderFence(clock)
    f.extend(100.0, 1.0)
    f.close("the leader key in etcd was deleted")
    f.extend(100.5, 1.0)  # a late renewal answer changes nothing
    assert not f.valid()
    for _ in range(3):
        with pytest.raises(NotLeader, match="deleted"):
            f.check()
    assert f.refused == 3
    f.close("another reason")
    assert f.closed == "the leader key in etcd was deleted"  # the first reason is kept


def test_a_stopped_process_finds_its_lease_passed_when_resumed() -> None:
    clock = Clock()
    f = LeaderFence(clock)
    f.extend(100.0, 1.0)
    clock.t += 30.0  # SIGSTOP for 30 s: the monotonic clock ran on
    with pytest.raises(NotLeader):
        f.check()


def test_another_epoch_in_the_region_closes_the_fence() -> None:
    clock = Clock()
    f = LeaderFence(clock)
    f.extend(100.0, 1.0)
    f.epoch = 7
    seen = [7]
    f.region_epoch = lambda: seen[0]
    f.check()
    seen[0] = 8
    with pytest.raises(NotLeader, match="epoch 8"):
        f.check()
    assert not f.valid()


class Recorder:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def publish(self, obj: object) -> None:
        self.calls.append("publish")

    def retire(self, obj: object) -> None:
        self.calls.append("retire")

    def grant(self, obj: object, *, ahead: bool = False) -> bool:
        self.calls.append("grant")
        return True

    def ungrant(self, obj: object) -> None:
        self.calls.append("ungrant")

    def sync(self) -> None:
        self.calls.append("sync")

    def damaged(self, obj: object) -> bool | None:
        self.calls.append("damaged")
        return None


def test_the_fenced_index_writes_nothing_once_the_fence_closed() -> None:
    clock = Clock()
    f = LeaderFence(clock)
    f.extend(100.0, 1.0)
    inner = Recorder()
    ix = FencedIndex(inner, f)
    ix.publish(None)  # type: ignore[arg-type]
    assert ix.grant(None)  # type: ignore[arg-type]
    ix.sync()
    assert inner.calls == ["publish", "grant", "sync"]
    clock.t += 5
    for write in (ix.publish, ix.retire, ix.grant, ix.ungrant):
        with pytest.raises(NotLeader):
            write(None)  # type: ignore[arg-type]
    with pytest.raises(NotLeader):
        ix.sync()
    assert ix.damaged(None) is None  # type: ignore[arg-type]  # reads still answer
    assert inner.calls == ["publish", "grant", "sync", "damaged"]


def test_records_round_trip_and_foreign_values_are_ignored() -> None:
    info = MasterInfo("abc123", "10.0.0.1:50051", epoch=4, role="leader")
    assert MasterInfo.decode(info.encode()) == info
    assert MasterInfo.decode(b"not json") is None
    assert MasterInfo.decode(b'{"address": "x"}') is None
    meta = ClusterMeta([{"name": "cxl0", "tier": "cxl", "size_bytes": 1 << 20}], 12345, {"eviction_policy": "lru"})
    assert ClusterMeta.decode(meta.encode()) == meta
    assert ClusterMeta.decode(b"[]") is None


def test_election_settings_are_checked() -> None:
    MasterConfig(etcd_endpoints=["127.0.0.1:2379"], leader_lease_ttl_s=2).validate()
    with pytest.raises(ConfigError, match="leader_lease_ttl_s"):
        MasterConfig(etcd_endpoints=["127.0.0.1:2379"], leader_lease_ttl_s=0.5).validate()
    with pytest.raises(ConfigError, match="leader_lease_ttl_s"):
        MasterConfig(etcd_endpoints=["127.0.0.1:2379"], leader_lease_ttl_s=1.5).validate()
    with pytest.raises(ConfigError, match="etcd_prefix"):
        MasterConfig(etcd_endpoints=["127.0.0.1:2379"], etcd_prefix="cxlkv").validate()
    with pytest.raises(ConfigError, match="etcd_endpoints"):
        MasterConfig(etcd_endpoints=["http://127.0.0.1"]).validate()
    MasterConfig(etcd_endpoints=["http://127.0.0.1:2379"]).validate()  # etcd's URL form
    MasterConfig(leader_lease_ttl_s=0.5).validate()  # ignored without etcd


def test_a_clientd_lists_several_masters() -> None:
    cfg = ClientdConfig(master_address="127.0.0.1:1, 127.0.0.1:2,127.0.0.1:3")
    cfg.validate()
    assert cfg.master_addresses == ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]
    with pytest.raises(ConfigError, match="loopback"):
        ClientdConfig(master_address="127.0.0.1:1,10.1.2.3:2").validate()


def _fenced_server(cfg: MasterConfig, **options: float) -> tuple[Clock, LeaderFence, Any]:
    """A MasterServer (no ports started) behind a fence on a test clock, valid for 900 s."""
    import dataclasses

    from cxlkv.master.server import MasterServer

    clock = Clock()
    fence = LeaderFence(clock)
    fence.extend(clock.t, 1000.0)
    return clock, fence, MasterServer(dataclasses.replace(cfg, **options), fence=fence)


def test_a_term_that_ends_during_a_sweep_pass_is_not_logged_as_a_bug(region_cfg, caplog) -> None:
    """The process stops past its lease in the middle of a sweep pass (SIGSTOP, a held
    loop): the fence refuses the pass's index writes with NotLeader, and the sweep loop
    takes that as the end of the term, not as a bug (before: "sweep failed" and a
    traceback in the log of every master resumed past its lease mid-pass)."""
    import asyncio
    import logging

    clock, fence, server = _fenced_server(region_cfg[1], sweep_interval_s=0.01)
    passes = []
    real_sweep = server.state.sweep

    def sweep(now: float) -> dict:
        done = real_sweep(now)
        passes.append(now)
        clock.t += 10_000.0  # the lease passes while the pass runs
        return done

    server.state.sweep = sweep  # type: ignore[method-assign]

    async def run() -> None:
        task = asyncio.ensure_future(server._sweep_loop())  # noqa: SLF001 - the loop itself is the unit
        await asyncio.sleep(0.3)
        task.cancel()

    try:
        with caplog.at_level(logging.DEBUG, logger="cxlkv.master"):
            asyncio.run(run())
    finally:
        server.ownership.release()
        server.ownership.close()
    assert len(passes) == 1  # the pass that ended the term; the loop then skips its passes
    assert fence.closed and fence.refused >= 1
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not bad, [r.getMessage() for r in bad]


def test_a_sliced_call_of_a_deposed_leader_answers_not_leader(region_cfg) -> None:
    """RemoveAll and UnmountSegment run by slices outside ``_invoke``: they check the
    fence first as every call does, and a term that ends between slices makes the
    call answer NotLeader (what it did is not published), never an exception out of
    the handler (a traceback, UNKNOWN to the caller)."""
    import asyncio

    from cxlkv.v1 import master_pb2

    clock, fence, server = _fenced_server(region_cfg[1], sweep_interval_s=3600.0)
    started = []

    class Cursor:
        def step(self, now: float, budget_s: float) -> bool:
            clock.t += 10_000.0  # the lease passes during the slice
            return True

    def start() -> Cursor:
        started.append(1)
        return Cursor()

    try:
        call = server.servicer._sliced  # noqa: SLF001 - the slicing itself is the unit
        req = master_pb2.RemoveAllRequest()
        response, error = asyncio.run(call("RemoveAll", req, start, lambda c: master_pb2.RemoveAllResponse()))
        assert response is None and isinstance(error, NotLeader), (response, error)
        response, error = asyncio.run(call("RemoveAll", req, start, lambda c: master_pb2.RemoveAllResponse()))
        assert response is None and isinstance(error, NotLeader) and started == [1]  # refused before it starts
    finally:
        server.ownership.release()
        server.ownership.close()
