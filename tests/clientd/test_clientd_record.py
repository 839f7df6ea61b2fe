"""The record a clientd process leaves for the next one (clientd/writers.py):
appended per direct put, rewritten whole rarely, read back exactly."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cxlkv.clientd import writers
from cxlkv.clientd.writers import DirectWriter, Incarnation, parse_record


def _claimed(tmp_path: Path) -> Incarnation:
    inc = Incarnation(str(tmp_path / "clientd.sock"))
    assert inc.acquire() is None
    inc.record_registration("cid-1", 3)
    return inc


def _read(inc: Incarnation):
    return parse_record(Path(inc.state_path).read_bytes())


def test_starts_and_ends_are_appended_and_read_back_in_order(tmp_path: Path) -> None:
    inc = _claimed(tmp_path)
    rewrites = inc.rewrites
    inc.direct_started([DirectWriter(7, "a key with spaces", 11, 123), DirectWriter(8, "k\nnl\"q", 12, None)])
    inc.direct_started([DirectWriter(9, "z", 11, 123)])
    inc.direct_ended([7, 999])  # 999: never started, not recorded
    assert inc.rewrites == rewrites  # appends only
    prev = _read(inc)
    assert (prev.pid, prev.client_id, prev.epoch) == (os.getpid(), "cid-1", 3)
    assert {w.put_token: w for w in prev.direct} == {8: DirectWriter(8, "k\nnl\"q", 12, None),
                                                      9: DirectWriter(9, "z", 11, 123)}
    assert Path(inc.state_path).read_text().count("\n") == 2 + 3 + 1  # magic, R, three +, one -


def test_the_record_is_rewritten_once_appends_outnumber_the_live_entries(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writers, "COMPACT_MIN_LINES", 16)
    inc = _claimed(tmp_path)
    for t in range(1, 101):
        inc.direct_started([DirectWriter(t, f"k{t}", 5, 6)])
        inc.direct_ended([t])
    inc.direct_started([DirectWriter(500, "kept", 5, 6)])
    text = Path(inc.state_path).read_text()
    assert text.count("\n") <= 2 + 16 + 1  # never more than the threshold past a rewrite
    assert [w.put_token for w in _read(inc).direct] == [500]


def test_an_unfinished_last_line_is_ignored(tmp_path: Path) -> None:
    inc = _claimed(tmp_path)
    inc.direct_started([DirectWriter(1, "a", 5, 6)])
    with open(inc.state_path, "ab") as f:
        f.write(b"- 1")  # the process died inside this write
    assert [w.put_token for w in _read(inc).direct] == [1]


def test_a_new_process_keeps_the_previous_writers_until_told_they_ended(tmp_path: Path) -> None:
    inc = _claimed(tmp_path)
    inc.direct_started([DirectWriter(1, "a", 5, 6), DirectWriter(2, "b", 5, 6)])
    inc.release()
    nxt = Incarnation(inc.state_path[: -len(".state")])
    prev = nxt.acquire()
    assert prev is not None and prev.client_id == "cid-1" and len(prev.direct) == 2
    nxt.record_registration("cid-1", 4)  # registering again rewrites the record: the writers stay in it
    assert sorted(w.put_token for w in _read(nxt).direct) == [1, 2]
    nxt.direct_ended([1])
    assert [w.put_token for w in _read(nxt).direct] == [2] and _read(nxt).epoch == 4
    nxt.release()


def test_the_json_record_of_earlier_versions_is_read(tmp_path: Path) -> None:
    raw = json.dumps({"pid": 9, "client_id": "old", "epoch": 2, "direct": [[5, "k", 77, None], [6, "j", 78, 1]]})
    prev = parse_record(raw.encode())
    assert prev.client_id == "old" and prev.direct == [DirectWriter(5, "k", 77, None), DirectWriter(6, "j", 78, 1)]


@pytest.mark.parametrize("raw", [b"garbage\n", b"cxlkv-clientd-state 1\n? 1 2\n", b"cxlkv-clientd-state 1\n+ x\n"])
def test_a_damaged_record_is_refused_with_the_line(raw: bytes) -> None:
    with pytest.raises(ValueError):
        parse_record(raw)


def test_a_failed_append_makes_the_next_change_rewrite_the_record(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    inc = _claimed(tmp_path)
    real_write = os.write

    def full(fd: int, data: bytes) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writers.os, "write", full)
    inc.direct_started([DirectWriter(1, "a", 5, 6)])  # logged, not raised
    monkeypatch.setattr(writers.os, "write", real_write)
    rewrites = inc.rewrites
    inc.direct_started([DirectWriter(2, "b", 5, 6)])
    assert inc.rewrites == rewrites + 1
    assert sorted(w.put_token for w in _read(inc).direct) == [1, 2]


def test_a_process_stopped_before_it_registered_passes_the_record_on_whole(tmp_path: Path) -> None:
    """A process that read the previous one's record and stopped before the master
    answered (it was down) rewrites the record at its clean stop: the client id, the
    epoch and the writers must survive it, or the next process registers afresh and
    the old registration's quarantined space waits for an operator (found: the
    rewrite wrote ``R <pid> 0 `` with no client id, and the next acquire returned None)."""
    inc = _claimed(tmp_path)
    inc.direct_started([DirectWriter(1, "a", 5, 6), DirectWriter(2, "b", 5, 6)])
    # killed: no release; the next process never registers and is stopped cleanly
    second = Incarnation(inc.state_path[: -len(".state")])
    os.close(inc._fd)  # the first process's flock goes with it
    inc._fd = -1
    assert second.acquire() is not None
    second.release()
    third = Incarnation(inc.state_path[: -len(".state")])
    prev = third.acquire()
    assert prev is not None and (prev.client_id, prev.epoch) == ("cid-1", 3)
    assert sorted(w.put_token for w in prev.direct) == [1, 2]
    third.release()


def test_a_full_filesystem_costs_one_rewrite_attempt_a_second_not_one_per_put(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Once an append failed, every change tried a whole rewrite: on a full filesystem
    each direct put's start and end formatted every pending entry and logged a warning
    (found on a 1 MiB tmpfs: 19 ms per start or end with 15k puts pending, on the
    daemon's event loop, and 4,000 warnings for 4,000 changes). Now a failed record is
    retried at most once per REWRITE_RETRY_S, warned once, and written whole again as
    soon as a retry succeeds."""
    inc = _claimed(tmp_path)
    for t in range(1, 201):
        inc.direct_started([DirectWriter(t, f"k{t}", 5, 6)])
    clock = [1000.0]
    monkeypatch.setattr(writers, "_monotonic", lambda: clock[0], raising=False)
    attempts = [0]
    real_rewrite = Incarnation._rewrite

    def counted(self: Incarnation) -> None:
        attempts[0] += 1
        real_rewrite(self)

    monkeypatch.setattr(Incarnation, "_rewrite", counted)
    real_open, real_write = writers.open if hasattr(writers, "open") else open, os.write

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writers.os, "write", full)
    monkeypatch.setattr(writers, "open", full, raising=False)
    caplog.set_level("WARNING", logger="cxlkv.clientd.writers")
    for t in range(1000, 3000):
        inc.direct_started([DirectWriter(t, f"k{t}", 5, 6)])
        inc.direct_ended([t])
    assert attempts[0] <= 2, attempts[0]  # not one per change
    assert len([r for r in caplog.records if r.levelname == "WARNING"]) <= 2
    monkeypatch.setattr(writers.os, "write", real_write)
    monkeypatch.setattr(writers, "open", real_open, raising=False)
    clock[0] += 2.0  # the retry is due: the next change writes the record whole
    inc.direct_started([DirectWriter(5000, "late", 5, 6)])
    assert sorted(w.put_token for w in _read(inc).direct) == [*range(1, 201), 5000]
    inc.direct_ended([5000])
    assert sorted(w.put_token for w in _read(inc).direct) == list(range(1, 201))  # appends again


def test_the_previous_writers_still_running_are_found_with_one_look_per_process(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A new process checks which of its predecessor's direct writers still run before
    it serves (on its event loop, after registering): one /proc read per entry took
    15 s for a record of 1M pending puts (MAX_PENDING) from one writer, past the
    master's client TTL. One look per writer process, whatever its pending puts."""
    from cxlkv.clientd import buffers

    me = os.getpid()
    start = buffers.process_start_time(me)
    looks: list[int] = []
    real = buffers.process_start_time

    def counted(pid: int):
        looks.append(pid)
        return real(pid)

    monkeypatch.setattr(buffers, "process_start_time", counted)
    ws = [DirectWriter(t, f"k{t}", me, start) for t in range(5000)]
    ws += [DirectWriter(9000 + t, f"j{t}", me, (start or 0) + 1) for t in range(10)]  # pid reused
    ws += [DirectWriter(9100, "gone", 0, None)]
    alive = writers.running(ws)
    assert [w.put_token for w in alive] == list(range(5000))
    assert len(looks) <= 1
