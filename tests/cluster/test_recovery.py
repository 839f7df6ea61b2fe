"""Master metadata rebuilt from the region's index after it is lost (real processes).

The master is SIGKILLed (its metadata lives in memory only) and restarted with
``--recover-from-region`` on the same region; it rebuilds from the region's
committed-object index (cxlkv.layout.index), the clientds re-register by themselves,
and every committed object is read back byte for byte — and nothing else.
"""

from __future__ import annotations

import random
import signal
import time
import tomllib

import tomli_w

from cxlkv.deploy.cluster import ManagedProcess, wait_for_file
from cxlkv.errors import CxlkvError, NotFound

from conftest import TestCluster

KiB, MiB = 1 << 10, 1 << 20


def _kill_and_recover(cl: TestCluster, *recover_args: str) -> None:
    """SIGKILL the master (unless it is dead already), then start a fresh one on the
    same address with ``recover_args``."""
    assert cl.master is not None and cl.master.proc is not None
    if cl.master.proc.poll() is None:
        cl.master.signal(signal.SIGKILL)
        cl.master.proc.wait(10)
    if cl._channel is not None:
        cl._channel.close()
        cl._channel = None
    conf = cl.run_dir / "master.toml"
    cfg = tomllib.loads(conf.read_text())
    cfg["listen_address"] = cl.master_address
    conf.write_text(tomli_w.dumps(cfg))
    address_file = cl.run_dir / "master.address"
    address_file.unlink(missing_ok=True)
    cl.master = ManagedProcess("master", [*cl.master.argv, *recover_args], cl.run_dir / "master-recovered.log")
    cl.master.start()
    wait_for_file(address_file, cl.start_timeout_s, cl.master)


def _read(client, key: str) -> bytes | None:
    try:
        return client.get(key)
    except CxlkvError:
        return None


def test_master_index_rebuilt_from_region_scan_every_object_byte_for_byte(make_cluster) -> None:
    cl = make_cluster(master_options={"heartbeat_interval_s": 0.2, "client_ttl_s": 2})
    rng = random.Random(42)
    sizes = [0, 1, 63, 64, 65, 4 * KiB, 100 * KiB, MiB - 1, MiB + 1, 5 * MiB] + [rng.randrange(0, 64 * KiB)
                                                                              for _ in range(150)]
    values = {f"rec/{i}/{n}": rng.randbytes(n) for i, n in enumerate(sizes)}
    with cl.client(0) as a, cl.client(1) as b:
        for i, (k, v) in enumerate(values.items()):
            (a if i % 2 else b).put(k, v)
        a.put("rec/upserted", b"old version " * 100)
        b.put("rec/upserted", b"newest version wins", upsert=True)
        values["rec/upserted"] = b"newest version wins"
        # Removed and its space not reused: the region still holds a valid
        # header, but the index no longer names it, so it stays removed.
        a.put("rec/removed", b"removed but still in the region")
        a.remove("rec/removed")
        assert _read(b, "rec/removed") is None
        before = cl.assert_invariants()
        before_keys = {e.key: (e.value_size_bytes, e.version) for e in cl.list_master_keys()}
        assert set(before_keys) == set(values)

        _kill_and_recover(cl, "--recover-from-region", cl.region_paths[0])
        st = cl.master_stat()
        assert st.key_count == len(values)  # the removed key stays removed
        # exactly the live extents: the extents the clientds held reserved ahead of need are not objects
        assert st.used_bytes <= before.used_bytes
        after_keys = {e.key: (e.value_size_bytes, e.version) for e in cl.list_master_keys()}
        assert after_keys == before_keys  # same keys, sizes and versions
        log = (cl.run_dir / "master-recovered.log").read_text()
        assert f"rebuilt from the index of region {cl.region_paths[0]}: {len(values)} object(s)" in log
        assert "0 did not verify" in log

        # both clientds re-register by themselves and read everything back (small
        # values from the region's index at once; the 5 MiB one through the master)
        big = next(k for k, v in values.items() if len(v) == 5 * MiB)
        assert _read(a, "rec/upserted") == values["rec/upserted"]
        cl.wait_until(lambda: _read(a, big) == values[big], timeout_s=20, what="clientd-0 to re-register")
        cl.wait_until(lambda: _read(b, big) == values[big], timeout_s=20, what="clientd-1 to re-register")
        for i, (k, v) in enumerate(values.items()):
            assert (a if i % 2 == 0 else b).get(k) == v, k
        assert _read(a, "rec/removed") is None
        cl.assert_invariants()

        # new puts work, take versions above the recovered ones, never overlap recovered extents
        for i in range(40):
            v = rng.randbytes(rng.randrange(0, 256 * KiB))
            a.put(f"rec/new/{i}", v)
            values[f"rec/new/{i}"] = v
        top = max(ver for _, ver in before_keys.values())
        newer = [e for e in cl.list_master_keys() if e.key.startswith("rec/new/")]
        assert len(newer) == 40 and min(e.version for e in newer) > top
        for k, v in values.items():
            assert b.get(k) == v, k
        b.put("rec/upserted", b"after recovery", upsert=True)
        assert a.get("rec/upserted") == b"after recovery"
        try:
            a.remove("rec/removed")
            raise AssertionError("rec/removed came back with the recovery")
        except NotFound:
            pass
    cl.assert_invariants()


def test_master_refuses_a_region_of_another_segment(make_cluster) -> None:
    cl = make_cluster(clientds=1)
    assert cl.master is not None
    cl.master.stop()
    proc = ManagedProcess("master-bad", [*cl.master.argv, "--recover-from-region", f"{cl.region_paths[0]}=cxl9"],
                          cl.run_dir / "master-bad.log")
    proc.start()
    assert proc.proc is not None
    deadline = time.monotonic() + 20
    while proc.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.proc.returncode == 2
    text = (cl.run_dir / "master-bad.log").read_text()
    assert "recover_from_region: region" in text and "not 'cxl9'" in text and "Traceback" not in text
    cl.master = None


def _start_failing(cl: TestCluster, name: str, *recover_args: str) -> str:
    """Start a master with ``recover_args`` that must refuse to start: exit 2, one
    line, no traceback; its log."""
    assert cl.master is not None
    proc = ManagedProcess(name, [*cl.master.argv, *recover_args], cl.run_dir / f"{name}.log")
    proc.start()
    assert proc.proc is not None
    deadline = time.monotonic() + 20
    while proc.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    text = (cl.run_dir / f"{name}.log").read_text()
    assert proc.proc.returncode == 2, text
    assert "Traceback" not in text
    return text


def test_a_recovery_start_that_fails_leaves_the_index_for_the_right_one(make_cluster) -> None:
    """A mistyped, doubled, unformatted or wrong-segment ``--recover-from-region``
    is refused before the master takes any region: the region's index is not
    emptied, so the corrected start still recovers every committed object (a
    failed start used to wipe it: the retry found 0 objects)."""
    cl = make_cluster(clientds=1)
    client = cl.client(0)
    values = {f"rec/typo/{i}": random.randbytes(3 * KiB + i) for i in range(20)}
    for k, v in values.items():
        client.put(k, v)
    assert cl.master is not None and cl.master.proc is not None
    cl.master.signal(signal.SIGKILL)
    cl.master.proc.wait(10)
    region = cl.region_paths[0]
    junk = cl.run_dir / "not-a-region"
    junk.write_bytes(b"\x00" * (1 << 20))
    for name, args, said in [
        ("typo", (f"{region}x",), "does not exist"),
        ("twice", (region, region), "is given twice"),
        ("unformatted", (region, str(junk)), "recover_from_region:"),
        ("segment", (f"{region}=cxl9",), "not 'cxl9'"),
    ]:
        argv = [a for r in args for a in ("--recover-from-region", r)]
        assert said in _start_failing(cl, f"master-{name}", *argv), name
    _kill_and_recover(cl, "--recover-from-region", region)
    log = (cl.run_dir / "master-recovered.log").read_text()
    assert f"{len(values)} object(s) of {len(values)} live slot(s)" in log, log
    reader = cl.client(0)
    deadline = time.monotonic() + 30
    while _read(reader, "rec/typo/0") is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert {k: _read(reader, k) for k in values} == values
