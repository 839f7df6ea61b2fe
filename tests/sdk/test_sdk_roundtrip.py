"""Round trips across hosts: put through clientd A, read through clientd B, byte for byte.

One cluster for the module (master + 2 clientds mapping one 256 MiB region).
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from cxlkv import Client
from cxlkv.errors import (
    AlreadyExists,
    InvalidArgument,
    InvalidKey,
    NotFound,
    OutOfRange,
)

MiB = 1 << 20
CLUSTER_OPTIONS = {"region_size_bytes": 256 * MiB}
SIZES = [0, 1, 4096, MiB, 64 * MiB]


@pytest.fixture(scope="module")
def ab(module_cluster):
    with module_cluster.client(0) as a, module_cluster.client(1) as b:
        yield a, b


def _payload(size: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


@pytest.mark.parametrize("size", SIZES)
def test_bytes_api_round_trip(ab, size: int) -> None:
    a, b = ab
    value = _payload(size, size)
    key = f"rt/bytes/{size}"
    version = a.put(key, value)
    assert version > 0
    got = b.get(key)
    assert len(got) == size and got == value
    a.remove(key)
    with pytest.raises(NotFound):
        b.get(key)


@pytest.mark.parametrize("size", SIZES)
def test_zero_copy_round_trip(ab, size: int) -> None:
    a, b = ab
    src = a.buffer(size)
    np.frombuffer(src, dtype=np.uint8)[:] = np.frombuffer(_payload(size, size + 1), dtype=np.uint8)
    key = f"rt/zc/{size}"
    a.put_from(key, src)
    dst = b.buffer(size + 64)
    n = b.get_into(key, dst)
    assert n == size
    assert bytes(dst[:n]) == bytes(src)
    a.remove(key)


@pytest.mark.parametrize("protocol", ["lean", "grpc"])
def test_both_framings_and_staged_memory(module_cluster, protocol: str) -> None:
    with module_cluster.client(0, protocol=protocol) as a, module_cluster.client(1, protocol=protocol) as b:
        for size in (0, 5, 70_000, 3 * MiB):
            arr = np.arange(size // 4 + 1, dtype=np.uint32)  # numpy value, not in a shared buffer
            key = f"rt/{protocol}/np/{size}"
            a.put_from(key, arr)
            out = np.zeros_like(arr)
            assert b.get_into(key, out) == arr.nbytes
            assert np.array_equal(out, arr)
            assert b.get(key) == arr.tobytes()
            ba = bytearray(arr.nbytes)
            assert b.get_into(key, memoryview(ba)) == arr.nbytes and bytes(ba) == arr.tobytes()
        assert a.exists(f"rt/{protocol}/np/5") and not a.exists(f"rt/{protocol}/np/6")
        assert a.remove_all(regex=f"^rt/{protocol}/np/") == 4


@pytest.mark.parametrize("protocol", ["lean", "grpc"])
def test_both_framings_are_one_connection_interface(module_cluster, protocol: str) -> None:
    """The Client reaches its daemon only through Connection (both framings implement
    it) and the Connector of its framing; a send (no answer awaited on lean frames, a
    call on gRPC) and a pipelined call work the same on both."""
    from cxlkv.client._conn import Connection, GrpcConnector, LeanConnector
    from cxlkv.client.framing import METHODS_BY_NAME
    from cxlkv.v1 import client_pb2

    with module_cluster.client(0, protocol=protocol) as c:
        conn = c._conn()
        assert isinstance(conn, Connection) and not conn.closed
        assert isinstance(c._links, LeanConnector if protocol == "lean" else GrpcConnector)
        stat = METHODS_BY_NAME["Stat"]
        conn.send(stat, client_pb2.ClientStatRequest())
        first, second = conn.call_many([(stat, client_pb2.ClientStatRequest())] * 2)
        alone = conn.call(stat, client_pb2.ClientStatRequest())
        assert first.client_id and first.client_id == second.client_id == alone.client_id
        assert c._links.get(True) == (conn, False)  # the same connection, not fresh


def test_immutable_keys_upsert_and_versions(ab) -> None:
    a, b = ab
    v1 = a.put("rt/imm", b"one")
    with pytest.raises(AlreadyExists):
        b.put("rt/imm", b"two")
    v2 = b.upsert("rt/imm", b"two!")
    assert v2 > v1
    assert a.get("rt/imm") == b"two!"
    a.remove("rt/imm")


@pytest.mark.parametrize("mode", [{}, {"direct": False}], ids=["default", "daemon"])
def test_batch_reads_report_the_version_they_read(module_cluster, mode: dict) -> None:
    """get_many and get_into_many give each hit the version its put returned (small
    and large values; from the region's index by default, through the daemon with
    direct=False); a miss has none."""
    name = "-".join(f"{k}{v}" for k, v in mode.items()) or "default"
    with module_cluster.client(0) as w, module_cluster.client(1, **mode) as r:
        keys = [f"rt/ver/{name}/{i}" for i in range(4)]
        values = [b"s" * 100, b"m" * 70_000, os.urandom(2 << 20), b"u1"]
        versions = [w.put(k, v) for k, v in zip(keys, values)]
        versions[3] = w.upsert(keys[3], b"u2")
        values[3] = b"u2"
        got = r.get_many(keys + [f"rt/ver/{name}/missing"])
        assert [(g.ok, g.value, g.version) for g in got[:4]] == list(zip([True] * 4, values, versions))
        assert not got[4].ok and got[4].version == 0
        dsts = [bytearray(len(v)) for v in values]
        into = r.get_into_many(keys, dsts)
        assert [(g.ok, g.version) for g in into] == [(True, v) for v in versions]
        assert [bytes(d) for d in dsts] == values
        w.remove_many(keys)


def test_key_forms_that_must_work(ab) -> None:
    a, b = ab
    keys = ["a/b/c", "with space", "ключ-ü-😀", "x" * 4096, "é" * 2048, "/", " "]
    for i, k in enumerate(keys):
        a.put(k, f"v{i}".encode())
    for i, k in enumerate(keys):
        assert b.get(k) == f"v{i}".encode()
    listed = {e.key for e in b.list()}
    assert set(keys) <= listed
    assert all(r.ok for r in a.remove_many(keys))


@pytest.mark.parametrize("bad", ["", "x" * 4097, "é" * 2049, "a\x00b"])
def test_invalid_keys_are_refused_everywhere(ab, bad: str) -> None:
    a, _ = ab
    with pytest.raises(InvalidKey):
        a.put(bad, b"v")
    with pytest.raises(InvalidKey):
        a.get(bad)
    with pytest.raises(InvalidKey):
        a.exists(bad)
    with pytest.raises(InvalidKey):
        a.remove(bad)
    (r,) = a.put_many([(bad, b"v")])
    assert not r.ok and isinstance(r.error, InvalidKey)
    assert a.exists_many([bad]) == [False]


def test_batches_answer_per_position_with_duplicates(ab) -> None:
    a, b = ab
    items = [("rt/batch/0", b"zero"), ("rt/batch/1", b"one"), ("rt/batch/0", b"again"), ("", b"bad")]
    res = a.put_many(items)
    assert [r.ok for r in res] == [True, True, False, False]
    assert res[0].version > 0
    assert isinstance(res[3].error, InvalidKey)
    got = b.get_many(["rt/batch/1", "rt/batch/0", "rt/batch/0", "rt/batch/missing", "rt/batch/1"])
    assert [g.value for g in got[:3]] == [b"one", b"zero", b"zero"]
    assert not got[3].ok and isinstance(got[3].error, NotFound)
    assert got[4].ok and got[4].value == b"one"
    assert b.exists_many(["rt/batch/0", "rt/batch/9", "rt/batch/0"]) == [True, False, True]
    rem = a.remove_many(["rt/batch/0", "rt/batch/0", "rt/batch/1"])
    assert [r.ok for r in rem] == [True, False, True]
    assert isinstance(rem[1].error, NotFound)


def test_zero_copy_batches_and_prefix(ab) -> None:
    a, b = ab
    block = 64 << 10
    n = 16
    src = a.buffer(n * block)
    srcs = [src[i * block:(i + 1) * block] for i in range(n)]
    for i, s in enumerate(srcs):
        s[:] = bytes([i]) * block
    keys = [f"rt/prefix/{i}" for i in range(n)]
    # only the first 10 blocks are cached
    res = a.put_from_many(keys[:10], srcs[:10])
    assert all(r.ok for r in res)
    dst = b.buffer(n * block)
    dsts = [dst[i * block:(i + 1) * block] for i in range(n)]
    assert b.get_prefix_into(keys, dsts) == 10
    for i in range(10):
        assert bytes(dsts[i]) == bytes([i]) * block
    # a hole stops the prefix
    a.remove(keys[4])
    assert b.get_prefix_into(keys, dsts) == 4
    # staged destinations (plain bytearrays) work too
    plain = [bytearray(block) for _ in range(3)]
    assert b.get_prefix_into(keys[:3], plain) == 3 and plain[2] == bytes([2]) * block
    got = b.get_into_many(keys[:6], dsts[:6])
    assert [g.ok for g in got] == [True, True, True, True, False, True]
    assert got[0].value == block and isinstance(got[4].error, NotFound)
    # a target too small is OUT_OF_RANGE (nothing copied), a read-only one refused by the SDK
    with pytest.raises(OutOfRange):
        b.get_into(keys[0], bytearray(10))
    with pytest.raises(InvalidArgument):
        b.get_into(keys[0], b"x" * block)
    a.remove_all(regex="^rt/prefix/")


def test_threads_share_one_client(ab) -> None:
    a, b = ab
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            for i in range(50):
                a.put(f"rt/thr/{t}/{i}", f"{t}:{i}".encode())
                assert a.get(f"rt/thr/{t}/{i}") == f"{t}:{i}".encode()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(b.get_many([f"rt/thr/{t}/{i}" for t in range(8) for i in range(50)])) == 400
    assert a.remove_all(regex="^rt/thr/") == 400


def test_stat_reports_daemon_and_space(ab, module_cluster) -> None:
    a, _ = ab
    st = a.stat()
    assert st["name"] == "clientd-0" and st["master_connected"] is True
    assert int(st["capacity_bytes"]) > 0 and st["client_id"]
    assert int(st["buffers_registered"]) >= 1
    module_cluster.assert_invariants()


def test_unavailable_names_the_socket(tmp_path) -> None:
    from cxlkv.errors import Unavailable

    missing = str(tmp_path / "nope.sock")
    with pytest.raises(Unavailable, match="nope.sock"):
        Client(missing)
    with pytest.raises(Unavailable, match="nope.sock"):
        Client(missing, protocol="grpc")
    os.environ["CXLKV_SOCKET"] = missing
    try:
        with pytest.raises(Unavailable, match="nope.sock"):
            Client()
    finally:
        del os.environ["CXLKV_SOCKET"]


def test_lone_surrogate_keys_are_invalid_keys(ab) -> None:
    """A str key no UTF-8 string can carry is refused as InvalidKey, never a UnicodeEncodeError."""
    from cxlkv.errors import InvalidKey

    a, _ = ab
    bad = "surrogate/\udc80"
    for call in (lambda: a.put(bad, b"x"), lambda: a.get(bad), lambda: a.exists(bad),
                 lambda: a.remove(bad), lambda: a.get_many([bad, "fine"])):
        with pytest.raises(InvalidKey, match="UTF-8"):
            call()
    a.put("surrogate/ok", b"still serving")
    assert a.get("surrogate/ok") == b"still serving"


@pytest.mark.parametrize("protocol", ["lean", "grpc"])
def test_bad_argument_types_raise_cxlkv_errors(module_cluster, protocol: str) -> None:
    """Wrong types and out-of-range options raise the cxlkv.errors hierarchy with a
    clear message, never a raw protobuf ValueError/TypeError — and nothing is stored."""
    from cxlkv.errors import CxlkvError, InvalidArgument
    from cxlkv.wire.keys import MAX_REPLICA_NUM

    with module_cluster.client(0, protocol=protocol) as c:
        for key in (123, None, b"bytes-key", 1.5, ["k"]):
            for call in (lambda k: c.put(k, b"x"), c.get, c.exists, c.remove,
                         lambda k: c.put_from(k, b"x"), lambda k: c.get_into(k, bytearray(4))):
                with pytest.raises(InvalidKey, match="key must be a str"):
                    call(key)
        with pytest.raises(InvalidKey, match=r"keys\[1\] must be a str, got int"):
            c.get_many(["ok", 7])
        with pytest.raises(InvalidKey, match=r"keys\[0\] must be a str"):
            c.put_many([(None, b"x")])
        with pytest.raises(InvalidArgument, match="sequence of str"):
            c.exists_many("abc")
        for n in (0, -1, MAX_REPLICA_NUM + 1, 2**40, 1.0, True, "2"):
            with pytest.raises(InvalidArgument, match="replica_num must be"):
                c.put(f"types/{protocol}/r", b"x", replica_num=n)
            with pytest.raises(InvalidArgument, match="replica_num must be"):
                c.put_many([(f"types/{protocol}/r", b"x")], replica_num=n)
        assert not c.exists(f"types/{protocol}/r")
        assert c.put(f"types/{protocol}/ok", b"x", replica_num=MAX_REPLICA_NUM) > 0  # the max is allowed
        try:
            c.put(123, b"x")
        except CxlkvError as exc:
            assert "\n" not in str(exc)


def test_clientd_refuses_replica_num_over_the_max(module_cluster) -> None:
    """The daemon applies the SDK's rules itself (raw messages, both sockets)."""
    import grpc

    from cxlkv.errors import ErrorCode, from_rpc_error
    from cxlkv.wire.keys import MAX_REPLICA_NUM
    from cxlkv.v1 import client_pb2, client_pb2_grpc, common_pb2

    opts = common_pb2.PutOptions(replica_num=MAX_REPLICA_NUM + 1)
    with grpc.insecure_channel(f"unix:{module_cluster.socket_path(0)}") as ch:
        stub = client_pb2_grpc.ClientServiceStub(ch)
        with pytest.raises(grpc.RpcError) as info:
            stub.Put(client_pb2.PutRequest(key="types/raw", value=b"x", options=opts), timeout=10)
        err = from_rpc_error(info.value)
        assert err.code == ErrorCode.INVALID_ARGUMENT and f"1..{MAX_REPLICA_NUM}" in err.message
        resp = stub.BatchPut(client_pb2.BatchPutRequest(items=[
            client_pb2.PutRequest(key="types/raw1", value=b"x", options=opts),
            client_pb2.PutRequest(key="types/raw2", value=b"x"),
        ]), timeout=10)
        assert [r.status.code for r in resp.results] == [ErrorCode.INVALID_ARGUMENT, 0]
        # 0 on the wire is the protobuf default: one replica
        stub.Put(client_pb2.PutRequest(key="types/raw0", value=b"x", options=common_pb2.PutOptions(replica_num=0)),
                 timeout=10)


_FORK_SCRIPT = r"""
import os, sys
from cxlkv import Client
from cxlkv.errors import InvalidArgument
sock = sys.argv[1]
with Client(socket_path=sock) as c:
    c.put("fork/k", b"v" * 5000, upsert=True)
    assert c.get("fork/k") == b"v" * 5000  # reads from the index in this process
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = b"?"
        try:
            try:
                c.get("fork/k")
                code = b"R"  # read through the parent's Client: wrong
            except InvalidArgument as exc:
                code = b"I" if "parent process" in str(exc) else b"M"
            with Client(socket_path=sock) as fresh:
                code += b"F" if fresh.get("fork/k") == b"v" * 5000 else b"W"
        except BaseException:
            code += b"E"
        finally:
            os.write(w, code)
            os._exit(0)
    os.close(w)
    got = os.read(r, 8)
    os.waitpid(pid, 0)
    assert c.get("fork/k") == b"v" * 5000
    print(got.decode())
"""


def test_a_client_used_after_fork_says_so_and_the_parents_keeps_working(module_cluster) -> None:
    """The fork check of the index read path (a pid kept by ``os.register_at_fork``, not a
    ``getpid()`` per read): in the child a get from the parent's Client is refused in one
    line (never a read through the parent's connections); a new Client in the child works.
    Forked from a process of its own: this one runs gRPC threads (the harness's channel),
    which a fork must not copy."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", _FORK_SCRIPT, module_cluster.socket_path(0)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "IF", (p.stdout, p.stderr)
