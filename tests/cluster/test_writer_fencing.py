"""A clientd stopped (SIGSTOP) past its TTL, at any step of a put, never damages another object.

Real processes. The master expires the stopped clientd and quarantines the
space it may still be writing (in-flight puts, extents reserved ahead of need);
another clientd fills the region several times over meanwhile, forcing every
free extent to be reused; the stopped clientd is resumed, finishes its copy
into its quarantined space, notices it was expired, re-registers, drains and
frees the quarantine. Every object of the other clientd is then read back byte
for byte (no CHECKSUM_MISMATCH, no wrong bytes), the region verifies clean, and
space accounting is exact (docs/master.md "Reservations and fencing").
"""

from __future__ import annotations

import signal
import threading
import time

import numpy as np
import pytest

from cxlkv.errors import ChecksumMismatch, CxlkvError, NotFound

MiB = 1 << 20
TTL = {"client_ttl_s": 1.0, "heartbeat_interval_s": 0.2}


def _value(i: int, n: int) -> bytes:
    return (i.to_bytes(8, "little") * (n // 8 + 1))[:n]


def _counters(cl) -> dict[str, int]:
    return dict(cl.master_stat(check_invariants=False).counters)


@pytest.mark.parametrize("big_mib, delay_s", [(1, 0.0), (1, 0.002), (256, 0.005), (256, 0.05)])
def test_a_stopped_writer_never_lands_in_reused_space(make_cluster, big_mib: int, delay_s: float) -> None:
    cl = make_cluster(clientds=2, region_size_bytes=(big_mib + 96) * MiB, master_options=TTL)
    a_proc = cl.clientds[0]
    with cl.client(0, direct=False) as a, cl.client(1) as b:
        for i in range(8):  # a holds reservations: small puts in one round trip
            a.put(f"a/small/{i}", _value(i, 4096))
        big = a.buffer(big_mib * MiB)
        np.frombuffer(big, dtype=np.uint8)[:] = 7
        outcome: list[object] = []

        def writer() -> None:
            try:
                outcome.append(a.put_from("a/big", big))
            except CxlkvError as exc:
                outcome.append(exc)

        t = threading.Thread(target=writer)
        t.start()
        time.sleep(delay_s)
        a_proc.signal(signal.SIGSTOP)  # before, during or after the put's master calls and copy
        try:
            cl.wait_until(lambda: _counters(cl).get("clients_expired", 0) >= 1, timeout_s=20,
                          what="the stopped clientd to expire")
            held = _counters(cl).get("quarantined", 0)
            # b fills the region three times over: every free extent is reused meanwhile
            written: dict[str, bytes] = {}
            n = 3 * (big_mib + 96) // 1
            for i in range(n):
                v = _value(1000 + i, MiB - 256)
                try:
                    b.put(f"b/{i}", v)
                    written[f"b/{i}"] = v
                except CxlkvError:
                    pass  # no space while a's space is held: a cache may refuse, never corrupt
        finally:
            a_proc.signal(signal.SIGCONT)
        t.join(60)
        assert outcome, "the stopped writer's put never returned"
        # a notices its expiry, re-registers, drains its copies and frees the quarantine
        cl.wait_until(lambda: _counters(cl).get("quarantine_released_bytes", 0) > 0 or held == 0,
                      timeout_s=30, what="the resumed clientd to free its quarantined space")
        damaged = []
        for k, v in written.items():
            try:
                if b.get(k) != v:
                    damaged.append(k)
            except NotFound:
                pass  # evicted: a cache forgets, it must not corrupt
            except ChecksumMismatch:
                damaged.append(k)
        assert not damaged, f"{len(damaged)} object(s) damaged, e.g. {damaged[:3]}"
        if not isinstance(outcome[0], CxlkvError):  # committed before the stop: intact too
            got = np.zeros(big_mib * MiB, np.uint8)
            try:
                assert a.get_into("a/big", got) == big_mib * MiB and int(got.min()) == int(got.max()) == 7
            except NotFound:
                pass
        cl.assert_invariants()
        assert held > 0 or delay_s == 0.0 or big_mib == 1, "a stopped mid-put held nothing in quarantine"
    report = _verify_region(cl)
    assert report == 0, f"{report} object(s) in the region fail verification"


def _verify_region(cl) -> int:
    """Objects the master lists whose extent does not verify (region scan)."""
    from cxlkv.transport import Region
    from cxlkv.transport.scan import scan_region

    keys = {e.key: e.version for e in cl.list_master_keys()}
    bad = 0
    with Region.open(cl.region_paths[0]) as r:
        found = scan_region(r, verify_values=True)
    seen = {(o.key, o.version): o for o in found}
    for k, ver in keys.items():
        o = seen.get((k, ver))
        if o is None or o.checksum_ok is False:
            bad += 1
    return bad
