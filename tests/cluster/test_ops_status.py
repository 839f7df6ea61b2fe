"""`cxlkv status` against a live cluster: table and JSON, usage bars, hit rate from
the clientds' /metrics, metrics URLs, clients alive and expired, recent rates,
and one clear line when nothing answers.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from cxlkv.cli.status import index_line, index_summary, usage_bar
from ops_helpers import METRICS_ON

KiB, MiB = 1 << 10, 1 << 20
FAST_EXPIRY = {"client_ttl_s": 1.5, "heartbeat_interval_s": 0.25}


def _status(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CXLKV_SOCKET"}
    return subprocess.run([sys.executable, "-m", "cxlkv.cli", "status", *args], capture_output=True, text=True,
                          timeout=60, env=env, stdin=subprocess.DEVNULL)


def test_usage_bar() -> None:
    assert usage_bar(0, 100, 10) == "[..........]   0.0%"
    assert usage_bar(50, 100, 10) == "[#####.....]  50.0%"
    assert usage_bar(100, 100, 10) == "[##########] 100.0%"
    assert "n/a" in usage_bar(5, 0, 10)


def test_index_line() -> None:
    assert index_summary(None) is None
    ix = index_summary({"slots": 8192, "object_slots": 3300, "grant_slots": 75, "key_limit": 6144,
                        "overflow_objects": 0})
    assert ix["used_slots"] == 3375 and abs(ix["usage_ratio"] - 3375 / 8192) < 1e-12 and ix["hint"] == ""
    assert index_line(ix) == ("[##########..............]  41.2%  of 8,192 slots "
                              "(3,300 objects, at most 6,144; 75 grants)")
    ix = index_summary({"slots": 8192, "object_slots": 6144, "grant_slots": 246, "key_limit": 6144,
                        "overflow_objects": 3856})
    assert index_line(ix) == (
        "[###################.....]  78.0%  of 8,192 slots (6,144 objects, at most 6,144; 246 grants); "
        "3,856 objects overflowed: their reads and every miss take the RPC path "
        "(size it: cxlkv region format --expected-objects N, N >= 10,000)")


def test_status_table_and_json(make_cluster, tmp_path: Path) -> None:
    cl = make_cluster(master_options={**METRICS_ON["master_options"], **FAST_EXPIRY},
                      clientd_options=METRICS_ON["clientd_options"])
    size = 64 * KiB
    with cl.client(0) as a:
        for i in range(8):
            a.put(f"st/{i}", bytes([i]) * size)
        buf = a.buffer(6 * size)
        views = [buf[j * size:(j + 1) * size] for j in range(6)]
        assert a.get_prefix_into([f"st/{i}" for i in range(4)] + ["st/none", "st/5"], views) == 4

    r = _status("--socket", cl.socket_path(0), "--json")
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    m = st["master"]
    assert m["address"] == cl.master_address and m["key_count"] == 8 and m["fenced_count"] == 0
    assert m["metrics_url"].startswith("http://")
    assert st["clientd"]["name"] == "clientd-0" and st["clientd"]["metrics_url"].startswith("http://")
    (seg,) = m["segments"]
    assert seg["name"] == "cxl0" and seg["tier"] == "cxl" and seg["used_bytes"] >= 8 * size
    assert 0 < seg["usage_ratio"] < 1
    assert st["tiers"]["cxl"]["used_bytes"] == seg["used_bytes"]
    assert st["clients_alive"] == 2 and st["clients_expired"] == 0
    assert all(c["metrics_url"].startswith("http://") for c in m["clients"])
    hr = st["hit_rate"]
    assert hr["prefix_blocks"] == 6 and hr["prefix_blocks_hit"] == 4 and hr["clientds_reporting"] == 2
    assert abs(hr["ratio"] - 4 / 6) < 1e-9
    assert st["evictions"]["evictions"] == 0
    # space held ahead of need (a clientd's reservations) is used but no object's: said
    assert m["reserved_bytes"] == cl.master_stat(False).reserved_bytes
    assert st["space"]["reserved_bytes"] == m["reserved_bytes"] and st["space"]["quarantined_bytes"] == 0
    # the region's index (64 MiB at the default sizing: 8,192 slots), nothing overflowed
    assert st["index"]["slots"] == m["index"]["slots"] == 8192 and st["index"]["object_slots"] == 8
    assert st["index"]["overflow_objects"] == 0 and st["index"]["hint"] == ""

    r = _status("--socket", cl.socket_path(0))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert re.search(r"\[#*\.+\]\s+\d+\.\d%", out), out
    assert "hit rate   66.7% (4 of 6 prefix blocks" in out, out
    if m["reserved_bytes"]:
        assert "reserved ahead of need" in out, out
    assert re.search(r"^index +\[#*\.+\] +\d+\.\d%  of 8,192 slots \(8 objects, at most 6,144; \d+ grants\)$", out,
                     re.M), out
    for name in ("clientd-0", "clientd-1", "cxl0", m["metrics_url"]):
        assert name in out, (name, out)

    # a host dies: its registration expires, status shows it
    cl.kill_clientd(1)
    cl.wait_until(lambda: any(not c.alive for c in cl.master_stat(False).clients), what="clientd-1 to expire")
    r = _status("--master", cl.master_address, "--json", "--window", "0.3")
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["clients_alive"] == 1 and st["clients_expired"] == 1
    assert st["clientd"] is None and st["hit_rate"]["clientds_alive"] == 1
    assert st["window"]["window_s"] == 0.3 and "evictions_per_s" in st["window"]
    r = _status("--master", cl.master_address)
    assert re.search(r"clientd-1 .* expired", r.stdout), r.stdout
    assert "1 alive, 1 expired" in r.stdout


def test_status_unreachable_is_one_line(tmp_path: Path) -> None:
    r = _status("--socket", str(tmp_path / "none.sock"))
    assert r.returncode == 22, (r.returncode, r.stderr)
    assert r.stdout == "" and len(r.stderr.splitlines()) == 1 and r.stderr.startswith("error: UNAVAILABLE:")
    assert "--master HOST:PORT" in r.stderr  # the way round a dead local clientd
    r = _status("--master", "127.0.0.1:1")
    assert r.returncode == 22 and len(r.stderr.splitlines()) == 1, r.stderr
    # the code is said once: "error: UNAVAILABLE: master 127.0.0.1:1: …"
    assert r.stderr.startswith("error: UNAVAILABLE: ") and r.stderr.count("UNAVAILABLE") == 1, r.stderr
    assert "127.0.0.1:1" in r.stderr, r.stderr
    assert "--master HOST:PORT" not in r.stderr


def test_status_space_is_per_tier_and_excludes_dram(make_cluster) -> None:
    """16 MiB CXL + 8 MiB SSD + 2 × 2 MiB DRAM: `space` is CXL + SSD (a DRAM tier holds
    only extra copies), and each tier has its own row (docs/operations.md)."""
    cl = make_cluster(region_size_bytes=16 * MiB, ssd_size_bytes=8 * MiB,
                      clientd_options={"dram_tier_bytes": 2 * MiB})
    cl.wait_until(lambda: sum(s.tier == 2 for s in cl.master_stat().segments if s.mounted) == 2,
                  what="both DRAM tiers mounted")
    r = _status("--socket", cl.socket_path(0), "--json")
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    t = st["tiers"]
    assert set(t) == {"cxl", "ssd", "dram"} and t["dram"]["segments"] == 2
    assert st["space"]["capacity_bytes"] == t["cxl"]["capacity_bytes"] + t["ssd"]["capacity_bytes"]
    assert st["space"]["capacity_bytes"] < st["master"]["capacity_bytes"]  # the master's sum counts DRAM
    r = _status("--socket", cl.socket_path(0))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    space = next(line for line in out.splitlines() if line.startswith("space"))
    assert "of 24.0 MiB" in space or "of 23.9 MiB" in space, space
    assert "(cxl + ssd)" in space, space
    dram = next(line for line in out.splitlines() if line.startswith("tier dram"))
    assert "not in space" in dram and "of 4.0 MiB" in dram, dram
    # `cxlkv stat` (one clientd) counts space the same way
    env = {k: v for k, v in os.environ.items() if k != "CXLKV_SOCKET"}
    r = subprocess.run([sys.executable, "-m", "cxlkv.cli", "stat", "--socket", cl.socket_path(0)],
                       capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    space = next(line for line in r.stdout.splitlines() if line.startswith("space"))
    # 24 MiB of CXL and SSD tiers, less the CXL region's header and its index (0.8 %)
    assert "DRAM tiers hold extra copies only" in space and ("used of 24.0 MiB" in space
                                                             or "used of 23.9 MiB" in space), space


def test_status_and_stat_with_the_master_lost(make_cluster) -> None:
    """The local clientd answers, the master does not: `status` prints the clientd's
    view, warns once naming the master once, and exits 22; `stat` says keys and
    space are unknown (null in --json), not 0."""
    cl = make_cluster(clientds=1, master_options={"heartbeat_interval_s": 0.2})
    with cl.client(0) as c:
        c.put("lost/a", b"a" * 1000)
    cl.stop_master()
    r = _status("--socket", cl.socket_path(0))
    assert r.returncode == 22, (r.returncode, r.stdout, r.stderr)
    warnings = [ln for ln in r.stdout.splitlines() if ln.startswith("warning")]
    assert len(warnings) == 1 and warnings[0].count(cl.master_address) == 1, r.stdout
    assert "unknown" in warnings[0]
    assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith("error: UNAVAILABLE:"), r.stderr
    r = _status("--socket", cl.socket_path(0), "--json")
    assert r.returncode == 22 and json.loads(r.stdout)["master"] is None

    env = {**os.environ, "CXLKV_SOCKET": cl.socket_path(0)}
    r = subprocess.run([sys.executable, "-m", "cxlkv.cli", "stat"], capture_output=True, text=True, timeout=60,
                       env=env)
    assert r.returncode == 0, r.stderr
    assert re.search(r"^keys\s+unknown", r.stdout, re.M) and re.search(r"^space\s+unknown", r.stdout, re.M), r.stdout
    assert "NOT connected" in r.stdout
    r = subprocess.run([sys.executable, "-m", "cxlkv.cli", "stat", "--json"], capture_output=True, text=True,
                       timeout=60, env=env)
    st = json.loads(r.stdout)
    assert st["key_count"] is None and st["used_bytes"] is None and st["master_connected"] is False
    cl.start_master_again()
    cl.wait_until(lambda: json.loads(subprocess.run(
        [sys.executable, "-m", "cxlkv.cli", "stat", "--json"], capture_output=True, text=True, timeout=60,
        env=env).stdout)["master_connected"], 30, "the clientd to reach the new master")
    r = _status("--socket", cl.socket_path(0))
    assert r.returncode == 0 and "warning" not in r.stdout, (r.stdout, r.stderr)
