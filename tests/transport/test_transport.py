"""Tests of the C transport and its Region wrapper, on real mapped files."""

from __future__ import annotations

import array
import errno
import json
import mmap
import os
import platform
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import numpy as np
import pytest
import xxhash

from cxlkv.transport import bindings as transport_bindings

from cxlkv.errors import InvalidArgument, OutOfRange, RegionError
from cxlkv.transport import (
    CACHE_LINE_BYTES,
    COPY_KERNEL,
    DAX_ALIGN_BYTES,
    FLUSH_INSTRUCTION,
    INVALIDATE_INSTRUCTION,
    PAGE_BYTES,
    Region,
    checksum_buffer,
    cxlkv_set_stream_threshold_bytes,
    cxlkv_stream_threshold_bytes,
)

MiB = 1 << 20
U64_MAX = (1 << 64) - 1


@pytest.fixture
def region(tmp_path):
    with Region.open(tmp_path / "region", size=MiB, create=True) as r:
        yield r


@pytest.fixture
def shm_path():
    path = f"/dev/shm/cxlkv-test-{uuid.uuid4().hex}"
    yield path
    if os.path.exists(path):
        os.unlink(path)


# -- constants ---------------------------------------------------------------------

def test_constants_come_from_c():
    assert CACHE_LINE_BYTES in (32, 64, 128, 256)
    assert PAGE_BYTES == mmap.PAGESIZE
    assert DAX_ALIGN_BYTES == 2 * MiB


def test_flush_instruction_matches_cpu():
    machine = platform.machine()
    if machine in ("x86_64", "AMD64"):
        flags = open("/proc/cpuinfo").read().split()
        expected = "clwb" if "clwb" in flags else "clflushopt" if "clflushopt" in flags else "clflush"
        assert FLUSH_INSTRUCTION == expected
        assert INVALIDATE_INSTRUCTION == ("clflushopt" if "clflushopt" in flags else "clflush")
    elif machine == "aarch64":
        assert (FLUSH_INSTRUCTION, INVALIDATE_INSTRUCTION) == ("dc cvac", "dc civac")
    else:
        assert FLUSH_INSTRUCTION == "none"


# -- open ----------------------------------------------------------------------------

def test_create_then_reopen(tmp_path):
    path = tmp_path / "r"
    with Region.open(path, size=2 * MiB, create=True) as r:
        assert (r.size_bytes, r.path, r.created, r.is_dax) == (2 * MiB, str(path), True, False)
        assert r.align_bytes == PAGE_BYTES
        r.copy_in(100, b"kept")
    assert os.path.getsize(path) == 2 * MiB
    with Region.open(path) as r:  # size from the file
        assert r.size_bytes == 2 * MiB and not r.created
        assert r.read(100, 4) == b"kept"
    with Region.open(path, size=2 * MiB, create=True) as r:  # existing file: not resized
        assert not r.created and r.read(100, 4) == b"kept"


def test_open_missing_path(tmp_path):
    path = tmp_path / "absent"
    with pytest.raises(RegionError, match="does not exist") as ei:
        Region.open(path)
    assert ei.value.errno == errno.ENOENT and ei.value.path == str(path)
    assert not path.exists()


def test_open_size_mismatch_names_both_sizes(tmp_path):
    path = tmp_path / "r"
    path.write_bytes(bytes(8192))
    with pytest.raises(RegionError, match=r"is 8192 bytes, but 4096 bytes were requested") as ei:
        Region.open(path, size=4096)
    assert ei.value.path == str(path)
    with pytest.raises(RegionError, match="8192 bytes"):
        Region.open(path, size=MiB, create=True)  # create never resizes a non-empty file
    assert path.stat().st_size == 8192


def test_open_zero_size(tmp_path):
    path = tmp_path / "empty"
    path.touch()
    with pytest.raises(RegionError, match="size 0"):
        Region.open(path)


@pytest.mark.parametrize("size", [None, 0, -1])
def test_create_needs_positive_size(tmp_path, size):
    with pytest.raises(InvalidArgument):
        Region.open(tmp_path / "r", size=size, create=True)
    assert not (tmp_path / "r").exists()


def test_open_directory(tmp_path):
    with pytest.raises(RegionError, match="directory") as ei:
        Region.open(tmp_path)
    assert ei.value.errno == errno.EISDIR


def test_open_dev_null_is_not_mappable():
    with pytest.raises(RegionError, match="not a regular file or a DAX") as ei:
        Region.open("/dev/null")
    assert ei.value.path == "/dev/null"


def test_open_fifo_is_not_mappable(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(RegionError, match="not a regular file or a DAX"):
        Region.open(fifo)


def test_open_without_permission(tmp_path):
    path = tmp_path / "locked"
    path.write_bytes(bytes(4096))
    path.chmod(0o400)
    if os.geteuid() != 0:
        with pytest.raises(RegionError, match="no permission") as ei:
            Region.open(path)
        assert ei.value.errno == errno.EACCES
        return
    # root ignores file modes: ask from a forked child that dropped to nobody
    # (the extension is already loaded, so the child needs no file access).
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            os.setgid(65534)
            os.setuid(65534)
            try:
                Region.open(path)
                msg = "opened"
            except RegionError as e:
                msg = f"{e.errno} {e}"
            os.write(wfd, msg.encode())
        finally:
            os._exit(0)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as f:
        msg = f.read().decode()
    os.waitpid(pid, 0)
    assert msg.startswith(f"{errno.EACCES} no permission to open region {path}"), msg


# -- bounds --------------------------------------------------------------------------

@pytest.mark.parametrize(
    "offset, length",
    [
        (MiB, 1),  # offset at the end
        (MiB + 1, 0),  # offset beyond the end
        (MiB - 10, 11),  # length beyond the end
        (U64_MAX, 2),  # offset + length overflows uint64
        (1, U64_MAX),  # idem, the other way round
    ],
)
def test_out_of_range_refused_in_c(region, offset, length):
    region.copy_in(MiB - 4, b"\xaa" * 4)
    for op in (region.flush, region.invalidate, region.prefault):
        with pytest.raises(OutOfRange):
            op(offset, length)
    if length <= 16:
        with pytest.raises(OutOfRange, match="outside the region"):
            region.copy_in(offset, bytes(length))
        with pytest.raises(OutOfRange):
            region.copy_out(offset, bytearray(length))
    with pytest.raises(OutOfRange):
        region.view(offset, length)
    with pytest.raises(OutOfRange):
        region.checksum(offset, length)
    assert region.read(MiB - 4, 4) == b"\xaa" * 4  # nothing written


@pytest.mark.parametrize("offset", [-1, -(1 << 70), 1 << 64, 1 << 70])
def test_negative_or_huge_offsets(region, offset):
    with pytest.raises(OutOfRange):
        region.copy_in(offset, b"x")
    with pytest.raises(OutOfRange):
        region.copy_out(offset, bytearray(1))
    with pytest.raises(OutOfRange):
        region.flush(offset, 1)
    with pytest.raises(OutOfRange):
        region.view(offset, 1)
    with pytest.raises(OutOfRange):
        region.copy_in_ranges(b"x", [0], [offset], [1])


def test_negative_length(region):
    with pytest.raises(OutOfRange, match="negative"):
        region.flush(0, -1)
    with pytest.raises(OutOfRange):
        region.read(0, -1)
    with pytest.raises(OutOfRange):
        region.copy_in_ranges(b"abc", [0], [0], [-3])


def test_edges_are_inside(region):
    assert region.copy_in(MiB - 3, b"end") == 3
    assert region.copy_in(MiB, b"") == 0  # empty copy at the very end
    assert region.read(MiB - 3, 3) == b"end"
    region.flush(MiB, 0)
    region.invalidate(0, MiB)


# -- buffers -------------------------------------------------------------------------

def test_buffer_kinds_round_trip(region):
    data = os.urandom(4096)
    m = mmap.mmap(-1, 4096)
    m.write(data)
    for i, src in enumerate([data, bytearray(data), memoryview(data), np.frombuffer(data, np.uint32), m]):
        assert region.copy_in(i * 4096, src) == 4096
    for i in range(5):
        dsts = [bytearray(4096), np.empty(1024, np.uint32), memoryview(bytearray(4096)), mmap.mmap(-1, 4096)]
        for dst in dsts:
            assert region.copy_out(i * 4096, dst) == 4096
            assert bytes(dst) == data
    m.close()


def test_read_only_destination_refused(region):
    for dst in (b"1234", memoryview(b"1234"), np.frombuffer(b"1234", np.uint8)):
        with pytest.raises(InvalidArgument, match="read-only"):
            region.copy_out(0, dst)
    with pytest.raises(InvalidArgument, match="read-only"):
        region.copy_out_ranges(b"1234", [0], [0], [4])


def test_non_contiguous_and_non_buffers_refused(region):
    strided = memoryview(bytearray(64))[::2]
    with pytest.raises(InvalidArgument, match="C-contiguous"):
        region.copy_in(0, strided)
    with pytest.raises(InvalidArgument, match="C-contiguous"):
        region.copy_out(0, np.zeros((8, 8), np.uint8)[:, ::2])
    with pytest.raises(InvalidArgument, match="bytes-like"):
        region.copy_in(0, "text")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="bytes-like"):
        region.copy_in_ranges(42, [0], [0], [1])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="offset must be an int"):
        region.copy_in(1.5, b"x")  # type: ignore[arg-type]


# -- copy kernels ------------------------------------------------------------------

@pytest.fixture(params=["vector", "stream"])
def small_stream_threshold(request):
    """Run with the default kernels, then with copies of >= 4 KiB streamed."""
    old = cxlkv_stream_threshold_bytes()
    if request.param == "stream":
        cxlkv_set_stream_threshold_bytes(4096)
    yield request.param
    cxlkv_set_stream_threshold_bytes(old)


def test_copy_kernel_reported():
    if platform.machine() in ("x86_64", "AMD64"):
        flags = open("/proc/cpuinfo").read().split()
        assert COPY_KERNEL == ("avx2" if "avx2" in flags else "memmove")
    if COPY_KERNEL == "avx2":
        assert cxlkv_stream_threshold_bytes() == 16 * MiB
    else:
        assert COPY_KERNEL == "memmove" and cxlkv_stream_threshold_bytes() == 0


def test_copy_kernels_exact_at_every_alignment(region, small_stream_threshold):
    # Page-aligned buffers, so (destination - source) mod 4096 is chosen
    # exactly: the kernels copy backwards for 1..2047 and forwards otherwise.
    rng = np.random.default_rng(7)
    m_src, m_dst = mmap.mmap(-1, 512 * 1024), mmap.mmap(-1, 512 * 1024)
    data = np.frombuffer(m_src, np.uint8)
    data[:] = rng.integers(0, 256, len(data), dtype=np.uint8)
    out = np.frombuffer(m_dst, np.uint8)
    cases = [  # (source offset, region offset, bytes)
        (0, 4096, 512), (5, 4096 + 8, 513), (31, 4096 + 1, 543), (0, 4096, 65536), (16, 4096, 65537),
        (0, 4096 + 16, 100_003), (0, 4096 + 2047, 70_000), (0, 4096 + 2048, 70_001), (4095, 4096, 130_000),
        (63, 4096 + 1, 4096 + 5), (16, 4096, 3),
    ]
    for src_off, reg_off, n in cases:
        region.copy_in(0, bytes(256 * 1024))
        src = data[src_off : src_off + n]
        region.copy_in(reg_off, src)
        assert region.read(reg_off - 1, 1) == b"\0"  # no byte before
        assert region.read(reg_off + n, 1) == b"\0"  # no byte after
        assert region.read(reg_off, n) == src.tobytes(), (src_off, reg_off, n)
        for dst_off in (src_off, (reg_off + 16) % 4096, (reg_off - 16) % 4096):  # both directions out
            out[:] = 0
            region.copy_out(reg_off, out[dst_off : dst_off + n])
            assert np.array_equal(out[dst_off : dst_off + n], src), (src_off, reg_off, n, dst_off)
            assert not out[:dst_off].any() and not out[dst_off + n :].any()


def test_overlapping_copy_is_memmove(region, small_stream_threshold):
    pattern = np.arange(65536, dtype=np.uint32).tobytes()  # 256 KiB
    region.copy_in(0, pattern)
    region.copy_in(100, region.view(0, len(pattern)))  # source overlaps destination
    assert region.read(100, len(pattern)) == pattern
    region.copy_out(100, region.view(92, len(pattern)))  # destination overlaps source
    assert region.read(92, len(pattern)) == pattern



@pytest.mark.parametrize("streaming", [False, True], ids=["cached", "streamed"])
def test_fused_copy_hash_equals_xxhash(region, streaming):
    """copy_in_hashed / copy_out_hashed move the same bytes as copy_in / copy_out
    and return python-xxhash's xxh3_64 of them, at chunk edges and odd sizes,
    with cached and with streamed (non-temporal) copies."""
    old = cxlkv_stream_threshold_bytes()
    if streaming:
        cxlkv_set_stream_threshold_bytes(4096)
    try:
        _check_fused(region)
    finally:
        cxlkv_set_stream_threshold_bytes(old)


def _check_fused(region):
    chunk = 256 * 1024
    rng = np.random.default_rng(11)
    for n in (0, 1, 63, 511, 512, 4096, chunk - 1, chunk, chunk + 1, 2 * chunk + 77):
        src = rng.integers(0, 256, n, dtype=np.uint8)
        want = xxhash.xxh3_64_intdigest(src)
        assert region.copy_in_hashed(4096 + 3, src) == want, n
        assert region.read(4096 + 3, n) == src.tobytes()
        out = bytearray(n + 1)
        assert region.copy_out_hashed(4096 + 3, memoryview(out)[1:]) == want, n
        assert out[1:] == src.tobytes() and out[0] == 0


def test_fused_copy_hash_refuses_bad_input(region):
    with pytest.raises(OutOfRange):
        region.copy_in_hashed(region.size_bytes - 10, bytes(11))
    with pytest.raises(OutOfRange):
        region.copy_out_hashed(-1, bytearray(1))
    with pytest.raises(InvalidArgument):
        region.copy_out_hashed(0, b"read-only")
    with pytest.raises(InvalidArgument, match="overlap|invalid"):
        region.copy_in_hashed(0, region.view(100, 1000))  # source overlaps the destination

# -- batched copies --------------------------------------------------------------------

def test_copy_ranges_round_trip(region):
    buf = np.frombuffer(os.urandom(64 * 1024), np.uint8)
    n = 16
    lengths = np.full(n, 4096, dtype=np.uint64)
    buf_offsets = np.arange(n, dtype=np.uint64) * 4096
    region_offsets = (np.arange(n, dtype=np.uint64)[::-1] * 16384 + 4096).copy()
    region.copy_in_ranges(buf, buf_offsets, region_offsets, lengths)
    for i in range(n):
        assert region.read(int(region_offsets[i]), 4096) == buf[i * 4096 : (i + 1) * 4096].tobytes()
    out = bytearray(len(buf))
    # plain lists, array('Q') and int64 arrays work too
    region.copy_out_ranges(out, list(map(int, buf_offsets)), array.array("Q", map(int, region_offsets)), lengths.astype(np.int64))
    assert bytes(out) == buf.tobytes()


def test_copy_ranges_checks_both_sides(region):
    buf = bytearray(8192)
    with pytest.raises(OutOfRange, match="extent #1"):
        region.copy_out_ranges(buf, [0, 8000], [0, 0], [4096, 200])  # past the buffer
    with pytest.raises(OutOfRange, match="extent #0"):
        region.copy_in_ranges(buf, [0], [MiB - 10], [4096])  # past the region
    with pytest.raises(OutOfRange):
        region.copy_in_ranges(buf, [U64_MAX], [0], [2])  # buffer offset + length overflows
    with pytest.raises(InvalidArgument, match="same length"):
        region.copy_in_ranges(buf, [0, 1], [0], [1])


# -- views, checksums, cache maintenance ---------------------------------------------------

def test_view_is_zero_copy_and_writable(region):
    v = region.view(4096, 16)
    assert isinstance(v, memoryview) and len(v) == 16 and not v.readonly
    v[:5] = b"hello"
    assert region.read(4096, 5) == b"hello"
    region.copy_in(4101, b"world")
    assert bytes(v[5:10]) == b"world"
    np.frombuffer(region.view(8192, 8), np.uint64)[0] = 7
    assert region.read(8192, 8) == (7).to_bytes(8, "little")


def test_view_outliving_close_reads_zeros(tmp_path):
    region = Region.open(tmp_path / "r", size=MiB, create=True)
    v = region.view(0, 8)
    v[:] = b"12345678"
    region.close()
    assert bytes(v) == bytes(8)  # no crash; the mapping was retired
    v[:] = b"87654321"  # writes go to private memory, not the file
    assert (tmp_path / "r").read_bytes()[:8] == b"12345678"


def test_checksum_equals_xxhash(region):
    data = os.urandom(300_000)
    region.copy_in(12345, data)
    expected = xxhash.xxh3_64_intdigest(data)
    assert region.checksum(12345, len(data)) == expected
    assert checksum_buffer(data) == expected == checksum_buffer(np.frombuffer(data, np.uint8))
    assert region.checksum(0, 0) == xxhash.xxh3_64_intdigest(b"")
    with pytest.raises(InvalidArgument):
        checksum_buffer("text")  # type: ignore[arg-type]


def test_flush_invalidate_fence_prefault_run(region):
    region.copy_in(0, b"\x5a" * 8192)
    region.flush(0, 8192)
    region.flush(3, 1)  # unaligned, inside one line
    region.flush()  # whole region
    region.invalidate(0, 8192)
    region.invalidate()
    Region.fence()
    region.prefault()
    region.prefault(4096 * 3 + 1, 10)
    assert region.read(0, 8192) == b"\x5a" * 8192  # flush/invalidate/prefault change no byte


def test_closed_region_refuses_everything(tmp_path):
    region = Region.open(tmp_path / "r", size=MiB, create=True)
    region.close()
    region.close()  # idempotent
    assert region.closed and "closed" in repr(region)
    with pytest.raises(RegionError, match="closed"):
        region.copy_in(0, b"x")
    with pytest.raises(RegionError, match="closed"):
        region.copy_out_ranges(bytearray(1), [0], [0], [1])
    with pytest.raises(RegionError, match="closed"):
        region.flush(0, 1)
    with pytest.raises(RegionError, match="closed"):
        region.view(0, 1)
    with pytest.raises(RegionError, match="closed"):
        region.checksum(0, 1)


# -- sharing -------------------------------------------------------------------------------

def test_two_processes_see_each_others_writes(shm_path):
    child = textwrap.dedent(
        f"""
        import sys
        from cxlkv.transport import Region
        with Region.open({shm_path!r}, size={MiB}) as r:
            r.invalidate(4096, 11)
            seen = r.read(4096, 11)
            r.copy_in(8192, b"from-child:" + seen)
            r.flush(8192, 22)
        print(seen.decode())
        """
    )
    with Region.open(shm_path, size=MiB, create=True) as region:
        region.copy_in(4096, b"from-parent")
        region.flush(4096, 11)
        proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == "from-parent"
        region.invalidate(8192, 22)
        assert region.read(8192, 22) == b"from-child:from-parent"


# -- GIL -------------------------------------------------------------------------------------

def test_gil_released_during_copy(shm_path):
    """Another Python thread keeps running while one long C copy is in flight."""
    size = 256 * MiB
    with Region.open(shm_path, size=size, create=True) as region:
        region.prefault()
        dst = np.ones(size, np.uint8)  # faulted in
        region.copy_out(0, dst)  # warm
        started = threading.Event()
        span: list[float] = []

        def worker() -> None:
            started.set()
            t0 = time.perf_counter()
            region.copy_out_ranges(dst, [0] * 4, [0] * 4, [size] * 4)  # one C call, ~1 GiB of copying
            span.extend([t0, time.perf_counter()])

        stamps: list[float] = []
        thread = threading.Thread(target=worker)
        thread.start()
        started.wait()
        while thread.is_alive():
            stamps.append(time.perf_counter())
        thread.join()
    t0, t1 = span
    during = [s for s in stamps if t0 <= s <= t1]
    copy_s = t1 - t0
    # With the GIL held for the whole call, this thread could not have run while
    # the copy was in flight: one gap as long as the copy, no stamps inside it.
    assert copy_s > 0.02
    assert len(during) > 100, (len(during), copy_s)
    gaps = np.diff([t0, *during, t1])
    assert gaps.max() < copy_s / 2, (gaps.max(), copy_s)


# -- benchmark helpers (bench/common.py, bench/transport.py) ---------------------------------

def test_bench_records_and_output(tmp_path, capsys):
    from cxlkv.bench.common import Record, emit, human_size, ops_for, time_op, write_json
    from cxlkv.bench.transport import must_show_failures

    calls = []
    timing = time_op(lambda: calls.append(1), ops=50, runs=3, warmup=2)
    assert len(calls) == 50 * 3 + 2 and timing.ops_per_run == 50 and len(timing.run_ops_per_s) == 3
    assert 0 < timing.p50_us <= timing.p99_us and timing.ops_per_s > 0
    rec = Record.from_timing("transport", "copy_in", 4096, timing, limit_gbps=10.0, batch=1, concurrency=1, buffer="shm")
    assert rec.gbps == pytest.approx(4096 * timing.ops_per_s / 1e9)
    assert rec.ratio_to_limit == pytest.approx(rec.gbps / 10.0)
    d = rec.to_dict()
    assert list(d)[:9] == ["bench", "op", "size_bytes", "ops_per_s", "gbps", "p50_us", "p99_us", "limit_gbps", "ratio_to_limit"]
    assert d["batch"] == 1 and d["buffer"] == "shm"
    with pytest.raises(ValueError):
        Record("b", "op", 1, 1.0, 1.0, 1.0, 1.0, extra={"gbps": 2}).to_dict()

    out = tmp_path / "sub" / "r.json"
    emit([rec], as_json=True, out=str(out))
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text()) == [json.loads(json.dumps(d))]
    emit([rec], as_json=False, out=None)
    table = capsys.readouterr().out
    assert "copy_in" in table and "4 KiB" in table and "ratio" in table
    write_json([], out)
    assert json.loads(out.read_text()) == []
    assert not [p for p in out.parent.iterdir() if p.suffix == ".tmp"]

    assert (human_size(4096), human_size(3 << 20), human_size(1000)) == ("4 KiB", "3 MiB", "1000 B")
    assert ops_for(4096, bytes_per_run=1 << 20) == 256 and ops_for(1 << 30) == 3

    slow = Record("transport", "copy_out", 4 << 20, 1.0, 1.0, 1.0, 1.0, 10.0, 0.1,
                  extra={"batch": 1, "concurrency": 1, "buffer": "shm"})
    batch = Record("transport", "copy_in_ranges", 1 << 20, 1.0, 0.5, 1.0, 1.0, 10.0, 0.05,
                   extra={"batch": 256, "concurrency": 1, "buffer": "shm"})
    assert len(must_show_failures([slow, batch])) == 2
    assert must_show_failures([rec]) == []


def test_bench_cli_is_registered():
    from click.testing import CliRunner

    from cxlkv.cli import main

    res = CliRunner().invoke(main, ["bench", "transport", "--help"])
    assert res.exit_code == 0 and "--json" in res.output and "--quick" in res.output and "--out" in res.output


def test_fresh_bytes_is_filled_by_one_copy(region) -> None:
    """fresh_bytes: a new bytes object a C copy fills in place (the one-copy get)."""
    from cxlkv.transport.bindings import fresh_bytes

    src = os.urandom(256 * 1024)
    region.copy_in(4096, src)
    value, target = fresh_bytes(len(src))
    assert region.copy_out_hashed(4096, target) == xxhash.xxh3_64_intdigest(src)
    del target
    assert type(value) is bytes and value == src and hash(value) == hash(bytes(src))
    other, t2 = fresh_bytes(len(src))
    assert other is not value
    with pytest.raises(InvalidArgument):
        fresh_bytes(1)
