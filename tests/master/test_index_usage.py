"""How full the region's index is, in-process: the writer's counts as the state sees
them (:meth:`RegionIndex.usage`), the warning's doubling, the Stat field and the
metric families — with and without an index (NoIndex)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from cxlkv.config import MasterConfig, SegmentConfig
from cxlkv.layout import index
from cxlkv.master.metrics import MasterCollector
from cxlkv.master.publish import IndexUsage, NoIndex, OverflowAlarm, RegionIndex, overflow_warning
from cxlkv.master.service import MasterServicer
from cxlkv.master.state import MasterState
from cxlkv.runtime.metrics import RequestStats
from cxlkv.transport import Region
from cxlkv.v1 import master_pb2

MiB = 1 << 20


def _state() -> MasterState:
    config = MasterConfig(segments=[SegmentConfig(name="cxl0", size_bytes=8 * MiB)])
    config.validate()
    return MasterState(config)


@pytest.fixture
def indexed(tmp_path: Path) -> Iterator[tuple[MasterState, index.IndexWriter]]:
    """A state publishing into a 32-slot index (4 buckets; objects take at most 24)."""
    st = _state()
    with Region.open(tmp_path / "ix", size=4 * MiB, create=True) as r:
        g = index.index_geometry(4 * MiB, expected_objects=16)
        index.format_index(r, g, uuid.uuid4())
        writer = index.IndexWriter(r, g, flush=False)
        seg = st.segments()[0]
        st.index = RegionIndex(writer, {seg.segment_id: 0}, st.segment_table.by_id)
        yield st, writer


def _fill(st: MasterState, n: int) -> tuple[str, int]:
    c = st.register_client("host", "clientd", 1, [], "", "", 0.0)
    w = (c.client_id, c.epoch)
    for i in range(n):
        obj = st.put_start(*w, f"k/{i}", 100, 0.0)
        st.put_end(*w, f"k/{i}", obj.version, 0.0, checksum=7)
    st.index.sync()
    return w


def test_overflow_alarm_warns_at_first_then_at_each_doubling() -> None:
    alarm = OverflowAlarm()
    fired = [n for n in [0, 0, 1, 1, 2, 3, 3, 4, 7, 8, 9, 15, 16, 17, 40, 41, 79, 80, 3, 0, 100, 160]
             if alarm.check(n)]
    assert fired == [1, 2, 4, 8, 16, 40, 80, 160]
    # counted per put, a long fill warns log2(n) + 1 times, never per put
    alarm = OverflowAlarm()
    assert sum(alarm.check(n) for n in range(1, 100_001)) == 17
    # a count seen only at sweeps (it jumped past thresholds meanwhile) warns at what it is
    alarm = OverflowAlarm()
    assert [n for n in (0, 1756, 3000, 3856, 5000, 7711, 7712) if alarm.check(n)] == [1756, 3856, 7712]


def test_usage_counts_objects_grants_and_overflow(indexed) -> None:
    st, writer = indexed
    u = st.index.usage()
    assert u == IndexUsage(slots=32, object_slots=0, grant_slots=0, key_limit=24, overflow_objects=0)
    w = _fill(st, 30)
    u = st.index.usage()
    assert u.slots == writer.geometry.slots == 32 and u.key_limit == writer.key_limit == 24
    assert u.object_slots == writer.key_slots and u.object_slots <= u.key_limit
    assert u.object_slots + u.overflow_objects == st.key_count == 30  # every object: a slot or the overflow
    assert u.overflow_objects == writer.overflow >= 6 and u.grant_slots == 0
    assert u.used_slots == u.object_slots == writer.live_slots
    # a put in flight holds a grant slot; removing overflowed objects shrinks the overflow
    st.put_start(*w, "inflight", 100, 0.0)
    assert st.index.usage().grant_slots == 1
    over = st.index.usage().overflow_objects
    st.remove("k/29", 0.0)
    assert st.index.usage().overflow_objects == over - 1  # the last ones in are the overflowed ones
    msg = overflow_warning(st.index.usage())
    assert msg.startswith(f"index overflow: {over - 1:,} committed object(s) have no slot in the region's index "
                          f"(32 slots, objects take at most 24; {u.object_slots} held)"), msg
    assert "every miss" in msg and "cxlkv region format --expected-objects N with N >= 29" in msg, msg
    assert f"Next warning at {2 * (over - 1)}" in msg and "docs/index.md" in msg


def test_no_index_has_no_usage() -> None:
    assert NoIndex().usage() is None
    assert _state().index.usage() is None


def _call_stat(st: MasterState) -> master_pb2.StatResponse:
    servicer = MasterServicer(st, clock=lambda: 1.0)
    return asyncio.run(servicer.Stat(master_pb2.StatRequest(), None))


def test_stat_carries_the_index_only_when_there_is_one(indexed) -> None:
    assert not _call_stat(_state()).HasField("index")
    st, writer = indexed
    _fill(st, 30)
    ix = _call_stat(st).index
    u = st.index.usage()
    assert (ix.slots, ix.object_slots, ix.grant_slots, ix.key_limit, ix.overflow_objects) == (
        u.slots, u.object_slots, u.grant_slots, u.key_limit, u.overflow_objects)
    assert ix.overflow_objects > 0


def _families(st: MasterState) -> dict[str, Any]:
    loop = asyncio.new_event_loop()
    try:
        return {f.name: f for f in MasterCollector(st, RequestStats("t_rpc", "t"), loop).collect()}
    finally:
        loop.close()


def test_metrics_export_the_index_gauges_only_when_there_is_one(indexed) -> None:
    fams = _families(_state())
    assert not {n for n in fams if n.startswith("cxlkv_master_index_")} - {"cxlkv_master_index_hits"}
    st, _ = indexed
    _fill(st, 30)
    fams = _families(st)
    u = st.index.usage()
    assert [s.value for s in fams["cxlkv_master_index_slots"].samples] == [32]
    used = {s.labels["kind"]: s.value for s in fams["cxlkv_master_index_slots_used"].samples}
    assert used == {"object": u.object_slots, "grant": u.grant_slots}
    assert [s.value for s in fams["cxlkv_master_index_overflow_objects"].samples] == [u.overflow_objects]
