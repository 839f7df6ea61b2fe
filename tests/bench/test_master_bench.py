"""`cxlkv bench master` plumbing: registered, records carry the standard fields."""

from __future__ import annotations

from cxlkv.bench.cli import BENCHMARKS
from cxlkv.bench.common import BASE_FIELDS
from cxlkv.bench.master import TARGET_UTILISATION, _bench_allocator, _state_limits


def test_registered_as_bench_master() -> None:
    assert BENCHMARKS["master"] == "cxlkv.bench.master:master_cmd"


def test_allocator_records_small_run() -> None:
    alloc, free = _bench_allocator(20_000, 4_000, seed=3)
    for rec in (alloc, free):
        d = rec.to_dict()
        assert set(BASE_FIELDS) <= set(d) and d["bench"] == "master" and d["gbps"] == 0.0
        assert d["ops_per_s"] > 0 and 0 < d["p50_us"] <= d["p99_us"]
        assert 19_000 <= d["live_objects"] <= 21_000
    assert alloc.op == "alloc" and free.op == "free"
    assert alloc.extra["utilisation"] >= TARGET_UTILISATION and alloc.extra["alloc_failures"] > 0


def test_in_process_limits_are_positive() -> None:
    limits = _state_limits(500)
    assert limits["put"] > 0 and limits["get"] > limits["put"] / 10
