"""Prometheus metrics of a live cluster: endpoints, naming, values that move with
operations (puts, gets, prefix hits and misses, bytes, RemoveAll, eviction), a
trace replay seen through the scrapes, and the dashboard's and alerts' metric
names present in a real scrape.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from cxlkv.trace.replay import ReplayOptions, run_replay
from master_harness import locate
from ops_helpers import METRICS_ON, Scrape, exists_in, metric_urls, promql_metric_names, scrape

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT.parent / "shared" / "traces" / "conversation_trace.jsonl"
MiB = 1 << 20
KiB = 1 << 10

CLUSTER_OPTIONS = dict(METRICS_ON)

#: Label names a cxlkv metric may carry (all with bounded values).
ALLOWED_LABELS = {"method", "result", "segment", "tier", "state", "op", "direction", "kind",
                  "component", "version", "python", "le", "commit", "code"}
SECRET = "ops-secret-key-material"


def _all(cl) -> tuple[Scrape, list[Scrape]]:
    master_url, clientd_urls = metric_urls(cl)
    return scrape(master_url), [scrape(u) for u in clientd_urls]


def _sum(scrapes: list[Scrape], name: str, **labels: str) -> float:
    return sum(s.value(name, **labels) for s in scrapes)


def _assert_sane(s: Scrape) -> None:
    """Naming conventions, bounded labels, no negative gauge."""
    for fam in s.families:
        assert re.match(r"^(cxlkv|process)_[a-z0-9_]+$", fam.name), fam.name
        if fam.name.startswith("process_"):
            continue
        if "bytes" in fam.name:
            assert fam.name.endswith("_bytes"), fam.name
        if "seconds" in fam.name:
            assert fam.name.endswith("_seconds"), fam.name
        for sample in fam.samples:
            assert set(sample.labels) <= ALLOWED_LABELS, (fam.name, sample.labels)
            if fam.type == "counter":
                assert sample.name.endswith("_total"), sample.name
            if fam.type == "gauge":
                assert sample.value >= 0, (sample.name, sample.labels, sample.value)
            assert not math.isnan(sample.value), sample
    assert SECRET not in s.text


def test_endpoints_are_reported_in_stat(module_cluster) -> None:
    cl = module_cluster
    st = cl.master_stat(False)
    assert st.metrics_url.startswith("http://127.0.0.1:") and st.metrics_url.endswith("/metrics")
    urls = [c.metrics_url for c in st.clients if c.alive]
    assert len(urls) == 2 and all(u.startswith("http://127.0.0.1:") for u in urls), urls
    with cl.client(0) as c:
        assert c.stat()["metrics_url"] in urls
    m = scrape(st.metrics_url)
    assert m.value("cxlkv_build_info", component="master") == 1
    for u in urls:
        assert scrape(u).value("cxlkv_build_info", component="clientd") == 1
    assert m.value("cxlkv_master_clients", state="alive") == 2
    assert m.value("cxlkv_master_segment_capacity_bytes", segment="cxl0", tier="cxl") > 60 * MiB
    assert m.value("cxlkv_master_segment_mounted", segment="cxl0", tier="cxl") == 1


def test_values_move_with_operations(module_cluster) -> None:
    cl = module_cluster
    m0, c0 = _all(cl)
    n, size = 20, 10 * KiB
    keys = [f"ops/{SECRET}/{i}" for i in range(n)]
    # a writes and b reads through their clientds (direct=False; b's reads the region's index)
    with cl.client(0, direct=False) as a, cl.client(1, direct=False) as b:
        for i, k in enumerate(keys):
            a.put(k, bytes([i]) * size)
        for i, k in enumerate(keys):
            assert b.get(k) == bytes([i]) * size
        with pytest.raises(KeyError):
            b.get(f"ops/{SECRET}/missing")
        buf = b.buffer(8 * size)
        views = [buf[j * size:(j + 1) * size] for j in range(8)]
        prefix = keys[:5] + [f"ops/{SECRET}/absent"] + keys[5:7]
        assert b.get_prefix_into(prefix, views[:8]) == 5
        registered = _sum(_all(cl)[1], "cxlkv_clientd_buffers")
    assert registered >= 1  # b's shared buffer, while b is open
    m1, c1 = _all(cl)
    for s in (m1, *c1):
        _assert_sane(s)

    def d_master(name: str, **labels: str) -> float:
        return m1.value(name, **labels) - m0.value(name, **labels)

    def d_clientd(name: str, **labels: str) -> float:
        return _sum(c1, name, **labels) - _sum(c0, name, **labels)

    # the first put of a size takes PutStart/PutEnd and reserves ahead; the others commit in one call
    started = d_master("cxlkv_master_puts_started_total")
    assert 1 <= started and started + d_master("cxlkv_master_commits_total") == n
    assert d_master("cxlkv_master_puts_committed_total") == n
    assert d_master("cxlkv_master_keys") == n
    assert d_master("cxlkv_master_segment_used_bytes") >= n * size
    assert d_master("cxlkv_master_segment_objects") >= n  # and the extents reserved ahead
    assert d_master("cxlkv_master_reserved_bytes") >= 0
    # reads come from the region's index: no lease, no master call; the hits arrive in batches
    assert d_master("cxlkv_master_lease_grants_total") == 0
    assert d_master("cxlkv_master_get_misses_total") == 0
    cl.wait_until(lambda: scrape(metric_urls(cl)[0]).value("cxlkv_master_index_hits_total")
                  - m0.value("cxlkv_master_index_hits_total") == n + 5, what="the hits reported")
    assert d_master("cxlkv_master_rpcs_total", method="PutStart", result="OK") >= 1
    assert d_master("cxlkv_master_rpc_duration_seconds_count", method="PutEnd") >= 1
    assert d_master("cxlkv_master_rpc_batch_items_sum", method="PutStart") == started
    assert d_master("cxlkv_master_rpc_batch_items_sum", method="Commit") == n - started
    assert d_master("cxlkv_master_rpc_batch_items_sum", method="MatchPrefix") == 0
    # clientd: bytes both ways, requests by result, prefix hits and misses
    assert d_clientd("cxlkv_clientd_copied_bytes_total", direction="in") == n * size
    assert d_clientd("cxlkv_clientd_copied_bytes_total", direction="out") == (n + 5) * size
    assert d_clientd("cxlkv_clientd_requests_total", method="Put", result="OK") == n
    assert d_clientd("cxlkv_clientd_requests_total", method="Get", result="OK") == n
    assert d_clientd("cxlkv_clientd_requests_total", method="Get", result="NOT_FOUND") == 1
    assert d_clientd("cxlkv_clientd_request_duration_seconds_count", method="Get") == n + 1
    assert d_clientd("cxlkv_clientd_prefix_blocks_total", result="hit") == 5
    assert d_clientd("cxlkv_clientd_prefix_blocks_total", result="miss") == 3
    assert d_clientd("cxlkv_clientd_prefix_queries_total") == 1
    assert d_clientd("cxlkv_clientd_request_batch_items_sum", method="PackedGetPrefixInto") == 8
    assert d_clientd("cxlkv_clientd_items_total", op="put") == n
    assert _sum(c1, "cxlkv_clientd_master_connected") == 2
    assert _sum(c1, "cxlkv_clientd_buffers") == _sum(c0, "cxlkv_clientd_buffers")  # unregistered at close


def _trace(tmp_path: Path) -> Path:
    if TRACE.exists():
        return TRACE
    # The shared trace is absent: a small one with the same shape (shared prefixes).
    path = tmp_path / "trace.jsonl"
    lines = []
    for i in range(60):
        ids = list(range(i % 5 * 100, i % 5 * 100 + 4 + i % 7))
        lines.append(json.dumps({"timestamp": i * 10, "input_length": len(ids) * 512, "output_length": 1,
                                 "hash_ids": ids}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_replay_moves_hit_rate_and_bytes_in_scrapes(module_cluster, tmp_path: Path) -> None:
    """The must-show: scrapes before and after a replay on two hosts show the
    prefix hit rate the replay measured, and the bytes it moved."""
    cl = module_cluster
    m0, c0 = _all(cl)
    opts = ReplayOptions(trace_path=str(_trace(tmp_path)), limit=60, workers=2, block_bytes=16 * KiB,
                         key_prefix="ops-replay/")
    report = run_replay(opts, cl.socket_paths)
    assert report.errors == 0, report.error_samples
    m1, c1 = _all(cl)
    hits = _sum(c1, "cxlkv_clientd_prefix_blocks_total", result="hit") - _sum(
        c0, "cxlkv_clientd_prefix_blocks_total", result="hit")
    misses = _sum(c1, "cxlkv_clientd_prefix_blocks_total", result="miss") - _sum(
        c0, "cxlkv_clientd_prefix_blocks_total", result="miss")
    assert hits + misses == report.blocks
    assert hits > 0 and misses > 0
    assert hits / (hits + misses) == pytest.approx(report.block_hit_rate, abs=1e-9)
    moved_in = _sum(c1, "cxlkv_clientd_copied_bytes_total", direction="in") - _sum(
        c0, "cxlkv_clientd_copied_bytes_total", direction="in")
    moved_out = _sum(c1, "cxlkv_clientd_copied_bytes_total", direction="out") - _sum(
        c0, "cxlkv_clientd_copied_bytes_total", direction="out")
    # the replay's writers commit directly (their bytes counted apart), or through the daemon
    direct_in = _sum(c1, "cxlkv_clientd_direct_commit_bytes_total") - _sum(c0, "cxlkv_clientd_direct_commit_bytes_total")
    assert moved_in + direct_in >= report.bytes_written > 0
    assert moved_out == report.bytes_read > 0
    assert m1.value("cxlkv_master_puts_committed_total") - m0.value("cxlkv_master_puts_committed_total") \
        == report.put_blocks
    # the prefix reads came from the region's index; their hits reach the master in batches
    cl.wait_until(lambda: scrape(metric_urls(cl)[0]).value("cxlkv_master_index_hits_total")
                  - m0.value("cxlkv_master_index_hits_total") >= hits, what="the replay's hits reported")


def _dashboard_exprs() -> list[str]:
    dash = json.loads((ROOT / "deploy" / "grafana" / "cxlkv.json").read_text())
    exprs: list[str] = []

    def walk(panels: list) -> None:
        for p in panels:
            exprs.extend(t["expr"] for t in p.get("targets", []))
            walk(p.get("panels", []))

    walk(dash["panels"])
    return exprs


def _alert_exprs() -> list[str]:
    text = (ROOT / "deploy" / "prometheus" / "cxlkv-alerts.yml").read_text()
    return [m.group(1) for m in re.finditer(r"^\s*expr:\s*(.+)$", text, re.M)]


def test_dashboard_and_alerts_query_only_served_metrics(module_cluster) -> None:
    m, cs = _all(module_cluster)
    served = m.sample_names().union(*(c.sample_names() for c in cs))
    dash = promql_metric_names(_dashboard_exprs())
    assert len(dash) >= 30, dash
    missing = sorted(n for n in dash if not exists_in(n, served))
    assert not missing, f"the dashboard queries metrics no daemon serves: {missing}"
    alerts = promql_metric_names(_alert_exprs())
    assert len(alerts) >= 8, alerts
    missing = sorted(n for n in alerts - {"up"} if not exists_in(n, served))
    assert not missing, f"the alert rules query metrics no daemon serves: {missing}"
    # every metric served is documented in docs/operations.md
    docs = (ROOT / "docs" / "operations.md").read_text()
    families = {f.name for s in (m, *cs) for f in s.families if f.name.startswith("cxlkv_")}
    undocumented = sorted(n for n in families
                          if f"`{n}`" not in docs and f"`{n}_total`" not in docs and f"{n}_total`" not in docs)
    assert not undocumented, f"metrics missing from docs/operations.md: {undocumented}"
    prom = (ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text()
    assert "job_name: cxlkv-master" in prom and "job_name: cxlkv-clientd" in prom
    assert "cxlkv-alerts.yml" in prom


def test_eviction_is_accounted(module_cluster) -> None:
    cl = module_cluster
    m0, _ = _all(cl)
    value = b"\xab" * MiB
    with cl.client(0) as a:
        for i in range(90):  # more than the 64 MiB region holds
            a.put(f"ops-evict/{i}", value)

    last: list[tuple[int, int]] = []

    def settled() -> bool:  # no put in flight, at or below the high watermark, unchanged over 3 sweeps
        st = cl.master_stat(False)
        last.append((st.used_bytes, st.key_count))
        return (st.processing_count == 0 and st.used_bytes <= st.high_watermark * st.capacity_bytes
                and len(last) >= 3 and len(set(last[-3:])) == 1)

    cl.wait_until(settled, what="eviction to settle below the high watermark")
    m1, cs = _all(cl)
    for s in (m1, *cs):
        _assert_sane(s)
    evictions = m1.value("cxlkv_master_evictions_total") - m0.value("cxlkv_master_evictions_total")
    evicted = m1.value("cxlkv_master_evicted_bytes_total") - m0.value("cxlkv_master_evicted_bytes_total")
    assert evictions > 0 and evicted > 0
    assert m1.value("cxlkv_master_no_space_total") == m0.value("cxlkv_master_no_space_total")
    st = cl.assert_invariants()
    assert m1.value("cxlkv_master_keys") == st.key_count
    cap = m1.value("cxlkv_master_segment_capacity_bytes")
    used = m1.value("cxlkv_master_segment_used_bytes")
    assert 0 < used <= cap
    assert used == sum(s.used_bytes for s in st.segments if s.mounted)


def test_remove_all_is_accounted(module_cluster) -> None:
    cl = module_cluster
    with cl.client(1) as b:
        b.put_many({f"ops-rm/{i}": b"v" * 100 for i in range(10)})
        m0, _ = _all(cl)
        keys_before = m0.value("cxlkv_master_keys")
        assert keys_before >= 10
        removed = b.remove_all()
    assert removed == keys_before
    def freed() -> bool:  # every object's extent freed: what is left is reserved ahead of need
        m = scrape(metric_urls(cl)[0])
        return m.value("cxlkv_master_segment_used_bytes") == m.value("cxlkv_master_reserved_bytes")

    cl.wait_until(freed, what="every extent freed")
    m1, cs = _all(cl)
    for s in (m1, *cs):
        _assert_sane(s)
    assert m1.value("cxlkv_master_keys") == 0
    assert m1.value("cxlkv_master_segment_objects") == cl.master_stat(check_invariants=False).reserved_count
    assert m1.value("cxlkv_master_puts_in_flight") == 0
    assert m1.value("cxlkv_master_removes_total") - m0.value("cxlkv_master_removes_total") == removed
    assert m1.value("cxlkv_master_rpcs_total", method="RemoveAll", result="OK") >= 1
    assert _sum(cs, "cxlkv_clientd_requests_total", method="RemoveAll", result="OK") >= 1
    cl.assert_invariants()


def test_checksum_failures_are_counted(make_cluster) -> None:
    """Non-coherent (flush) mode: bytes changed behind the store's back are a miss,
    counted in cxlkv_clientd_checksum_failures_total and by result CHECKSUM_MISMATCH."""
    from cxlkv.errors import ChecksumMismatch

    cl = make_cluster(clientds=1, clientd_options={"coherence": "flush"})
    size = 4 * KiB
    with cl.client(0) as a:
        a.put("ops-sum/a", b"\x11" * size)
        a.put("ops-sum/b", b"\x22" * size)
        loc = locate(cl.master_stub(), "ops-sum/b", no_lease=True)
        ext = loc.replicas[0]
        with open(cl.region_paths[0], "r+b") as region:  # a torn write nobody flushed
            region.seek(ext.offset_bytes + loc.header_bytes + 100)  # a value byte
            region.write(b"\x99")
        (c0,) = _all(cl)[1]
        with pytest.raises(ChecksumMismatch):
            a.get("ops-sum/b")
        # the master was told and dropped the damaged object: the prefix now ends there as a miss
        cl.wait_until(lambda: cl.master_stat(check_invariants=False).counters["objects_damaged_dropped"] == 1,
                      what="the master to drop the damaged object")
        buf = a.buffer(2 * size)
        assert a.get_prefix_into(["ops-sum/a", "ops-sum/b"], [buf[:size], buf[size:]]) == 1
    (c1,) = _all(cl)[1]
    _assert_sane(c1)
    assert c1.value("cxlkv_clientd_checksum_failures_total") - c0.value("cxlkv_clientd_checksum_failures_total") == 1
    assert c1.value("cxlkv_clientd_requests_total", method="Get", result="CHECKSUM_MISMATCH") == 1
    assert c1.value("cxlkv_clientd_prefix_blocks_total", result="miss") - c0.value(
        "cxlkv_clientd_prefix_blocks_total", result="miss") == 1


def test_dashboard_imports_and_scopes() -> None:
    """The import dialog's data source is used; job/instance variables scope every
    query (several clusters on one Prometheus); no panel mixes units on one axis."""
    dash = json.loads((ROOT / "deploy" / "grafana" / "cxlkv.json").read_text())
    (inp,) = dash["__inputs"]
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["current"]["value"] == "${%s}" % inp["name"]
    assert {"job", "instance"} <= set(variables)
    for e in _dashboard_exprs():
        for name in promql_metric_names([e]):
            if name.startswith(("cxlkv_", "process_")):
                assert re.search(re.escape(name) + r'\{job=~"\$job", instance=~"\$instance"', e), e

    def panels(ps: list) -> list:
        return [q for p in ps for q in [p, *panels(p.get("panels", []))]]

    for p in panels(dash["panels"]):
        exprs = [t["expr"] for t in p.get("targets", [])]
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit")
        overridden = {o["matcher"]["options"] for o in p.get("fieldConfig", {}).get("overrides", [])
                      if any(pr["id"] == "unit" for pr in o["properties"])}
        for t in p.get("targets", []):
            if t["refId"] in overridden:
                continue
            bytes_like = "_bytes" in t["expr"] and "/" not in t["expr"] and "rate(" not in t["expr"]
            if bytes_like:
                assert unit in ("bytes", "Bps"), (p["title"], t["expr"], unit)
        assert exprs or p["type"] == "row", p["title"]


def test_already_exists_is_no_put_error_and_errors_carry_a_code(module_cluster) -> None:
    """A replay's put of a cached key (ALREADY_EXISTS) counts in
    cxlkv_clientd_put_already_exists_total, not in errors_total, whose series
    carry an error-code label (the known codes exported at 0)."""
    cl = module_cluster
    _, before = _all(cl)
    with cl.client(0) as c:
        c.put("ops-exists/a", b"x" * 100)
        for r in c.put_many([("ops-exists/a", b"y" * 100)] * 3):  # a clean replay: the key is cached
            assert r.error is not None and r.error.code.name == "ALREADY_EXISTS"
    _, after = _all(cl)
    assert _sum(after, "cxlkv_clientd_put_already_exists_total") - _sum(
        before, "cxlkv_clientd_put_already_exists_total") == 3
    assert _sum(after, "cxlkv_clientd_errors_total", op="put", code="ALREADY_EXISTS") == 0
    assert _sum(after, "cxlkv_clientd_errors_total", op="put") == _sum(before, "cxlkv_clientd_errors_total", op="put")
    codes = {smp.labels["code"] for fam in after[0].families for smp in fam.samples
             if smp.name == "cxlkv_clientd_errors_total"}
    assert {"NO_SPACE", "UNAVAILABLE", "TOO_LARGE"} <= codes  # known codes at 0 before the first error
