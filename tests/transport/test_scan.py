"""transport/scan.py's live_objects: which headers a scan vouches for, and at what cost.

``cxlkv region scan|verify`` and the master's recovery from object headers hand it
every header of a region: millions on a large one, so it must stay O(n log n).
"""

from __future__ import annotations

import random
import time

from cxlkv.transport.scan import ScannedObject, live_objects


def _obj(off: int, key: str, version: int, vlen: int, ok: bool | None = None) -> ScannedObject:
    return ScannedObject(off, key, 0, version, vlen, 128, 0, ok)


def _reference(scanned: list[ScannedObject]) -> list[ScannedObject]:
    """The rule spelled out, quadratically: newest first, skip taken keys, corrupt
    values and anything overlapping what was taken."""
    taken: list[tuple[int, int]] = []
    keys: set[str] = set()
    chosen = []
    for o in sorted(scanned, key=lambda o: -o.version):
        if o.checksum_ok is False or o.key in keys:
            continue
        end = max(o.end_bytes, o.offset_bytes + 1)
        if any(s < end and o.offset_bytes < e for s, e in taken):
            continue
        taken.append((o.offset_bytes, end))
        keys.add(o.key)
        chosen.append(o)
    return sorted(chosen, key=lambda o: o.offset_bytes)


def test_rules() -> None:
    objs = [
        _obj(4096, "a", 1, 100),          # overwritten by b (newer, overlapping)
        _obj(4160, "b", 5, 10),
        _obj(8192, "a", 3, 10),           # a's newest intact version
        _obj(12288, "c", 9, 10, False),   # corrupt: dropped, its older copy stands
        _obj(16384, "c", 2, 10, True),
        _obj(20480, "d", 4, 0),           # an empty value still occupies its offset
        _obj(20480 + 128, "e", 1, 0),      # right after d (header 128 B): no overlap
    ]
    got = [(o.key, o.version) for o in live_objects(objs)]
    assert got == [("b", 5), ("a", 3), ("c", 2), ("d", 4), ("e", 1)]
    assert live_objects([]) == []


def test_matches_the_rule_on_random_regions() -> None:
    rng = random.Random(7)
    for _ in range(200):
        objs = []
        for off in rng.sample(range(0, 200), rng.randint(1, 60)):
            objs.append(_obj(4096 + 64 * off, f"k{rng.randint(0, 15)}", rng.randint(1, 40),
                             rng.choice([0, 10, 100, 300, 1000]), rng.choice([None, True, False])))
        assert live_objects(objs) == _reference(objs)


def test_many_headers_scale() -> None:
    # 300,000 headers (a 256 MiB region of small objects holds more than a million):
    # the list-insert version took ~45 s here (~85 s for 400,000), quadratic.
    n = 300_000
    versions = list(range(1, n + 1))
    random.Random(3).shuffle(versions)  # writes land all over the region, as they do
    objs = [_obj(4096 + 256 * i, f"k{i}", n + versions[i], 16) for i in range(n)]
    objs += [_obj(4096 + 256 * i + 64, f"s{i}", 1, 16) for i in range(0, n, 3)]  # stale, overlapped
    t0 = time.perf_counter()
    live = live_objects(objs)
    took = time.perf_counter() - t0
    assert len(live) == n
    assert took < 10.0, f"live_objects of {len(objs)} headers took {took:.1f} s"
