"""Leader election's pure parts: the fence, the fenced index, the etcd records, config (docs/ha.md).

No network: the clock is passed in. tests/cluster/test_ha.py runs the real thing.
"""

from __future__ import annotations

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
