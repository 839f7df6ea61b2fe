"""ClientdCore in-process, with a scripted master link: lease expiry, retries, copy planning."""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cxlkv.clientd.batcher import Coalescer
from cxlkv.clientd.master_link import Located, LocatedReplica, Location, PrefixMatch
from cxlkv.clientd.copies import SPLIT_COPY_BYTES, _Copy, _partition
from cxlkv.clientd.core import ClientdCore
from cxlkv.clientd.results import Read, ReadTarget
from cxlkv.config import ClientdConfig
from cxlkv.errors import CxlkvError, ErrorCode
from cxlkv.transport import Region
from cxlkv.v1 import common_pb2

MiB = 1 << 20
#: The one replica every fake location points at: 64 bytes at 4096 of segment 1.
_REPLICA = LocatedReplica(1, 4096, 64, common_pb2.CXL)


class _Mapped:
    def __init__(self, region: Region) -> None:
        self.region = region
        self.segment_id = 1


class _Regions:
    def __init__(self, region: Region) -> None:
        self.mapped = _Mapped(region)

    def by_segment_id(self, segment_id: int):
        return self.mapped if segment_id == 1 else None


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Link:
    """Locates every key at offset 4096 (size 5) with a 1 s lease; the copy 'takes'
    ``copy_s`` seconds of the fake clock for the first ``slow_reads`` reads."""

    generation = 1
    registered = True
    index_region_uuid = ""  # publishes no index: reads take the leased path under test

    def __init__(self, clock: _Clock, *, slow_reads: int) -> None:
        self.on_registered: list = []
        self.clock = clock
        self.slow_reads = slow_reads
        self.released: list[int] = []
        self.lease = 0
        self.locate = Coalescer("locate", self._locate)

    async def _locate(self, keys: list[str]):
        out = []
        t0 = self.clock.now
        for _ in keys:
            self.lease += 1
            loc = Location(common_pb2.Status(), value_size_bytes=5, version=7, replicas=(_REPLICA,),
                           lease_id=self.lease, lease_ttl_ms=1000, checksum=0, header_bytes=0)
            if self.slow_reads > 0:
                self.slow_reads -= 1
                self.clock.now += 2.0  # the lease (1 s) ends before the copy is done
            out.append(loc)
        return Located(out, t0)

    def release_leases(self, ids: list[int]) -> None:
        self.released.extend(ids)


@pytest.fixture()
def region():
    path = f"/dev/shm/cxlkv-test-core-{os.getpid()}"
    r = Region.open(path, size=8 * MiB, create=True)
    r.copy_in(4096, b"hello")
    yield r
    r.close()
    Path(path).unlink(missing_ok=True)


def _core(region: Region, slow_reads: int) -> tuple[ClientdCore, _Link]:
    clock = _Clock()
    link = _Link(clock, slow_reads=slow_reads)
    core = ClientdCore(ClientdConfig(), _Regions(region), link, ThreadPoolExecutor(2), clock=clock)  # type: ignore[arg-type]
    return core, link


def test_read_whose_lease_expired_is_retried_once(region: Region) -> None:
    core, link = _core(region, slow_reads=1)
    (o,) = asyncio.run(core.get(["k"], [None]))
    assert isinstance(o, Read) and o.value == b"hello"
    assert link.released == [1, 2]  # both leases released, the expired one too


def test_read_never_returns_bytes_after_two_expired_leases(region: Region) -> None:
    core, link = _core(region, slow_reads=2)
    buf = bytearray(16)
    (o,) = asyncio.run(core.get(["k"], [ReadTarget(memoryview(buf), 0, 16)]))
    assert isinstance(o, CxlkvError) and o.code == ErrorCode.LEASE_EXPIRED and o.key == "k"
    assert "lease" in o.message
    assert link.released == [1, 2]


def test_prefix_ends_where_a_lease_expired_twice(region: Region) -> None:
    core, link = _core(region, slow_reads=0)

    async def match(queries):
        out = []
        for keys in queries:
            locs = []
            for _ in keys:
                link.lease += 1
                locs.append(Location(common_pb2.Status(), value_size_bytes=5, version=1, replicas=(_REPLICA,),
                                     lease_id=link.lease, lease_ttl_ms=1000, checksum=0, header_bytes=0))
            resp = PrefixMatch(len(keys), locs)
            t0 = link.clock.now
            link.clock.now += 2.0  # every attempt's leases end before the copies are done
            out.append((resp, t0))
        return out

    link.match_prefix = Coalescer("match", match)  # type: ignore[attr-defined]
    bufs = [bytearray(8) for _ in range(3)]
    matched, outs = asyncio.run(core.get_prefix(["a", "b", "c"], [ReadTarget(memoryview(b), 0, 8) for b in bufs]))
    assert matched == 0 and outs == []
    assert len(link.released) == 6


def test_inline_limit_and_small_targets(region: Region) -> None:
    core, _ = _core(region, slow_reads=0)
    core.max_inline_bytes = 4
    (o,) = asyncio.run(core.get(["k"], [None]))
    assert isinstance(o, CxlkvError) and o.code == ErrorCode.TOO_LARGE and o.requested_bytes == 5
    (o,) = asyncio.run(core.get(["k"], [ReadTarget(memoryview(bytearray(4)), 0, 4)]))
    assert isinstance(o, CxlkvError) and o.code == ErrorCode.OUT_OF_RANGE and o.requested_bytes == 5
    outs = asyncio.run(core.get(["", "k"], [None, ReadTarget(memoryview(bytearray(8)), 0, 8)]))
    assert isinstance(outs[0], CxlkvError) and outs[0].code == ErrorCode.INVALID_KEY
    assert isinstance(outs[1], Read) and outs[1].size_bytes == 5


def test_partition_spreads_bytes_and_splits_large_copies() -> None:
    m = object()
    big = _Copy(0, m, 4096, 2 * SPLIT_COPY_BYTES + 100, bytearray(1), 0)  # type: ignore[arg-type]
    small = [_Copy(i, m, 0, 1000, bytearray(1), 0) for i in range(1, 4)]  # type: ignore[arg-type]
    inline = _Copy(9, m, 0, SPLIT_COPY_BYTES * 2, None, 0)  # type: ignore[arg-type]
    jobs = _partition([big, *small, inline], 2)
    assert len(jobs) == 2
    pieces = [p for j in jobs for p in j]
    big_pieces = sorted((p for p in pieces if p.index == 0), key=lambda p: p.region_offset)
    assert sum(p.length for p in big_pieces) == big.length
    assert big_pieces[0].region_offset == 4096 and all(p.length % 64 == 0 for p in big_pieces[:-1])
    for a, b in zip(big_pieces, big_pieces[1:]):
        assert b.region_offset == a.region_offset + a.length and b.buf_offset == a.buf_offset + a.length
    assert [p for p in pieces if p.index == 9] == [inline]  # inline reads are never split
    assert _partition([big], 1) == [[big]]
    whole = _Copy(5, m, 0, 2 * SPLIT_COPY_BYTES - 64, bytearray(1), 0)  # type: ignore[arg-type]
    assert _partition([whole], 2) == [[whole]]  # halves would be under the streaming size
