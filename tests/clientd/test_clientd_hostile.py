"""Hostile input, through raw gRPC and raw lean frames (where the SDK would refuse first).

Every case gets a clear error from the ErrorCode enum, the daemon stays up, and
afterwards the master's accounting is exact (its own check, Stat, ListKeys).
"""

from __future__ import annotations

import mmap
import os
import socket
import struct
import time

import grpc
import pytest

from cxlkv.client import framing
from cxlkv.errors import ErrorCode, from_rpc_error
from cxlkv.v1 import client_pb2, client_pb2_grpc, common_pb2
from master_harness import rss_bytes

MiB = 1 << 20
CODE = ErrorCode


# ------------------------------------------------------------------ helpers
class Raw:
    """A raw lean connection: send any bytes, read frames."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(path)
        self.rid = 0

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def frame(self, method: int, payload: bytes, rid: int | None = None) -> int:
        if rid is None:
            self.rid += 1
            rid = self.rid
        self.send(framing.encode_request(method, rid, payload))
        return rid

    def read(self) -> tuple[int, int, bytes]:
        head = self._exact(framing.HEADER_BYTES)
        length, code, _flags, rid = framing.HEADER.unpack(head)
        return code, rid, self._exact(length - framing.MIN_LENGTH)

    def _exact(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("closed")
            out += chunk
        return bytes(out)

    def call(self, name: str, request) -> tuple[int, object]:
        m = framing.METHODS_BY_NAME[name]
        rid = self.frame(m.number, request.SerializeToString())
        code, got, body = self.read()
        assert got == rid
        if code:
            return code, common_pb2.ErrorDetail.FromString(body)
        return 0, m.response_type.FromString(body)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture()
def raw(module_cluster):
    r = Raw(module_cluster.lean_socket_path(0))
    yield r
    r.close()


@pytest.fixture(scope="module")
def stub(module_cluster):
    ch = grpc.insecure_channel(f"unix:{module_cluster.socket_path(0)}")
    yield client_pb2_grpc.ClientServiceStub(ch)
    ch.close()


def grpc_code(fn, *args) -> int:
    try:
        fn(*args, timeout=10)
    except grpc.RpcError as exc:
        return int(from_rpc_error(exc).code)
    return 0


def shm_buffer(size: int) -> tuple[str, mmap.mmap]:
    path = f"/dev/shm/cxlkv-buf-{os.getpid()}-{os.urandom(6).hex()}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.ftruncate(fd, size)
    mm = mmap.mmap(fd, size)
    os.close(fd)
    return path, mm


@pytest.fixture()
def registered(raw):
    path, mm = shm_buffer(1 * MiB)
    try:
        code, resp = raw.call("RegisterBuffer", client_pb2.RegisterBufferRequest(
            path=path, size_bytes=1 * MiB, pid=os.getpid()))
        assert code == 0, resp
    finally:
        os.unlink(path)
    yield resp.buffer_id, mm
    raw.call("UnregisterBuffer", client_pb2.UnregisterBufferRequest(buffer_id=resp.buffer_id))
    mm.close()


@pytest.fixture(autouse=True)
def daemon_survives(module_cluster):
    yield
    for p in module_cluster.clientds:
        assert p.alive(), f"{p.name} died"
    with module_cluster.client(0) as c:
        c.put(f"alive/{time.monotonic_ns()}", b"ok")
    module_cluster.assert_invariants()


def BR(buffer_id: int, offset: int, length: int) -> client_pb2.BufferRange:
    return client_pb2.BufferRange(buffer_id=buffer_id, offset_bytes=offset, length_bytes=length)


# -------------------------------------------------------------------- buffers
def test_unknown_buffer_ids(raw) -> None:
    for bid in (0, 1, 2**63 + 5, 2**64 - 1):
        code, err = raw.call("PutFrom", client_pb2.PutFromRequest(key="h/unk", source=BR(bid, 0, 10)))
        assert code == CODE.UNKNOWN_BUFFER and "unknown buffer" in err.message
        code, _ = raw.call("GetInto", client_pb2.GetIntoRequest(key="h/unk", target=BR(bid, 0, 10)))
        assert code == CODE.UNKNOWN_BUFFER
        code, _ = raw.call("UnregisterBuffer", client_pb2.UnregisterBufferRequest(buffer_id=bid))
        assert code == CODE.UNKNOWN_BUFFER
    code, resp = raw.call("BatchPutFrom", client_pb2.BatchPutFromRequest(items=[
        client_pb2.PutFromRequest(key="h/unk1", source=BR(7, 0, 1)),
        client_pb2.PutFromRequest(key="h/unk2", source=BR(8, 0, 1)),
    ]))
    assert code == 0 and [r.status.code for r in resp.results] == [CODE.UNKNOWN_BUFFER] * 2
    code, err = raw.call("GetPrefixInto", client_pb2.GetPrefixIntoRequest(items=[
        client_pb2.GetIntoRequest(key="h/unk1", target=BR(7, 0, 1))]))
    assert code == CODE.UNKNOWN_BUFFER


#: What the "other process" scripts below share: one lean call on a connection of
#: their own (the daemon knows the caller from the socket).
_FOREIGN_CALL = r"""
import socket, sys
from cxlkv.client import framing
from cxlkv.v1 import client_pb2
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
def call(rid, name, req):
    s.sendall(framing.encode_request(framing.METHODS_BY_NAME[name].number, rid, req.SerializeToString()))
    head = b""
    while len(head) < framing.HEADER_BYTES:
        head += s.recv(framing.HEADER_BYTES - len(head))
    length, code, _f, _rid = framing.HEADER.unpack(head)
    body = b""
    while len(body) < length - framing.MIN_LENGTH:
        body += s.recv(length - framing.MIN_LENGTH - len(body))
    return code, body
"""

_FOREIGN_RELEASE = _FOREIGN_CALL + r"""
lease = int(sys.argv[2])
for rid, (name, req) in enumerate([
        ("DirectRelease", client_pb2.DirectReleaseRequest(lease_ids=[lease])),
        ("DirectGet", client_pb2.DirectGetRequest(keys=[], release_lease_ids=[lease]))], 1):
    code, _body = call(rid, name, req)
    print(name, code)
"""


def test_a_caller_cannot_end_another_callers_direct_lease(raw, stub, module_cluster) -> None:
    """A direct reader's lease protects its copy: another process (lean, known from
    the socket) or a gRPC caller naming its lease id in DirectRelease or in
    DirectGet's release_lease_ids does not end it — a Remove without force is
    still refused HAS_LEASE. The reader's own release ends it."""
    import subprocess
    import sys

    key = f"h/lease/{time.monotonic_ns()}"
    assert grpc_code(stub.Put, client_pb2.PutRequest(key=key, value=b"v" * 1000)) == 0
    code, resp = raw.call("DirectGet", client_pb2.DirectGetRequest(keys=[key]))
    assert code == 0 and resp.results[0].status.code == 0, resp
    lease = resp.results[0].lease_id
    assert lease
    other = subprocess.run([sys.executable, "-c", _FOREIGN_RELEASE, module_cluster.lean_socket_path(0), str(lease)],
                           capture_output=True, text=True, timeout=60)
    assert other.returncode == 0 and other.stdout.split() == ["DirectRelease", "0", "DirectGet", "0"], other
    assert grpc_code(stub.DirectRelease, client_pb2.DirectReleaseRequest(lease_ids=[lease, lease + 1])) == 0
    assert grpc_code(stub.DirectGet, client_pb2.DirectGetRequest(release_lease_ids=[lease])) == 0
    assert grpc_code(stub.Remove, client_pb2.ClientRemoveRequest(key=key)) == CODE.HAS_LEASE
    # the holder's own release (over another connection of its process) ends it
    other_conn = Raw(module_cluster.lean_socket_path(0))
    try:
        assert other_conn.call("DirectRelease", client_pb2.DirectReleaseRequest(lease_ids=[lease]))[0] == 0
    finally:
        other_conn.close()
    assert grpc_code(stub.Remove, client_pb2.ClientRemoveRequest(key=key)) == 0


_FOREIGN_PUT_END = _FOREIGN_CALL + r"""
req = client_pb2.DirectPutEndRequest(items=[client_pb2.DirectPutEndItem(key=sys.argv[2], put_token=int(sys.argv[3]),
                                                                         revoke=True)])
code, body = call(1, "DirectPutEnd", req)
print(code, client_pb2.DirectPutEndResponse.FromString(body).results[0].code if not code else -1)
"""


def test_a_caller_cannot_end_another_callers_direct_put(raw, module_cluster) -> None:
    """DirectPutEnd (commit or revoke) of a direct put another process started on the
    lean socket answers STALE_TOKEN and leaves the put to its writer, which then
    ends it itself."""
    import subprocess
    import sys

    key = f"h/dput/{time.monotonic_ns()}"
    code, resp = raw.call("DirectPutStart", client_pb2.DirectPutStartRequest(
        items=[client_pb2.DirectPutStartItem(key=key, value_size_bytes=100)], pid=os.getpid()))
    assert code == 0, resp
    r = resp.results[0]
    assert r.status.code == 0 and not r.fallback and r.put_token, r
    other = subprocess.run([sys.executable, "-c", _FOREIGN_PUT_END, module_cluster.lean_socket_path(0), key,
                            str(r.put_token)], capture_output=True, text=True, timeout=60)
    assert other.returncode == 0 and other.stdout.split() == ["0", str(int(CODE.STALE_TOKEN))], other
    # still the writer's: its own revoke ends it (a foreign revoke would have made this STALE_TOKEN)
    code, end = raw.call("DirectPutEnd", client_pb2.DirectPutEndRequest(
        items=[client_pb2.DirectPutEndItem(key=key, put_token=r.put_token, revoke=True)]))
    assert code == 0 and end.results[0].code == 0, end


def test_buffer_used_after_unregister(raw) -> None:
    path, mm = shm_buffer(4096)
    try:
        _, resp = raw.call("RegisterBuffer", client_pb2.RegisterBufferRequest(path=path, size_bytes=4096, pid=os.getpid()))
    finally:
        os.unlink(path)
    bid = resp.buffer_id
    assert raw.call("UnregisterBuffer", client_pb2.UnregisterBufferRequest(buffer_id=bid))[0] == 0
    code, _ = raw.call("PutFrom", client_pb2.PutFromRequest(key="h/after", source=BR(bid, 0, 16)))
    assert code == CODE.UNKNOWN_BUFFER
    code, _ = raw.call("GetInto", client_pb2.GetIntoRequest(key="h/after", target=BR(bid, 0, 16)))
    assert code == CODE.UNKNOWN_BUFFER
    mm.close()


def test_ranges_beyond_a_buffer_and_huge_or_negative_sizes(raw, registered) -> None:
    bid, mm = registered
    bad = [(MiB, 1), (MiB - 10, 11), (0, MiB + 1), (2**64 - 1, 1), (1, 2**64 - 1)]
    for off, ln in bad:
        code, err = raw.call("PutFrom", client_pb2.PutFromRequest(key="h/range", source=BR(bid, off, ln)))
        assert code == CODE.OUT_OF_RANGE, (off, ln, err)
        code, _ = raw.call("GetInto", client_pb2.GetIntoRequest(key="h/range", target=BR(bid, off, ln)))
        assert code == CODE.OUT_OF_RANGE
    # "negative" numbers (int64 varints) decode as huge uint64 values
    req = client_pb2.PutFromRequest(key="h/neg")
    req.source.buffer_id = bid
    req.source.offset_bytes = (-4096) & (2**64 - 1)
    req.source.length_bytes = 16
    assert raw.call("PutFrom", req)[0] == CODE.OUT_OF_RANGE
    # a get into a range smaller than the value: OUT_OF_RANGE, requested_bytes = value size
    mm[:100] = b"v" * 100
    assert raw.call("PutFrom", client_pb2.PutFromRequest(key="h/small", source=BR(bid, 0, 100)))[0] == 0
    code, err = raw.call("GetInto", client_pb2.GetIntoRequest(key="h/small", target=BR(bid, 0, 50)))
    assert code == CODE.OUT_OF_RANGE and err.requested_bytes == 100
    # batches: a bad range fails only its own item
    code, resp = raw.call("BatchGetInto", client_pb2.BatchGetIntoRequest(items=[
        client_pb2.GetIntoRequest(key="h/small", target=BR(bid, 200, 100)),
        client_pb2.GetIntoRequest(key="h/small", target=BR(bid, MiB, 100)),
    ]))
    assert [r.status.code for r in resp.results] == [0, CODE.OUT_OF_RANGE]
    assert bytes(mm[200:300]) == b"v" * 100
    raw.call("Remove", client_pb2.ClientRemoveRequest(key="h/small"))


def test_packed_batch_calls_refuse_ragged_arrays_and_answer_bad_items_per_position(raw, registered) -> None:
    """The packed forms (PackedPutFrom, PackedGetInto, PackedGetPrefixInto): arrays
    that disagree in length refuse the whole call; an unknown buffer, a range past
    a buffer or a bad key fails only its own item (the prefix call whole, as
    GetPrefixInto); good items answer as the message forms do."""
    bid, mm = registered
    P = client_pb2
    ragged = [
        P.PackedPutFromRequest(keys=["h/p1", "h/p2"], buffer_ids=[bid], offsets_bytes=[0], lengths_bytes=[1, 1]),
        P.PackedPutFromRequest(keys=["h/p1"], buffer_ids=[bid, bid], offsets_bytes=[0], lengths_bytes=[1]),
        P.PackedPutFromRequest(keys=["h/p1"], buffer_ids=[], offsets_bytes=[0], lengths_bytes=[1]),
    ]
    for req in ragged:
        code, err = raw.call("PackedPutFrom", req)
        assert code == CODE.INVALID_ARGUMENT and "one per key" in err.message, err
        rr = P.PackedRangesRequest(keys=req.keys, buffer_ids=req.buffer_ids, offsets_bytes=req.offsets_bytes,
                                   lengths_bytes=req.lengths_bytes)
        for m in ("PackedGetInto", "PackedGetPrefixInto"):
            assert raw.call(m, rr)[0] == CODE.INVALID_ARGUMENT
    mm[:300] = bytes(range(100)) * 3
    keys = ["h/pk-a", "h/pk-b", "h/pk-c", "", "h/pk-d"]
    code, resp = raw.call("PackedPutFrom", P.PackedPutFromRequest(
        keys=keys, buffer_ids=[bid, bid, bid + 1000, bid, bid], offsets_bytes=[0, 100, 0, 0, MiB],
        lengths_bytes=[100, 200, 5, 5, 5]))
    assert code == 0, resp
    assert list(resp.codes) == [0, 0, CODE.UNKNOWN_BUFFER, CODE.INVALID_KEY, CODE.OUT_OF_RANGE]
    assert list(resp.error_positions) == [2, 3, 4] and len(resp.messages) == 3
    assert resp.versions[0] > 0 and resp.versions[1] > 0 and list(resp.versions[2:]) == [0, 0, 0]
    # a single buffer id stands for every item
    code, got = raw.call("PackedGetInto", P.PackedRangesRequest(
        keys=["h/pk-b", "h/pk-a", "h/pk-missing", "h/pk-a"], buffer_ids=[bid],
        offsets_bytes=[1000, 2000, 3000, MiB - 10], lengths_bytes=[200, 100, 10, 100]))
    assert code == 0, got
    assert list(got.codes) == [0, 0, CODE.NOT_FOUND, CODE.OUT_OF_RANGE] and got.matched == 2
    assert list(got.value_sizes_bytes[:2]) == [200, 100] and list(got.error_positions) == [2, 3]
    assert bytes(mm[1000:1200]) == bytes(mm[100:300]) and bytes(mm[2000:2100]) == bytes(mm[0:100])
    code, pre = raw.call("PackedGetPrefixInto", P.PackedRangesRequest(
        keys=["h/pk-a", "h/pk-b", "h/pk-missing", "h/pk-a"], buffer_ids=[bid],
        offsets_bytes=[4000, 5000, 6000, 7000], lengths_bytes=[100, 200, 100, 100]))
    assert code == 0 and pre.matched == 2 and list(pre.value_sizes_bytes) == [100, 200]
    assert list(pre.tiers) == [common_pb2.CXL] * 2 and bytes(mm[5000:5200]) == bytes(mm[100:300])
    code, err = raw.call("PackedGetPrefixInto", P.PackedRangesRequest(
        keys=["h/pk-a", "h/pk-b"], buffer_ids=[bid, bid + 1000], offsets_bytes=[0, 0], lengths_bytes=[100, 200]))
    assert code == CODE.UNKNOWN_BUFFER
    code, _ = raw.call("BatchRemove", client_pb2.ClientBatchRemoveRequest(keys=["h/pk-a", "h/pk-b"]))
    assert code == 0


def test_register_buffer_refusals(raw, tmp_path) -> None:
    cases = [
        client_pb2.RegisterBufferRequest(path="/etc/passwd", size_bytes=4096, pid=os.getpid()),
        client_pb2.RegisterBufferRequest(path="/dev/shm/../../etc/passwd", size_bytes=4096),
        client_pb2.RegisterBufferRequest(path="relative", size_bytes=4096),
        client_pb2.RegisterBufferRequest(path="/dev/shm/cxlkv-no-such", size_bytes=4096),
        client_pb2.RegisterBufferRequest(path="", size_bytes=4096),
    ]
    for req in cases:
        code, err = raw.call("RegisterBuffer", req)
        assert code == CODE.INVALID_ARGUMENT and err.message, req
    path, mm = shm_buffer(8192)
    try:
        code, err = raw.call("RegisterBuffer", client_pb2.RegisterBufferRequest(path=path, size_bytes=4096, pid=os.getpid()))
        assert code == CODE.INVALID_ARGUMENT and "8192" in err.message
        code, err = raw.call("RegisterBuffer", client_pb2.RegisterBufferRequest(path=path, size_bytes=0, pid=os.getpid()))
        assert code == CODE.INVALID_ARGUMENT
    finally:
        os.unlink(path)
        mm.close()


def test_a_buffer_file_truncated_by_its_owner_never_kills_the_daemon(raw, module_cluster) -> None:
    """The owner of a registered buffer keeps its file descriptor and truncates the
    file under the daemon's mapping: a PutFrom then made the daemon read past the
    file's end, and the SIGBUS killed it (every caller of the host lost its daemon).
    The SIGBUS guard covers buffers now: the put fails (nothing is stored: the copy
    read zeros, not the value), a GetInto does not kill the daemon either, and every
    later use of the buffer is refused with OUT_OF_RANGE."""
    size = 1 * MiB
    path = f"/dev/shm/cxlkv-buf-{os.getpid()}-{os.urandom(6).hex()}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, size)
        os.pwrite(fd, b"v" * size, 0)
        code, resp = raw.call("RegisterBuffer", client_pb2.RegisterBufferRequest(
            path=path, size_bytes=size, pid=os.getpid()))
        assert code == 0, resp
        os.unlink(path)
        bid = resp.buffer_id
        os.ftruncate(fd, 0)  # shrink it under the daemon's mapping
        code, err = raw.call("PutFrom", client_pb2.PutFromRequest(key="trunc/put", source=BR(bid, 0, size)))
        assert code == CODE.OUT_OF_RANGE and "shrank" in err.message, (code, err)
        code, err = raw.call("Get", client_pb2.GetRequest(key="trunc/put"))
        assert code == CODE.NOT_FOUND, "a value read from a truncated buffer was stored"
        code, _ = raw.call("Put", client_pb2.PutRequest(key="trunc/get", value=b"g" * 4096))
        assert code == 0
        code, err = raw.call("GetInto", client_pb2.GetIntoRequest(key="trunc/get", target=BR(bid, 0, 4096)))
        assert code == CODE.OUT_OF_RANGE and "shrank" in err.message, (code, err)
        code, resp = raw.call("BatchPutFrom", client_pb2.BatchPutFromRequest(items=[
            client_pb2.PutFromRequest(key="trunc/again", source=BR(bid, 0, 4096))]))
        assert code == 0 and resp.results[0].status.code == CODE.OUT_OF_RANGE, resp
        raw.call("UnregisterBuffer", client_pb2.UnregisterBufferRequest(buffer_id=bid))
        raw.call("BatchRemove", client_pb2.ClientBatchRemoveRequest(keys=["trunc/get"]))
    finally:
        os.close(fd)
        if os.path.exists(path):
            os.unlink(path)


# ---------------------------------------------------------------------- keys
@pytest.mark.parametrize("key", ["", "k" * 4097, "a\x00b"])
def test_bad_keys_over_grpc(stub, key: str) -> None:
    assert grpc_code(stub.Put, client_pb2.PutRequest(key=key, value=b"v")) == CODE.INVALID_KEY
    assert grpc_code(stub.Get, client_pb2.GetRequest(key=key)) == CODE.INVALID_KEY
    assert grpc_code(stub.Exist, client_pb2.ExistRequest(key=key)) == CODE.INVALID_KEY
    assert grpc_code(stub.Remove, client_pb2.ClientRemoveRequest(key=key)) == CODE.INVALID_KEY
    resp = stub.BatchExist(client_pb2.BatchExistRequest(keys=[key, "fine"]), timeout=10)
    assert list(resp.exists) == [False, False]
    assert resp.results[0].code == CODE.INVALID_KEY and resp.results[1].code == 0


def test_key_with_invalid_utf8_in_a_lean_frame(raw) -> None:
    # field 1 (key), wire type 2, length 2, bytes 0xff 0xfe: not UTF-8
    payload = b"\x0a\x02\xff\xfe"
    m = framing.METHODS_BY_NAME["Get"]
    rid = raw.frame(m.number, payload)
    code, got, body = raw.read()
    assert got == rid and code == CODE.INVALID_KEY
    assert "not valid UTF-8" in common_pb2.ErrorDetail.FromString(body).message


def _raw_grpc(channel: grpc.Channel, service: str, method: str, payload: bytes):
    """Call ``method`` with raw request bytes; the typed error (from the status details)."""
    call = channel.unary_unary(f"/{service}/{method}")  # no serializers: bytes in, bytes out
    try:
        call(payload, timeout=10)
    except grpc.RpcError as exc:
        assert exc.code() != grpc.StatusCode.UNKNOWN, exc.details()
        return exc.code(), from_rpc_error(exc)
    raise AssertionError("the call succeeded")


def _field(request_type, name: str) -> int:
    return request_type.DESCRIPTOR.fields_by_name[name].number


def _string_field(number: int, raw: bytes) -> bytes:
    return bytes([number << 3 | 2, len(raw)]) + raw


def test_requests_that_do_not_parse_over_grpc(module_cluster) -> None:
    """A request that fails to parse answers INVALID_KEY (a non-UTF-8 key) or
    INVALID_ARGUMENT with an ErrorDetail — never UNKNOWN with Python text — on the
    clientd's gRPC socket and on the master's gRPC port."""
    svc = "cxlkv.v1.ClientService"
    bad = b"\xff\xfe"
    with grpc.insecure_channel(f"unix:{module_cluster.socket_path(0)}") as ch:
        for method, req in (("Get", client_pb2.GetRequest), ("Put", client_pb2.PutRequest),
                            ("Exist", client_pb2.ExistRequest)):
            status, err = _raw_grpc(ch, svc, method, _string_field(_field(req, "key"), bad))
            assert status == grpc.StatusCode.INVALID_ARGUMENT and err.code == CODE.INVALID_KEY, err
            assert err.message == f"{method}: key is not valid UTF-8 (field key)"
        # a repeated key field, and a key inside a nested message
        status, err = _raw_grpc(ch, svc, "BatchExist", _string_field(_field(client_pb2.BatchExistRequest, "keys"), bad))
        assert err.code == CODE.INVALID_KEY and "field keys" in err.message
        item = _string_field(_field(client_pb2.PutRequest, "key"), bad)
        status, err = _raw_grpc(ch, svc, "BatchPut", _string_field(_field(client_pb2.BatchPutRequest, "items"), item))
        assert err.code == CODE.INVALID_KEY and "field items.key" in err.message
        # another string field: INVALID_ARGUMENT naming the field and UTF-8
        path = _string_field(_field(client_pb2.RegisterBufferRequest, "path"), bad)
        status, err = _raw_grpc(ch, svc, "RegisterBuffer", path)
        assert err.code == CODE.INVALID_ARGUMENT and err.message == "RegisterBuffer: field path is not valid UTF-8"
        # bytes that are no protobuf message at all
        status, err = _raw_grpc(ch, svc, "Get", b"\x0a\x7f")  # length past the end
        assert err.code == CODE.INVALID_ARGUMENT and "malformed request message" in err.message
        assert "\n" not in err.message
    from cxlkv.v1 import master_pb2

    with grpc.insecure_channel(module_cluster.master_address) as ch:
        key_field = _field(master_pb2.ExistKeyRequest, "keys")
        status, err = _raw_grpc(ch, "cxlkv.v1.MasterService", "ExistKey", _string_field(key_field, bad))
        assert status == grpc.StatusCode.INVALID_ARGUMENT and err.code == CODE.INVALID_KEY, err
        status, err = _raw_grpc(ch, "cxlkv.v1.MasterService", "Stat", b"\xff\xff\xff")
        assert err.code == CODE.INVALID_ARGUMENT and "malformed request message" in err.message


def test_oversized_inline_values(stub, raw, module_cluster) -> None:
    big = b"x" * (MiB + 1)  # max_inline_bytes defaults to 1 MiB
    assert grpc_code(stub.Put, client_pb2.PutRequest(key="h/big", value=big)) == CODE.TOO_LARGE
    code, err = raw.call("Put", client_pb2.PutRequest(key="h/big", value=big))
    assert code == CODE.TOO_LARGE and "inline" in err.message
    code, resp = raw.call("BatchPut", client_pb2.BatchPutRequest(items=[
        client_pb2.PutRequest(key="h/big", value=big), client_pb2.PutRequest(key="h/ok", value=b"ok")]))
    assert [r.status.code for r in resp.results] == [CODE.TOO_LARGE, 0]
    # a value over the inline limit put zero-copy is refused inline on Get, with its size
    with module_cluster.client(0) as c:
        c.put("h/large", b"y" * (2 * MiB))
        assert c.get("h/large") == b"y" * (2 * MiB)  # the SDK falls back to GetInto
    code, err = raw.call("Get", client_pb2.GetRequest(key="h/large"))
    assert code == CODE.TOO_LARGE and err.requested_bytes == 2 * MiB
    # a value larger than every segment (the 64 MiB region): TOO_LARGE, nothing placed
    path, mm = shm_buffer(80 * MiB)  # sparse: no memory is touched
    try:
        _, resp = raw.call("RegisterBuffer", client_pb2.RegisterBufferRequest(
            path=path, size_bytes=80 * MiB, pid=os.getpid()))
    finally:
        os.unlink(path)
    code, err = raw.call("PutFrom", client_pb2.PutFromRequest(key="h/huge", source=BR(resp.buffer_id, 0, 80 * MiB)))
    assert code == CODE.TOO_LARGE, err
    raw.call("UnregisterBuffer", client_pb2.UnregisterBufferRequest(buffer_id=resp.buffer_id))
    mm.close()
    raw.call("BatchRemove", client_pb2.ClientBatchRemoveRequest(keys=["h/ok", "h/large"]))


def test_batches_over_the_masters_limit_are_served_per_item(stub, raw, module_cluster) -> None:
    """clientd accepts batches up to its own max_batch_items (16,384), eight times the
    master's (2,048): it must never forward one as a single master call (which the
    master refused with TOO_LARGE naming *its* limit, failing every item)."""
    n = 4100  # over the master's 2,048; under clientd's 16,384
    keys = [f"hb/{i}" for i in range(n)]
    resp = stub.BatchPut(client_pb2.BatchPutRequest(items=[
        client_pb2.PutRequest(key=k, value=k.encode()) for k in keys]), timeout=60)
    assert [r.status.message for r in resp.results if r.status.code] == []
    code, got = raw.call("BatchGet", client_pb2.BatchGetRequest(keys=keys))
    assert code == 0 and [r.value for r in got.results] == [k.encode() for k in keys]
    resp = stub.BatchExist(client_pb2.BatchExistRequest(keys=keys), timeout=60)
    assert all(resp.exists)
    resp = stub.BatchRemove(client_pb2.ClientBatchRemoveRequest(keys=keys), timeout=60)
    assert [r.message for r in resp.results if r.code] == []
    code, got = raw.call("BatchRemove", client_pb2.ClientBatchRemoveRequest(keys=keys))
    assert code == 0 and {r.code for r in got.results} == {CODE.NOT_FOUND}
    assert module_cluster.master_stat().key_count == 0 or not any(
        e.key.startswith("hb/") for e in module_cluster.list_master_keys())


# -------------------------------------------------------------------- frames
def test_unknown_method_and_garbage_payload_keep_the_connection(raw) -> None:
    rid = raw.frame(999, b"")
    code, got, body = raw.read()
    assert got == rid and code == CODE.INVALID_ARGUMENT
    assert "unknown method" in common_pb2.ErrorDetail.FromString(body).message
    rid = raw.frame(framing.METHODS_BY_NAME["Put"].number, b"\xff\xff\xff\xff\xff garbage")
    code, got, _ = raw.read()
    assert got == rid and code == CODE.INVALID_ARGUMENT
    rid = raw.frame(0, b"")
    assert raw.read()[0] == CODE.INVALID_ARGUMENT
    # the connection still works
    code, resp = raw.call("Exist", client_pb2.ExistRequest(key="h/nothing"))
    assert code == 0 and resp.exists is False


@pytest.mark.parametrize("length", [0xFFFFFFFF, 0x10000000 + 1, 3, 0])
def test_impossible_frame_lengths_close_only_that_connection(module_cluster, length: int) -> None:
    r = Raw(module_cluster.lean_socket_path(0))
    r.send(struct.pack("<IHHQ", length, 1, 0, 42))
    code, rid, body = r.read()
    # too short: INVALID_ARGUMENT; too long: TOO_LARGE naming max_request_bytes (docs/protocol.md, Limits)
    assert code == (CODE.INVALID_ARGUMENT if length < 12 else CODE.TOO_LARGE) and rid == 42
    message = common_pb2.ErrorDetail.FromString(body).message
    assert "frame" in message and (length < 12 or "max_request_bytes" in message)
    with pytest.raises((ConnectionError, OSError)):
        r.read()
    r.close()


def test_disconnect_mid_frame_and_mid_call(module_cluster) -> None:
    # half a header, half a payload, then gone
    for data in (b"\x10\x00", framing.encode_request(1, 1, client_pb2.PutRequest(
            key="h/half", value=b"z" * 1000).SerializeToString())[:500]):
        r = Raw(module_cluster.lean_socket_path(0))
        r.send(data)
        r.close()
    # puts sent, connection closed before the answers: every put the daemon started
    # completes (none is left PROCESSING), the rest were never received
    r = Raw(module_cluster.lean_socket_path(0))
    for i in range(20):
        r.frame(1, client_pb2.PutRequest(key=f"h/gone/{i}", value=b"q" * 300_000).SerializeToString())
    r.sock.shutdown(socket.SHUT_RDWR)
    r.close()
    keys = [f"h/gone/{i}" for i in range(20)]
    with module_cluster.client(1) as c:
        # the daemon goes on with the frames already in its socket buffer after the close,
        # so a put can reach the master after an earlier one was seen committed: wait until
        # nothing is PROCESSING and the set of committed keys has stopped growing
        seen: list[list[str]] = []

        def settled() -> bool:
            if module_cluster.master_stat(False).processing_count:
                seen.clear()
                return False
            seen.append([k for k, e in zip(keys, c.exists_many(keys)) if e])
            time.sleep(0.5)
            return len(seen) >= 3 and seen[-1] == seen[-2] == seen[-3]

        module_cluster.wait_until(settled, timeout_s=60.0, what="no put left PROCESSING, the key set settled")
        present = seen[-1]
        assert present, "the daemon had received at least the first put"
        for k in present:
            assert c.get(k) == b"q" * 300_000
        assert c.remove_all(regex="^h/gone/") == len(present)
    # the same over gRPC: a call cancelled by its client
    ch = grpc.insecure_channel(f"unix:{module_cluster.socket_path(0)}")
    stub = client_pb2_grpc.ClientServiceStub(ch)
    fut = stub.Put.future(client_pb2.PutRequest(key="h/cancelled", value=b"c" * 500_000))
    fut.cancel()
    ch.close()
    module_cluster.wait_until(lambda: module_cluster.master_stat(False).processing_count == 0,
                              what="no put left PROCESSING")


def test_garbage_stream_then_eof(module_cluster) -> None:
    r = Raw(module_cluster.lean_socket_path(0))
    r.send(os.urandom(64 * 1024))
    r.sock.shutdown(socket.SHUT_WR)
    # the daemon answers whatever frames it could parse and then closes
    try:
        while True:
            code, _, _ = r.read()
            assert code != 0
    except (ConnectionError, OSError):
        pass
    r.close()


def test_pipelined_requests_answer_by_request_id(raw) -> None:
    ids = [raw.frame(1, client_pb2.PutRequest(key=f"h/pipe/{i}", value=bytes([i]) * 10).SerializeToString())
           for i in range(50)]
    got = {}
    for _ in ids:
        code, rid, _ = raw.read()
        got[rid] = code
    assert sorted(got) == sorted(ids) and set(got.values()) == {0}
    code, resp = raw.call("BatchGet", client_pb2.BatchGetRequest(keys=[f"h/pipe/{i}" for i in range(50)]))
    assert [r.value for r in resp.results] == [bytes([i]) * 10 for i in range(50)]
    code, resp = raw.call("RemoveAll", client_pb2.ClientRemoveAllRequest(regex="^h/pipe/"))
    assert resp.removed == 50
    code, err = raw.call("RemoveAll", client_pb2.ClientRemoveAllRequest(regex="(unclosed"))
    assert code == CODE.INVALID_ARGUMENT
    code, err = raw.call("List", client_pb2.ListRequest(page_token="not-a-token"))
    assert code == CODE.INVALID_ARGUMENT


def test_a_caller_that_never_reads_its_answers_is_paused_not_buffered(raw, module_cluster) -> None:
    """1,000 pipelined Gets of a 1 MiB value from a caller that does not read: the
    daemon stops dispatching its frames once its answers fill the socket (about
    ``max_in_flight`` answers wait, not 1 GiB), serves other callers meanwhile,
    and answers all of them, in order and right, once the caller reads."""
    value = os.urandom(MiB)
    code, _ = raw.call("Upsert", client_pb2.PutRequest(key="h/noread/big", value=value))
    assert code == 0
    pid = module_cluster.clientds[0].pid
    before = rss_bytes(pid)
    hog = Raw(module_cluster.lean_socket_path(0))
    try:
        get = framing.METHODS_BY_NAME["Get"].number
        body = client_pb2.GetRequest(key="h/noread/big").SerializeToString()
        hog.send(b"".join(framing.encode_request(get, rid, body) for rid in range(1000)))
        time.sleep(1.5)
        for _ in range(5):  # another caller is served while the hog's answers wait
            t0 = time.monotonic()
            code, resp = raw.call("Exist", client_pb2.ExistRequest(key="h/noread/big"))
            assert code == 0 and resp.exists
            assert time.monotonic() - t0 < 1.0
        grown = rss_bytes(pid) - before
        assert grown < 400 * MiB, f"clientd grew by {grown >> 20} MiB for a caller that does not read"
        hog.sock.settimeout(30)
        for rid in range(1000):
            code, got, body = hog.read()
            assert (code, got) == (0, rid)
            if rid in (0, 999):
                assert client_pb2.GetResponse.FromString(body).value == value
    finally:
        hog.close()
    code, resp = raw.call("Remove", client_pb2.ClientRemoveRequest(key="h/noread/big"))
    assert code == 0


def test_huge_reported_counts_never_break_stat(make_cluster) -> None:
    """ReportHits / DirectRelease add callers' counts to the daemon's counters: counts
    near 2^64 (twice) used to push a counter past uint64, and every Stat — ``cxlkv
    stat`` included — failed INTERNAL from then on. It saturates instead."""
    cl = make_cluster(clientds=1, region_size_bytes=16 * MiB)
    ch = grpc.insecure_channel(f"unix:{cl.socket_path(0)}")
    try:
        s = client_pb2_grpc.ClientServiceStub(ch)
        top = 2**64 - 1
        for _ in range(2):
            assert grpc_code(s.ReportHits, client_pb2.ClientReportHitsRequest(
                get_items=top, bytes_out=top, prefix_queries=top, prefix_keys=top, prefix_hits=top,
                reads_copied_again=top)) == 0
            assert grpc_code(s.DirectRelease, client_pb2.DirectReleaseRequest(
                checksum_failures=2**32 - 1, reads_copied_again=2**32 - 1)) == 0
        st = s.Stat(client_pb2.ClientStatRequest(), timeout=10)
        assert st.counters["get_items"] == top and st.counters["bytes_out"] == top
    finally:
        ch.close()
    r = Raw(cl.lean_socket_path(0))
    try:
        code, resp = r.call("Stat", client_pb2.ClientStatRequest())
        assert code == 0, resp
    finally:
        r.close()
