"""A warm standby follows the index by diffs and takes over with the same state a
cold rebuild gives (master/warm.py, docs/ha.md). Real region file, real index, real
MasterServer states (no gRPC needed: the state publishes into the region)."""

from __future__ import annotations

import dataclasses
import time

import pytest
import xxhash

from cxlkv.master.server import MasterServer
from cxlkv.master.objects import RestoredObject
from cxlkv.layout.objheader import header_bytes_for, pack_header

MiB = 1 << 20
STRIDE = 256


def _put(server: MasterServer, first: int, n: int, version: int) -> list[str]:
    """Commit objects ``first..first+n`` (header, key, value in the region; slot published)."""
    region = server.ownership.index_region.region
    seg = server.state.segment_table.by_name("cxl0")
    objs, keys = [], []
    for i in range(first, first + n):
        key = f"warm/{i:06d}"
        k = key.encode()
        value = bytes([i % 251]) * 40
        vsum = xxhash.xxh3_64_intdigest(value)
        off = 4096 + i * STRIDE
        hb = header_bytes_for(len(k))
        region.copy_in(off, pack_header(k, version + i, len(value), vsum) + k.ljust(hb - 64, b"\0") + value)
        objs.append(RestoredObject(key, off, len(value), hb, version + i, vsum))
        keys.append(key)
    rep = server.state.restore_objects(seg.segment_id, objs, time.monotonic())
    assert rep.restored == n
    server.state.index.sync()
    return keys


def _objects(server: MasterServer) -> dict[str, tuple[int, tuple]]:
    objs = server.state._objects  # noqa: SLF001 - the auditor's view (as master/invariants.py)
    return {k: (o.version, tuple(o.extents)) for k, o in objs.items()}


def test_warm_state_follows_the_index_and_takes_over_like_a_cold_rebuild(region_cfg) -> None:
    from cxlkv.master.warm import WarmState

    path, cfg = region_cfg
    leader = MasterServer(cfg)
    ws = None
    try:
        keys = _put(leader, 0, 300, 1000)
        ws = WarmState(cfg)
        assert ws.refresh() == 300 and ws.state.key_count == 300
        assert ws.refresh() == 0  # nothing changed: nothing applied
        now = time.monotonic()
        for k in keys[:50]:
            leader.state.remove(k, now)
        leader.state.index.sync()
        _put(leader, 300, 100, 1000)  # the extents of the 50 removed are not reused here: new offsets
        assert 100 <= ws.refresh() <= 150  # slots changed (a freed slot may take a new key)
        assert ws.state.key_count == 350
        assert set(ws.state._objects) == set(leader.state._objects)  # noqa: SLF001
        ws.state.check_invariants()
        # changes after the last pass: applied at takeover
        for k in keys[50:70]:
            leader.state.remove(k, now)
        leader.state.index.sync()
        _put(leader, 400, 10, 1000)
        final = _objects(leader)
    finally:
        leader.ownership.release()
        leader.ownership.close()
    rec_cfg = dataclasses.replace(cfg, recover_from_region=[f"{path}=cxl0"])
    warm = MasterServer(rec_cfg, warm=ws)
    try:
        assert warm.index_recovery["warm"] == 1 and 10 <= warm.index_recovery["changed_at_takeover"] <= 30
        assert _objects(warm) == final
        warm.state.check_invariants()
        assert warm.state._seq > max(v for v, _ in final.values())  # noqa: SLF001 - new versions above the old
        w = warm.ownership.writer
        tables = (dict(w._by_hash), bytes(w._used))  # noqa: SLF001 - compared with a cold rebuild's below
    finally:
        warm.ownership.release()
        warm.ownership.close()
        ws.close()
    cold = MasterServer(rec_cfg)
    try:
        assert "warm" not in cold.index_recovery
        assert _objects(cold) == final  # the same state a cold rebuild gives
        c = cold.ownership.writer
        assert (dict(c._by_hash), bytes(c._used)) == tables  # noqa: SLF001 - and the same slot placement
    finally:
        cold.ownership.release()
        cold.ownership.close()


def test_a_warm_state_of_other_regions_is_not_used(region_cfg, tmp_path) -> None:
    from cxlkv.master.warm import WarmState

    path, cfg = region_cfg
    leader = MasterServer(cfg)
    try:
        _put(leader, 0, 20, 1000)
    finally:
        leader.ownership.release()
        leader.ownership.close()
    ws = WarmState(cfg)
    ws.refresh()
    ws.geometry = dataclasses.replace(ws.geometry, buckets=ws.geometry.buckets * 2)  # as if another index
    server = MasterServer(dataclasses.replace(cfg, recover_from_region=[f"{path}=cxl0"]), warm=ws)
    try:
        assert "warm" not in server.index_recovery and server.index_recovery["restored"] == 20
    finally:
        server.ownership.release()
        server.ownership.close()
        ws.close()
