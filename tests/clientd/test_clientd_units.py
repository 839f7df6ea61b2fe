"""Unit tests of clientd parts that need no cluster: framing, coalescing, buffers."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cxlkv.client import framing
from cxlkv.clientd.batcher import Coalescer
from cxlkv.clientd.buffers import BufferRegistry, process_start_time
from cxlkv.errors import InvalidArgument, OutOfRange, UnknownBuffer
from cxlkv.v1 import client_pb2


# ------------------------------------------------------------------ framing
def test_method_table_follows_service_declaration_order() -> None:
    service = client_pb2.DESCRIPTOR.services_by_name["ClientService"]
    assert [m.name for m in framing.METHODS] == [m.name for m in service.methods]
    assert [m.number for m in framing.METHODS] == list(range(1, len(service.methods) + 1))
    put = framing.METHODS_BY_NAME["Put"]
    assert put.number == 1 and put.request_type is client_pb2.PutRequest
    assert framing.METHODS_BY_NAME["GetPrefixInto"].response_type is client_pb2.GetPrefixIntoResponse


def test_frame_layout_is_little_endian_with_length_of_the_rest() -> None:
    payload = client_pb2.GetRequest(key="k").SerializeToString()
    frame = framing.encode_request(2, 0x0102030405060708, payload)
    assert len(frame) == framing.HEADER_BYTES + len(payload)
    assert int.from_bytes(frame[0:4], "little") == 12 + len(payload)
    assert int.from_bytes(frame[4:6], "little") == 2
    assert int.from_bytes(frame[6:8], "little") == 0
    assert int.from_bytes(frame[8:16], "little") == 0x0102030405060708
    assert frame[16:] == payload
    resp = framing.encode_response(1, 7, b"x")
    assert framing.HEADER.unpack_from(resp) == (13, 1, 0, 7)


# --------------------------------------------------------------- coalescing
def test_idle_coalescer_sends_at_once_and_busy_one_batches() -> None:
    calls: list[list[int]] = []

    async def send(items: list[int]) -> list[int]:
        calls.append(list(items))
        await asyncio.sleep(0.01)
        return [x * 10 for x in items]

    async def main() -> None:
        c: Coalescer[int, int] = Coalescer("t", send)
        assert list(await c.submit([1])) == [10]
        assert calls == [[1]]
        calls.clear()
        first = asyncio.ensure_future(c.submit([1, 2]))
        await asyncio.sleep(0.001)  # first call now in flight
        rest = [asyncio.ensure_future(c.submit([i])) for i in range(3, 8)]
        assert list(await first) == [10, 20]
        assert [list(await r) for r in rest] == [[30], [40], [50], [60], [70]]
        assert calls == [[1, 2], [3, 4, 5, 6, 7]]
        assert c.calls == 3 and c.items == 8

    asyncio.run(main())


def test_coalescer_splits_at_max_items_and_keeps_submissions_whole() -> None:
    """Submissions of at most max_items items are never split; a larger one goes out
    as consecutive calls of max_items, in order (never one call over the master's
    limit: a local-API batch may be 8x the master's max_batch_items)."""
    calls: list[list[int]] = []

    async def send(items: list[int]) -> list[int]:
        calls.append(list(items))
        await asyncio.sleep(0)
        return [x * 10 for x in items]

    async def main() -> None:
        c: Coalescer[int, int] = Coalescer("t", send, max_items=4)
        subs = [asyncio.ensure_future(c.submit([i, i])) for i in range(5)]
        big = asyncio.ensure_future(c.submit(list(range(100, 109))))
        await asyncio.gather(*subs, big)
        assert list(big.result()) == [x * 10 for x in range(100, 109)]
        assert all(len(x) <= 4 for x in calls), calls
        # every small submission stays whole, in one call
        for i in range(5):
            assert any(x[j:j + 2] == [i, i] for x in calls for j in range(len(x) - 1)), calls
        # the big one's parts reach send in order
        bigs = [v for x in calls for v in x if v >= 100]
        assert bigs == list(range(100, 109))
        assert sorted(sum(calls, [])) == sorted(sum(([i, i] for i in range(5)), []) + list(range(100, 109)))

    asyncio.run(main())


def test_coalescer_error_in_a_later_part_of_a_split_submission_fails_it() -> None:
    calls: list[list[int]] = []

    async def send(items: list[int]) -> list[int]:
        calls.append(list(items))
        await asyncio.sleep(0)
        if 5 in items:
            raise RuntimeError("boom")
        return items

    async def main() -> None:
        c: Coalescer[int, int] = Coalescer("t", send, max_items=2)
        with pytest.raises(RuntimeError, match="boom"):
            await c.submit(list(range(8)))
        assert calls == [[0, 1], [2, 3], [4, 5]]  # nothing sent after the failed part

    asyncio.run(main())


def test_coalescer_error_fails_every_submitter_of_that_call_only() -> None:
    async def send(items: list[int]) -> list[int]:
        await asyncio.sleep(0)
        if 13 in items:
            raise RuntimeError("boom")
        return items

    async def main() -> None:
        c: Coalescer[int, int] = Coalescer("t", send)
        a = asyncio.ensure_future(c.submit([13]))
        b = asyncio.ensure_future(c.submit([1]))
        res = await asyncio.gather(a, b, return_exceptions=True)
        # a and b travel in the same (first) call: both fail
        assert all(isinstance(r, RuntimeError) for r in res)
        assert list(await c.submit([2])) == [2]

    asyncio.run(main())


def test_coalescer_skips_cancelled_submitters() -> None:
    sent: list[list[int]] = []
    gate = asyncio.Event

    async def main() -> None:
        release = gate()

        async def send(items: list[int]) -> list[int]:
            sent.append(list(items))
            await release.wait()
            return items

        c: Coalescer[int, int] = Coalescer("t", send)
        first = asyncio.ensure_future(c.submit([1]))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        gone = asyncio.ensure_future(c.submit([2]))
        keep = asyncio.ensure_future(c.submit([3]))
        await asyncio.sleep(0)
        gone.cancel()
        release.set()
        assert list(await first) == [1]
        assert list(await keep) == [3]
        assert sent == [[1], [3]]

    asyncio.run(main())


# ------------------------------------------------------------------ buffers
def _shm_file(tmp_name: str, size: int, mode: int = 0o600) -> str:
    path = f"/dev/shm/{tmp_name}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
    os.ftruncate(fd, size)
    os.close(fd)
    return path


@pytest.fixture()
def shm_path(request):
    name = f"cxlkv-buf-{os.getpid()}-{os.urandom(6).hex()}"  # the SDK's naming convention
    path = _shm_file(name, 1 << 16)
    yield path
    Path(path).unlink(missing_ok=True)


def test_register_acquire_release_unregister(shm_path: str) -> None:
    reg = BufferRegistry()
    buf = reg.register(shm_path, 1 << 16, os.getpid())
    os.unlink(shm_path)  # the SDK unlinks at once; the mapping stays
    assert buf.buffer_id > 0 and len(reg) == 1
    held = reg.acquire(buf.buffer_id, 100, 200)
    held.view[100:103] = b"abc"
    reg.unregister(buf.buffer_id)  # while held: unmapped only at release
    assert held.view[100:103] == b"abc"
    reg.release(held)
    with pytest.raises(UnknownBuffer):
        reg.acquire(buf.buffer_id, 0, 1)
    with pytest.raises(UnknownBuffer):
        reg.unregister(buf.buffer_id)
    assert reg.stats() == (0, 0)


@pytest.mark.parametrize("offset,length", [
    (0, (1 << 16) + 1), ((1 << 16) + 1, 0), (1 << 15, 1 << 15 + 1), (2**64 - 1, 2), (10, 2**64 - 5),
])
def test_acquire_out_of_range(shm_path: str, offset: int, length: int) -> None:
    reg = BufferRegistry()
    buf = reg.register(shm_path, 1 << 16, os.getpid())
    with pytest.raises(OutOfRange):
        reg.acquire(buf.buffer_id, offset, length)
    reg.acquire(buf.buffer_id, 1 << 16, 0)  # empty range at the end is fine
    reg.close()


def test_register_refusals(shm_path: str, tmp_path: Path) -> None:
    reg = BufferRegistry()
    me = os.getpid()
    with pytest.raises(InvalidArgument, match="exists|does not exist"):
        reg.register(f"/dev/shm/cxlkv-buf-{me}-000000000000", 4096, me)
    with pytest.raises(InvalidArgument, match="absolute"):
        reg.register("relative/path", 4096, me)
    outside = tmp_path / f"cxlkv-buf-{me}-000000000000"
    outside.write_bytes(b"\0" * 4096)
    with pytest.raises(InvalidArgument, match="/dev/shm"):
        reg.register(str(outside), 4096, me)
    with pytest.raises(InvalidArgument, match="bytes"):
        reg.register(shm_path, 4096, me)  # size mismatch
    with pytest.raises(InvalidArgument, match="> 0"):
        reg.register(shm_path, 0, me)
    for pid in (0, -1):
        with pytest.raises(InvalidArgument, match="pid"):
            reg.register(shm_path, 1 << 16, pid)
    with pytest.raises(InvalidArgument, match="not the caller's pid"):
        reg.register(shm_path, 1 << 16, me, peer_pid=me + 1, peer_uid=os.geteuid())
    with pytest.raises(InvalidArgument, match="owned by uid"):
        reg.register(shm_path, 1 << 16, me, peer_pid=me, peer_uid=os.geteuid() + 1)
    link = f"/dev/shm/cxlkv-buf-{me}-{os.urandom(6).hex()}"
    os.symlink(shm_path, link)
    try:
        with pytest.raises(InvalidArgument, match="symbolic link"):
            reg.register(link, 1 << 16, me)
    finally:
        os.unlink(link)
    hard = f"/dev/shm/cxlkv-buf-{me}-{os.urandom(6).hex()}"
    os.link(shm_path, hard)
    try:
        with pytest.raises(InvalidArgument, match="2 links"):
            reg.register(hard, 1 << 16, me)
    finally:
        os.unlink(hard)
    st = os.stat(shm_path)
    reg.protect([(st.st_dev, st.st_ino)])
    with pytest.raises(InvalidArgument, match="region files"):
        reg.register(shm_path, 1 << 16, me)
    reg = BufferRegistry()
    bad_name = _shm_file(f"cxlkv-test-{me}-{os.urandom(4).hex()}", 4096)
    try:
        with pytest.raises(InvalidArgument, match="cxlkv-buf-<pid>"):
            reg.register(bad_name, 4096, me)
    finally:
        os.unlink(bad_name)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    dead_file = _shm_file(f"cxlkv-buf-{dead.pid}-{os.urandom(6).hex()}", 4096)
    try:
        with pytest.raises(InvalidArgument, match="not running"):
            reg.register(dead_file, 4096, dead.pid)
        with pytest.raises(InvalidArgument, match="named after"):
            reg.register(dead_file, 4096, me)
    finally:
        os.unlink(dead_file)
    with pytest.raises(InvalidArgument, match="NUL"):
        reg.register("/dev/shm/a\x00b", 1 << 16, me)
    assert len(reg) == 0


def test_reaper_drops_buffers_of_exited_owners(shm_path: str) -> None:
    reg = BufferRegistry()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        mine = reg.register(shm_path, 1 << 16, os.getpid())
        their_path = _shm_file(f"cxlkv-buf-{child.pid}-{os.urandom(6).hex()}", 1 << 16)
        try:
            theirs = reg.register(their_path, 1 << 16, child.pid)
        finally:
            os.unlink(their_path)
        assert reg.reap_dead_owners() == []
    finally:
        child.kill()
        child.wait()
    assert reg.reap_dead_owners() == [theirs.buffer_id]
    reg.acquire(mine.buffer_id, 0, 1)
    assert process_start_time(os.getpid()) is not None
    assert process_start_time(child.pid) is None


def test_linger_gathers_the_returning_cohort_but_not_a_lone_caller() -> None:
    calls: list[list[int]] = []

    async def send(items: list[int]) -> list[int]:
        calls.append(list(items))
        await asyncio.sleep(0.02)
        return items

    async def main() -> None:
        c: Coalescer[int, int] = Coalescer("t", send, linger_fraction=1.0, max_linger_s=0.5)
        await asyncio.gather(*(c.submit([i]) for i in range(4)))  # one call of 4
        assert calls == [[0, 1, 2, 3]]

        async def late(i: int) -> None:
            await asyncio.sleep(0.002 * i)  # the cohort comes back over 6 ms
            await c.submit([10 + i])

        t0 = asyncio.get_running_loop().time()
        await asyncio.gather(*(late(i) for i in range(4)))
        assert calls[1] == [10, 11, 12, 13]  # gathered into one call, not 1 + 3
        assert asyncio.get_running_loop().time() - t0 < 0.2
        # concurrency dropped to one caller: it waits at most one linger, then never again
        await c.submit([20])
        t1 = asyncio.get_running_loop().time()
        await c.submit([21])
        assert asyncio.get_running_loop().time() - t1 < 0.05
        assert calls[-2:] == [[20], [21]]

    asyncio.run(main())


def test_urgent_submissions_cut_a_linger_short() -> None:
    calls: list[list[int]] = []

    async def send(items: list[int]) -> list[int]:
        calls.append(list(items))
        await asyncio.sleep(0.05)
        return items

    async def main() -> None:
        c: Coalescer[int, int] = Coalescer("t", send, linger_fraction=1.0, max_linger_s=1.0)
        await asyncio.gather(*(c.submit([i]) for i in range(4)))
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await c.submit([9], urgent=True)  # would otherwise wait up to 50 ms for 3 more
        assert loop.time() - t0 < 0.1
        assert calls[-1] == [9]

    asyncio.run(main())


def test_orphan_buffer_files_of_exited_processes_are_removed(tmp_path) -> None:
    """A process killed between creating and registering a shared buffer leaves its
    file; the daemon's reaper removes it once that process is gone, never a live one's."""
    import subprocess
    import sys

    from cxlkv.clientd.buffers import BufferRegistry

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead_pid = int(dead.stdout)
    orphan = tmp_path / f"cxlkv-buf-{dead_pid}-0123456789ab"
    live = tmp_path / f"cxlkv-buf-{os.getpid()}-0123456789ab"
    other = tmp_path / f"not-a-buffer-{dead_pid}"
    for f in (orphan, live, other):
        f.write_bytes(b"x" * 4096)
    reg = BufferRegistry(shm_dir=tmp_path)
    assert reg.reap_orphan_files() == [str(orphan)]
    assert not orphan.exists() and live.exists() and other.exists()
    assert reg.reap_orphan_files() == []


def test_a_batchs_small_inline_values_are_copied_from_one_gathered_buffer() -> None:
    """BatchPut hands the core its small inline values as ranges of one buffer (one
    C copy per region instead of one per value); errors, empty values and values
    over the gathering size keep their place and their own bytes."""
    from cxlkv.clientd.api import GATHER_MAX_BYTES, _one_source
    from cxlkv.clientd.results import PutSpec
    from cxlkv.errors import InvalidKey

    big = bytes(range(256)) * (GATHER_MAX_BYTES // 256 + 1)
    items = [PutSpec("a", 3, None, b"abc"), InvalidKey("bad"), PutSpec("e", 0, None, b""),
             PutSpec("big", len(big), None, big), PutSpec("b", 5, None, b"hello"), PutSpec("c", 1, None, b"z")]
    out = _one_source(items)
    assert len(out) == len(items) and out[1] is items[1] and out[2] is items[2] and out[3] is items[3]
    blobs = {id(out[i].src) for i in (0, 4, 5)}
    assert len(blobs) == 1  # one buffer for the three small values
    for i in (0, 4, 5):
        s, orig = out[i], items[i]
        assert (s.key, s.size_bytes, s.options) == (orig.key, orig.size_bytes, orig.options)
        assert bytes(s.src[s.src_offset_bytes:s.src_offset_bytes + s.size_bytes]) == orig.src
    assert _one_source([items[0], items[1]]) == [items[0], items[1]]  # nothing to gather: unchanged
