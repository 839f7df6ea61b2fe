"""`cxlkv bench all`: the summary table and the option checks."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from cxlkv.bench.all import all_cmd, summarize


def test_summary_has_every_record_beside_its_limit(tmp_path: Path) -> None:
    (tmp_path / "kv.json").write_text(json.dumps([
        {"bench": "kv", "op": "get", "size_bytes": 16 << 20, "ops_per_s": 700.0, "gbps": 11.7, "p50_us": 1400.0,
         "p99_us": 2000.0, "limit_gbps": 17.4, "ratio_to_limit": 0.67, "path": "shared_buffer", "concurrency": 2},
        {"bench": "kv", "op": "put", "size_bytes": 4096, "ops_per_s": 9000.0, "gbps": 0.04, "p50_us": 100.0,
         "p99_us": 300.0, "limit_gbps": 5.2, "ratio_to_limit": 0.007, "batch": 128},
    ]))
    (tmp_path / "replay.json").write_text(json.dumps({
        "bench": "replay", "requests": 12031, "block_hit_rate": 0.2791, "policy_sim_hit_rate": 0.2841,
        "lru_sim_hit_rate": 0.2784, "bound_hit_rate": 0.3664, "requests_per_s": 1400.0, "gbps": 1.9,
        "limit_gbps": 31.0, "p50_ms": 0.9, "p99_ms": 7.0, "errors": 0}))
    md = summarize(tmp_path)
    assert "## kv" in md and "## replay" in md
    assert "| get | 16 MiB | path=shared_buffer, concurrency=2 | 700 | 11.70 |" in md
    assert "batch=128" in md and "| 17.40 | 0.67 |" in md
    assert "| 12,031 | 27.91 % | 28.41 % | 27.84 % | 36.64 % | 1,400 |" in md
    assert "Measured" not in md  # no record of when: no claim


def test_summary_heads_each_section_with_when_it_was_measured(tmp_path: Path) -> None:
    """A partial run (--only) stamps only what it measured; the others keep their time."""
    from cxlkv.bench.all import MEASURED_AT, _stamp

    (tmp_path / "replay.json").write_text(json.dumps({
        "bench": "replay", "requests": 1, "block_hit_rate": 0.0, "policy_sim_hit_rate": 0.0,
        "lru_sim_hit_rate": 0.0, "bound_hit_rate": 0.0, "requests_per_s": 1.0, "gbps": 0.0,
        "limit_gbps": 1.0, "p50_ms": 1.0, "p99_ms": 1.0, "errors": 0}))
    (tmp_path / "kv.json").write_text("[]")
    (tmp_path / MEASURED_AT).write_text(json.dumps({"kv": "2026-01-02 03:04 UTC"}))
    _stamp(tmp_path, "replay")
    md = summarize(tmp_path)
    assert "## measured_at" not in md
    kv, replay = md.split("## kv")[1].split("## replay")
    assert "Measured 2026-01-02 03:04 UTC." in kv
    assert "Measured 20" in replay and "2026-01-02" not in replay


def test_unknown_benchmark_is_refused(tmp_path: Path) -> None:
    r = CliRunner().invoke(all_cmd, ["--json-dir", str(tmp_path), "--only", "nope"])
    assert r.exit_code != 0 and "unknown benchmark" in r.output and "replay" in r.output


def test_kv_rates_against_the_larger_limit(monkeypatch) -> None:
    """bench kv re-measures each size's memcpy at the end of its run and rates every
    record against the larger measurement: a slow moment at the start cannot
    inflate a ratio, and a slow one at the end cannot either."""
    from cxlkv.bench import kv
    from cxlkv.bench.common import Record

    recs = [Record("kv", "put", 16 << 20, 100.0, 1.6777216, 1.0, 2.0, 10.0, 0.1678),
            Record("kv", "get", 4096, 1000.0, 0.004096, 1.0, 2.0, 5.0, 0.0008)]
    later = {16 << 20: 20.0, 4096: 4.0}
    monkeypatch.setattr(kv, "measure_memcpy_gbps", lambda size, runs=3: later[size])
    logged: list[str] = []
    limits = {16 << 20: 10.0, 4096: 5.0}
    kv._settle_limits(recs, limits, logged.append)
    assert limits == {16 << 20: 20.0, 4096: 5.0}
    assert recs[0].limit_gbps == 20.0 and abs(recs[0].ratio_to_limit - 1.6777216 / 20.0) < 1e-12
    assert recs[1].limit_gbps == 5.0 and abs(recs[1].ratio_to_limit - 0.004096 / 5.0) < 1e-12
    assert len(logged) == 1 and "rating against the larger" in logged[0]


def test_gets_carry_a_cold_source_limit(monkeypatch) -> None:
    """Gets from 64 KiB are also rated against memcpy from a source out of cache
    (where a get's bytes are); puts and small gets are not."""
    from cxlkv.bench import kv
    from cxlkv.bench.common import Record, measure_cold_memcpy_gbps, measure_written_memcpy_gbps

    cold = measure_cold_memcpy_gbps(1 << 20, runs=1, pool_bytes=64 << 20)
    assert cold > 0.1
    assert measure_written_memcpy_gbps(1 << 20, copies=8, pool_bytes=8 << 20) > 0.1  # a real writer process
    recs = [Record("kv", "get", 1 << 20, 1000.0, 1.048576, 1.0, 2.0, 10.0, 0.1),
            Record("kv", "put", 1 << 20, 1000.0, 1.048576, 1.0, 2.0, 10.0, 0.1),
            Record("kv", "get", 4096, 1000.0, 0.004096, 1.0, 2.0, 5.0, 0.0008)]
    monkeypatch.setattr(kv, "measure_memcpy_gbps", lambda size, runs=3: 10.0)
    monkeypatch.setattr(kv, "measure_cold_memcpy_gbps", lambda size: 4.0)
    monkeypatch.setattr(kv, "measure_written_memcpy_gbps", lambda size: 2.0)
    kv._settle_limits(recs, {1 << 20: 10.0, 4096: 5.0}, lambda m: None)
    assert recs[0].extra == {"cold_limit_gbps": 4.0, "ratio_to_cold_limit": round(1.048576 / 4.0, 3),
                             "written_limit_gbps": 2.0, "ratio_to_written_limit": round(1.048576 / 2.0, 3)}
    assert "cold_limit_gbps" not in recs[1].extra and "cold_limit_gbps" not in recs[2].extra


def test_call_limits_are_measured_with_real_processes() -> None:
    """Both per-call ceilings run a real server process and real caller processes
    over a Unix socket, and report calls/s and a latency."""
    import multiprocessing as mp

    import pytest

    from cxlkv.bench.calls import measure_call_limit

    ctx = mp.get_context("spawn")
    for kind in ("echo", "noop"):
        lim = measure_call_limit(ctx, kind, 2, 50)
        assert lim.kind == kind and lim.callers == 2
        assert lim.ops_per_s > 0 and lim.p50_us > 0
    with pytest.raises(ValueError, match="unknown call limit"):
        measure_call_limit(ctx, "nope", 1, 1)
    with pytest.raises(ValueError, match="at least 1"):
        measure_call_limit(ctx, "echo", 0, 1)


def test_summary_shows_the_call_limits_of_small_records(tmp_path: Path) -> None:
    (tmp_path / "kv.json").write_text(json.dumps([
        {"bench": "kv", "op": "get", "size_bytes": 4096, "ops_per_s": 8000.0, "gbps": 0.03, "p50_us": 1900.0,
         "p99_us": 3000.0, "limit_gbps": 5.0, "ratio_to_limit": 0.007, "path": "inline", "concurrency": 16,
         "batch": 1, "echo_limit_ops_per_s": 40000.0, "call_limit_ops_per_s": 16000.0, "ratio_to_call_limit": 0.5},
    ]))
    md = summarize(tmp_path)
    assert "no-op call 16,000/s (ratio 0.50), echo 40,000/s" in md


def test_kv_misses_name_the_no_op_ceiling() -> None:
    from cxlkv.bench.kv import must_show_failures
    from cxlkv.bench.common import Record

    rec = Record("kv", "get", 4096, 8000.0, 0.03, 1900.0, 3000.0, 5.0, 0.007,
                 extra={"path": "inline", "concurrency": 16, "batch": 1, "call_limit_ops_per_s": 16000.0})
    missed = [m for m in must_show_failures([rec]) if m.startswith("4 KiB get with 16 callers")]
    assert missed == ["4 KiB get with 16 callers: 8,000/s < 15,000/s (a no-op call through the same stack: 16,000/s)",
                      "4 KiB get with 16 callers: 8,000/s < 200,000/s"]  # issue 17's target, reads from the index


def test_bench_tables_fit_their_width() -> None:
    """Records with many extra fields print as tables no wider than asked, one
    group per benchmark, every value still shown."""
    import io

    from cxlkv.bench.common import Record, print_table

    recs = [Record("master", "put_batch", 0, 1e6, None, 10.0, 20.0, None, None,
                   extra={f"field_{k}": f"value-{i}-{k}" for k in range(12)}) for i in range(3)]
    recs.append(Record("transport", "copy_in", 4096, 1e6, 4.0, 1.0, 2.0, 5.0, 0.8, extra={"kernel": "avx2"}))
    out = io.StringIO()
    print_table(recs, file=out, width=100)
    text = out.getvalue()
    assert max(map(len, text.splitlines())) <= 100, text
    for i in range(3):
        for k in range(12):
            assert f"value-{i}-{k}" in text
    assert "avx2" in text and "field_0" not in text.split("transport")[-1]  # its own table
