"""Direct commit: a direct-mode writer commits its puts to the master itself.

Real processes (tests/conftest.py clusters). Covered: single and batched puts
committed with no Commit through the daemon and read back from another host,
byte for byte; the errors of the daemon's path (ALREADY_EXISTS); what cannot be
committed directly (upserts, large values) still goes through the daemon; a
writer killed holding reservations gives every one back, and a writer that
claims commits it did not make frees them too; a commit under a registration
that ended (its clientd restarted) goes through the daemon and leaves no
quarantine; a lost answer is settled from the index; TLS turns it off
(docs/sdk.md "Direct commit").
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

import cxlkv.client._conn as conn_mod
from cxlkv.errors import AlreadyExists, Unavailable
from cxlkv.v1 import client_pb2

KiB = 1 << 10


def _counters(client) -> dict[str, int]:
    return {k: int(v) for k, v in client.stat()["counters"].items()}


def _value(i: int, n: int) -> bytes:
    return (i.to_bytes(8, "little") * (n // 8 + 1))[:n]


def _reservations_settled(cluster, i: int = 0) -> bool:
    """No handed reservation pending in clientd ``i`` (the only one taking reservations),
    and the master holds exactly that daemon's pool."""
    with cluster.client(i, direct=False) as client:
        c = _counters(client)
    return c.get("direct_puts_pending", 0) == 0 and (
        cluster.master_stat(check_invariants=False).reserved_count == c.get("reservations_held", 0))


def test_puts_commit_from_the_writer_and_read_back_elsewhere(cluster) -> None:
    with cluster.client(0) as a, cluster.client(1, direct=False) as b:
        assert a.direct, a.direct_status
        for i in range(4):  # the daemon's pool learns the sizes
            a.put(f"warm/{i}", _value(i, 4 * KiB))
        a.put_many([(f"warm/b/{i}", _value(i, 4 * KiB)) for i in range(64)])
        before = _counters(a)
        for i in range(50):
            assert a.put(f"one/{i}", _value(i, 4 * KiB)) >= 1
        results = a.put_many([(f"many/{i}", _value(1000 + i, 4 * KiB)) for i in range(300)])
        assert all(r.ok for r in results), [r for r in results if not r.ok][:3]
        after = _counters(a)
        commits = a._direct.commits
        # what the daemon's pool could not hand at once went through the daemon (inline)
        assert commits.committed >= 300 and not commits.why_not
        grew = {k: after.get(k, 0) - before.get(k, 0) for k in after}
        assert grew.get("master_calls.Commit", 0) <= 2, grew  # (those) through the daemon
        assert grew.get("master_calls.PutStart", 0) == 0, grew
        assert grew["direct_reserved_handed"] >= 300, grew
        for i in range(50):
            assert b.get(f"one/{i}") == _value(i, 4 * KiB)
        got = b.get_many([f"many/{i}" for i in range(300)])
        assert [r.value for r in got] == [_value(1000 + i, 4 * KiB) for i in range(300)]
        # the daemon's answers, unchanged
        with pytest.raises(AlreadyExists):
            a.put("one/3", b"other")
        assert b.get("one/3") == _value(3, 4 * KiB)
        dup = a.put_many([("dup", b"x" * 100), ("dup", b"y" * 100)])  # a key twice: the daemon answers
        assert sum(r.ok for r in dup) == 1
        # not committed directly: upserts, values over 1 MiB, empty values are fine
        assert a.upsert("one/3", b"new") > 0 and b.get("one/3") == b"new"
        big = os.urandom((1 << 20) + 5)
        a.put("big", big)
        a.put("empty", b"")
        assert b.get("big") == big and b.get("empty") == b""
    cluster.wait_until(lambda: _reservations_settled(cluster), what="the writer's reservations given back")
    cluster.assert_invariants()


_KILLED_HOLDER = textwrap.dedent("""
    import os, sys, time
    from cxlkv import Client
    c = Client(sys.argv[1])
    for i in range(40):
        c.put(f"held/{i}", bytes([i]) * 4096)
    if sys.argv[2] == "lie":  # claim commits of reservations never used (and keys never put)
        d = c._direct.commits
        with d._lock:
            held = [t for s in d._stacks.values() for t, _ in s]
            d._stacks.clear()
        c._call("DirectReserve", __import__("cxlkv.v1.client_pb2", fromlist=["x"]).DirectReserveRequest(
            pid=os.getpid(), committed_put_tokens=held, committed_keys=[f"nope/{t}" for t in held]))
    print(len(c._direct.commits._stacks), flush=True)
    time.sleep(600)
""")


@pytest.mark.parametrize("how", ["kill9", "lie"])
def test_a_writer_killed_or_lying_holds_no_space(cluster, how: str) -> None:
    with cluster.client(0, direct=False) as watcher:
        p = subprocess.Popen([sys.executable, "-c", _KILLED_HOLDER, cluster.socket_path(0), how],
                             stdout=subprocess.PIPE, text=True)
        try:
            assert p.stdout.readline().strip() != ""  # type: ignore[union-attr]
            if how == "lie":
                # the claims the index does not confirm go back to the master at once
                cluster.wait_until(lambda: cluster.master_stat(check_invariants=False).reserved_count
                                   <= _counters(watcher).get("reservations_held", 0)
                                   + _counters(watcher).get("direct_puts_pending", 0),
                                   what="unconfirmed claims given back")
            assert _counters(watcher).get("direct_puts_pending", 0) >= 1 or how == "lie"
        finally:
            p.send_signal(signal.SIGKILL)
            p.wait(10)
        cluster.wait_until(lambda: _reservations_settled(cluster),
                           what="the killed writer's reservations given back")
        for i in range(40):
            assert watcher.get(f"held/{i}") == bytes([i]) * 4096
    cluster.assert_invariants()


def test_a_commit_under_an_ended_registration_goes_through_the_daemon(cluster) -> None:
    with cluster.client(0) as a, cluster.client(1, direct=False) as b:
        for i in range(5):
            a.put(f"before/{i}", _value(i, 4 * KiB))
        assert a._direct.commits._stacks, "the writer holds reservations"
        old_route = a._direct.commits._route
        cluster.kill_clientd(0)  # a host's daemon crashes; a new one registers again
        cluster.restart_clientd(0)
        for i in range(20):  # the held reservations are the old registration's: refused, put again
            assert a.put(f"after/{i}", _value(100 + i, 4 * KiB)) >= 1
        assert a._direct.commits._route != old_route
        for i in range(20):
            assert b.get(f"after/{i}") == _value(100 + i, 4 * KiB)
        for i in range(5):
            assert b.get(f"before/{i}") == _value(i, 4 * KiB)
        # what the old registration granted is freed once the writer reported it
        cluster.wait_until(lambda: cluster.master_stat(check_invariants=False).quarantined_bytes == 0,
                           what="the old registration's reservations freed")
    cluster.wait_until(lambda: _reservations_settled(cluster), what="reservations given back")
    cluster.assert_invariants()


def test_a_lost_commit_answer_is_settled_from_the_index(cluster, monkeypatch) -> None:
    real_call = conn_mod.LeanConnection.call
    lost = []

    def call_and_lose_the_answer(self, method, request):
        resp = real_call(self, method, request)
        if self.peer.startswith("the master") and not lost:
            lost.append(method.name)
            raise Unavailable("the answer was lost (test)")
        return resp

    with cluster.client(0) as a, cluster.client(1, direct=False) as b:
        a.put("warm", b"w" * 4096)
        a.put("warm2", b"w" * 4096)
        monkeypatch.setattr(conn_mod.LeanConnection, "call", call_and_lose_the_answer)
        v = a.put("lost", b"L" * 4096)  # committed; its answer lost; the retry is refused; the index says
        assert lost == ["Commit"]
        assert v >= 1 and b.get("lost") == b"L" * 4096
        assert a.put("next", b"N" * 4096) >= 1 and b.get("next") == b"N" * 4096
    cluster.wait_until(lambda: _reservations_settled(cluster), what="reservations given back")
    cluster.assert_invariants()


def test_direct_commit_is_declined_with_tls(make_cluster, tls_certs) -> None:
    cl = make_cluster(clientds=1, tls=True, certs_dir=tls_certs.dir)
    with cl.client(0) as a:
        a.put("k", b"v" * 4096)
        assert a.get("k") == b"v" * 4096
        resp = a._call("DirectReserve", client_pb2.DirectReserveRequest(pid=os.getpid(), need_bytes=[4160],
                                                                       counts=[1]))
        assert not resp.offered and "plaintext" in resp.why_not, resp
        assert a._direct.commits.committed == 0


def test_reservations_come_packed_or_as_extent_messages(cluster, monkeypatch) -> None:
    """DirectReserve answers the extents in packed columns when asked
    (``packed_extents``, what this SDK asks), else as DirectExtent messages (an
    older SDK): both describe the same kind of reservation, and an SDK given the
    message form still commits from it."""
    from cxlkv.client import _commit
    from cxlkv.v1 import client_pb2

    with cluster.client(0) as a, cluster.client(1, direct=False) as b:
        a.put("warm", _value(0, 4 * KiB))
        for packed in (True, False):
            resp = a._call("DirectReserve", client_pb2.DirectReserveRequest(
                pid=os.getpid(), need_bytes=[4160], counts=[3], packed_extents=packed))
            assert resp.offered and list(resp.granted) == [3] and len(resp.put_tokens) == 3
            if packed:
                assert not resp.extents and len(resp.segment_ids) == len(resp.offsets_bytes) == 3
                assert list(resp.lengths_bytes) == [4160] * 3
            else:
                assert not resp.segment_ids and len(resp.extents) == 3
                assert all(e.direct and e.extent.length_bytes == 4160 for e in resp.extents)
            a._call("DirectReserve", client_pb2.DirectReserveRequest(pid=os.getpid(),
                                                                     done_put_tokens=resp.put_tokens))
        # this SDK, answered the message form (as by a daemon that predates packed_extents)
        real = client_pb2.DirectReserveRequest

        def unpacked(**kw):
            kw.pop("packed_extents", None)
            return real(**kw)

        monkeypatch.setattr(_commit.client_pb2, "DirectReserveRequest", unpacked)
        with cluster.client(0) as c:
            before = c._direct.commits.committed
            results = c.put_many([(f"msgform/{i}", _value(i, 4 * KiB)) for i in range(40)])
            assert all(r.ok for r in results)
            assert c._direct.commits.committed > before
        assert [r.value for r in b.get_many([f"msgform/{i}" for i in range(40)])] == \
            [_value(i, 4 * KiB) for i in range(40)]
    cluster.wait_until(lambda: _reservations_settled(cluster), what="the writer's reservations given back")
    cluster.assert_invariants()
