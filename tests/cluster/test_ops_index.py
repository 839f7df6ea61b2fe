"""An operator sees a full region index: a live cluster whose index is sized for 64
objects (128 slots, objects take at most 96) is filled past it; `cxlkv status` (table
and --json), the master's /metrics and Stat show the slots and the overflow, and the
master warns once when the overflow starts and once per doubling — never per put.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

from ops_helpers import METRICS_ON, scrape

_WARNING = re.compile(r"WARNING .*index overflow: ([\d,]+) committed object\(s\) have no slot in the region's index")


def _status(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CXLKV_SOCKET"}
    return subprocess.run([sys.executable, "-m", "cxlkv.cli", "status", *args], capture_output=True, text=True,
                          timeout=60, env=env, stdin=subprocess.DEVNULL)


def _warned(cl) -> list[int]:
    """The overflow counts the master's warnings named, in order."""
    return [int(m.group(1).replace(",", "")) for m in _WARNING.finditer(cl.master.log_path.read_text())]


def _put(c, first: int, n: int) -> None:
    for start in range(first, first + n, 16):  # a batch's puts in flight each hold a slot of the small index
        res = c.put_many([(f"ix/{i}", b"v") for i in range(start, min(first + n, start + 16))])
        assert all(r.ok for r in res), [r.error for r in res if not r.ok][:3]


def _overflow(cl) -> int:
    return cl.master_stat(False).index.overflow_objects


def test_a_full_index_is_shown_and_warned_once_per_doubling(make_cluster) -> None:
    cl = make_cluster(clientds=1, index_objects=64, master_options=METRICS_ON["master_options"])
    st = cl.master_stat(False)
    assert st.index.slots == 128 and st.index.key_limit == 96 and st.index.overflow_objects == 0
    assert _warned(cl) == []
    with cl.client(0) as c:
        _put(c, 0, 200)
        # the puts are done: a sweep (50 ms apart) warns until the last count is over half of it
        cl.wait_until(lambda: _warned(cl) and _overflow(cl) < 2 * _warned(cl)[-1], what="the overflow warnings")
        warned = _warned(cl)
        assert warned[0] >= 1 and all(b >= 2 * a for a, b in zip(warned, warned[1:])), warned
        assert len(warned) <= _overflow(cl).bit_length(), warned  # by doubling: not per put
        # below twice the last count: no new warning, however many sweeps run
        now = _overflow(cl)
        below = 2 * warned[-1] - now - 1
        if below > 0:  # each put adds at most one overflowed object
            _put(c, 200, below)
        time.sleep(0.5)  # ten sweeps
        assert _warned(cl) == warned
        # reaching it: exactly one more
        n = 200 + max(below, 0)
        while _overflow(cl) < 2 * warned[-1]:
            _put(c, n, 4)
            n += 4
        cl.wait_until(lambda: len(_warned(cl)) > len(warned), what="the warning at the doubling")
        time.sleep(0.3)  # six more sweeps: nothing more to say
        again = _warned(cl)
        assert len(again) == len(warned) + 1 and 2 * warned[-1] <= again[-1] < 4 * warned[-1], (warned, again)
    line = next(ln for ln in cl.master.log_path.read_text().splitlines() if _WARNING.search(ln))
    assert "(128 slots, objects take at most 96;" in line and "every miss" in line, line
    assert "cxlkv region format --expected-objects N" in line and "docs/index.md" in line, line

    # Stat and /metrics: the same counts, consistent with the keys
    st = cl.master_stat(False)
    ix = st.index
    assert ix.object_slots <= ix.key_limit and ix.object_slots + ix.grant_slots <= ix.slots
    assert ix.overflow_objects > 0 and ix.object_slots + ix.overflow_objects == st.key_count == n
    m = scrape(st.metrics_url)
    assert m.value("cxlkv_master_index_slots") == 128
    used_obj = m.value("cxlkv_master_index_slots_used", kind="object")
    used_grant = m.value("cxlkv_master_index_slots_used", kind="grant")
    assert 0 < used_obj <= 96 and used_obj + used_grant <= 128
    assert m.value("cxlkv_master_index_overflow_objects") == ix.overflow_objects > 0
    assert used_obj + m.value("cxlkv_master_index_overflow_objects") == m.value("cxlkv_master_keys")

    # cxlkv status: the line, with the consequence and the fix; --json the same
    r = _status("--master", cl.master_address, "--json")
    assert r.returncode == 0, r.stderr
    js = json.loads(r.stdout)
    assert js["master"]["index"] == {"slots": 128, "object_slots": ix.object_slots, "grant_slots": ix.grant_slots,
                                     "key_limit": 96, "overflow_objects": ix.overflow_objects}
    ji = js["index"]
    assert ji["used_slots"] == ix.object_slots + ix.grant_slots and abs(ji["usage_ratio"] - ji["used_slots"] / 128) < 1e-9
    assert f"{ix.overflow_objects:,} objects overflowed" in ji["hint"] and "--expected-objects" in ji["hint"]
    r = _status("--master", cl.master_address)
    assert r.returncode == 0, r.stderr
    (row,) = [ln for ln in r.stdout.splitlines() if ln.startswith("index ")]
    assert re.search(r"\[#+\.*\]\s+\d+\.\d%  of 128 slots \(\d+ objects, at most 96; \d+ grants\)", row), row
    assert (f"; {ix.overflow_objects:,} objects overflowed: their reads and every miss take the RPC path "
            f"(size it: cxlkv region format --expected-objects N, N >= {n:,})") in row, row


def test_cluster_up_sizes_the_index_for_the_expected_objects(tmp_path) -> None:
    """``cxlkv cluster up --expected-objects N``: the region's index is sized for N
    objects (at least 2 N slots), as ``cxlkv region format --expected-objects N``."""
    run_dir = tmp_path / "up"
    env = {k: v for k, v in os.environ.items() if k != "CXLKV_SOCKET"}

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "cxlkv.cli", *args], capture_output=True, text=True,
                              timeout=120, env=env, stdin=subprocess.DEVNULL)

    up = cli("cluster", "up", "--run-dir", str(run_dir), "--clientds", "1", "--region-size", "64MiB",
             "--expected-objects", "20000")
    try:
        assert up.returncode == 0, up.stderr
        state = json.loads((run_dir / "cluster.json").read_text())
        st = cli("status", "--json", "--master", state["master_address"])
        assert st.returncode == 0, st.stderr
        index = json.loads(st.stdout)["index"]
        # 64 MiB / 16 KiB = 4,096 by default; 20,000 needs buckets of 8 for 40,000 slots: 8,192 buckets
        assert index["slots"] == 65536 and index["overflow_objects"] == 0, index
    finally:
        cli("cluster", "down", "--run-dir", str(run_dir))
