"""``cxlkv bench ha``: failover of the leader master under load, and a standby's rebuild.

Two measurements (docs/ha.md, "Measured"):

* ``failover`` — a local cluster of etcd, three masters with leader election and
  two clientds; writer and reader threads (:class:`~cxlkv.bench.ha_load.MixedLoad`,
  4 KiB values) run throughout while the leader is killed with SIGKILL, ``rounds``
  times (the killed master comes back as a standby before the next round). One
  record per round: ``write_gap_s`` (from the kill to the first put acknowledged
  after the first refused one), ``failed_reads`` and ``wrong_reads`` during the
  whole run, ``lost`` (acknowledged puts not read back at the end, from both
  clientds) and ``takeover_s`` (the new leader's own time from winning the
  campaign to serving). Needs the ``etcd`` binary (``apt-get install -y
  etcd-server``); without it the records say so and carry no numbers.
* ``rebuild`` — the time a standby takes to rebuild the master's state from the
  region's index at ``objects`` committed objects (1,000,000 in a full run): a
  region is formatted and filled in-process (object headers and keys written into
  extents, one index slot each, published by a real
  :class:`~cxlkv.master.server.MasterServer`), then a second ``MasterServer`` is
  built with ``recover_from_region`` the way a standby takes over: map the region,
  take the owner lease, read every slot, verify each extent's header, claim the
  extents, adopt the slots. ``ops_per_s`` is objects rebuilt per second,
  ``rebuild_s`` the wall time of the whole construction.

Both records carry the memcpy bandwidth measured in the same run
(``limit_gbps``) for comparison with the other benchmarks; neither moves bulk
bytes, so ``ratio_to_limit`` compares the bytes the rebuild reads (slots and
headers) per second with memcpy.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import shutil
import signal
import tempfile
import time
import uuid
from typing import Any

import click

from cxlkv.bench.common import Record, emit, measure_memcpy_gbps, output_options

__all__ = ["run", "ha_cmd", "bench_failover", "bench_rebuild"]

MiB = 1 << 20


def bench_failover(rounds: int, limit_gbps: float) -> list[Record]:
    """Kill the leader ``rounds`` times under mixed load; one record per round."""
    from cxlkv.bench.ha_load import MixedLoad, follow_leader
    from cxlkv.deploy.cluster import LocalCluster

    if shutil.which("etcd") is None:
        return [Record("ha", "failover", 4096, 0.0, 0.0, 0.0, 0.0, limit_gbps, None,
                       {"skipped": "etcd not installed: apt-get install -y etcd-server"})]
    run_dir = tempfile.mkdtemp(prefix="cxlkv-bench-ha-")
    cl = LocalCluster(run_dir, masters=3, clientds=2, region_size_bytes=256 * MiB,
                      master_options={"sweep_interval_s": 0.05}, clientd_options={"master_timeout_s": 3.0})
    out: list[tuple[float | None, float, int, int]] = []
    try:
        cl.start()
        with MixedLoad(cl, f"ha-{uuid.uuid4().hex[:6]}") as load:
            load.wait_acked(200)
            for _ in range(rounds):
                leader = follow_leader(cl)
                load.wait_acked(100)
                t = time.monotonic()
                cl.masters[leader].signal(signal.SIGKILL)
                assert cl.masters[leader].proc is not None
                cl.masters[leader].proc.wait(10)
                new = follow_leader(cl, 30, other_than=leader)
                load.wait_acked(100, timeout_s=30)
                takeover = _last_takeover_s(cl.masters[new].log_path.read_text())
                out.append((load.write_gap_after(t), takeover, len(load.stats.put_failures), len(load.stats.acked)))
                cl.restart_ha_master(leader, stop=False)
                cl.wait_members(3, 60)
        lost0, wrong0 = load.verify(cl, 0)
        lost1, wrong1 = load.verify(cl, 1)
        reads, failed, wrong_reads = load.stats.reads, len(load.stats.read_failures), load.stats.wrong_bytes
    finally:
        cl.stop()
        shutil.rmtree(run_dir, ignore_errors=True)
    recs = []
    for i, (gap, takeover, refused, acked) in enumerate(out):
        recs.append(Record("ha", "failover", 4096, 0.0, 0.0, 0.0, 0.0, limit_gbps, None, {
            "round": i + 1, "write_gap_s": gap, "takeover_s": takeover, "puts_refused_so_far": refused,
            "acked_so_far": acked, "reads": reads, "failed_reads": failed, "wrong_reads": wrong_reads,
            "lost": lost0 + lost1, "wrong_bytes": wrong0 + wrong1, "target_write_gap_s": 3.0,
            "meets_target": gap is not None and gap < 3.0 and failed == 0 and lost0 + lost1 == 0}))
    return recs


def _last_takeover_s(log_text: str) -> float:
    """The ``serving X s after winning the campaign`` of the last term in a master's log."""
    import re

    found = re.findall(r"serving ([0-9.]+) s after winning the campaign", log_text)
    return float(found[-1]) if found else -1.0


def bench_rebuild(objects: int, limit_gbps: float, *, warm: bool = False) -> Record:
    """Build a region holding ``objects`` committed objects, then time a standby's rebuild.

    With ``warm``: a :class:`~cxlkv.master.warm.WarmState` follows the index first (its
    first pass timed as ``warm_first_pass_s``), the previous leader then commits 1 %
    more objects, and the takeover applies only that difference (``rebuild_s``).
    """
    import xxhash

    from cxlkv.config import MasterConfig, SegmentConfig
    from cxlkv.master.server import MasterServer
    from cxlkv.master.objects import RestoredObject
    from cxlkv.layout.objheader import header_bytes_for, pack_header
    from cxlkv.layout.region import format_region
    from cxlkv.transport import Region

    value_bytes = 64
    extra = max(1, objects // 100) if warm else 0
    total = objects + extra
    keys = [f"bench/rebuild/{i:09d}" for i in range(total)]
    hb = header_bytes_for(len(keys[0].encode()))
    stride = (hb + value_bytes + 63) & ~63
    index_bytes = total * 2 * 64 + (8 << 20)
    size = ((4096 + total * stride + index_bytes + (64 << 20)) + (2 * MiB - 1)) & ~(2 * MiB - 1)
    path = f"/dev/shm/cxlkv-bench-rebuild-{os.getpid()}"
    value = b"\x5a" * value_bytes
    vsum = xxhash.xxh3_64_intdigest(value)
    base = 4096

    def fill(region: Any, first: int, count: int) -> list[RestoredObject]:
        """Write the headers, keys and values of objects ``first..first+count``."""
        out: list[RestoredObject] = []
        chunk = 65536
        for start in range(first, first + count, chunk):
            n = min(chunk, first + count - start)
            buf = bytearray(stride * n)
            for j, key in enumerate(keys[start:start + n]):
                k = key.encode()
                off = j * stride
                h = pack_header(k, 1000 + start + j, value_bytes, vsum)
                buf[off:off + len(h)] = h
                buf[off + 64:off + 64 + len(k)] = k
                buf[off + hb:off + hb + value_bytes] = value
                out.append(RestoredObject(key, base + (start + j) * stride, value_bytes, hb, 1000 + start + j, vsum))
            region.copy_in(base + start * stride, bytes(buf))
        return out

    warm_first_s = 0.0
    ws: Any = None
    try:
        with Region.open(path, size=size, create=True) as region:
            identity = format_region(region, "cxl0", expected_objects=total)
        cfg = MasterConfig(listen_address="127.0.0.1:0", metrics_address="", lean_listen_address="off",
                           segments=[SegmentConfig(name="cxl0", size_bytes=size, path=path)],
                           owner_lease_ttl_s=1.0)
        # the "previous leader": writes every object's header and key, publishes its slot
        old = MasterServer(cfg)
        try:
            seg = old.state.segment_table.by_name("cxl0")
            assert seg is not None
            region = old.ownership.index_region.region  # type: ignore[union-attr]
            t0 = time.perf_counter()
            report = old.state.restore_objects(seg.segment_id, fill(region, 0, objects), time.monotonic())
            old.state.index.sync()
            publish_s = time.perf_counter() - t0
            assert report.restored == objects, report
            if warm:
                from cxlkv.master.warm import WarmState

                t0 = time.perf_counter()
                ws = WarmState(cfg)
                ws.refresh()
                warm_first_s = time.perf_counter() - t0
                report = old.state.restore_objects(seg.segment_id, fill(region, objects, extra), time.monotonic())
                old.state.index.sync()
            overflow = old.ownership.writer.overflow  # type: ignore[union-attr]  # no slot: not rebuilt from the index
        finally:
            old.ownership.release()
            old.ownership.close()
            del old
        gc.collect()
        # the standby taking over: map, owner lease, read and verify every slot (or apply the
        # last diff to the warm state), claim, adopt
        t0 = time.perf_counter()
        new = MasterServer(dataclasses.replace(cfg, recover_from_region=[f"{path}=cxl0"]), warm=ws)
        rebuild_s = time.perf_counter() - t0
        try:
            rec = new.index_recovery
            assert rec.get("restored") == total - overflow, (rec, overflow)
            keys_after = new.state.key_count
            index_s = float(rec.get("seconds", 0.0))
            new.state.check_invariants()
        finally:
            new.ownership.release()
            new.ownership.close()
            if ws is not None:
                ws.close()
    finally:
        if os.path.exists(path):
            os.unlink(path)
    read_bytes = total * (64 + hb)  # one slot and one header (with its key) per object
    gbps = read_bytes / rebuild_s / 1e9
    return Record("ha", "takeover_warm" if warm else "rebuild", 0, total / rebuild_s, gbps, 0.0, 0.0, limit_gbps,
                  gbps / limit_gbps if limit_gbps else None, {
                      "objects": total, "rebuild_s": rebuild_s, "index_recovery_s": index_s,
                      "rebuilt": int(rec.get("restored", 0)), "overflowed": overflow,
                      "changed_since_warm": extra, "warm_first_pass_s": warm_first_s,
                      "keys_after": keys_after, "region_bytes": size, "publish_s": publish_s,
                      "region_uuid": str(identity.region_uuid)})


def run(quick: bool) -> list[Record]:
    """Every record of this benchmark."""
    limit = measure_memcpy_gbps(4 * MiB)
    records = bench_failover(1 if quick else 5, limit)
    gc.collect()
    for n in ((20_000,) if quick else (100_000, 1_000_000)):
        records.append(bench_rebuild(n, limit))
        gc.collect()
        records.append(bench_rebuild(n, limit, warm=True))
        gc.collect()
    return records


@click.command("ha")
@output_options
def ha_cmd(as_json: bool, out: str | None, quick: bool) -> None:
    """Leader failover under load (3 masters on etcd) and a standby's rebuild at 1M objects."""
    emit(run(quick), as_json=as_json, out=out)
