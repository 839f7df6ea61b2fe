"""The SDK's path decision (cxlkv.client._paths), pure: no cluster, no I/O.

The end-to-end tests (test_direct, test_sdk_roundtrip, test_gpu …) show each path
moving bytes; these pin down which path an item takes.
"""

from __future__ import annotations

import numpy as np
import pytest

from cxlkv.client._paths import Memory, Offers, Op, Path, daemon_path, memory_of, plan, starts_at_index

I, D = 64 << 10, (64 << 10) + 1  # the default inline and direct thresholds
OFF = Offers(inline_threshold_bytes=I, direct_threshold_bytes=D)
DIRECT = Offers(direct=True, inline_threshold_bytes=I, direct_threshold_bytes=D)
ALL = Offers(index=True, direct=True, inline_threshold_bytes=I, direct_threshold_bytes=D)
INDEX, INLINE, POOL, STAGED = Path.INDEX, Path.INLINE, Path.POOL, Path.STAGED
DIR, CUDA_DIRECT, CUDA_HOST, DAEMON = Path.DIRECT, Path.CUDA_DIRECT, Path.CUDA_HOST, Path.DAEMON


@pytest.mark.parametrize("memory,nbytes,offers,paths", [
    (Memory.BYTES, 4096, ALL, (INLINE, STAGED)),         # small bytes ride inline, even in direct mode
    (Memory.BYTES, I, OFF, (INLINE, STAGED)),            # the limit is inclusive
    (Memory.BYTES, I + 1, OFF, (DAEMON,)),               # larger bytes: pool or staged, once located
    (Memory.BYTES, 1 << 20, DIRECT, (DIR, DAEMON)),
    (Memory.HOST, 4096, DIRECT, (DAEMON,)),              # under the direct threshold
    (Memory.HOST, D, DIRECT, (DIR, DAEMON)),             # the direct threshold is inclusive
    (Memory.HOST, D - 1, DIRECT, (DAEMON,)),
    (Memory.HOST, 1 << 20, OFF, (DAEMON,)),
    (Memory.CUDA, 16, DIRECT, (CUDA_DIRECT, CUDA_HOST)),  # CUDA tensors use direct mode at any size
    (Memory.CUDA, 1 << 20, OFF, (CUDA_HOST,)),
])
def test_put_plans(memory: str, nbytes: int, offers: Offers, paths: tuple[str, ...]) -> None:
    assert plan(Op.PUT, memory, nbytes, offers) == paths


def test_put_with_a_direct_threshold_under_the_inline_limit() -> None:
    """``direct_threshold_bytes=0``: host memory of any size goes direct; ``bytes``
    values of ``put`` still ride inline (``put_from`` passes them as host memory)."""
    low = Offers(direct=True, inline_threshold_bytes=I, direct_threshold_bytes=0)
    assert plan(Op.PUT, Memory.HOST, 10, low) == (DIR, DAEMON)
    assert plan(Op.PUT, Memory.BYTES, 10, low) == (INLINE, STAGED)
    assert plan(Op.PUT, Memory.HOST, 0, low) == (DIR, DAEMON)


@pytest.mark.parametrize("memory,nbytes,offers,paths", [
    (Memory.NONE, None, ALL, (INDEX, INLINE)),           # size unknown: the index, else inline
    (Memory.NONE, None, DIRECT, (INLINE,)),               # direct mode without a mapped index
    (Memory.NONE, None, OFF, (INLINE,)),
    (Memory.NONE, 1 << 20, ALL, (DIR, STAGED)),           # the inline answer said: this large
    (Memory.NONE, D - 1, ALL, (STAGED,)),
    (Memory.NONE, 1 << 20, OFF, (STAGED,)),
])
def test_get_plans(memory: str, nbytes: int | None, offers: Offers, paths: tuple[str, ...]) -> None:
    assert plan(Op.GET, memory, nbytes, offers) == paths


@pytest.mark.parametrize("memory,nbytes,offers,paths", [
    (Memory.HOST, 4096, ALL, (INDEX, DAEMON)),
    (Memory.HOST, 1 << 20, ALL, (INDEX, DIR, DAEMON)),
    (Memory.HOST, 1 << 20, DIRECT, (DIR, DAEMON)),
    (Memory.HOST, None, ALL, (INDEX, DAEMON)),           # capacity not asked yet: only the index step counts
    (Memory.HOST, 1 << 20, OFF, (DAEMON,)),
    (Memory.CUDA, 1 << 20, ALL, (CUDA_DIRECT, CUDA_HOST)),  # the index copies into host memory only
    (Memory.CUDA, 16, OFF, (CUDA_HOST,)),
])
def test_get_into_plans(memory: str, nbytes: int | None, offers: Offers, paths: tuple[str, ...]) -> None:
    assert plan(Op.GET_INTO, memory, nbytes, offers) == paths


def test_prefix_and_exists_plans() -> None:
    assert plan(Op.PREFIX, Memory.HOST, None, ALL) == (INDEX, DAEMON)
    assert plan(Op.PREFIX, Memory.CUDA, None, ALL) == (DAEMON,)
    assert plan(Op.PREFIX, Memory.HOST, None, DIRECT) == (DAEMON,)
    assert plan(Op.EXISTS, Memory.NONE, None, ALL) == (INDEX, INLINE)
    assert plan(Op.EXISTS, Memory.NONE, None, OFF) == (INLINE,)


def test_daemon_step() -> None:
    """Located shared memory is zero-copy; else a small put rides inline (staged
    over the daemon's own limit) unless a batch's direct put handed it back."""
    batch = Offers(direct=True, batch=True, inline_threshold_bytes=I, direct_threshold_bytes=D)
    for op in (Op.PUT, Op.GET_INTO, Op.PREFIX):
        assert daemon_path(op, True, 1 << 20, OFF) == (POOL,)
    assert daemon_path(Op.PUT, False, 4096, OFF) == (INLINE, STAGED)
    assert daemon_path(Op.PUT, False, I + 1, OFF) == (STAGED,)
    assert daemon_path(Op.PUT, False, 4096, batch) == (INLINE, STAGED)
    assert daemon_path(Op.PUT, False, 4096, batch, handed_back=True) == (STAGED,)
    assert daemon_path(Op.PUT, False, 4096, OFF, handed_back=True) == (INLINE, STAGED)  # a single put
    assert daemon_path(Op.GET_INTO, False, 4096, OFF) == (STAGED,)


def test_every_plan_ends_in_a_path_that_answers() -> None:
    """No plan ends in a path that can hand an item back (INDEX, DIRECT, CUDA_DIRECT):
    the Client always has somewhere to go next."""
    answers = {STAGED, POOL, DAEMON, CUDA_HOST, INLINE}
    sizes = (None, 0, 1, I, I + 1, 1 << 20)
    offers = [Offers(index=x, direct=y, batch=z, inline_threshold_bytes=I, direct_threshold_bytes=t)
              for x in (False, True) for y in (False, True) for z in (False, True) for t in (0, D)]
    for op in Op.ALL:
        for memory in Memory.ALL:
            for n in sizes:
                for o in offers:
                    paths = plan(op, memory, n, o)
                    assert paths and paths[-1] in answers, (op, memory, n, o, paths)
                    assert DAEMON not in paths[:-1] and len(set(paths)) == len(paths)


def test_memory_of() -> None:
    assert memory_of(b"x", put_value=True) == Memory.BYTES
    assert memory_of(b"x") == Memory.HOST  # put_from: the source's memory, not a bytes value
    assert memory_of(bytearray(3), put_value=True) == Memory.HOST
    assert memory_of(np.zeros(4, np.uint8)) == Memory.HOST
    assert memory_of(memoryview(b"ab"), put_value=True) == Memory.HOST


def test_starts_at_index_is_plans_first_step() -> None:
    """The reads' first question, asked alone on every call, answers as plan() does."""
    valid = [(Op.GET, Memory.NONE), (Op.EXISTS, Memory.NONE)] + \
        [(op, m) for op in (Op.GET_INTO, Op.PREFIX) for m in (Memory.HOST, Memory.CUDA)] + \
        [(Op.PUT, m) for m in (Memory.BYTES, Memory.HOST, Memory.CUDA)]
    for op, memory in valid:
        for o in (OFF, DIRECT, ALL):
            assert starts_at_index(op, memory, o.index) == (plan(op, memory, None, o)[0] == INDEX), (op, memory, o)
