"""The allocator: alignment, coalescing, exact accounting, no calcified classes."""

from __future__ import annotations

import random

import pytest

from cxlkv.master.allocator import ExtentAllocator, align_up

KiB, MiB = 1 << 10, 1 << 20
BASE = 4096


def test_offsets_are_absolute_aligned_and_exact() -> None:
    a = ExtentAllocator(BASE, BASE + MiB, 64)
    assert a.capacity_bytes == MiB and a.free_bytes == MiB and a.largest_free_bytes == MiB
    end = BASE + MiB
    x = a.alloc(100)  # extents come off the end of the free block
    y = a.alloc(0)  # an empty value takes one alignment unit
    z = a.alloc(64)
    assert (x, y, z) == (end - 128, end - 192, end - 256)
    assert [a.length_of(o) for o in (x, y, z)] == [128, 64, 64]
    assert a.used_bytes == 256 and a.used_bytes + a.free_bytes == a.capacity_bytes
    a.check()


def test_range_is_trimmed_to_the_alignment() -> None:
    a = ExtentAllocator(100, 100 + 10_000, 4096)
    assert a.base_bytes == 4096 and a.end_bytes == 8192 and a.capacity_bytes == 4096
    assert a.alloc(1) == 4096 and a.alloc(1) == -1
    with pytest.raises(ValueError):
        ExtentAllocator(0, 100, 48)
    with pytest.raises(ValueError):
        ExtentAllocator(100, 50)


def test_free_coalesces_both_neighbours() -> None:
    a = ExtentAllocator(BASE, BASE + 4 * 4096, 64)
    offs = [a.alloc(4096) for _ in range(4)]
    assert a.alloc(1) == -1 and a.largest_free_bytes == 0
    a.free(offs[0])
    a.free(offs[2])
    assert a.free_blocks == 2 and a.largest_free_bytes == 4096
    assert a.alloc(8192) == -1  # two separate holes
    a.free(offs[1])  # joins both
    assert a.free_blocks == 1 and a.largest_free_bytes == 3 * 4096
    assert a.alloc(3 * 4096) == min(offs[:3])
    a.check()


def test_double_free_and_foreign_offsets_are_refused() -> None:
    a = ExtentAllocator(BASE, BASE + MiB)
    off = a.alloc(10)
    a.free(off)
    with pytest.raises(KeyError):
        a.free(off)
    with pytest.raises(KeyError):
        a.free(off + 64)
    a.check()
    assert a.used_bytes == 0


def test_whole_range_in_one_extent_and_nothing_more() -> None:
    a = ExtentAllocator(BASE, BASE + 64 * MiB)
    assert a.alloc(64 * MiB + 1) == -1
    assert a.alloc(64 * MiB) == BASE
    assert a.alloc(0) == -1 and a.high_water_bytes() == 64 * MiB
    a.free(BASE)
    assert a.high_water_bytes() == 0


def test_small_objects_do_not_calcify_the_space() -> None:
    # Fill with 4 KiB, free everything: one block again, usable by 8 MiB extents.
    cap = 64 * MiB
    a = ExtentAllocator(BASE, BASE + cap)
    offs = []
    while (o := a.alloc(4 * KiB)) >= 0:
        offs.append(o)
    assert len(offs) == cap // (4 * KiB)
    random.Random(3).shuffle(offs)
    for o in offs:
        a.free(o)
    assert a.free_blocks == 1 and a.largest_free_bytes == cap
    assert sum(1 for _ in iter(lambda: a.alloc(8 * MiB), -1)) == 8
    a.check()


def test_good_fit_prefers_a_small_hole_to_splitting_a_big_one() -> None:
    a = ExtentAllocator(BASE, BASE + 10 * MiB)
    small = a.alloc(64 * KiB)
    sep = a.alloc(64)
    a.free(small)  # a 64 KiB hole above a separator, the big free block below it
    assert a.alloc(60 * KiB) == small + 4 * KiB
    assert sep < small
    a.check()


def test_own_class_search_finds_a_fitting_block() -> None:
    # Two free blocks of one size class, only the larger fits the request.
    a = ExtentAllocator(BASE, BASE + 4 * MiB, 64)
    x = a.alloc(1000 * 64)
    a.alloc(64)
    y = a.alloc(1003 * 64)
    a.alloc(64)
    rest = a.alloc(a.largest_free_bytes)
    assert rest >= 0 and a.largest_free_bytes == 0
    a.free(x)
    a.free(y)
    assert a.alloc(1002 * 64) == y + 64  # the fast path sees no class above; the own class has y
    a.check()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_operations_keep_every_invariant(seed: int) -> None:
    rng = random.Random(seed)
    a = ExtentAllocator(BASE, BASE + 32 * MiB, 64)
    live: dict[int, int] = {}
    for step in range(6000):
        if live and rng.random() < 0.45:
            off = rng.choice(list(live)) if len(live) < 64 else next(iter(live))
            assert a.free(off) == live.pop(off)
        else:
            size = rng.choice([0, 1, 63, 64, 65, 4 * KiB, 60 * KiB, MiB, 3 * MiB + 7])
            off = a.alloc(size)
            if off < 0:
                assert a.largest_free_bytes < align_up(max(size, 1), 64)
                continue
            live[off] = align_up(max(size, 1), 64)
            assert off % 64 == 0 and BASE <= off and off + live[off] <= BASE + 32 * MiB
        assert a.used_bytes == sum(live.values())
        if step % 500 == 0:
            a.check()
    for off in list(live):
        a.free(off)
    a.check()
    assert a.used_bytes == 0 and a.free_blocks == 1


def test_can_alloc_says_what_alloc_does() -> None:
    # Own-class blocks too small in front of the one that fits (the slow path looks
    # at 64): the largest block is large enough, alloc still fails; can_alloc agrees.
    from cxlkv.master.allocator import ExtentAllocator

    u = 64
    a = ExtentAllocator(0, (70 * 1537 + 1568) * u, u)
    holes = []
    for _ in range(70):
        holes.append(a.alloc(1536 * u))
        a.alloc(u)
    holes.append(a.alloc(1567 * u))
    a.alloc(u)
    assert a.free_bytes == 0 and not a.can_alloc(0)
    for off in holes:
        a.free(off)
    assert a.largest_free_bytes == 1567 * u
    seen = {}
    for units in (1, 1000, 1536, 1537, 1565, 1567, 1568, 4000, 10**9):
        n = units * u
        predicted = a.can_alloc(n)
        off = a.alloc(n) if n <= a.free_bytes else -1
        seen[units] = predicted
        assert predicted == (off >= 0), units
        if off >= 0:
            a.free(off)
    assert seen[1536] and not seen[1565] and not seen[1568]
    a.check()
