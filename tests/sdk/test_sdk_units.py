"""Unit tests of SDK parts that need no daemon: memory conversion and the buffer pool."""

from __future__ import annotations

import os

import numpy as np
import pytest

from cxlkv.client._memory import address_of, dst_array, nbytes_of, src_array
from cxlkv.client._pool import BufferPool
from cxlkv.errors import InvalidArgument


def test_src_array_is_zero_copy_for_contiguous_memory() -> None:
    b = bytearray(b"hello world")
    a = src_array(b)
    assert a.dtype == np.uint8 and a.nbytes == 11
    b[0:1] = b"J"
    assert bytes(a[:1]) == b"J"  # same memory
    f = np.arange(6, dtype=np.float32).reshape(2, 3)
    af = src_array(f)
    assert af.nbytes == 24 and address_of(af) == f.__array_interface__["data"][0]
    assert src_array(memoryview(b)[2:5]).tobytes() == b"llo"
    assert src_array(b"").nbytes == 0


def test_src_array_copies_non_contiguous_and_dst_refuses_it() -> None:
    f = np.arange(12, dtype=np.int64).reshape(3, 4)[:, ::2]
    assert src_array(f).nbytes == f.nbytes
    assert np.array_equal(src_array(f).view(np.int64), f.ravel())
    with pytest.raises(InvalidArgument, match="contiguous"):
        dst_array(f)
    with pytest.raises(InvalidArgument, match="read-only"):
        dst_array(b"immutable")
    with pytest.raises(InvalidArgument, match="expected"):
        src_array(12345)


def test_nbytes_of() -> None:
    assert nbytes_of(b"abc") == 3
    assert nbytes_of(np.zeros(5, dtype=np.float64)) == 40
    assert nbytes_of(memoryview(bytearray(7))) == 7
    with pytest.raises(InvalidArgument):
        nbytes_of(object())


class _FakeDaemon:
    def __init__(self) -> None:
        self.registered: dict[int, tuple[str, int, int]] = {}
        self.next_id = 1

    def register(self, path: str, size: int, pid: int) -> int:
        assert os.path.exists(path) and os.path.getsize(path) == size and pid == os.getpid()
        self.registered[self.next_id] = (path, size, pid)
        self.next_id += 1
        return self.next_id - 1

    def unregister(self, buffer_id: int) -> None:
        del self.registered[buffer_id]


def test_pool_allocates_locates_merges_and_leaves_no_files() -> None:
    d = _FakeDaemon()
    pool = BufferPool(d.register, d.unregister, 1 << 20)
    seg, a = pool.alloc(100)
    _, b = pool.alloc(100 << 10)
    _, c = pool.alloc(10)
    assert a % 64 == 0 and b % 4096 == 0 and c % 64 == 0
    assert len({a, b, c}) == 3
    path = d.registered[seg.buffer_id][0]
    assert not os.path.exists(path)  # unlinked right after registration
    assert pool.locate(seg.base + b, 100 << 10) == (seg.buffer_id, b)
    assert pool.locate(seg.base + seg.size_bytes - 1, 2) is None
    assert pool.locate(12345, 1) is None
    for off in (a, b, c):
        pool.free(seg, off)
    assert seg.free_offsets == [0] and seg.free_lengths == [seg.size_bytes]
    # a request larger than the pool gets its own segment, returned when freed
    big, off = pool.alloc(3 << 20)
    assert big.dedicated and big.size_bytes >= 3 << 20 and len(d.registered) == 2
    pool.free(big, off)
    assert len(d.registered) == 1
    # a full regular segment makes the pool grow by another one
    s1, o1 = pool.alloc(1 << 20)
    s2, o2 = pool.alloc(1)
    assert s1 is seg and s2 is not seg and len(d.registered) == 2
    pool.close()
    assert d.registered == {}


def test_packed_answers_are_checked_before_use() -> None:
    """A packed answer whose arrays disagree (a daemon bug) raises Internal instead of
    being read as data; a consistent one maps each failed position to its error."""
    from cxlkv.client._daemon import _ids, _packed_errors
    from cxlkv.errors import Internal
    from cxlkv.v1 import client_pb2

    ok = client_pb2.PackedPutResponse(codes=[0, 5, 0], versions=[3, 0, 4], error_positions=[1], messages=["gone"])
    assert _packed_errors(ok, 3, "PackedPutFrom") == {1: (5, "gone")}
    bad = [
        client_pb2.PackedPutResponse(codes=[0, 0], versions=[1, 2]),                       # short
        client_pb2.PackedPutResponse(codes=[0, 5, 0], versions=[1, 0, 2]),                # error not listed
        client_pb2.PackedPutResponse(codes=[0, 0, 0], versions=[1, 2, 3], error_positions=[1], messages=["x"]),
        client_pb2.PackedPutResponse(codes=[0, 5, 0], versions=[1, 0, 2], error_positions=[7], messages=["x"]),
        client_pb2.PackedPutResponse(codes=[0, 5, 0], versions=[1, 0, 2], error_positions=[1]),  # no message
    ]
    for resp in bad:
        with pytest.raises(Internal, match="inconsistent answer"):
            _packed_errors(resp, 3, "PackedPutFrom")
    assert _ids([4, 4, 4]) == [4] and _ids([4, 5]) == [4, 5] and _ids([]) == []


def test_argument_types_raise_cxlkv_errors(tmp_path) -> None:
    """Wrong argument types raise InvalidArgument (the one hierarchy), never a bare
    TypeError; an empty socket path means the default."""
    from cxlkv.client import Client
    from cxlkv.client._api import _number

    for bad in ("x", None, [1], float("nan"), float("inf")):
        with pytest.raises(InvalidArgument, match="timeout_s must be a finite number"):
            Client(str(tmp_path / "none.sock"), timeout_s=bad)
    for bad in (0, -1, 1e300):
        with pytest.raises(InvalidArgument, match=r"timeout_s must be > 0.0 and <= 1e\+06"):
            Client(str(tmp_path / "none.sock"), timeout_s=bad)
    for bad in (-0.1, float("nan"), "x", 1e300):
        with pytest.raises(InvalidArgument, match="retry_s must be"):
            Client(str(tmp_path / "none.sock"), retry_s=bad)
    with pytest.raises(InvalidArgument, match=r"buffer_pool_bytes must be >= 1 and <= 70368744177664"):
        Client(str(tmp_path / "none.sock"), buffer_pool_bytes=2**70)
    with pytest.raises(InvalidArgument, match="buffer_pool_bytes must be an integer"):
        Client(str(tmp_path / "none.sock"), buffer_pool_bytes=1.5)
    for bad in (1.5, "3", True, None):
        with pytest.raises(InvalidArgument, match="size_bytes must be an integer"):
            _number("size_bytes", bad, int)
    assert _number("size_bytes", np.int64(7), int) == 7 and _number("t", 2, float) == 2.0
    os.environ["CXLKV_SOCKET"] = str(tmp_path / "env.sock")
    try:
        from cxlkv.errors import Unavailable
        with pytest.raises(Unavailable, match="env.sock"):
            Client("")
    finally:
        del os.environ["CXLKV_SOCKET"]


def test_buffer_status_against_an_older_daemon() -> None:
    """A daemon without BufferStatus answers INVALID_ARGUMENT ("unknown method
    number"; BufferStatus itself never answers that code): the SDK then cannot
    check and keeps its buffers (instead of failing every call). The decision is
    the code's, not the message's: any other code (a subclass of InvalidArgument
    with its own code included), or a wrong number of answers, is raised."""
    from cxlkv.client._daemon import registered as _registered
    from cxlkv.errors import Internal, InvalidKey, LimitExceeded
    from cxlkv.v1 import client_pb2

    class Conn:
        def __init__(self, answer: object) -> None:
            self.answer = answer

        def call(self, method: object, request: object) -> object:
            if isinstance(self.answer, Exception):
                raise self.answer
            return self.answer

    assert _registered(Conn(InvalidArgument("unknown method number 28 (this daemon knows 1..24)")), [5, 6]) \
        == [True, True]
    assert _registered(Conn(InvalidArgument("worded otherwise")), [5]) == [True]
    with pytest.raises(LimitExceeded, match="max_batch_items"):
        _registered(Conn(LimitExceeded("over max_batch_items")), [5])
    with pytest.raises(InvalidKey, match="something else"):
        _registered(Conn(InvalidKey("something else")), [5])
    assert _registered(Conn(client_pb2.BufferStatusResponse(registered=[True, False])), [5, 6]) == [True, False]
    with pytest.raises(Internal, match="1 answers for 2"):
        _registered(Conn(client_pb2.BufferStatusResponse(registered=[True])), [5, 6])


def test_retried_reads_share_one_budget_and_retry_lost_items() -> None:
    """`Client.retry_s`: a read is tried again after DaemonUnreachable or NotReady
    (raised, or in an item's Result); answers and timeouts are not retried; reads
    inside a retried read share its budget; 0 tries once."""
    import threading

    from cxlkv.client._api import Result, _retried
    from cxlkv.client._client import Client
    from cxlkv.errors import DaemonUnreachable, NotFound, NotReady, Unavailable

    class Fake:
        def __init__(self, retry_s: float, outcomes: list) -> None:
            self.retry_s = retry_s
            self._local = threading.local()
            self._closed = False
            self.outcomes = outcomes
            self.calls = 0
            self.checks = 0

        def _recheck_buffers_next_call(self) -> None:
            self.checks += 1

        def _forgotten_buffers(self) -> bool:
            return self.forgot

        _items_lost = Client._items_lost

        forgot = False

        @_retried
        def read(self) -> object:
            self.calls += 1
            out = self.outcomes.pop(0)
            if isinstance(out, BaseException):
                raise out
            return out

        @_retried
        def outer(self) -> object:
            try:
                return self.read()
            except DaemonUnreachable as exc:
                return [Result(False, error=exc)]

    lost = DaemonUnreachable("gone")
    f = Fake(5.0, [lost, NotReady("starting"), [Result(False, error=lost)], [Result(True, value=b"v")]])
    assert f.read()[0].value == b"v" and f.calls == 4
    for answer in (NotFound("no"), Unavailable("master unreachable")):
        f = Fake(5.0, [answer, "unused"])
        with pytest.raises(type(answer)):
            f.read()
        assert f.calls == 1
    f = Fake(0.0, [lost])
    with pytest.raises(DaemonUnreachable):
        f.read()
    # Nested: the inner read does not loop on its own; the outer retries the whole.
    f = Fake(5.0, [lost, [Result(True, value=b"w")]])
    assert f.outer()[0].value == b"w" and f.calls == 2
    # UnknownBuffer: retried (after a buffer check) only once the daemon was lost.
    from cxlkv.errors import UnknownBuffer

    f = Fake(5.0, [lost, UnknownBuffer("forgotten"), [Result(False, error=UnknownBuffer("x"))], b"ok"])
    assert f.read() == b"ok" and f.calls == 4 and f.checks == 3
    f = Fake(5.0, [UnknownBuffer("never registered"), "unused"])
    with pytest.raises(UnknownBuffer):
        f.read()
    assert f.calls == 1 and f.checks == 0
    # Per-item UnknownBuffer with no loss seen: retried only if the daemon forgot the pool's buffers.
    f = Fake(5.0, [[Result(False, error=UnknownBuffer("x"))], [Result(True, value=b"z")]])
    f.forgot = True
    assert f.read()[0].value == b"z" and f.calls == 2
    f = Fake(5.0, [[Result(False, error=UnknownBuffer("x"))], "unused"])
    assert isinstance(f.read()[0].error, UnknownBuffer) and f.calls == 1
    # Out of budget: the per-item errors are returned, a raised one is raised.
    f = Fake(0.05, [[Result(False, error=lost)]] * 50)
    res = f.read()
    assert isinstance(res[0].error, DaemonUnreachable) and f.calls > 1


def test_grpc_channel_reconnects_quickly_to_a_restarted_daemon(tmp_path, monkeypatch) -> None:
    """The SDK's gRPC channel tries the daemon's socket again every 0.1-1 s (not
    gRPC's 1 s growing to 120 s), so a read retried under retry_s finds a
    restarted daemon soon."""
    import socket

    import grpc

    from cxlkv.client import _conn

    seen: dict[str, object] = {}
    real = grpc.insecure_channel

    def spy(target, options=None, **kw):
        seen.update(dict(options or []))
        return real(target, options=options, **kw)

    monkeypatch.setattr(grpc, "insecure_channel", spy)
    path = str(tmp_path / "d.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    try:
        conn = _conn.GrpcConnection(path, 1.0)
        conn.close()
    finally:
        listener.close()
    assert seen["grpc.initial_reconnect_backoff_ms"] == seen["grpc.min_reconnect_backoff_ms"] == 100
    assert seen["grpc.max_reconnect_backoff_ms"] == 1000


def test_direct_path_tells_a_changed_region_from_one_it_cannot_see_yet() -> None:
    """DirectPath.changed: "" for the same regions, a reason for another uuid, a
    segment no longer listed or a withdrawn offer, None while the daemon lists no
    region (not registered yet: ask again later)."""
    from cxlkv.client._direct import FALLBACK, DirectPath
    from cxlkv.v1 import client_pb2

    d = DirectPath(lambda name, req: None, {}, flush=False, identities={1: "u1", 2: "u2"})

    def info(regions: dict[int, str], offered: bool = True) -> client_pb2.DirectInfoResponse:
        r = client_pb2.DirectInfoResponse(offered=offered)
        for sid, uuid in regions.items():
            r.regions.add(segment_id=sid, region_uuid=uuid)
        return r

    assert d.changed(info({1: "u1", 2: "u2", 3: "u3"})) == ""
    assert d.changed(info({})) is None
    assert "now region u9" in d.changed(info({1: "u9", 2: "u2"}))
    assert "no longer lists segment 2" in d.changed(info({1: "u1"}))
    assert "no longer offers" in d.changed(info({1: "u1", 2: "u2"}, offered=False))
    d.disable("test")
    assert d.get(["a", "b"], [None, None]) == [FALLBACK, FALLBACK]
    assert d.put([(0, "a", b"x", None), (3, "b", b"y", None)]) == {0: FALLBACK, 3: FALLBACK}


def test_hit_reports_from_many_threads_lose_and_double_nothing() -> None:
    """Single-key gets note their hits lock-free (cxlkv/client/_index.py): under eight
    threads reading while reports are sent, every hit is reported exactly once, and the
    counts (get_items, bytes_out) add up to what was read."""
    import threading

    from cxlkv.client._index import IndexPath

    sent: list = []
    send_lock = threading.Lock()

    def send(name: str, req) -> None:
        with send_lock:
            sent.append(req)

    ix = IndexPath(reader=None, send=send)
    per_thread, threads = 20_000, 8

    def reader(t: int) -> None:
        for i in range(per_thread):
            if i % 5 == 4:
                ix._note_get(None, 0)  # a miss
            else:
                ix._note_get(f"t{t}/{i}", 100)

    ts = [threading.Thread(target=reader, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    ix.flush_hits()
    keys = [k for r in sent for k in r.keys]
    hits = threads * per_thread * 4 // 5
    assert len(keys) == len(set(keys)) == hits
    assert sum(r.get_items for r in sent) == threads * per_thread
    assert sum(r.bytes_out for r in sent) == hits * 100
