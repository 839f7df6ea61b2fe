"""The non-coherent ("flush" mode) copy kernels: bytes, and their cache discipline
replayed on the stale-cache emulator's model.

Every kernel runs for real on a real mapping. Its bytes are checked against the
source at many sizes and alignments; what it did to the cache (its recorded
loads, cached and streaming stores, write-backs, drops and fences:
``bindings.nc_trace``) is replayed by ``emulate.KernelTrace`` on a cache that
starts with a stale copy of every line, under the x86 ordering rules: no load
may see a line whose drop was not fenced before it, and every written line must
be in memory when the call returns. The same model flags the mistakes a kernel
could make (a drop fenced by SFENCE only, a load before the fence, a line never
written back), and the emulated regions show, host against host, that the
non-coherent copies return nothing stale while plain copies do.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash

from cxlkv.errors import InvalidArgument
from cxlkv.layout.objheader import header_bytes_for
from cxlkv.transport import Region
from cxlkv.transport import bindings as b
from cxlkv.transport.bindings import ffi, nc_trace
from cxlkv.transport.emulate import KernelTrace, NoncoherentRegion
from cxlkv.transport.bindings import IX_HIT, IX_MISS
from cxlkv.transport.index import IndexReader
from test_index_transport import HO, SIZE, MiniMaster

KiB, MiB = 1 << 10, 1 << 20
LINE = b.CACHE_LINE_BYTES
KERNELS = ["avx2-nt", "avx512-nt", "sse2-nt", "movdir64b", "cached"]
SIZES = [1, 63, 64, 65, 200, 511, 4096, 4097, 70_000, 300_001]
OFFSETS = [8192, 8192 + 1, 8192 + 63, 8192 + 100]
h3 = xxhash.xxh3_64_intdigest


def _supported(kernel: str) -> bool:
    current = b.cxlkv_nc_write_kernel()
    try:
        b.cxlkv_set_nc_write_kernel(kernel)
    except InvalidArgument:
        return False
    b.cxlkv_set_nc_write_kernel(current)
    return True


@pytest.fixture
def region(tmp_path: Path):
    with Region.open(tmp_path / "r", size=4 * MiB, create=True) as r:
        yield r


@pytest.fixture
def write_kernel(request):
    """Each write kernel the CPU has, restored afterwards."""
    name = request.param
    if not _supported(name):
        pytest.skip(f"this CPU has no {name}")
    current = b.cxlkv_nc_write_kernel()
    b.cxlkv_set_nc_write_kernel(name)
    yield name
    b.cxlkv_set_nc_write_kernel(current)


@pytest.fixture
def read_chunk(request):
    current = b.cxlkv_nc_read_chunk_bytes()
    b.cxlkv_set_nc_read_chunk_bytes(request.param)
    yield request.param
    b.cxlkv_set_nc_read_chunk_bytes(current)


def _base(region: Region) -> int:
    return int(ffi.cast("uintptr_t", region._r.base))


def _replay(region: Region, fn) -> tuple[Any, KernelTrace]:
    result, events = nc_trace(fn)
    return result, KernelTrace(events, _base(region), LINE)


def test_kernel_selection() -> None:
    assert b.cxlkv_nc_write_kernel() in KERNELS
    assert b.cxlkv_nc_read_chunk_bytes() == 128 * KiB
    with pytest.raises(InvalidArgument, match="unknown or not supported"):
        b.cxlkv_set_nc_write_kernel("rep-movsb")
    if "avx2" in open("/proc/cpuinfo").read():
        assert b.cxlkv_nc_write_kernel() == "avx2-nt"  # chosen from CPUID at load


@pytest.mark.parametrize("write_kernel", KERNELS, indirect=True)
def test_write_kernels_bytes_and_discipline(region: Region, write_kernel: str) -> None:
    """Every write kernel: exact bytes (neighbours untouched), all written lines in
    memory at return, streaming stores over whole lines only, and only the
    partial end lines written back (a streaming kernel leaves at most two lines
    to CLWB); one SFENCE per call."""
    rng = np.random.default_rng(7)
    for n in SIZES:
        for off in OFFSETS:
            src = rng.integers(0, 256, n, dtype=np.uint8)
            region.copy_in(off - 8, bytes(n + 16))
            _, kt = _replay(region, lambda: region.copy_in(off, src, flush=True))
            got = region.read(off - 8, n + 16)
            assert got[:8] == bytes(8) and got[-8:] == bytes(8) and got[8:8 + n] == src.tobytes(), (n, off)
            assert kt.violations == [], (write_kernel, n, off, kt.violations[:3])
            first, last = off // LINE, (off + n - 1) // LINE
            assert kt.written == set(range(first, last + 1))
            assert kt.fences == {"sfence": 1, "mfence": 0}
            if write_kernel != "cached" and n >= 2 * LINE:
                assert len(kt.written - kt.streamed) <= 2  # the partial lines only
            # hashed: same bytes, the source's hash
            _, kt = _replay(region, lambda: region.copy_in_hashed(off, src[::-1].copy(), flush=True))
            assert region.read(off, n) == src[::-1].tobytes() and kt.violations == []


@pytest.mark.parametrize("read_chunk", [0, 256, 16 * KiB, 128 * KiB], indirect=True)
def test_read_pipeline_bytes_and_discipline(region: Region, read_chunk: int) -> None:
    """The invalidate-and-copy read: exact bytes; no line read before its drop was
    fenced (MFENCE); each line dropped once (a line shared by two chunks: twice);
    one fence per chunk boundary plus the first: the range is walked once."""
    rng = np.random.default_rng(8)
    for n in SIZES:
        for off in OFFSETS:
            data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
            region.copy_in(off, data)
            dst = np.zeros(n + 2, np.uint8)
            _, kt = _replay(region, lambda: region.copy_out(off, dst[1:1 + n], invalidate=True))
            assert dst[1:1 + n].tobytes() == data and dst[0] == 0 and dst[-1] == 0, (n, off)
            assert kt.violations == [], (read_chunk, n, off, kt.violations[:3])
            lines = set(range(off // LINE, (off + n - 1) // LINE + 1))
            assert kt.loaded == lines and set(kt.drops) == lines
            assert max(kt.drops.values()) <= 2
            chunks = 1 if read_chunk == 0 else _chunks(off, n, read_chunk)
            assert kt.fences["mfence"] == chunks and kt.fences["sfence"] <= chunks
            # a destination at the same page offset as the source: the forward
            # copy loop that drops the next chunk's lines itself (traced per line)
            page = np.frombuffer(mmap.mmap(-1, n + 8192), np.uint8)
            fwd = page[off % 4096:off % 4096 + n]
            _, kt = _replay(region, lambda: region.copy_out(off, fwd, invalidate=True))
            assert fwd.tobytes() == data and kt.violations == [], (read_chunk, n, off, kt.violations[:3])
            assert kt.loaded == lines and set(kt.drops) == lines
            # hashed, and the index reader's hashed read
            out = np.zeros(n, np.uint8)
            got, kt = _replay(region, lambda: region.copy_out_hashed(off, out, invalidate=True))
            assert got == h3(data) and out.tobytes() == data and kt.violations == []


def _chunks(off: int, n: int, chunk: int) -> int:
    """Chunks of a read: the first min(chunk, 16 KiB), each next twice the last, up to chunk."""
    p, end, count, size = off, off + n, 0, min(chunk, 16 * KiB)
    while p < end:
        q = (p + size) & ~63
        p = end if q >= end else q
        size = chunk if size >= chunk // 2 else 2 * size
        count += 1
    return count


def test_the_pipeline_overlaps_the_next_drop_with_this_copy(region: Region) -> None:
    """Chunk k+1's lines are dropped by chunk k's copy loop (each line once), and
    the fence that covers them comes after it (what lets the drops overlap the
    copy); chunks grow from 16 KiB (the first drop overlaps nothing) by doubling."""
    data = os.urandom(64 * KiB)
    region.copy_in(8192, data)
    dst = bytearray(len(data))
    _, events = nc_trace(lambda: region.copy_out(8192, dst, invalidate=True))
    base = _base(region)
    groups: list[dict[str, tuple[int, int]]] = [{}]  # between fences: kind -> span (drops traced per line)
    for k, a, e in events:
        if k == "mfence":
            groups.append({})
            continue
        lo, hi = groups[-1].get(k, (a - base, e - base))
        groups[-1][k] = (min(lo, a - base), max(hi, e - base))
    c0, c1, c2 = (8192, 8192 + 16 * KiB), (8192 + 16 * KiB, 8192 + 48 * KiB), (8192 + 48 * KiB, 8192 + 64 * KiB)
    assert groups == [{"drop": c0}, {"load": c0, "drop": c1}, {"load": c1, "drop": c2}, {"load": c2}]


@pytest.mark.parametrize("read_chunk", [256, 16 * KiB], indirect=True)
def test_batches_pipeline_across_ranges(region: Region, read_chunk: int) -> None:
    """ranges / many / hashed ranges, both ways: exact bytes and hashes; reads
    never see an unfenced line (the next range's first chunk is dropped while the
    last chunk of this one is copied); writes: one SFENCE for the call."""
    rng = np.random.default_rng(9)
    lens = [0, 5, 4096, 3000, 0, 70_000, 300_000, 64, 1]
    bo, pos = [], 0
    for n in lens:
        bo.append(pos)
        pos += n + 3
    ro = [8192 + i * 400_000 + (i * 13) % 64 for i in range(len(lens))]
    buf = rng.integers(0, 256, pos, dtype=np.uint8)
    want = [h3(buf[o:o + n].tobytes()) for o, n in zip(bo, lens)]
    for call in ("ranges", "ranges_hashed"):
        if call == "ranges":
            _, kt = _replay(region, lambda: region.copy_in_ranges(buf, bo, ro, lens, flush=True))
        else:
            got, kt = _replay(region, lambda: region.copy_in_ranges_hashed(buf, bo, ro, lens, flush=True))
            assert got == want
        assert kt.violations == [] and kt.fences["sfence"] == 1 and kt.fences["mfence"] == 0, call
        out = np.zeros_like(buf)
        if call == "ranges":
            _, kt = _replay(region, lambda: region.copy_out_ranges(out, bo, ro, lens, invalidate=True))
        else:
            got, kt = _replay(region, lambda: region.copy_out_ranges_hashed(out, bo, ro, lens, invalidate=True))
            assert got == want
        assert kt.violations == [], (call, kt.violations[:3])
        for o, n in zip(bo, lens):
            assert out[o:o + n].tobytes() == buf[o:o + n].tobytes(), call


def test_overlapping_copies_keep_memmove_semantics(region: Region) -> None:
    region.copy_in(100_000, os.urandom(5000))
    before = region.read(100_000, 5000)
    _, kt = _replay(region, lambda: region.copy_in(100_100, region.view(100_000, 5000), flush=True))
    assert region.read(100_100, 5000) == before and kt.violations == []
    before = region.read(100_000, 3000)
    _, kt = _replay(region, lambda: region.copy_out(100_000, region.view(100_050, 3000), invalidate=True))
    assert region.read(100_050, 3000) == before and kt.violations == []


def test_headers_batch_their_fences(region: Region) -> None:
    """write_headers(flush): every span written back, ONE SFENCE; verify_headers
    (invalidate): every header dropped, ONE MFENCE, then read."""
    keys = [b"k1", b"key-two" * 20, b"x"]
    blob = b"".join(keys)
    koffs = [0, 2, 2 + len(keys[1])]
    hbs = [header_bytes_for(len(k)) for k in keys]
    exts = [8192, 16384, 65536]
    cols = (exts, hbs, blob, koffs, [len(k) for k in keys], [1, 2, 3], [10, 20, 30], [7, 8, 9])
    _, kt = _replay(region, lambda: region.write_headers(*cols, flush=True))
    assert kt.violations == [] and kt.fences == {"sfence": 1, "mfence": 0}
    ok, kt = _replay(region, lambda: region.verify_headers(*cols, invalidate=True))
    assert ok == b"\1\1\1" and kt.violations == [] and kt.fences == {"sfence": 0, "mfence": 1}


@pytest.mark.parametrize("verify_first", [False, True], ids=["drop-all", "verify-first"])
def test_index_get_reads_nothing_stale(tmp_path: Path, verify_first: bool) -> None:
    """cxlkv_index_get / probe in invalidate mode: the publish word, both buckets
    and the object header are read after a fenced drop (one fence for the index
    lines); misses too. Drop-all: the value too (the value's pipeline). Verify
    first: the value's first copy is the only read that may see stale lines
    (``vload``: hashed and compared with the slot's checksum before use; the
    emulator stress test shows a stale one is caught and read again)."""
    with Region.open(tmp_path / "ix", size=SIZE, create=True) as region:
        m = MiniMaster(region, HO, 8, flush=True)
        big = os.urandom(100 * KiB + 7)
        m.put(b"small", b"v" * 100, 1, 8192)
        m.put(b"big", big, 2, 16384)
        rd = IndexReader(region, HO, HO + 4096, 8, [region], invalidate=True, verify_first=verify_first)
        for key, want, ext in ((b"small", b"v" * 100, 8192), (b"big", big, 16384), (b"absent", None, 0)):
            dst = bytearray(200 * KiB)
            res, kt = _replay(region, lambda: rd.get(key, dst))
            assert kt.violations == [], (key, kt.violations[:3])
            if want is None:
                assert res.outcome == IX_MISS
            else:
                assert res.outcome == IX_HIT and res.retries == 0
                assert bytes(dst[:len(want)]) == want and res.value_len_bytes == len(want)
                hb = header_bytes_for(len(key))
                value_lines = set(range((ext + hb) // LINE, (ext + hb + len(want) - 1) // LINE + 1))
                assert kt.verified == (value_lines if verify_first else set())
                assert not kt.verified & {ln for ln in kt.loaded if ln * LINE < ext + hb}  # header: a fenced drop
            assert kt.fences["sfence"] == 0
            res, kt = _replay(region, lambda: rd.probe(key))
            assert kt.violations == [] and res.outcome == (IX_MISS if want is None else IX_HIT)


# ---------------------------------------------------------------- the model itself
def test_the_model_catches_misplaced_fences(region: Region) -> None:
    """The replay is not a rubber stamp: each mistake a kernel could make is flagged."""
    base = _base(region)
    line = (base + 8192, base + 8192 + LINE)
    assert KernelTrace([("load", *line)], base).violations  # no drop at all
    assert KernelTrace([("drop", *line), ("load", *line), ("mfence", 0, 0)], base).violations  # load before fence
    assert KernelTrace([("drop", *line), ("sfence", 0, 0), ("load", *line)], base).violations  # SFENCE: loads pass it
    assert not KernelTrace([("drop", *line), ("mfence", 0, 0), ("load", *line)], base).violations
    assert KernelTrace([("store", *line)], base).violations  # dirty at return
    assert KernelTrace([("store", *line), ("wb", *line)], base).violations  # written back, never fenced
    assert KernelTrace([("wb", *line), ("store", *line), ("sfence", 0, 0)], base).violations  # store after its wb
    assert not KernelTrace([("store", *line), ("wb", *line), ("sfence", 0, 0)], base).violations
    assert KernelTrace([("stream", base + 8200, base + 8200 + LINE), ("sfence", 0, 0)], base).violations
    assert not KernelTrace([("stream", *line), ("sfence", 0, 0)], base).violations
    # a pipeline whose next-chunk drop is fenced only by SFENCE reads stale lines
    a, b2 = (base + 8192, base + 8192 + 4 * LINE), (base + 8192 + 4 * LINE, base + 8192 + 8 * LINE)
    bad = [("drop", *a), ("mfence", 0, 0), ("drop", *b2), ("load", *a), ("sfence", 0, 0), ("load", *b2)]
    assert len(KernelTrace(bad, base).violations) == 4
    good = [("drop", *a), ("mfence", 0, 0), ("drop", *b2), ("load", *a), ("mfence", 0, 0), ("load", *b2)]
    assert KernelTrace(good, base).violations == []
    # a verified load may see a stale line (the kernel checks the hash), but it
    # leaves the line stale: a plain load after it, without a fenced drop, is flagged
    kt = KernelTrace([("vload", *line)], base)
    assert kt.violations == [] and kt.verified_stale == {8192 // LINE}
    assert KernelTrace([("vload", *line), ("load", *line)], base).violations
    kt = KernelTrace([("drop", *line), ("mfence", 0, 0), ("vload", *line)], base)
    assert kt.violations == [] and kt.verified_stale == set()


# ------------------------------------------------------- host against host (emulator)
def test_emulated_hosts_flush_mode_copies_see_nothing_stale(tmp_path: Path) -> None:
    """Two emulated hosts: the reader caches old bytes first. Plain copies read the
    stale lines; the non-coherent copies (every entry point) read the writer's
    bytes, and the writer's non-coherent copies need no flush call."""
    path = tmp_path / "shared"
    with Region.open(path, size=MiB, create=True) as plain:
        plain.copy_in(4096, b"\0" * 64 * KiB)
    w = Region.open(path, emulate_noncoherent=True)
    r = Region.open(path, emulate_noncoherent=True)
    try:
        assert isinstance(w, NoncoherentRegion) and isinstance(r, NoncoherentRegion)
        off, n = 4096 + 5, 20_000
        r.read(4096, 64 * KiB)  # the reader's cache now holds the old lines
        new = os.urandom(n)
        w.copy_in(off, new, flush=True)  # no flush() call: published by the copy
        assert r.read(off, n) != new and r.stale_line_reads > 0  # plain read: stale
        assert r.read(off, n, invalidate=True) == new
        out = bytearray(n)
        assert r.copy_out_hashed(off, out, invalidate=True) == h3(new) and bytes(out) == new
        # the other entry points, after the reader cached the lines again
        new2 = os.urandom(n)
        r.read(4096, 64 * KiB)
        assert w.copy_in_hashed(off, new2, flush=True) == h3(new2)
        r.copy_out_ranges(out, [0], [off], [n])
        assert bytes(out) != new2
        r.copy_out_ranges(out, [0], [off], [n], invalidate=True)
        assert bytes(out) == new2
        new3 = os.urandom(n)
        r.read(4096, 64 * KiB)
        w.copy_in_ranges(new3, [0], [off], [n], flush=True)
        assert r.copy_out_ranges_hashed(out, [0], [off], [n], invalidate=True) == [h3(new3)]
        new4 = os.urandom(n)
        r.read(4096, 64 * KiB)
        assert w.copy_in_ranges_hashed(new4, [0], [off], [n], flush=True) == [h3(new4)]
        dst = bytearray(n)
        r.copy_out(off, dst, invalidate=True)
        assert bytes(dst) == new4
        new5 = os.urandom(n)
        r.read(4096, 64 * KiB)
        w.copy_in(off, new5, flush=True)
        r.copy_out(off, dst, invalidate=True)
        assert bytes(dst) == new5
        # without flush the writer's bytes stay in its cache
        w.copy_in(off, b"unpublished")
        assert r.read(off, 11, invalidate=True) != b"unpublished"
    finally:
        w.close()
        r.close()
