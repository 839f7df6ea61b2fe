"""Storage faults get their own answers (issue 18, item 4), on real processes.

* A region or SSD tier file larger than its filesystem is refused at
  ``cxlkv region format`` / ``cxlkv cluster up`` / clientd start with one line.
* ENOSPC on the SSD tier is NO_SPACE, never UNAVAILABLE; the master stops giving
  moves into the full tier (backoff), failures are logged at a bounded rate, and
  demotions resume once there is room again.
* A region file truncated under a running clientd gives errors, not SIGBUS.

Small filesystems are tmpfs mounts of our own (root only; skipped otherwise).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
import tomli_w

from cxlkv.errors import NoSpace, NotFound, RegionError
from cxlkv.layout.region import REGION_HEADER_BYTES

KiB = 1024
MiB = 1 << 20
BLOCK = 4 * KiB


def _mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)


@pytest.fixture()
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs of this test's own."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs")
    d = tmp_path / "small"
    try:
        _mount_tmpfs(d, "8m")
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cxlkv.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def _one_line_error(p: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert p.returncode != 0, p.stdout + p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if all(n in ln for n in needles)]
    assert len(lines) == 1, p.stderr
    return lines[0]


# ---------------------------------------------------------------- start-up checks

def test_region_format_larger_than_filesystem_refused(small_fs: Path) -> None:
    path = small_fs / "region"
    p = _cli("region", "format", str(path), "--segment", "cxl0", "--create", "--size", "1TiB")
    line = _one_line_error(p, "does not fit its filesystem")
    assert "1.0 TiB" in line and "8.0 MiB free" in line
    assert not path.exists()  # nothing left behind
    ok = _cli("region", "format", str(path), "--segment", "cxl0", "--create", "--size", "4MiB")
    assert ok.returncode == 0, ok.stderr
    assert os.stat(path).st_blocks * 512 >= 4 * MiB  # preallocated, not sparse
    # a second region that no longer fits beside the first
    p = _cli("region", "format", str(small_fs / "r2"), "--segment", "cxl1", "--create", "--size", "6MiB")
    _one_line_error(p, "does not fit its filesystem")
    assert not (small_fs / "r2").exists()


def test_cluster_up_with_region_larger_than_dev_shm_refused(tmp_path: Path) -> None:
    """The issue's own case: --region-size 1TiB on a /dev/shm far smaller (statvfs:
    refused before anything is written)."""
    shm = os.statvfs("/dev/shm")
    if shm.f_bavail * shm.f_frsize >= 1 << 40:
        pytest.skip("/dev/shm holds 1 TiB here")
    before = set(os.listdir("/dev/shm"))
    p = _cli("cluster", "up", "--run-dir", str(tmp_path / "run"), "--region-size", "1TiB", "--clientds", "1")
    _one_line_error(p, "does not fit its filesystem", "/dev/shm")
    left = []  # other jobs create files in /dev/shm meanwhile: look for a 1 TiB one only
    for n in set(os.listdir("/dev/shm")) - before:
        try:
            if os.stat(f"/dev/shm/{n}").st_size == 1 << 40:
                left.append(n)
        except OSError:
            pass
    assert not left, left


def _clientd_conf(tmp_path: Path, regions: list[dict[str, str]]) -> Path:
    conf = tmp_path / "clientd.toml"
    conf.write_text(tomli_w.dumps({"name": "c0", "master_address": "127.0.0.1:1",
                                   "socket_path": str(tmp_path / "c0.sock"), "regions": regions}))
    return conf


@pytest.mark.parametrize("tier", ["cxl", "ssd"])
def test_clientd_refuses_sparse_file_larger_than_filesystem(small_fs: Path, tmp_path: Path, tier: str) -> None:
    """A region or tier file made sparse (truncate) beyond its filesystem: clientd stops at
    start with one line (exit 2), instead of SIGBUS or ENOSPC later."""
    path = small_fs / "big"
    with open(path, "wb") as f:
        f.truncate(64 * MiB)
    fmt = _cli("region", "format", str(path), "--segment", "s0")
    assert "does not fit its filesystem" in _one_line_error(fmt, "does not fit")  # refused there too
    from cxlkv.layout.region import format_region
    from cxlkv.transport import Region

    with Region.open(str(path)) as r:  # formatted anyway (the header only): clientd must refuse it
        format_region(r, "s0")
    conf = _clientd_conf(tmp_path, [{"segment": "s0", "path": str(path), "tier": tier}])
    p = _cli("clientd", "--config", str(conf))
    assert p.returncode == 2, p.stderr
    line = _one_line_error(p, "does not fit its filesystem")
    assert "64.0 MiB" in line and ("SSD tier" in line if tier == "ssd" else "region" in line)


def test_ssd_tier_larger_than_filesystem_refused_at_cluster_start(small_fs: Path, tmp_path: Path) -> None:
    from cxlkv.deploy.cluster import LocalCluster

    cl = LocalCluster(tmp_path / "run", clientds=1, region_size_bytes=4 * MiB, ssd_size_bytes=64 * MiB,
                      ssd_dir=str(small_fs))
    with pytest.raises(RegionError, match=r"SSD tier .* does not fit its filesystem"):
        cl.start()
    cl.stop()
    assert not list(small_fs.iterdir())


# ---------------------------------------------------------------- ENOSPC at run time

def _punch_hole(path: Path, offset: int, length: int) -> None:
    """Give ``length`` bytes at ``offset`` back to the filesystem (the file keeps its size):
    how a filesystem that cannot keep a reservation (thin provisioning, copy-on-write)
    looks to the writer."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
    fd = os.open(path, os.O_RDWR)
    try:
        if libc.fallocate(fd, 0x01 | 0x02, offset, length) != 0:  # KEEP_SIZE | PUNCH_HOLE
            raise OSError(ctypes.get_errno(), "fallocate(PUNCH_HOLE)")
    finally:
        os.close(fd)


def _fill(directory: Path) -> Path:
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    chunk = b"\xff" * (4 * KiB)
    try:
        while True:
            os.write(fd, chunk)
    except OSError:
        pass
    finally:
        os.close(fd)
    return filler


def _value(i: int) -> bytes:
    return (i.to_bytes(8, "little") * 2) * (BLOCK // 16)


def _counters(cl) -> dict[str, int]:
    return dict(cl.master_stat(check_invariants=False).counters)


TIER_MASTER = {"high_watermark": 0.9, "low_watermark": 0.8, "promotion_threshold": 0,
               "dram_promotion_threshold": 0, "task_timeout_s": 2.0, "task_retries": 3,
               "full_tier_backoff_s": 0.5, "full_tier_backoff_max_s": 2.0, "copy_ahead_watermark": 1.0}


def test_ssd_enospc_is_no_space_with_backoff(small_fs: Path, make_cluster) -> None:
    cl = make_cluster(clientds=1, region_size_bytes=REGION_HEADER_BYTES + 64 * (BLOCK + 128),
                      ssd_size_bytes=4 * MiB, ssd_dir=str(small_fs), master_options=TIER_MASTER)
    _punch_hole(Path(cl.ssd_path), REGION_HEADER_BYTES, 4 * MiB - REGION_HEADER_BYTES)
    filler = _fill(small_fs)
    codes: dict[str, int] = {}
    written: list[int] = []
    with cl.client(0) as c:
        # 4 s of puts, several times the CXL tier: demotions into the full SSD tier all along
        t0 = time.monotonic()
        j = 0
        while time.monotonic() - t0 < 4.0:
            for r in c.put_many([(f"f/{i}", _value(i)) for i in range(j, j + 10)]):
                name = r.error.code.name if r.error else "OK"
                codes[name] = codes.get(name, 0) + 1
            written.extend(range(j, j + 10))
            j += 10
        elapsed = time.monotonic() - t0
        assert "UNAVAILABLE" not in codes, codes
        assert set(codes) <= {"OK", "NO_SPACE"}, codes
        counters = _counters(cl)
        assert counters["tier_write_refusals"] > 0, counters
        master_log = (cl.run_dir / "master.log").read_text()
        marks = master_log.count("refused a write")
        # the tier is paused after a refusal (0.5 s doubling to 2 s) and tried again after it:
        # a few marks, not ~2,000 retries a second
        assert 1 <= marks <= elapsed / 0.5 + 2, marks
        assert counters["tier_write_refusals"] <= 64 * (marks + 1), counters
        clientd_log = (cl.run_dir / "clientd-0.log").read_text()
        assert "filesystem is full (ENOSPC)" in clientd_log
        assert clientd_log.count("move of key") <= elapsed / 5 + 2  # logged at a bounded rate
        # never wrong bytes: every key reads its own value or is a miss (dropped from a full cache)
        for i in written:
            try:
                assert c.get(f"f/{i}") == _value(i)
            except NotFound:
                pass
        cl.assert_invariants()
        # room again: the tier is tried after its backoff and demotions go through
        filler.unlink()
        time.sleep(TIER_MASTER["full_tier_backoff_max_s"] + 0.5)  # the longest pause of the tier
        before = _counters(cl)["demotions"]
        for i in range(j, j + 200, 10):
            res = c.put_many([(f"f/{k}", _value(k)) for k in range(i, i + 10)])
            assert all(r.ok for r in res), [r.error for r in res if not r.ok]
        cl.wait_until(lambda: _counters(cl)["demotions"] > before, timeout_s=30, what="demotions resumed")
        for i in range(j, j + 200):
            assert c.get(f"f/{i}") == _value(i)  # demoted, not dropped: the SSD tier has room
    cl.assert_invariants()


def test_file_region_enospc_is_no_space(small_fs: Path) -> None:
    """The SSD tier's write path itself: ENOSPC is NoSpace (code NO_SPACE), with the path."""
    from cxlkv.clientd.tiers import FileRegion
    from cxlkv.errors import ErrorCode

    with FileRegion.open(str(small_fs / "ssd"), size=2 * MiB, create=True) as r:
        _punch_hole(small_fs / "ssd", 0, 2 * MiB)
        _fill(small_fs)
        with pytest.raises(NoSpace, match="filesystem is full") as exc:
            r.copy_in(1 * MiB, b"x" * (256 * KiB))
        assert exc.value.code == ErrorCode.NO_SPACE


# ---------------------------------------------------------------- a full run directory

def test_clientd_starts_and_serves_with_a_full_run_directory(small_fs: Path, make_cluster, tmp_path: Path) -> None:
    """The clientd's socket, lock, state record and ready file on a full filesystem:
    the daemon starts and serves (the flock is the lock; records that cannot be
    written are logged in one line each), never a traceback or a bare
    ``cannot start: [Errno 28]``."""
    import tomllib

    from cxlkv import Client
    from cxlkv.deploy.cluster import ManagedProcess

    cl = make_cluster(clientds=1, region_size_bytes=16 * MiB)
    cfg = tomllib.loads((cl.run_dir / "clientd-0.toml").read_text())
    cfg.update(name="full", socket_path=str(small_fs / "full.sock"), ready_file=str(small_fs / "full.ready"))
    conf = tmp_path / "full.toml"
    conf.write_text(tomli_w.dumps(cfg))
    _fill(small_fs)
    assert os.statvfs(small_fs).f_bavail == 0
    log_path = tmp_path / "full.log"
    proc = ManagedProcess("full", [sys.executable, "-m", "cxlkv.cli", "clientd", "--config", str(conf)], log_path)
    proc.start()
    try:
        cl.wait_until(lambda: "ready" in log_path.read_text() or not proc.alive(), timeout_s=30,
                      what="the clientd on a full run directory to be ready")
        log = log_path.read_text()
        assert proc.alive(), log
        assert f"cannot write ready_file {small_fs / 'full.ready'}: No space left on device" in log, log
        assert "Traceback" not in log, log
        with Client(socket_path=str(small_fs / "full.sock")) as c:
            c.put("full/1", b"v" * 5000)
            assert c.get("full/1") == b"v" * 5000
    finally:
        rc, _killed = proc.stop()
    log = log_path.read_text()
    assert "Traceback" not in log, log
    assert not [p for p in small_fs.iterdir() if p.name.endswith(".tmp")]  # no partial record left


def test_master_address_file_on_a_full_filesystem_is_one_line(small_fs: Path, tmp_path: Path) -> None:
    """The master's address_file cannot be written (full filesystem): one line naming
    the file, exit 2, no traceback and no temporary file left (was a traceback)."""
    region = tmp_path / "region"
    fmt = _cli("region", "format", str(region), "--segment", "cxl0", "--create", "--size", "4MiB")
    assert fmt.returncode == 0, fmt.stderr
    conf = tmp_path / "master.toml"
    address_file = small_fs / "master.address"
    conf.write_text(tomli_w.dumps({"listen_address": "127.0.0.1:0", "address_file": str(address_file),
                                   "segments": [{"name": "cxl0", "size_bytes": 4 * MiB, "path": str(region)}]}))
    _fill(small_fs)
    p = _cli("master", "--config", str(conf))
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    line = _one_line_error(p, "cannot write address_file")
    assert str(address_file) in line and "No space left on device" in line, line
    assert sorted(x.name for x in small_fs.iterdir()) == ["filler"]


def test_cluster_up_on_a_full_run_directory_is_one_line(small_fs: Path) -> None:
    """``cxlkv cluster up --run-dir`` on a full filesystem: one line, non-zero exit,
    nothing left running (was a traceback from writing master.toml)."""
    _fill(small_fs)
    run_dir = small_fs / "run"
    p = _cli("cluster", "up", "--run-dir", str(run_dir), "--clientds", "1", "--region-size", "4MiB")
    assert "Traceback" not in p.stderr, p.stderr
    line = _one_line_error(p, "cannot start the cluster")
    assert str(run_dir) in line and "No space left on device" in line, line
    assert not (run_dir / "cluster.json").exists()


# ---------------------------------------------------------------- a region that shrinks

def _alive(cl, i: int = 0) -> bool:
    return cl.clientds[i].proc.poll() is None


@pytest.mark.parametrize("direct", [False, True])
def test_region_truncated_under_running_clientd(make_cluster, direct: bool) -> None:
    """Truncate the region file under a running cluster: the clientd stays alive and
    answers a clear error for the segment (no SIGBUS), in this process too (direct mode)."""
    from cxlkv.errors import CxlkvError

    cl = make_cluster(clientds=1, region_size_bytes=16 * MiB)
    value = lambda i: bytes([i % 251]) * (64 * KiB)  # noqa: E731
    with cl.client(0, direct=direct) as c:
        for i in range(150):  # ~9.6 MiB: most of the region
            c.put(f"t/{i}", value(i))
        assert c.get("t/149") == value(149)
        os.truncate(cl.region_paths[0], 4 * MiB)
        # reads and writes right after the truncation: a miss or an error, never wrong bytes
        # and never a crash (whether or not the daemon's check has run yet)
        outcomes: dict[str, int] = {}
        for i in range(0, 150, 3):
            try:
                got = c.get(f"t/{i}")
                assert got == value(i), f"wrong bytes for t/{i}"
                outcomes["ok"] = outcomes.get("ok", 0) + 1
            except CxlkvError as exc:
                outcomes[type(exc).__name__] = outcomes.get(type(exc).__name__, 0) + 1
        for i in range(150, 160):
            try:
                c.put(f"t/{i}", value(i))
            except CxlkvError:
                pass
        assert set(outcomes) <= {"ok", "ChecksumMismatch", "NotFound", "RegionError", "Unavailable"}, outcomes
        assert _alive(cl), (cl.run_dir / "clientd-0.log").read_text()[-2000:]
        log_path = cl.run_dir / "clientd-0.log"
        cl.wait_until(lambda: "shrank to 4194304 bytes" in log_path.read_text(), timeout_s=10,
                      what="clientd to see the region shrink")
        # from now on: a clear error for the segment, for reads (even of bytes before the cut) and writes
        with pytest.raises(CxlkvError, match="shrank to 4194304 bytes"):
            c.get("t/149")
        with pytest.raises(CxlkvError, match="shrank to 4194304 bytes"):
            c.get("t/0")
        with pytest.raises(CxlkvError, match="shrank"):
            c.put("t/new", value(7))
        assert _alive(cl)
    log = log_path.read_text()
    assert "Traceback" not in log
    assert log.count("shrank to 4194304 bytes under this daemon") == 1  # logged once
    with cl.client(0, direct=False) as c:  # the daemon still answers everything else
        assert isinstance(c.exists("t/0"), bool)  # answered (whether it is listed is the master's matter)



def test_ssd_tier_truncated_under_running_clientd(make_cluster, tmp_path: Path) -> None:
    """Truncate the SSD tier file under a running cluster: the clientd sees it as it
    sees a shrunk CXL region — every later read and write on the tier is one clear
    error naming the file (was: "short read at N" per object, and writes that grew
    the file again, sparse), the daemon stays up, never wrong bytes."""
    from cxlkv.errors import CxlkvError

    ssd_dir = tmp_path / "ssd"
    ssd_dir.mkdir()
    cl = make_cluster(clientds=1, region_size_bytes=REGION_HEADER_BYTES + 64 * (BLOCK + 128),
                      ssd_size_bytes=4 * MiB, ssd_dir=str(ssd_dir), master_options=TIER_MASTER)
    with cl.client(0) as c:
        for j in range(0, 300, 10):
            assert all(r.ok for r in c.put_many([(f"s/{i}", _value(i)) for i in range(j, j + 10)]))
        cl.wait_until(lambda: _counters(cl)["demotions"] > 100, timeout_s=20, what="demotions to SSD")
        os.truncate(cl.ssd_path, 1 * MiB)
        log_path = cl.run_dir / "clientd-0.log"
        cl.wait_until(lambda: "shrank to 1048576 bytes" in log_path.read_text(), timeout_s=10,
                      what="clientd to see the SSD tier shrink")
        outcomes: dict[str, int] = {}
        for i in range(300):
            try:
                assert c.get(f"s/{i}") == _value(i), f"wrong bytes for s/{i}"
                outcomes["ok"] = outcomes.get("ok", 0) + 1
            except CxlkvError as exc:
                assert "shrank" in exc.message, exc.message
                outcomes["shrank"] = outcomes.get("shrank", 0) + 1
        assert outcomes.get("shrank", 0) > 0 and outcomes.get("ok", 0) > 0, outcomes
        for j in range(300, 400, 10):  # demotions and SSD puts into the shrunk file: refused
            c.put_many([(f"s/{i}", _value(i)) for i in range(j, j + 10)])
        assert os.path.getsize(cl.ssd_path) == 1 * MiB  # not grown again by writes past its end
        assert _alive(cl)
    log = log_path.read_text()
    assert "Traceback" not in log
    errors = [ln for ln in log.splitlines() if "ERROR" in ln and "shrank to 1048576 bytes under this daemon" in ln]
    assert len(errors) == 1, errors  # found once (failed moves quote it, at a bounded rate)


_GUARD_SCRIPT = r"""
import os, sys
from cxlkv.transport import Region, install_sigbus_guard
path = sys.argv[1]
r = Region.open(path, size=1 << 20, create=True)
r.copy_in(4096, b"kept")
r.copy_in(900_000, b"gone")
if sys.argv[2] == "guard":
    install_sigbus_guard()
os.truncate(path, 64 * 1024)
out = bytearray(4)
r.copy_out(900_000, out)
print("read", bytes(out), r.guard_hits, flush=True)
r.copy_in(500_000, b"lost")
back = bytearray(4)
r.copy_out(4096, back)
print("before the cut", bytes(back), r.guard_hits, flush=True)
r.retire()
try:
    r.copy_out(0, bytearray(1))
except Exception as exc:
    print("retired", type(exc).__name__, flush=True)
"""


def test_sigbus_guard_turns_a_shrunk_file_into_zeros(tmp_path: Path) -> None:
    """The transport's SIGBUS guard, in a process of its own: without it the first access
    past the new end kills the process (SIGBUS); with it reads see zeros, writes are lost,
    the hits are counted, and bytes before the cut stay readable."""
    path = tmp_path / "region"
    bare = subprocess.run([sys.executable, "-c", _GUARD_SCRIPT, str(path), "none"], capture_output=True,
                          text=True, timeout=60)
    assert bare.returncode == -7, (bare.returncode, bare.stdout, bare.stderr)  # -SIGBUS
    path.unlink()
    p = subprocess.run([sys.executable, "-c", _GUARD_SCRIPT, str(path), "guard"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["read b'\\x00\\x00\\x00\\x00' 1", "before the cut b'kept' 2",
                                     "retired RegionError"]
