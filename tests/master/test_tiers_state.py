"""Tier decisions of the master's state machine, called directly (no network, time
passed in): demotion, SSD-direct puts, promotion, DRAM caching and invalidation,
task timeouts, retries and failures, the access sketch, config validation, and
the exact accounting invariant after each."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from cxlkv.config import ClientdConfig, MasterConfig, SegmentConfig
from cxlkv.errors import ConfigError, NotFound, StaleToken
from cxlkv.master.eviction import load_policy
from cxlkv.master.segments import Tier
from cxlkv.master.state import MasterState
from cxlkv.master.tiering import CACHE, DEMOTE, PROMOTE, AccessSketch
from cxlkv.layout.region import REGION_HEADER_BYTES

KiB, MiB = 1 << 10, 1 << 20
EXT = 4 * KiB  # one value's extent (no header)


def make_state(cxl_blocks: int = 10, ssd_blocks: int = 100, **cfg: Any) -> MasterState:
    segs = [SegmentConfig(name="cxl0", size_bytes=REGION_HEADER_BYTES + cxl_blocks * EXT)]
    if ssd_blocks:
        segs.append(SegmentConfig(name="ssd0", size_bytes=REGION_HEADER_BYTES + ssd_blocks * EXT, tier="ssd"))
    base: dict[str, Any] = {"high_watermark": 0.8, "low_watermark": 0.5, "promotion_threshold": 2,
                            "dram_promotion_threshold": 2, "task_timeout_s": 1.0, "task_retries": 2}
    base.update(cfg)
    config = MasterConfig(segments=segs, **base)
    config.validate()
    return MasterState(config)


def client(st: MasterState, maps: tuple[str, ...] = ("cxl0", "ssd0"), now: float = 0.0) -> tuple[str, int]:
    regions = [SimpleNamespace(segment_name=n, region_uuid="", size_bytes=st.segment_table.by_name(n).size_bytes,
                               device_path="") for n in maps]
    c = st.register_client("host", "clientd", 1, regions, "", "", now)
    return c.client_id, c.epoch


def put(st: MasterState, c: tuple[str, int], key: str, now: float = 0.0):
    obj = st.put_start(c[0], c[1], key, EXT, now)
    return st.put_end(c[0], c[1], key, obj.version, now, checksum=1)


def tiers(st: MasterState, key: str) -> list[int]:
    obj = st.get_object(key)
    return sorted(st.segment(e[0]).tier for e in obj.extents) if obj else []


def run_all(st: MasterState, c: tuple[str, int], now: float = 0.0, ok: bool = True) -> int:
    """Run every task the client can get, reporting success (or failure)."""
    n = 0
    while True:
        tasks = st.fetch_tasks(c[0], c[1], 100, now)
        if not tasks:
            return n
        st.complete_tasks(c[0], c[1], [(t.task_id, 0 if ok else 13, "" if ok else "boom") for t in tasks], now)
        n += len(tasks)
        if not ok:
            return n


def test_cxl_past_high_watermark_demotes_to_ssd_and_nothing_is_lost() -> None:
    st = make_state()
    c = client(st)
    for i in range(9):  # 90 % > high watermark 80 %
        put(st, c, f"k{i}")
    assert st.counters["demotions_started"] >= 4 and st.counters["evictions"] == 0
    # the bytes being demoted stay readable in CXL until the copy is verified
    assert all(tiers(st, f"k{i}") == [Tier.CXL] for i in range(9))
    st.check_invariants()
    assert run_all(st, c) >= 4
    cxl = st.segment_table.by_name("cxl0")
    assert cxl.used_bytes <= 0.5 * cxl.capacity_bytes
    assert st.counters["demotions"] >= 4
    assert sum(tiers(st, f"k{i}") == [Tier.SSD] for i in range(9)) >= 4
    assert st.key_count == 9
    st.check_invariants()


def test_a_full_cxl_with_demotions_running_places_puts_on_ssd() -> None:
    st = make_state(high_watermark=1.0, low_watermark=0.9)
    c = client(st)
    for i in range(10):
        put(st, c, f"k{i}")
    put(st, c, "over")  # CXL full, nothing demoted yet: the put goes to SSD, nothing lost
    assert tiers(st, "over") == [Tier.SSD] and st.counters["ssd_puts"] == 1
    assert st.key_count == 11 and st.counters["evictions"] == 0
    st.check_invariants()


def test_demotion_of_a_leased_object_frees_its_cxl_extent_when_the_lease_ends() -> None:
    st = make_state()
    c = client(st)
    for i in range(9):
        put(st, c, f"k{i}")
    tasks = st.fetch_tasks(*c, 100, 0.0)
    victim = next(t for t in tasks if t.kind == DEMOTE).obj.key
    _, lease = st.get(c[0], victim, 0.0)  # a reader holds the CXL copy
    used_before = st.segment_table.by_name("cxl0").used_bytes
    st.complete_tasks(*c, [(t.task_id, 0, "") for t in tasks], 0.0)
    assert tiers(st, victim) == [Tier.SSD]  # new readers get the SSD replica
    obj = st.get_object(victim)
    assert obj.detached and obj.detached[0][0] == st.segment_table.by_name("cxl0").segment_id
    st.check_invariants()
    st.release_leases(c[0], [lease.lease_id])
    assert not obj.detached
    assert st.segment_table.by_name("cxl0").used_bytes < used_before
    st.check_invariants()


def test_failed_and_timed_out_moves_are_retried_then_failed_and_the_object_stays() -> None:
    st = make_state()
    c = client(st)
    for i in range(9):
        put(st, c, f"k{i}")
    ssd = st.segment_table.by_name("ssd0")
    n = len(st.tasks)
    run_all(st, c, ok=False)  # attempt 1 fails: given again
    assert st.counters["moves_retried"] == n and len(st.tasks) == n
    st.fetch_tasks(*c, 100, 0.0)  # attempt 2: the clientd dies, never reports
    old = {t.task_id for t in st.tasks.all()}
    st.tiering.sweep_tasks(5.0)  # past task_timeout_s with task_retries (2) spent: failed
    assert st.counters["moves_failed"] == n and len(st.tasks) == 0
    # the silent clientd may be stopped, not dead: its destinations stay held for it
    assert st.counters["moves_fenced"] == n and ssd.used_bytes > 0
    assert all(tiers(st, f"k{i}") == [Tier.CXL] for i in range(9))  # readable where they were
    st.check_invariants()
    # a late report of a failed task is refused, and frees that destination (its writer is done)
    used = ssd.used_bytes
    (err,) = st.complete_tasks(*c, [(min(old), 0, "")], 5.0)
    assert isinstance(err, StaleToken)
    assert st.counters["moves_fence_released"] == 1 and ssd.used_bytes < used
    st.check_invariants()
    # the next sweep tries again with fresh tasks
    st.sweep(5.0)
    assert st.tasks and all(t.attempts == 0 and t.kind == DEMOTE for t in st.tasks.all())
    st.check_invariants()


def test_remove_or_upsert_during_a_move_discards_the_copy() -> None:
    st = make_state()
    c = client(st)
    for i in range(9):
        put(st, c, f"k{i}")
    tasks = st.fetch_tasks(*c, 100, 0.0)
    a, b = tasks[0].obj.key, tasks[1].obj.key
    st.remove(a, 0.0)
    obj = st.put_start(*c, b, EXT, 0.0, upsert=True)
    st.put_end(*c, b, obj.version, 0.0)
    st.complete_tasks(*c, [(t.task_id, 0, "") for t in tasks], 0.0)
    assert st.counters["moves_dropped"] == 2
    with pytest.raises(NotFound):
        st.get("", a, 0.0)
    assert st.get_object(b).version == obj.version
    st.check_invariants()


def test_a_move_failing_because_its_object_changed_is_dropped_not_failed() -> None:
    """An upsert or remove during a move rewrites or frees its source: the clientd's
    copy then fails its check. That is a dropped move — not retried, not counted in
    moves_failed — and the report's answer says so (NOT_FOUND)."""
    st = make_state()
    c = client(st)
    for i in range(9):
        put(st, c, f"k{i}")
    tasks = st.fetch_tasks(*c, 100, 0.0)
    a, b = tasks[0].obj.key, tasks[1].obj.key
    st.remove(a, 0.0)
    obj = st.put_start(*c, b, EXT, 0.0, upsert=True)
    st.put_end(*c, b, obj.version, 0.0)
    failed = [(t.task_id, 11, "value checksum differs") for t in tasks[:2]]  # CHECKSUM_MISMATCH
    rest = [(t.task_id, 0, "") for t in tasks[2:]]
    errs = st.complete_tasks(*c, failed + rest, 0.0)
    assert all(isinstance(e, NotFound) and "move dropped" in e.message for e in errs[:2]), errs
    assert errs[2:] == [None] * len(rest)
    assert st.counters["moves_dropped"] == 2
    assert st.counters["moves_failed"] == 0 and st.counters["moves_retried"] == 0
    assert st.get_object(b).version == obj.version
    st.check_invariants()
    # a failure of a move whose object did not change is still retried
    put(st, c, "k-late")
    more = st.fetch_tasks(*c, 100, 0.0)
    if more:
        st.complete_tasks(*c, [(t.task_id, 13, "boom") for t in more], 0.0)
        assert st.counters["moves_retried"] == len(more) and st.counters["moves_dropped"] == 2


def test_hot_ssd_object_is_promoted_and_stays_on_ssd_too() -> None:
    st = make_state()
    c = client(st)
    for i in range(9):
        put(st, c, f"k{i}")
    run_all(st, c)
    cold = next(f"k{i}" for i in range(9) if tiers(st, f"k{i}") == [Tier.SSD])
    st.get(c[0], cold, 1.0)
    assert not st.tasks  # once: not hot yet
    st.get(c[0], cold, 1.0)
    assert [t.kind for t in st.tasks.all()] == [PROMOTE]
    run_all(st, c, 1.0)
    assert tiers(st, cold) == [Tier.CXL, Tier.SSD] and st.counters["promotions"] == 1
    st.check_invariants()


def test_dram_tier_caches_hot_objects_of_one_host_and_upsert_or_remove_drop_them() -> None:
    st = make_state(ssd_blocks=0)
    a = client(st, ("cxl0",))
    b = client(st, ("cxl0",))
    dram = st.mount_segment(a[0], a[1], "dram-a", Tier.DRAM, REGION_HEADER_BYTES + 4 * EXT, "u", "", 0.0)
    put(st, b, "hot")
    put(st, b, "other")
    st.get(b[0], "hot", 0.0)
    st.get(b[0], "hot", 0.0)
    assert not st.tasks  # host b has no DRAM tier
    st.get(a[0], "hot", 0.0)
    st.get(a[0], "hot", 0.0)
    (task,) = st.tasks.all()
    assert task.kind == CACHE and task.client_id == a[0] and task.destination[0] == dram.segment_id
    assert st.fetch_tasks(*b, 10, 0.0) == []  # only the owner runs it
    run_all(st, a)
    assert tiers(st, "hot") == [Tier.CXL, Tier.DRAM] and st.counters["dram_caches"] == 1
    st.check_invariants()
    # an upsert anywhere: the new version has no DRAM replica; the old one's is
    # freed once the readers' leases on the old version end
    _, lease = st.get(a[0], "hot", 0.0)
    obj = st.put_start(*b, "hot", EXT, 0.0, upsert=True)
    st.put_end(*b, "hot", obj.version, 0.0)
    assert tiers(st, "hot") == [Tier.CXL]
    st.check_invariants()
    st.sweep(st.config.lease_ttl_s + 0.5)  # every lease ends (the clients are still alive)
    assert dram.used_bytes == 0
    st.check_invariants()
    # the owner's expiry unmounts its DRAM tier; objects stay
    for _ in range(2):
        st.get(a[0], "other", 6.0)
    run_all(st, a, 6.0)
    assert tiers(st, "other") == [Tier.CXL, Tier.DRAM]
    st.sweep(100.0)  # a and b expire (no heartbeat)
    assert tiers(st, "other") == [Tier.CXL] and not dram.mounted
    st.check_invariants()


def test_hard_pinned_bytes_per_segment_follow_dram_copies_and_unmounts() -> None:
    """NO_SPACE reports hard-pinned bytes from a per-segment counter, not a scan: the
    counter follows a pinned object's replicas as they are cached, uncached and unmounted."""
    st = make_state(ssd_blocks=0)
    a = client(st, ("cxl0",))
    dram = st.mount_segment(*a, "dram-a", Tier.DRAM, REGION_HEADER_BYTES + 4 * EXT, "u", "", 0.0)
    obj = st.put_start(*a, "pin", EXT, 0.0, hard_pin=True)
    st.put_end(*a, "pin", obj.version, 0.0)
    for _ in range(2):
        st.get(a[0], "pin", 0.0)
    run_all(st, a)
    assert tiers(st, "pin") == [Tier.CXL, Tier.DRAM]
    assert st._pinned_bytes[dram.segment_id] == EXT  # noqa: SLF001 - the counter NO_SPACE reads
    st.check_invariants()
    for i in range(4):  # hotter objects take the DRAM tier: the pinned copy, least recently read, goes
        put(st, a, f"k{i}")
        for _ in range(2):
            st.get(a[0], f"k{i}", 0.0)
        run_all(st, a)
    assert tiers(st, "pin") == [Tier.CXL] and st.counters["dram_uncached"] >= 1
    st.check_invariants()
    b = client(st, ("cxl0",))
    dram_b = st.mount_segment(*b, "dram-b", Tier.DRAM, REGION_HEADER_BYTES + 4 * EXT, "u2", "", 0.0)
    for _ in range(2):
        st.get(b[0], "pin", 0.0)
    run_all(st, b)
    assert tiers(st, "pin") == [Tier.CXL, Tier.DRAM]
    assert st._pinned_bytes[dram_b.segment_id] == EXT  # noqa: SLF001
    st.sweep(100.0)  # the clients expire: their DRAM tiers are unmounted, the pinned object stays in CXL
    assert tiers(st, "pin") == [Tier.CXL] and not dram.mounted and not dram_b.mounted
    st.check_invariants()
    st.remove("pin", 100.0)
    assert not any(st._pinned_bytes.values())  # noqa: SLF001
    st.check_invariants()


def test_ssd_full_drops_least_recently_read_ssd_only_objects() -> None:
    st = make_state(cxl_blocks=10, ssd_blocks=4)
    c = client(st)
    for i in range(30):
        put(st, c, f"k{i}", now=float(i))
        run_all(st, c, float(i))
    assert st.counters["ssd_evictions"] > 0
    assert st.key_count < 30 and st.get_object("k29") is not None
    st.check_invariants()


def test_access_sketch_never_underestimates_and_decays() -> None:
    sk = AccessSketch(width=64, depth=4, reset_adds=1000)
    for i in range(200):
        for _ in range(i % 5):
            sk.add(f"key{i}")
    for i in range(200):
        assert sk.estimate(f"key{i}") >= i % 5
    assert sk.memory_bytes == 64 * 4 * 4
    sk2 = AccessSketch(width=1024, depth=4, reset_adds=10)
    for _ in range(9):
        sk2.add("x")
    assert sk2.estimate("x") == 9
    sk2.add("x")  # the 10th add halves every counter
    assert sk2.estimate("x") == 5 and sk2.resets == 1


@pytest.mark.parametrize("cfg, match", [
    ({"promotion_threshold": -1}, "promotion_threshold"),
    ({"dram_promotion_threshold": -2}, "dram_promotion_threshold"),
    ({"access_sketch_width": 4}, "access_sketch_width"),
    ({"access_sketch_depth": 0}, "access_sketch_depth"),
    ({"task_timeout_s": 0}, "task_timeout_s"),
    ({"task_retries": 0}, "task_retries"),
    ({"copy_ahead_watermark": 1.5}, "copy_ahead_watermark"),
    ({"segments": [SegmentConfig(name="d", size_bytes=MiB, tier="dram")]}, "tier"),
])
def test_master_tier_settings_are_validated(cfg: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        MasterConfig(**cfg).validate()


@pytest.mark.parametrize("cfg, match", [
    ({"dram_tier_bytes": 1000}, "dram_tier_bytes"),
    ({"task_batch": -1}, "task_batch"),
])
def test_clientd_tier_settings_are_validated(cfg: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ClientdConfig(**cfg).validate()


def test_unknown_policy_name_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown .*'nope'.*arc.*lru"):
        load_policy("nope")
    with pytest.raises(ConfigError, match="nope"):
        make_state(eviction_policy="nope")


def test_demotion_counters_add_up_with_copies_ahead() -> None:
    """Objects copied ahead are demoted without a task: counted in ``demotions`` and
    ``demotions_no_copy``, never in ``demotions_started``; the completed DEMOTE tasks
    are ``demotions − demotions_no_copy`` ≤ ``demotions_started`` (docs/operations.md)."""
    st = make_state(copy_ahead_watermark=0.2)
    c = client(st)
    for i in range(5):
        put(st, c, f"k{i}")
    run_all(st, c)  # the copies ahead
    assert st.counters["ssd_copies"] >= 2
    for i in range(5, 9):
        put(st, c, f"k{i}")
        run_all(st, c)
    n = st.counters
    assert n["demotions_no_copy"] >= 1
    assert n["demotions"] > n["demotions_no_copy"] or n["demotions_started"] == 0
    assert 0 <= n["demotions"] - n["demotions_no_copy"] <= n["demotions_started"]
    assert st.key_count == 9 and n["evictions"] == 0
    st.check_invariants()


def test_full_ssd_filesystem_pauses_the_tier_with_backoff() -> None:
    """NO_SPACE from a move (the SSD tier's filesystem is full): the task fails at once, the
    tier takes nothing new for full_tier_backoff_s (doubling, capped), is tried again after
    it, and a successful move resets the backoff."""
    from cxlkv.errors import ErrorCode

    st = make_state(full_tier_backoff_s=1.0, full_tier_backoff_max_s=3.0, copy_ahead_watermark=1.0)
    c = client(st)
    ssd = st.segment_table.by_name("ssd0")
    for i in range(9):
        put(st, c, f"k{i}")
    queued = len(st.tasks)
    tasks = st.fetch_tasks(c[0], c[1], 2, 0.0)
    assert len(tasks) == 2 and queued > 2 and all(t.kind == DEMOTE for t in tasks)
    st.complete_tasks(c[0], c[1], [(tasks[0].task_id, ErrorCode.NO_SPACE, "filesystem is full")], 0.0)
    assert len(st.tasks) == 1  # the moves still queued into the tier failed with it; one still runs
    st.complete_tasks(c[0], c[1], [(tasks[1].task_id, ErrorCode.NO_SPACE, "filesystem is full")], 0.0)
    assert st.counters["tier_write_refusals"] == 2 and st.counters["moves_failed"] == queued
    assert st.counters["moves_retried"] == 0  # not retried into the full tier
    assert ssd.refused_until == 1.0 and ssd.refusals == 1 and ssd.used_bytes == 0  # one pause, not two
    assert "refused a write" in st.last_tier_refusal
    # while paused: demotion falls back to eviction, puts never land on the tier
    for i in range(9, 30):
        put(st, c, f"k{i}", now=0.5)
    assert not st.fetch_tasks(c[0], c[1], 100, 0.5)
    assert ssd.used_bytes == 0 and st.counters["evictions"] > 0
    st.check_invariants()
    # after the pause: tried again; another refusal doubles it, capped at 3 s
    for i, (now, pause) in enumerate([(1.0, 2.0), (3.0, 3.0), (6.0, 3.0)]):
        for k in range(4):
            put(st, c, f"r{i}/{k}", now=now)
        tasks = st.fetch_tasks(c[0], c[1], 100, now)
        assert tasks, now
        st.complete_tasks(c[0], c[1], [(t.task_id, ErrorCode.NO_SPACE, "full") for t in tasks], now)
        assert ssd.refused_until == now + pause
    # room again: a successful move resets the backoff
    for k in range(4):
        put(st, c, f"ok/{k}", now=9.0)
    assert run_all(st, c, now=9.0) > 0
    assert ssd.refusals == 0 and st.counters["demotions"] > 0
    st.check_invariants()


def test_a_stalled_mover_never_writes_into_space_given_to_another() -> None:
    """A clientd that stops (SIGSTOP, a partition) while it runs moves and resumes
    after task_timeout_s — however long after — may still write each destination it
    was given. The master gives the moves again with new destinations and keeps the
    old ones allocated for it: through another clientd's moves, through puts that
    fill the tier, through the end of its registration; freed only once it reports
    (it stopped writing) or its registration's quarantine is released."""
    st = make_state(task_retries=3)
    a = client(st)
    b = client(st)
    for i in range(9):
        put(st, a, f"k{i}")
    given = st.fetch_tasks(*a, 100, 0.0)
    assert given
    held = {t.task_id: t.destination for t in given}
    st.tiering.sweep_tasks(5.0)  # a went silent: given again elsewhere, its destinations held
    assert st.counters["moves_fenced"] == len(given)
    again = st.fetch_tasks(*b, 100, 5.0)
    assert {t.task_id for t in again} == set(held)
    assert all(t.destination != held[t.task_id] for t in again)  # new destinations
    st.complete_tasks(*b, [(t.task_id, 0, "") for t in again], 5.0)
    st.check_invariants()
    ssd = st.segment_table.by_name("ssd0")

    def overlaps_held() -> list[Any]:
        live = [e for o in st._objects.values() for e in o.extents]
        return [e for e in live for d in held.values()
                if e[0] == d[0] and e[1] < d[1] + d[2] and d[1] < e[1] + e[2]]

    # nothing the master hands out afterwards overlaps a held destination
    for i in range(9, 200):
        put(st, b, f"fill{i}", 5.0 + i * 0.001)
        st.fetch_tasks(*b, 100, 5.0)
        run_all(st, b, 5.0)
    assert not overlaps_held(), overlaps_held()
    assert ssd.used_bytes > 0
    st.check_invariants()
    # a's registration ends (it expired): the held destinations move to quarantine, still held
    st.sweep(5.0 + st.config.client_ttl_s + 1.0)
    assert not overlaps_held()
    st.check_invariants()
    quarantined_before = len(st.quarantine.held)
    assert quarantined_before >= len(held)
    freed = st.release_quarantine_of(a[0])  # the operator's word: that host is gone
    assert freed >= len(held) * EXT
    st.check_invariants()


def test_a_late_report_frees_the_held_destination_at_once() -> None:
    st = make_state(task_retries=3)
    a = client(st)
    for i in range(9):
        put(st, a, f"k{i}")
    given = st.fetch_tasks(*a, 100, 0.0)
    st.tiering.sweep_tasks(5.0)
    used = st.segment_table.by_name("ssd0").used_bytes
    errs = st.complete_tasks(*a, [(t.task_id, 0, "") for t in given], 5.0)  # late: refused, but done writing
    assert all(isinstance(e, StaleToken) for e in errs)
    assert st.counters["moves_fence_released"] == len(given)
    assert st.segment_table.by_name("ssd0").used_bytes < used
    st.check_invariants()
