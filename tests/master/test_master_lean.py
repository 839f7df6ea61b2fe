"""The master's lean-framing MasterService: same handlers and errors as gRPC, fewer µs."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from pathlib import Path

import pytest

from cxlkv.errors import ErrorCode, InvalidArgument, UnknownClient
from cxlkv.wire.lean import LeanChannel, service_methods
from cxlkv.v1 import common_pb2, master_pb2
from master_harness import MasterProcess, Writer, assert_invariant, rss_bytes

METHODS = service_methods(master_pb2.DESCRIPTOR.services_by_name["MasterService"])


def _recv_exactly(s: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        assert chunk, "connection closed early"
        data += chunk
    return data


def _lean_port(mp: MasterProcess) -> int:
    resp = mp.stub.RegisterClient(master_pb2.RegisterClientRequest(hostname="h", name="probe"))
    assert resp.lean_port > 0
    return resp.lean_port


def test_lean_calls_match_grpc_semantics(tmp_path: Path) -> None:
    with MasterProcess(tmp_path) as mp:
        port = _lean_port(mp)

        async def scenario() -> None:
            ch = LeanChannel("127.0.0.1", port, METHODS)
            reg = await ch.call("RegisterClient", master_pb2.RegisterClientRequest(hostname="h", name="w"))
            cid, epoch = reg.client_id, reg.epoch
            started = await ch.call("PutStart", master_pb2.PutStartRequest(
                client_id=cid, epoch=epoch, keys=["a", "b", "a"], value_size_bytes=[4096] * 3), timeout=10)
            codes = list(started.codes)
            assert codes[:2] == [0, 0] and codes[2] == ErrorCode.NOT_READY  # duplicate answered per position
            ended = await ch.call("PutEnd", master_pb2.PutEndRequest(
                client_id=cid, epoch=epoch, keys=["a", "b"], put_tokens=list(started.put_tokens)[:2]), timeout=10)
            assert list(ended.codes) == [0, 0]
            again = await ch.call("PutStart", master_pb2.PutStartRequest(
                client_id=cid, epoch=epoch, keys=["a"], value_size_bytes=[1]))
            assert list(again.codes) == [ErrorCode.ALREADY_EXISTS]
            stale = await ch.call("PutEnd", master_pb2.PutEndRequest(
                client_id=cid, epoch=epoch, keys=["b"], put_tokens=[1]))
            assert list(stale.codes) == [ErrorCode.STALE_TOKEN]
            # a call refused as a whole arrives as a typed exception (ErrorDetail frame)
            with pytest.raises(InvalidArgument, match="put_tokens"):
                await ch.call("PutEnd", master_pb2.PutEndRequest(
                    client_id=cid, epoch=epoch, keys=["a", "b"], put_tokens=[1]))
            with pytest.raises(UnknownClient):
                await ch.call("Heartbeat", master_pb2.HeartbeatRequest(client_id="nobody", epoch=1))
            # pipelined: many calls in flight on one connection
            many = await asyncio.gather(*(ch.call("ExistKey", master_pb2.ExistKeyRequest(keys=[k]))
                                          for k in ("a", "b", "zz") * 50))
            assert [m.exists[0] for m in many[:3]] == [True, True, False]
            ch.close()

        asyncio.run(scenario())
        st = assert_invariant(mp.stub)
        assert st.key_count == 2


def test_lean_port_survives_garbage(tmp_path: Path) -> None:
    with MasterProcess(tmp_path) as mp:
        port = _lean_port(mp)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(struct.pack("<IHHQ", 12 + 3, 999, 0, 7) + b"xyz")  # unknown method
            head = s.recv(16)
            length, code, _f, rid = struct.unpack("<IHHQ", head)
            assert rid == 7 and code == int(InvalidArgument.code)
            s.recv(length - 12)
            s.sendall(struct.pack("<IHHQ", 1 << 31, 1, 0, 8))  # absurd length: answered, then closed
            data = s.recv(16)
            length, code, _f, rid = struct.unpack("<IHHQ", data)
            assert rid == 8 and code == int(ErrorCode.TOO_LARGE)  # over max_request_bytes: its own error
            detail = common_pb2.ErrorDetail.FromString(_recv_exactly(s, length - 12))
            assert "max_request_bytes" in detail.message and detail.requested_bytes == 1 << 31
        # still serving, over both framings
        assert list(mp.stub.ExistKey(master_pb2.ExistKeyRequest(keys=["x"])).exists) == [False]
        assert _lean_port(mp) == port


def test_lean_can_be_turned_off(tmp_path: Path) -> None:
    with MasterProcess(tmp_path, {"lean_listen_address": "off"}) as mp:
        resp = mp.stub.RegisterClient(master_pb2.RegisterClientRequest(hostname="h", name="p"))
        assert resp.lean_port == 0


def test_clientd_falls_back_to_grpc_when_the_lean_port_is_unreachable(make_cluster) -> None:
    """The master's lean port bound where clients cannot reach it (127.0.0.2, while
    they dial 127.0.0.1): every call still works, over gRPC, and the clientd says so once."""
    cl = make_cluster(clientds=1, master_options={"lean_listen_address": "127.0.0.2:0", "lean_socket_path": ""})
    with cl.client(0) as c:
        for i in range(20):
            c.put(f"fallback/{i}", b"v%d" % i)
        assert [r.value for r in c.get_many([f"fallback/{i}" for i in range(20)])] == [b"v%d" % i for i in range(20)]
    log = cl.clientds[0].log_path.read_text()
    assert log.count("using gRPC for every master call") == 1
    cl.assert_invariants()


def test_lean_call_times_out_against_a_silent_server() -> None:
    """A server that accepts but never answers: the call fails with Unavailable after
    its timeout, forgets the request, and a late answer for it is dropped."""
    from cxlkv.errors import Unavailable

    async def scenario() -> None:
        accepted: list[asyncio.StreamWriter] = []

        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.append(writer)
            await reader.read(1 << 16)  # swallow the request, answer nothing

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        ch = LeanChannel("127.0.0.1", port, METHODS)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(Unavailable, match=r"ExistKey to 127\.0\.0\.1:\d+: no answer within 0\.2 s"):
            await ch.call("ExistKey", master_pb2.ExistKeyRequest(keys=["k"]), timeout=0.2)
        assert 0.15 < loop.time() - t0 < 2.0
        assert ch._pending == {}
        # A late answer to the expired request id 1 is ignored (no exception, no leak).
        payload = master_pb2.ExistKeyResponse(exists=[True]).SerializeToString()
        accepted[0].write(struct.pack("<IHHQ", 12 + len(payload), 0, 0, 1) + payload)
        await accepted[0].drain()
        await asyncio.sleep(0.05)
        ch.close()
        server.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("event_loop", ["asyncio", "uvloop"])
def test_inline_routes_answer_in_order_in_one_read(event_loop: str) -> None:
    """Inline routes (plain functions, the master's handlers) are answered while
    their frames are parsed: the answers of frames that arrived together, errors
    and a handler's bug (INTERNAL) included, come back in frame order before the
    answer of a task-run route sent in the same read, and the server goes on."""
    from cxlkv.errors import Internal, NotFound
    from cxlkv.wire.lean import LeanFrameServer, LeanRoute
    from cxlkv.runtime.loops import run

    def exist(req: master_pb2.ExistKeyRequest) -> master_pb2.ExistKeyResponse:
        if req.keys[0] == "missing":
            raise NotFound("no such key", key=req.keys[0])
        if req.keys[0] == "bug":
            raise ValueError("a handler bug")
        return master_pb2.ExistKeyResponse(exists=[True])

    async def slow_exist(req: master_pb2.ExistKeyRequest) -> master_pb2.ExistKeyResponse:
        await asyncio.sleep(0)
        return master_pb2.ExistKeyResponse(exists=[req.keys[0] == "slow"])

    parse = master_pb2.ExistKeyRequest.FromString
    routes = {1: LeanRoute("Exist", parse, exist, inline=True), 2: LeanRoute("SlowExist", parse, slow_exist)}

    def frame(method: int, rid: int, key: str) -> bytes:
        body = master_pb2.ExistKeyRequest(keys=[key]).SerializeToString()
        return struct.pack("<IHHQ", 12 + len(body), method, 0, rid) + body

    async def scenario() -> None:
        server = LeanFrameServer(routes)
        port = await server.start_tcp("127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(frame(2, 1, "slow") + frame(1, 2, "k") + frame(1, 3, "missing") + frame(1, 4, "bug")
                     + frame(1, 5, "k2"))
        answers = []
        for _ in range(5):
            length, code, _f, rid = struct.unpack("<IHHQ", await reader.readexactly(16))
            answers.append((rid, code, await reader.readexactly(length - 12)))
        assert [(rid, code) for rid, code, _ in answers] == [
            (2, 0), (3, int(NotFound.code)), (4, int(Internal.code)), (5, 0), (1, 0)]
        assert list(master_pb2.ExistKeyResponse.FromString(answers[0][2]).exists) == [True]
        assert list(master_pb2.ExistKeyResponse.FromString(answers[4][2]).exists) == [True]
        # still serving on the same connection
        writer.write(frame(1, 6, "k"))
        assert struct.unpack("<IHHQ", await reader.readexactly(16))[3] == 6
        writer.close()
        await server.stop(1.0)

    run(scenario(), event_loop)


def test_a_lean_caller_that_never_reads_cannot_fill_the_masters_memory_or_hold_up_others(tmp_path: Path) -> None:
    """3,000 pipelined ListKeys of ~400 KB pages from a caller that never reads
    (1.2 GB of answers if all were served): the master stops dispatching its frames
    once its answers fill the socket, keeps answering other callers promptly, goes
    on with the held frames in order once the caller reads, drops them when it
    hangs up, and stops cleanly."""
    with MasterProcess(tmp_path) as mp:
        port = _lean_port(mp)
        w = Writer(mp.stub)
        for start in range(0, 2000, 500):
            w.batch_put([f"{'k' * 200}{i}" for i in range(start, start + 500)], 64)
        pid = mp.process.pid
        before = rss_bytes(pid)
        list_keys = next(m.number for m in METHODS if m.name == "ListKeys")
        body = master_pb2.ListKeysRequest(page_size=2000).SerializeToString()
        hog = socket.create_connection(("127.0.0.1", port), timeout=30)
        try:
            hog.sendall(b"".join(struct.pack("<IHHQ", 12 + len(body), list_keys, 0, rid) + body
                                 for rid in range(3000)))
            time.sleep(1.5)

            async def probes() -> list[float]:
                ch = LeanChannel("127.0.0.1", port, METHODS)
                took = []
                for _ in range(5):
                    t0 = time.monotonic()
                    got = await ch.call("ExistKey", master_pb2.ExistKeyRequest(keys=[f"{'k' * 200}7"]), timeout=10)
                    assert list(got.exists) == [True]
                    took.append(time.monotonic() - t0)
                ch.close()
                return took

            assert max(asyncio.run(probes())) < 1.0
            grown = rss_bytes(pid) - before
            assert grown < 200 << 20, f"the master grew by {grown >> 20} MiB for a caller that does not read"
            for rid in range(40):  # reading: the held frames go on, in order
                length, code, _f, got = struct.unpack("<IHHQ", _recv_exactly(hog, 16))
                page = master_pb2.ListKeysResponse.FromString(_recv_exactly(hog, length - 12))
                assert (code, got, len(page.entries)) == (0, rid, 2000)
        finally:
            hog.close()  # the ~2,960 frames left are dropped, not served
        time.sleep(0.5)
        assert len(mp.stub.ListKeys(master_pb2.ListKeysRequest(page_size=10), timeout=5).entries) == 10
    assert "Traceback" not in mp.log()


@pytest.mark.parametrize("event_loop", ["asyncio", "uvloop"])
def test_one_connections_pipeline_waits_its_turn(event_loop: str) -> None:
    """2,000 pipelined calls of 1 ms each on one connection (2 s of work): a call
    on another connection is answered within a few turns (TURN_BUDGET_S each), not
    after the pipeline; the pipeline's answers all come, in order."""
    from cxlkv.runtime.loops import run
    from cxlkv.wire.lean import TURN_BUDGET_S, LeanFrameServer, LeanRoute

    def busy(req: master_pb2.ExistKeyRequest) -> master_pb2.ExistKeyResponse:
        end = time.perf_counter() + 0.001
        while time.perf_counter() < end:
            pass
        return master_pb2.ExistKeyResponse(exists=[True])

    routes = {1: LeanRoute("Busy", master_pb2.ExistKeyRequest.FromString, busy, inline=True)}
    body = master_pb2.ExistKeyRequest(keys=["k"]).SerializeToString()

    def frame(rid: int) -> bytes:
        return struct.pack("<IHHQ", 12 + len(body), 1, 0, rid) + body

    async def scenario() -> None:
        server = LeanFrameServer(routes)
        port = await server.start_tcp("127.0.0.1", 0)
        hog_r, hog_w = await asyncio.open_connection("127.0.0.1", port)
        other_r, other_w = await asyncio.open_connection("127.0.0.1", port)
        hog_w.write(b"".join(frame(rid) for rid in range(2000)))
        await hog_w.drain()
        await asyncio.sleep(0.05)  # the pipeline is being served
        t0 = time.perf_counter()
        other_w.write(frame(7))
        assert struct.unpack("<IHHQ", await other_r.readexactly(16))[3] == 7
        waited = time.perf_counter() - t0
        assert waited < 40 * TURN_BUDGET_S, f"another connection waited {waited:.3f} s"
        for rid in range(2000):
            length, code, _f, got = struct.unpack("<IHHQ", await hog_r.readexactly(16))
            await hog_r.readexactly(length - 12)
            assert (code, got) == (0, rid)
        hog_w.close()
        other_w.close()
        await server.stop(1.0)

    run(scenario(), event_loop)


def test_event_loop_setting() -> None:
    """``event_loop``: uvloop by default, asyncio on request, a clear error for
    anything else or for uvloop when it cannot be imported."""
    import sys

    from cxlkv.config import ClientdConfig, MasterConfig
    from cxlkv.errors import ConfigError
    from cxlkv.runtime.loops import loop_factory, run

    assert MasterConfig().event_loop == ClientdConfig().event_loop == "uvloop"
    with pytest.raises(ConfigError, match="event_loop: must be uvloop or asyncio"):
        MasterConfig(event_loop="tokio").validate()
    with pytest.raises(ConfigError, match="event_loop"):
        loop_factory("tokio")
    assert loop_factory("asyncio") is None

    async def kind() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert run(kind(), "uvloop").startswith("uvloop")
    assert run(kind(), "asyncio").startswith("asyncio")
    saved = sys.modules.get("uvloop")
    sys.modules["uvloop"] = None  # type: ignore[assignment]  # import fails as if not installed
    try:
        with pytest.raises(ConfigError, match=r'set event_loop = "asyncio"'):
            run(kind(), "uvloop")
    finally:
        if saved is None:
            del sys.modules["uvloop"]
        else:
            sys.modules["uvloop"] = saved


def test_master_and_clientd_serve_on_the_standard_loop(make_cluster) -> None:
    """``event_loop = "asyncio"`` (the fallback where uvloop is missing) serves the same API."""
    cl = make_cluster(clientds=1, master_options={"event_loop": "asyncio"},
                      clientd_options={"event_loop": "asyncio"})
    with cl.client(0) as c:
        c.put("std/a", b"x" * 5000)
        assert c.get("std/a") == b"x" * 5000
        assert c.exists_many(["std/a", "std/b"]) == [True, False]
    cl.assert_invariants()


def test_local_clientds_use_the_masters_unix_socket_and_a_stale_one_is_replaced(make_cluster) -> None:
    """A master with lean_socket_path (cxlkv cluster sets it) serves lean frames there
    too; the clientd of its host (a loopback master address) uses it. A socket file
    left by a master killed with SIGKILL is replaced by the next one."""
    import signal
    import time

    from cxlkv.errors import CxlkvError

    cl = make_cluster(clientds=1)
    path = cl.run_dir / "master.lean"
    with cl.client(0) as c:
        c.put("unix/1", b"one")
        assert c.get("unix/1") == b"one"
    assert f"lean link to the master on {path}" in cl.clientds[0].log_path.read_text()
    cl.master.signal(signal.SIGKILL)
    cl.master.proc.wait(10)
    assert path.exists()  # left behind
    cl.start_master_again()
    deadline = time.monotonic() + 30
    with cl.client(0) as c:
        while True:
            try:
                c.put("unix/2", b"two")
                break
            except CxlkvError:
                assert time.monotonic() < deadline, "no put after the master came back"
                time.sleep(0.2)
        assert c.get("unix/2") == b"two"
    assert "another process serves it" not in cl.master.log_path.read_text()
