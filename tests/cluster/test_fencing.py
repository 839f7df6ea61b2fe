"""A writer that outlives its put's timeout never lands in space given to another object.

The master revokes a put after ``put_timeout_s``; a writer that is merely slow
(or a direct-mode SDK process that was stopped) may still be copying into the
extent. The master holds such "fenced" space until the writer ends the attempt
(clientd sends PutRevoke when PutEnd answers STALE_TOKEN) or its registration
ends (docs/master.md, "Put timeout").
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import cxlkv.client._direct as direct_mod
from cxlkv.errors import CxlkvError, NotFound, NotReady, StaleToken

MiB = 1 << 20


def _before_direct_copies(monkeypatch, stall) -> None:
    """Run ``stall()`` before each direct-mode copy of this process into the region,
    by either path: one value (``_copy_in``) or a direct commit's batch (``_copy_in_gather``)."""
    for name in ("_copy_in", "_copy_in_gather"):
        real = getattr(direct_mod, name)

        def stalled_copy(*args, _real=real, **kwargs):
            stall()
            return _real(*args, **kwargs)

        monkeypatch.setattr(direct_mod, name, stalled_copy)


def _stall_the_first_direct_copy(monkeypatch, seconds: float) -> threading.Event:
    """Make this process's first direct-mode copy into the region wait ``seconds``
    before it starts (a writer stopped mid-put); the event is set when it waits."""
    stalled = threading.Event()

    def stall() -> None:
        if not stalled.is_set():
            stalled.set()
            time.sleep(seconds)  # the master may revoke the put meanwhile

    _before_direct_copies(monkeypatch, stall)
    return stalled


def test_a_stalled_direct_writer_never_lands_in_reused_space(make_cluster, monkeypatch) -> None:
    cl = make_cluster(region_size_bytes=64 * MiB, master_options={"put_timeout_s": 1.0})
    stalled = _stall_the_first_direct_copy(monkeypatch, 3.0)  # past put_timeout_s
    late = np.full(20 * MiB, 0x11, np.uint8)
    good = np.full(20 * MiB, 0x22, np.uint8)
    outcome: list[object] = []
    with cl.client(0, direct_threshold_bytes=0) as writer, cl.client(1, direct=False) as other, \
            cl.client(0, direct=False) as same_host:
        assert writer.direct, writer.direct_status

        def slow_put() -> None:
            try:
                outcome.append(writer.put_from("k", late))
            except CxlkvError as exc:  # the put timed out: refused, or already exists on a retry
                outcome.append(exc)

        t = threading.Thread(target=slow_put)
        t.start()
        assert stalled.wait(10)
        deadline = time.monotonic() + 10
        while True:  # NOT_READY while the slow put is in flight, then the key is free
            try:
                other.put_from("k", good)
                break
            except NotReady:
                assert time.monotonic() < deadline, "the stalled put was never revoked"
                time.sleep(0.05)
        assert cl.master_stat().fenced_count == 1  # the slow writer's space is still held
        t.join(30)
        assert not t.is_alive() and outcome
        # The late copy went into the fenced extent, not into "good"'s.
        for c in (other, same_host):
            assert c.get("k") == good.tobytes()
        out = np.zeros(20 * MiB, np.uint8)
        writer.get_into("k", out)
        assert (out == 0x22).all()
        cl.wait_until(lambda: cl.master_stat().fenced_count == 0, what="the fenced space to be freed")
    st = cl.assert_invariants()
    assert st.used_bytes < 2 * 20 * MiB + MiB  # only "good" (and nothing fenced) holds space


def test_a_stalled_upsert_is_refused_not_redone_over_a_newer_value(make_cluster, monkeypatch) -> None:
    """A direct upsert stalled past put_timeout_s is revoked; a newer upsert of the key
    commits meanwhile. When the stalled writer resumes, its put raises StaleToken: it
    is not started again behind the caller's back, where it would replace the newer
    value with the older one (a redo is only for a daemon that re-registered:
    UNKNOWN_CLIENT)."""
    cl = make_cluster(region_size_bytes=64 * MiB, master_options={"put_timeout_s": 1.0})
    stalled = _stall_the_first_direct_copy(monkeypatch, 3.0)  # past put_timeout_s
    older = np.full(8 * MiB, 0xEE, np.uint8)
    newer = np.full(8 * MiB, 0x11, np.uint8)
    outcome: list[object] = []
    with cl.client(0, direct_threshold_bytes=0) as writer, cl.client(1, direct=False) as other:
        assert writer.direct, writer.direct_status

        def slow_upsert() -> None:
            try:
                outcome.append(writer.put_from("k", older, upsert=True))
            except CxlkvError as exc:
                outcome.append(exc)

        t = threading.Thread(target=slow_upsert)
        t.start()
        assert stalled.wait(10)
        deadline = time.monotonic() + 10
        while True:  # NOT_READY while the slow put is in flight, then the key is free
            try:
                other.put_from("k", newer, upsert=True)
                break
            except NotReady:
                assert time.monotonic() < deadline, "the stalled put was never revoked"
                time.sleep(0.05)
        t.join(30)
        assert not t.is_alive() and outcome
        assert isinstance(outcome[0], StaleToken), outcome[0]
        for c in (other, writer):
            assert c.get("k") == newer.tobytes()
        cl.wait_until(lambda: cl.master_stat().fenced_count == 0, what="the fenced space to be freed")
    cl.assert_invariants()


def test_a_direct_writer_stalled_across_a_restart_of_its_clientd_never_lands_in_reused_space(
        make_cluster, monkeypatch) -> None:
    """The direct-mode SDK writer stops mid-put; its clientd is killed (kill -9) and
    restarted; the master expires the old registration and quarantines the writer's
    extent. The new clientd finds the old one's record (clientd/writers.py): the
    writer still runs, so its put stays held while another host fills the region;
    when the writer resumes, its copy lands in its own (quarantined) extent, and
    the space is freed once the writer has ended its put."""
    import signal

    cl = make_cluster(region_size_bytes=64 * MiB, master_options={"client_ttl_s": 1.0,
                                                                   "heartbeat_interval_s": 0.2})
    stalled, resume = threading.Event(), threading.Event()

    def stall() -> None:
        if not stalled.is_set():
            stalled.set()
            resume.wait(60)  # the clientd is killed and restarted meanwhile

    _before_direct_copies(monkeypatch, stall)
    late = np.full(20 * MiB, 0x11, np.uint8)
    outcome: list[object] = []
    with cl.client(0, direct_threshold_bytes=0) as writer, cl.client(1, direct=False) as other:
        assert writer.direct, writer.direct_status

        def slow_put() -> None:
            try:
                outcome.append(writer.put_from("k", late))
            except CxlkvError as exc:
                outcome.append(exc)

        t = threading.Thread(target=slow_put)
        t.start()
        assert stalled.wait(10)
        cl.clientds[0].signal(signal.SIGKILL)
        cl.clientds[0].proc.wait(10)
        cl.restart_clientd(0)
        # the new process registers under the old client id (its predecessor's record): the old
        # registration ends, and the writer's extent is quarantined, not freed
        cl.wait_until(lambda: cl.master_stat(check_invariants=False).quarantined_bytes >= 20 * MiB,
                      timeout_s=20, what="the stalled writer's extent to be quarantined")
        # the other host fills the region twice over: every free extent is reused
        written: dict[str, bytes] = {}
        for i in range(100):
            v = bytes([i % 251]) * (MiB - 512)
            try:
                other.put(f"fill/{i}", v)
                written[f"fill/{i}"] = v
            except CxlkvError:
                pass
        assert cl.master_stat(check_invariants=False).quarantined_bytes >= 20 * MiB  # still held
        resume.set()
        t.join(30)
        assert not t.is_alive() and outcome
        for k, v in written.items():
            try:
                assert other.get(k) == v, k
            except NotFound:
                pass  # evicted
        cl.wait_until(lambda: cl.master_stat(check_invariants=False).quarantined_bytes == 0, timeout_s=20,
                      what="the writer's space to be freed once it ended its put")
    cl.assert_invariants()


@pytest.mark.parametrize("how", ["kill9-restart", "sigstop-past-ttl"])
def test_a_stalled_direct_writer_in_a_reserved_extent_frees_its_quarantine(make_cluster, monkeypatch,
                                                                          how: str) -> None:
    """As above, with a value small enough for a reserved extent (≤ 1 MiB, a size the
    daemon has reserved for): the writer's clientd is killed and restarted, or stopped
    past client_ttl_s (it re-registers itself), so the extent is quarantined; the
    writer then resumes and ends its put. The quarantined reservation used to stay
    held for good: PutRevoke named the put's key, the reservation has none, and the
    master answered STALE_TOKEN without freeing it (nor did a failed PackedCommit of
    an ended registration's reservation revoke it)."""
    import signal

    cl = make_cluster(region_size_bytes=64 * MiB, master_options={"client_ttl_s": 1.0,
                                                                   "heartbeat_interval_s": 0.2})
    size = 256 << 10
    armed, stalled, resume = threading.Event(), threading.Event(), threading.Event()

    def stall() -> None:
        if armed.is_set() and not stalled.is_set():
            stalled.set()
            resume.wait(60)  # the clientd is restarted or paused meanwhile

    _before_direct_copies(monkeypatch, stall)
    outcome: list[object] = []
    with cl.client(0, direct_threshold_bytes=0) as writer, cl.client(1, direct=False) as other:
        assert writer.direct, writer.direct_status
        for i in range(3):  # the daemon now holds reserved extents of this size
            writer.put(f"warm/{i}", bytes([i]) * size)
        armed.set()

        def slow_put() -> None:
            try:
                outcome.append(writer.put("k", b"\x11" * size))
            except CxlkvError as exc:
                outcome.append(exc)

        t = threading.Thread(target=slow_put)
        t.start()
        assert stalled.wait(10)
        if how == "kill9-restart":
            cl.clientds[0].signal(signal.SIGKILL)
            cl.clientds[0].proc.wait(10)
            cl.restart_clientd(0)
        else:
            cl.clientds[0].signal(signal.SIGSTOP)
            try:
                cl.wait_until(lambda: cl.master_stat(check_invariants=False).counters["clients_expired"] >= 1,
                              timeout_s=20, what="the paused clientd to expire")
            finally:
                cl.clientds[0].signal(signal.SIGCONT)
        cl.wait_until(lambda: cl.master_stat(check_invariants=False).quarantined_bytes >= size, timeout_s=20,
                      what="the stalled writer's extent to be quarantined")
        time.sleep(1.0)  # the daemon has released what it could (re-registered, drained)
        assert cl.master_stat(check_invariants=False).quarantined_bytes >= size  # the writer still runs
        resume.set()
        t.join(30)
        assert not t.is_alive() and outcome
        if not isinstance(outcome[0], CxlkvError):
            assert other.get("k") == b"\x11" * size
        cl.wait_until(lambda: cl.master_stat(check_invariants=False).quarantined_bytes == 0, timeout_s=20,
                      what="the writer's reserved extent to be freed once it ended its put")
    cl.assert_invariants()


def test_a_put_start_whose_answer_was_lost_does_not_hold_its_space_for_good(make_cluster) -> None:
    # The master stalls (SIGSTOP, a VM pause) while clientd's PutStart waits in its
    # socket; clientd's call times out (Unavailable to the caller), then the master
    # runs and starts the put for a writer that never learns its token. It timed out
    # into a *fenced* put, held until the writer ended it — which it never could —
    # or its registration ended: space lost until the daemon restarted (seen as
    # "1 fenced" in cxlkv status after a 20 s SIGSTOP of the master under load).
    import signal

    from cxlkv.errors import Unavailable

    cl = make_cluster(clientds=1, master_options={"put_timeout_s": 1.0},
                      clientd_options={"master_timeout_s": 1.0, "reserve_ahead": False})
    with cl.client(0, direct=False) as c:
        c.put("warm", b"w" * 1000)
        cl.master.signal(signal.SIGSTOP)
        try:
            with pytest.raises(Unavailable):
                c.put("lost", b"x" * 100_000)
        finally:
            cl.master.signal(signal.SIGCONT)

        cl.wait_until(lambda: cl.master_stat().counters["puts_started"] >= 2, 20,
                      "the master to start the put whose answer was lost")

        def settled() -> bool:
            st = cl.master_stat()
            return st.processing_count == 0 and st.fenced_count == 0 and st.quarantined_bytes == 0

        cl.wait_until(settled, 20, "the lost put's space to be freed (not fenced for good)")
        st = cl.assert_invariants()
        assert st.key_count == 1
        c.put("lost", b"y" * 100_000)  # the key is free, and so is its space
        assert c.get("lost") == b"y" * 100_000
    cl.assert_invariants()
