"""The committed-object index in the region, on real clusters (issue 17; docs/index.md).

* reads (get, get_into, get_many, get_prefix_into, exists) succeed through the
  SDK in direct mode and through a clientd while the master is SIGSTOPped, and a
  clientd serving them from the index calls the master for none of them;
* kill -9 of the master under a put load, then ``--recover-from-region``: every
  acknowledged put reads back byte for byte, the accounting is exact;
* object headers forged inside a value never become objects after recovery from
  the index; after ``cxlkv region format --force`` nothing of the old contents
  comes back;
* the reader in docs/index.md's appendix (struct + xxhash + mmap only) finds what
  the SDK finds: the page is enough to write a reader;
* the index's costs, measured and printed.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import timeit
import tomllib
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tomli_w
import xxhash

from cxlkv.deploy.cluster import ManagedProcess, wait_for_file
from cxlkv.errors import CxlkvError, NotFound
from cxlkv.v1 import client_pb2, client_pb2_grpc

from conftest import TestCluster

KiB, MiB = 1 << 10, 1 << 20
ROOT = Path(__file__).resolve().parents[2]
_xxh3 = xxhash.xxh3_64_intdigest


# ----------------------------------------------------------------------------- helpers
def _appendix_reader() -> Any:
    """The ``IndexFile`` class of docs/index.md's appendix, executed from the page itself."""
    text = (ROOT / "docs" / "index.md").read_text()
    block = text.split("<!-- appendix-reader-begin -->", 1)[1].split("<!-- appendix-reader-end -->", 1)[0]
    code = block.split("```python\n", 1)[1].rsplit("```", 1)[0]
    imported = set(re.findall(r"^\s*(?:import|from)\s+([\w.]+)", code, re.M))
    assert imported <= {"mmap", "struct", "xxhash"}, imported  # the page's reader needs nothing of cxlkv
    ns: dict[str, Any] = {}
    exec(compile(code, "docs/index.md (appendix A)", "exec"), ns)
    return ns["IndexFile"]


def _slot_dump(ixf: Any, key: str) -> str:
    """What the index holds for ``key``: its buckets' slots and the header each names (a failure's evidence)."""
    import struct
    import xxhash
    h = xxhash.xxh3_64_intdigest(key.encode())
    mask = ixf.buckets - 1
    b1, b2 = h & mask, (h >> 32) & mask
    lines = [f"{key}: hash {h:#x}, buckets {b1} {b2}, publish/overflow "
             f"{struct.unpack_from('<QQ', ixf.m, ixf.ix + 64)}"]
    for b in dict.fromkeys([b1, b2 if b2 != b1 else (b1 + 1) & mask]):
        for j in range(8):
            off = ixf.table + (8 * b + j) * 64
            raw = ixf.m[off:off + 64]
            s = struct.unpack_from("<QQQQQQIHBB", raw, 0)
            ok = xxhash.xxh3_64_intdigest(raw[:56]) == struct.unpack_from("<Q", raw, 56)[0]
            mark = "*" if s[1] == h else " "
            head = ""
            if s[1] == h and s[2] + 64 <= len(ixf.m):
                hd = ixf.m[s[2]:s[2] + 80]
                head = f" header {hd[:8]!r} ver {struct.unpack_from('<Q', hd, 24)[0]} vlen " \
                       f"{struct.unpack_from('<Q', hd, 32)[0]} key {bytes(hd[64:80])!r}"
            lines.append(f" {mark} slot {8 * b + j} seq {s[0]} sum_ok {ok} flags {s[7]:#x} region {s[8]} "
                         f"extent {s[2]} vlen {s[3]} ver {s[4]} hb {s[6]}{head}")
    return "\n".join(lines)


def _clientd_counters(cl: TestCluster, i: int = 0) -> dict[str, int]:
    with grpc.insecure_channel(f"unix:{cl.socket_path(i)}") as ch:
        st = client_pb2_grpc.ClientServiceStub(ch).Stat(client_pb2.ClientStatRequest(), timeout=10)
    return dict(st.counters)


def _master_calls(counters: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in counters.items() if k.startswith("master_calls.")}


def _start_master(cl: TestCluster, *args: str, log_name: str) -> None:
    """Start a fresh master on the cluster's address (the old one already stopped or killed)."""
    assert cl.master is not None
    if cl._channel is not None:
        cl._channel.close()
        cl._channel = None
    conf = cl.run_dir / "master.toml"
    cfg = tomllib.loads(conf.read_text())
    cfg["listen_address"] = cl.master_address
    conf.write_text(tomli_w.dumps(cfg))
    address_file = cl.run_dir / "master.address"
    address_file.unlink(missing_ok=True)
    argv, old = [], list(cl.master.argv)
    while old:  # the configured command line, without an earlier restart's recovery arguments
        a = old.pop(0)
        if a == "--recover-from-region":
            old.pop(0)
        else:
            argv.append(a)
    cl.master = ManagedProcess("master", [*argv, *args], cl.run_dir / log_name)
    cl.master.start()
    wait_for_file(address_file, cl.start_timeout_s, cl.master)


def _kill9_master(cl: TestCluster) -> None:
    assert cl.master is not None and cl.master.proc is not None
    cl.master.signal(signal.SIGKILL)
    cl.master.proc.wait(10)


def _recovery_line(cl: TestCluster, log_name: str) -> str:
    text = (cl.run_dir / log_name).read_text()
    m = re.search(r"recovery: rebuilt from the index of region .*", text)
    assert m, text[-2000:]
    return m.group(0)


def _get(c: Any, key: str) -> bytes | None:
    try:
        return c.get(key)
    except NotFound:
        return None


def _bounded(fn: Any, timeout_s: float) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``fn`` in a thread, waiting at most ``timeout_s``: ``(thread, {"value"|"error": …})``
    (the caller checks ``thread.is_alive()``: a call that blocks does not hang the test)."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout_s)
    return t, out


# ----------------------------------------------------------------------------- reads, master stopped
def test_reads_from_the_index_while_the_master_is_stopped(make_cluster) -> None:
    cl = make_cluster(clientds=1)
    rng = random.Random(17)
    sizes = [0, 1, 63, 64, 65, 4 * KiB, 64 * KiB, 300 * KiB] + [rng.randrange(1, 32 * KiB) for _ in range(24)]
    values = {f"st/v/{i}": rng.randbytes(n) for i, n in enumerate(sizes)}
    blocks = [f"st/blk/{j}" for j in range(8)]
    for b in blocks:
        values[b] = rng.randbytes(16 * KiB)
    IndexFile = _appendix_reader()
    with cl.client(0) as sdk, cl.client(0, direct=False) as lean, \
            cl.client(0, direct=False, protocol="grpc") as rpc:
        assert sdk.direct, sdk.direct_status
        assert not lean.direct and not rpc.direct
        for i, (k, v) in enumerate(values.items()):
            (sdk if i % 2 else lean).put(k, v)
        sdk.put("st/up", b"old" * 1000)
        lean.put("st/up", b"new version", upsert=True)
        values["st/up"] = b"new version"
        sdk.put("st/gone", b"removed")
        sdk.remove("st/gone")
        keys = list(values)
        for c in (sdk, lean, rpc):  # everything is in the index before the master stops
            assert _get(c, "st/up") == b"new version" and _get(c, "st/gone") is None

        # the page's reader finds what the SDK finds (master running)
        ixf = IndexFile(cl.region_paths[0])
        for k in keys:
            outcome, value, _version = ixf.lookup(k)
            assert outcome == "HIT" and value == values[k] == sdk.get(k), k
        assert ixf.lookup("st/gone")[0] == "MISS" and ixf.lookup("st/never")[0] == "MISS"
        assert ixf.lookup(keys[0], probe=True)[0] == "HIT"

        cd_before = _clientd_counters(cl)
        ms_before = dict(cl.master_stat(False).counters)
        sdk_answered, sdk_fallbacks = sdk._direct.index.answered, sdk._direct.index.fallbacks

        def reads(c: Any) -> int:
            n = 0
            for k in keys:
                assert c.get(k) == values[k], k
                n += 1
            dst = np.zeros(400 * KiB, dtype=np.uint8)
            for k in keys[::3]:
                got = c.get_into(k, dst)
                assert got == len(values[k]) and dst[:got].tobytes() == values[k], k
                n += 1
            res = c.get_many(keys + ["st/never", "st/gone"])
            assert [r.value for r in res[:-2]] == [values[k] for k in keys]
            assert not res[-1].ok and not res[-2].ok and isinstance(res[-1].error, NotFound)
            n += len(keys)
            dsts = [np.zeros(16 * KiB, dtype=np.uint8) for _ in range(len(blocks) + 1)]
            assert c.get_prefix_into(blocks + ["st/blk/missing"], dsts) == len(blocks)
            for b, d in zip(blocks, dsts):
                assert d.tobytes() == values[b], b
            n += len(blocks)
            assert all(c.exists(k) for k in keys[:5])
            assert not c.exists("st/never") and not c.exists("st/gone")
            with pytest.raises(NotFound):
                c.get("st/never")
            return n

        assert cl.master is not None
        cl.master.signal(signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            done = {}
            for name, c in (("sdk", sdk), ("lean", lean), ("grpc", rpc)):
                t, out = _bounded(lambda c=c: reads(c), 30.0)
                assert not t.is_alive(), f"{name}: reads blocked while the master is stopped (a master call)"
                if "error" in out:
                    raise out["error"]
                done[name] = out["value"]
            elapsed = time.monotonic() - t0
            # and the page's reader, master stopped
            for k in keys:
                assert ixf.lookup(k)[1] == values[k]
        finally:
            cl.master.signal(signal.SIGCONT)
        print(f"\n[index] {sum(done.values())} reads with the master stopped in {elapsed:.2f} s")

        # the SDK answered from the index itself; the clientd answered its callers' reads
        # from the index without one master call (no lookup, no lease, no miss)
        assert sdk._direct.index.fallbacks == sdk_fallbacks  # not one read went to the daemon
        assert sdk._direct.index.answered - sdk_answered >= 2 * len(keys)
        cd_after = _clientd_counters(cl)
        assert _master_calls(cd_after) == _master_calls(cd_before), (cd_before, cd_after)
        assert cd_after["index_hits"] - cd_before["index_hits"] >= done["lean"] + done["grpc"]
        ms_after = dict(cl.master_stat(False).counters)
        for name in ("lease_grants", "get_misses"):
            assert ms_after[name] == ms_before[name], name
        # hits still reach the master's policy, in batches, once it runs again
        cl.wait_until(lambda: cl.master_stat(False).counters["index_hits"] - ms_before["index_hits"]
                      >= done["lean"] + done["grpc"], timeout_s=15, what="hit reports at the master")
        ixf.m.close()
    cl.assert_invariants()


def test_a_large_get_through_the_daemon_costs_one_master_round_trip(make_cluster) -> None:
    """A value over index_max_value_bytes read with Get through the daemon: the index
    slot tells its size (TOO_LARGE without the master), the SDK's GetInto then makes the
    one master call (a located, leased read)."""
    cl = make_cluster(clientds=1, clientd_options={"index_max_value_bytes": 256 * KiB})
    value = random.Random(5).randbytes(3 * MiB)
    with cl.client(0, direct=False) as c:
        c.put("big/one", value)
        before = _master_calls(_clientd_counters(cl))
        assert c.get("big/one") == value
        after = _master_calls(_clientd_counters(cl))
    grew = {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}
    located = sum(n for k, n in grew.items() if "GetReplicaList" in k)
    assert located == 1, grew
    cl.assert_invariants()


@pytest.mark.parametrize("coherence", ["coherent", "flush"])
def test_large_gets_return_the_bytes_they_were_copied_into(make_cluster, coherence: str) -> None:
    """Values past the SDK's 64 KiB scratch buffer (index path) and past 4 MiB (leased
    path) are copied once, straight into the ``bytes`` returned: right type, right
    bytes, independent objects, in both coherence modes; a value upserted to another
    size in between is read at its new size."""
    cl = make_cluster(clientds=1, region_size_bytes=64 * MiB, clientd_options={"coherence": coherence})
    rng = random.Random(9)
    sizes = [2, 64 * KiB - 1, 64 * KiB + 1, MiB, 5 * MiB]
    values = {f"big/{n}": rng.randbytes(n) for n in sizes}
    with cl.client(0) as c:
        assert c.direct, c.direct_status
        for k, v in values.items():
            c.put(k, v)
        for _ in range(2):
            got = {k: c.get(k) for k in values}
            assert all(type(g) is bytes for g in got.values())
            assert got == values and len({id(g) for g in got.values()}) == len(got)
            assert {hash(g) for g in got.values()} == {hash(v) for v in values.values()}
        c.put("big/1048576", b"small now", upsert=True)
        assert c.get("big/1048576") == b"small now"
        c.put("big/1048576", rng.randbytes(3 * MiB), upsert=True)
        assert len(c.get("big/1048576")) == 3 * MiB


def test_an_index_smaller_than_the_cache_takes_every_put(make_cluster) -> None:
    """A table sized for 64 objects (128 slots) under 8 concurrent writers of 900 keys:
    keys past 3/4 of the slots overflow (read through the RPC path), reservations stop
    at their 1/8, and every put still finds a slot for its grant: no put is refused,
    every value reads back, the page's reader never answers MISS for a committed key."""
    cl = make_cluster(clientds=2, index_objects=64)
    values = {f"tiny/{t}/{i}": random.Random(f"{t}/{i}").randbytes(300) for t in range(8) for i in range(112)}
    errors: list[str] = []

    def writer(t: int) -> None:
        with cl.client(t % 2, direct=bool(t % 4 < 2)) as c:
            for k in (k for k in values if k.startswith(f"tiny/{t}/")):
                try:
                    c.put(k, values[k])
                except CxlkvError as exc:
                    errors.append(f"{k}: {exc}")

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[:5]
    with cl.client(0) as a, cl.client(1, direct=False) as b:
        assert [r.value for r in a.get_many(list(values))] == list(values.values())
        assert [r.value for r in b.get_many(list(values))] == list(values.values())
    ixf = _appendix_reader()(cl.region_paths[0])
    outcomes = {ixf.lookup(k)[0] for k in values}
    assert outcomes <= {"HIT", "UNSURE"} and "HIT" in outcomes, outcomes
    assert ixf.lookup("tiny/never")[0] == "UNSURE"  # the overflow word says the table is not the whole truth
    ixf.m.close()
    counters = dict(cl.master_stat(False).counters)
    assert counters.get("grants_unrecorded", 0) == 0 and counters["puts_committed"] == len(values), counters
    cl.assert_invariants()


# ----------------------------------------------------------------------------- kill -9 under load
def test_kill9_of_the_master_under_puts_loses_no_committed_object(make_cluster) -> None:
    cl = make_cluster(clientds=2, master_options={"owner_lease_ttl_s": 1.0, "heartbeat_interval_s": 0.2,
                                                  "client_ttl_s": 3})
    acked: dict[str, bytes] = {}
    failures: list[str] = []
    stop = threading.Event()
    lock = threading.Lock()

    def writer(ci: int, direct: bool, tag: str) -> None:
        rng = random.Random(tag)
        with cl.client(ci, direct=direct) as c:
            i = 0
            while not stop.is_set():
                key = f"load/{tag}/{i}"
                value = rng.randbytes(rng.choice([0, 100, 4 * KiB, 20 * KiB, 64 * KiB]))
                i += 1
                try:
                    c.put(key, value)
                except CxlkvError as exc:  # not acknowledged: may or may not be committed
                    with lock:
                        failures.append(f"{key}: {type(exc).__name__}")
                    time.sleep(0.05)
                    continue
                with lock:
                    acked[key] = value

    # both writers on clientd-0 (the SDK copying in direct mode, and clientd copying for a caller):
    # writers on both clientds: the extents the dead master had handed out stay theirs
    threads = [threading.Thread(target=writer, args=(0, True, "sdk"), daemon=True),
               threading.Thread(target=writer, args=(1, False, "daemon"), daemon=True)]
    for t in threads:
        t.start()
    try:
        cl.wait_until(lambda: len(acked) >= 150, timeout_s=30, what="150 acknowledged puts")
        _kill9_master(cl)
        with lock:
            at_kill = len(acked)
        _start_master(cl, "--recover-from-region", cl.region_paths[0], log_name="master-recovered.log")
        # the load goes on against the recovered master
        cl.wait_until(lambda: len(acked) >= at_kill + 60, timeout_s=40, what="puts after the recovery")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not any(t.is_alive() for t in threads), "a writer did not stop"
    line = _recovery_line(cl, "master-recovered.log")
    restored = int(re.search(r": (\d+) object\(s\)", line).group(1))
    assert restored >= at_kill and "0 did not verify" in line, line
    print(f"\n[index] kill -9 under load: {at_kill} acknowledged before the kill, {restored} restored, "
          f"{len(acked)} acknowledged in all, {len(failures)} puts refused around the restart")

    # every acknowledged put, byte for byte, through the SDK (index), a clientd and the page's reader
    ixf = _appendix_reader()(cl.region_paths[0])
    with cl.client(0) as a, cl.client(1, direct=False) as b:
        cl.wait_until(lambda: _get(b, next(iter(acked))) is not None, timeout_s=20, what="clientd-1 back")
        lost = [k for k, v in acked.items() if _get(a, k) != v]
        assert not lost, f"{len(lost)} acknowledged puts lost or wrong: {lost[:10]}"
        res = b.get_many(list(acked))
        assert [r.value for r in res] == list(acked.values())
        wrong = {k: ixf.lookup(k)[0] for k, v in acked.items() if ixf.lookup(k)[1] != v}
        assert not wrong, (f"the page's reader disagrees on {len(wrong)} key(s): {list(wrong.items())[:5]}\n"
                           + "\n".join(_slot_dump(ixf, k) for k in list(wrong)[:3]))
        keys_at_master = {e.key for e in cl.list_master_keys()}
        assert set(acked) <= keys_at_master
    ixf.m.close()
    cl.wait_until(lambda: cl.master_stat(False).processing_count == 0, timeout_s=20, what="no put in flight")
    cl.assert_invariants()


def test_a_clientd_with_reservations_of_a_dead_master_never_overwrites_new_objects(make_cluster) -> None:
    """Deterministic form of what the load test above hits now and then: clientd-1 holds extents
    reserved by the old master; it is stopped while the master is killed and recovered, clientd-0
    fills the space with acknowledged puts, then clientd-1 resumes with a put already queued."""
    cl = make_cluster(clientds=2, master_options={"owner_lease_ttl_s": 1.0, "heartbeat_interval_s": 0.2,
                                                  "client_ttl_s": 3})
    size = 60 * KiB
    with cl.client(1, direct=False) as b:
        for i in range(3):
            b.put(f"old/{i}", os.urandom(size))  # clientd-1 now holds reserved 60 KiB extents
    cl.clientds[1].signal(signal.SIGSTOP)
    try:
        _kill9_master(cl)
        _start_master(cl, "--recover-from-region", cl.region_paths[0], log_name="master-recovered.log")
        new = {f"new/{i}": os.urandom(size) for i in range(40)}
        with cl.client(0) as a:
            cl.wait_until(lambda: _put_ok(a, "probe/0", b"x"), timeout_s=30, what="clientd-0 registered again")
            for k, v in new.items():
                a.put(k, v)  # acknowledged by the recovered master
        with cl.client(1, direct=False, timeout_s=30) as b:
            late = [os.urandom(size) for _ in range(4)]
            t, _ = _bounded(lambda: [_put_quiet(b, f"late/{i}", v) for i, v in enumerate(late)], 0.5)
            cl.clientds[1].signal(signal.SIGCONT)
            t.join(30)
    finally:
        cl.clientds[1].signal(signal.SIGCONT)
    with cl.client(0, direct=False) as a:
        lost = [k for k, v in new.items() if _get_or_error(a, k) != v]
    assert not lost, f"{len(lost)} acknowledged puts overwritten by a stale reservation: {lost[:5]}"
    cl.wait_until(lambda: cl.master_stat(False).processing_count == 0, timeout_s=20, what="no put in flight")
    cl.assert_invariants()


def _put_ok(c: Any, key: str, value: bytes) -> bool:
    try:
        c.put(key, value, upsert=True)
        return True
    except CxlkvError:
        return False


def _put_quiet(c: Any, key: str, value: bytes) -> None:
    try:
        c.put(key, value)
    except CxlkvError:
        pass


def _get_or_error(c: Any, key: str) -> bytes | str:
    try:
        return c.get(key)
    except CxlkvError as exc:
        return repr(exc)


# ----------------------------------------------------------------------------- forged headers, re-format
def _forged_image(key: str, version: int, value: bytes) -> bytes:
    """An object header + key + value, exactly as a writer lays an extent out (64-aligned)."""
    from cxlkv.layout.objheader import header_bytes_for, pack_header

    kb = key.encode()
    image = pack_header(kb, version, len(value), _xxh3(value)) + kb
    image += bytes(header_bytes_for(len(kb)) - len(image)) + value
    return image + bytes(-len(image) % 64)


def test_forged_headers_and_a_reformatted_region_restore_nothing_foreign(make_cluster) -> None:
    from cxlkv.transport import Region
    from cxlkv.transport.scan import scan_region

    cl = make_cluster(clientds=1, master_options={"owner_lease_ttl_s": 1.0, "heartbeat_interval_s": 0.2,
                                                  "client_ttl_s": 3})
    victim = b"forged value " * 300
    forged_keys = ["forged/victim", "forged/other", "forged/carrier"]
    carrier = b"".join(_forged_image(k, v, victim) for k in forged_keys for v in (1, 2 ** 40 + 7))
    real = {f"real/{i}": os.urandom(1000 + 37 * i) for i in range(20)}
    real["forged/carrier"] = carrier
    with cl.client(0) as c:
        for k, v in real.items():
            c.put(k, v)
        assert c.get("forged/carrier") == carrier and _get(c, "forged/victim") is None
    # the forgeries are in the region: a header scan (the old recovery) would take them for objects
    with Region.open(cl.region_paths[0]) as r:
        scanned = {o.key for o in scan_region(r)}
    assert {"forged/victim", "forged/other"} <= scanned, scanned

    _kill9_master(cl)
    _start_master(cl, "--recover-from-region", cl.region_paths[0], log_name="master-recovered.log")
    line = _recovery_line(cl, "master-recovered.log")
    assert f": {len(real)} object(s) of {len(real)} live slot(s)" in line and "0 did not verify" in line, line
    assert {e.key for e in cl.list_master_keys()} == set(real)
    ixf = _appendix_reader()(cl.region_paths[0])
    with cl.client(0) as sdk, cl.client(0, direct=False) as daemon:
        cl.wait_until(lambda: daemon.exists("real/0"), timeout_s=20, what="clientd back")
        for c in (sdk, daemon):
            assert not c.exists("forged/victim") and not c.exists("forged/other")
            with pytest.raises(NotFound):
                c.get("forged/victim")
            assert c.get("forged/carrier") == carrier
            assert all(c.get(k) == v for k, v in real.items())
        assert ixf.lookup("forged/victim")[0] == "MISS"
    ixf.m.close()
    cl.assert_invariants()

    # a stopped cluster's region re-formatted: a master recovering from it finds nothing
    cl.clientds[0].stop()
    assert cl.master is not None
    cl.master.stop()
    out = subprocess.run([sys.executable, "-m", "cxlkv.cli", "region", "format", cl.region_paths[0],
                          "--segment", "cxl0", "--force"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    _start_master(cl, "--recover-from-region", cl.region_paths[0], log_name="master-reformatted.log")
    line = _recovery_line(cl, "master-reformatted.log")
    assert ": 0 object(s) of 0 live slot(s)" in line, line
    cl.restart_clientd(0)
    assert cl.master_stat(False).key_count == 0 and cl.list_master_keys() == []
    ixf = _appendix_reader()(cl.region_paths[0])
    with cl.client(0) as sdk, cl.client(0, direct=False) as daemon:
        assert sdk.direct, sdk.direct_status
        for k in [*real, "forged/victim"]:
            assert ixf.lookup(k)[0] == "MISS", k
            for c in (sdk, daemon):
                assert not c.exists(k), k
                assert _get(c, k) is None, k
        sdk.put("after/format", b"fresh")  # and the region works as new
        assert daemon.get("after/format") == b"fresh" and ixf.lookup("after/format")[1] == b"fresh"
    ixf.m.close()
    cl.assert_invariants()


# ----------------------------------------------------------------------------- costs
def test_index_costs_measured() -> None:
    """Bytes of region per object, the master's publish time per commit, a probe's and a
    4 KiB get's time: printed (asserted only for sanity)."""
    from cxlkv.layout.index import IndexWriter, set_publish_word
    from cxlkv.master.segments import Tier
    from cxlkv.layout.objheader import header_bytes_for
    from cxlkv.layout.region import format_region
    from cxlkv.transport import Region
    from cxlkv.transport.index import IX_HIT, IndexReader

    size = 64 * MiB
    path = f"/dev/shm/cxlkv-ixcost-{os.getpid()}"
    try:
        with Region.open(path, size=size, create=True) as r:
            ident = format_region(r, "cxl0")
            geo = ident.index
            assert geo is not None
            expected = size // (16 * KiB)
            per_object = geo.index_bytes / expected
            share = geo.index_bytes / size
            assert 128 <= per_object <= 2 * 128 + 4096 / expected and share < 0.02

            writer = IndexWriter(r, geo, flush=True)
            n = 2000
            keys = [f"cost/{i:06d}" for i in range(n)]
            value = os.urandom(4 * KiB)
            vsum = _xxh3(value)
            hb = header_bytes_for(len(keys[0]))
            stride = (hb + len(value) + 63) & ~63
            for i, k in enumerate(keys[:256]):  # real extents behind the first 256 slots
                r.copy_in(4096 + i * stride, _forged_image(k, i + 1, value))
            hashes = [_xxh3(k.encode()) for k in keys]
            t0 = time.perf_counter()
            for i, (k, h) in enumerate(zip(keys, hashes)):
                writer.publish(k, h, extent_offset_bytes=4096 + i * stride, value_len_bytes=len(value),
                               version=i + 1, value_checksum=vsum, header_bytes=hb, region_no=0,
                               tier=int(Tier.CXL), elsewhere=False)
            writer.sync()  # the slots are written once per master call
            publish_us = (time.perf_counter() - t0) / n * 1e6
            assert writer.overflow == 0 and writer.live_slots == n
            t0 = time.perf_counter()  # republish (an upsert's new version into the same slot)
            for i, (k, h) in enumerate(zip(keys, hashes)):
                writer.publish(k, h, extent_offset_bytes=4096 + i * stride, value_len_bytes=len(value),
                               version=i + 1, value_checksum=vsum, header_bytes=hb, region_no=0,
                               tier=int(Tier.CXL), elsewhere=False)
            writer.sync()  # the slots are written once per master call
            republish_us = (time.perf_counter() - t0) / n * 1e6
            t0 = time.perf_counter()
            for k, h in zip(keys[256:], hashes[256:]):  # the objects without extents go again
                writer.retire(k, h)
            retire_us = (time.perf_counter() - t0) / (n - 256) * 1e6
            set_publish_word(r, geo, 1)

            reader = IndexReader(r, geo.index_offset_bytes, geo.table_offset_bytes, geo.buckets, [r])
            buf = np.zeros(64 * KiB, dtype=np.uint8)
            k0 = keys[7].encode()
            res = reader.get(k0, buf)
            assert res.outcome == IX_HIT and buf[:len(value)].tobytes() == value
            assert reader.probe(k0).outcome == IX_HIT
            reps = 20000
            probe_us = min(timeit.repeat(lambda: reader.probe(k0), number=reps, repeat=3)) / reps * 1e6
            get_us = min(timeit.repeat(lambda: reader.get(k0, buf), number=reps, repeat=3)) / reps * 1e6
            miss = b"cost/missing"
            miss_us = min(timeit.repeat(lambda: reader.probe(miss), number=reps, repeat=3)) / reps * 1e6
            del reader
    finally:
        Path(path).unlink(missing_ok=True)
    print(f"\n[index costs] region {size // MiB} MiB, default sizing ({expected} expected objects): index "
          f"{geo.index_bytes} B = {per_object:.1f} B of region per expected object, {share * 100:.2f} % of the "
          f"region; master publish (write-through, flushed) {publish_us:.2f} us per commit (republish "
          f"{republish_us:.2f} us, tombstone {retire_us:.2f} us); probe "
          f"{probe_us:.2f} us (miss {miss_us:.2f} us); get 4 KiB {get_us:.2f} us")
    assert publish_us < 1000 and probe_us < 1000 and get_us < 1000
