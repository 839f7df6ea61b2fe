"""Plugin registries: built-ins, unknown names, broken plugins, a third-party package."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w

from cxlkv.config import MasterConfig, SegmentConfig
from cxlkv.errors import ConfigError
from cxlkv.master.eviction import ArcPolicy, LruPolicy, available_policies, load_policy
from cxlkv.master.segments import Segment, Tier
from cxlkv.master.strategies import PlacementRequest, available_strategies, load_strategy
from cxlkv.master.strategies.builtin import CxlFirstStrategy, FreeRatioFirstStrategy, RandomStrategy
from cxlkv.v1 import master_pb2

from master_harness import MiB, MasterProcess, Writer, assert_invariant, stat

PLUGIN_SRC = Path(__file__).parents[1] / "plugin_strategy"


def test_builtins_are_registered_through_entry_points() -> None:
    assert {"cxl_first", "free_ratio_first", "random"} <= set(available_strategies())
    assert {"lru", "arc"} <= set(available_policies())
    assert isinstance(load_strategy("cxl_first"), CxlFirstStrategy)
    assert isinstance(load_strategy("free_ratio_first"), FreeRatioFirstStrategy)
    assert isinstance(load_strategy("random", seed=1), RandomStrategy)
    assert isinstance(load_policy("lru"), LruPolicy) and isinstance(load_policy("arc"), ArcPolicy)
    assert load_strategy("random").name == "random"


def test_unknown_names_list_the_known_ones() -> None:
    with pytest.raises(ConfigError) as exc:
        load_strategy("best_guess")
    assert "best_guess" in str(exc.value) and "cxl_first, free_ratio_first, random" in str(exc.value)
    with pytest.raises(ConfigError) as exc:
        load_policy("mru")
    assert "arc" in str(exc.value) and "lru" in str(exc.value)


def _segments() -> list[Segment]:
    a = Segment(1, "a", Tier.CXL, 16 * MiB)
    b = Segment(2, "b", Tier.CXL, 64 * MiB)
    d = Segment(3, "d", Tier.DRAM, 64 * MiB)
    a.allocator.alloc(8 * MiB)  # a: 8 MiB free of 16 (50 %)
    b.allocator.alloc(40 * MiB)  # b: 24 MiB free of 64 (37 %)
    return [a, b, d]


def test_builtin_strategies_order_candidates() -> None:
    a, b, d = _segments()
    req = PlacementRequest(MiB, 2, "", 0)
    # cxl_first: CXL before DRAM; within CXL the largest free block first.
    assert CxlFirstStrategy().select([a, b, d], req) == [b, a, d]
    assert CxlFirstStrategy().select([a, b, d], req._replace(preferred_segment="d")) == [d, b, a]
    assert CxlFirstStrategy().select([a, b, d], req._replace(tier=int(Tier.DRAM))) == [d]
    # free_ratio_first: by free/capacity, tier ignored.
    assert FreeRatioFirstStrategy().select([a, b, d], req) == [d, a, b]
    # random: a permutation, reproducible with a seed, never mutating its input.
    segs = [a, b, d]
    picks = {tuple(s.name for s in RandomStrategy(seed=i).select(segs, req)) for i in range(20)}
    assert len(picks) > 1 and all(sorted(p) == ["a", "b", "d"] for p in picks)
    assert RandomStrategy(seed=7).select(segs, req) == RandomStrategy(seed=7).select(segs, req)
    assert segs == [a, b, d]


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo plugin package, pip-installed into a temporary target directory."""
    root = tmp_path_factory.mktemp("plugin")
    src = root / "src"
    shutil.copytree(PLUGIN_SRC, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = root / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
         "--target", str(target), str(src)],
        check=True, timeout=120,
    )
    return target


def test_third_party_strategy_plugin_is_used_by_the_master(tmp_path: Path, plugin_path: Path) -> None:
    segs = [{"name": f"cxl{i}", "size_bytes": 16 * MiB} for i in range(3)]
    cfg = {"segments": segs, "allocation_strategy": "last_segment"}
    with MasterProcess(tmp_path, cfg, env={"PYTHONPATH": str(plugin_path)}) as m:
        w = Writer(m.stub)
        res = w.put("k", MiB, replica_num=2)
        ids = [e.segment_id for e in res.extents]
        assert ids == [w.segments["cxl2"].segment_id, w.segments["cxl1"].segment_id]
        assert stat(m.stub).allocation_strategy == "last_segment"
        assert_invariant(m.stub)


def test_plugin_that_fails_to_import_stops_start_up(tmp_path: Path, plugin_path: Path) -> None:
    m = MasterProcess(tmp_path, {"allocation_strategy": "broken_demo"})
    m.config_path.write_text(tomli_w.dumps(m.config))
    out = subprocess.run(m.argv(), capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(plugin_path)})
    assert out.returncode == 2
    assert "broken_demo" in out.stderr and "failed to load" in out.stderr and "ImportError" in out.stderr
    assert "Traceback" not in out.stderr


def test_master_state_refuses_unknown_policy() -> None:
    from cxlkv.master.state import MasterState

    cfg = MasterConfig(segments=[SegmentConfig(name="c", size_bytes=MiB)], eviction_policy="fifo-ish")
    with pytest.raises(ConfigError, match="lru"):
        MasterState(cfg)


def test_register_client_request_is_the_wire_message() -> None:
    # The state reads regions by attribute: the proto message is accepted as is.
    from cxlkv.master.state import MasterState

    st = MasterState(MasterConfig(segments=[SegmentConfig(name="c", size_bytes=MiB)]))
    c = st.register_client("h", "n", 1, [master_pb2.RegionIdentity(segment_name="c", region_uuid="u",
                                                                     size_bytes=MiB)], "", "", 0.0)
    assert st.segments()[0].region_uuid == "u" and c.epoch >= 1
