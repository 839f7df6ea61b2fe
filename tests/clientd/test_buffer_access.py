"""RegisterBuffer access control: a caller cannot make the daemon write into a
file that is not its own SDK buffer (docs/clientd.md, "Shared buffers").

The attack this guards against: register the region file (or another file the
daemon's uid owns) as a "buffer", then ``GetInto`` it, so the daemon overwrites
the region header. Both sockets are tried; each refusal is INVALID_ARGUMENT, the
daemon stays up, the region is untouched and nothing stays registered.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys

import grpc

from cxlkv.errors import ErrorCode, from_rpc_error
from cxlkv.v1 import client_pb2, client_pb2_grpc

from test_clientd_hostile import Raw  # noqa: E402 (tests/ is on sys.path)

CODE = ErrorCode


def _grpc_register(stub, req) -> tuple[int, str, int]:
    try:
        resp = stub.RegisterBuffer(req, timeout=10)
    except grpc.RpcError as exc:
        err = from_rpc_error(exc)
        return int(err.code), err.message, 0
    return 0, "", resp.buffer_id


def _lean_register(raw: Raw, req) -> tuple[int, str, int]:
    code, resp = raw.call("RegisterBuffer", req)
    return (code, resp.message, 0) if code else (0, "", resp.buffer_id)


def _buffer_file(size: int, *, pid: int | None = None, mode: int = 0o600) -> str:
    path = f"/dev/shm/cxlkv-buf-{pid or os.getpid()}-{os.urandom(6).hex()}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    os.ftruncate(fd, size)
    os.close(fd)
    return path


def _digest(path: str) -> str:
    """sha256 of the region's bytes, the master's owner lease record left out (its
    heartbeat rewrites it every ``heartbeat_interval_s``; docs/index.md)."""
    with open(path, "rb") as f:
        data = bytearray(f.read())
    index_offset = int.from_bytes(data[128:136], "little")
    if index_offset:
        data[index_offset + 128:index_offset + 192] = bytes(64)
    return hashlib.sha256(data).hexdigest()


def test_register_buffer_refuses_foreign_files_on_both_sockets(module_cluster) -> None:
    cl = module_cluster
    region = cl.region_paths[0]
    region_size = os.path.getsize(region)
    before = _digest(region)
    ch = grpc.insecure_channel(f"unix:{cl.socket_path(0)}")
    stub = client_pb2_grpc.ClientServiceStub(ch)
    raw = Raw(cl.lean_socket_path(0))
    me = os.getpid()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    made: list[str] = []
    try:
        # a hard link to the region under a buffer-shaped name (same uid: the link is allowed)
        link = f"/dev/shm/cxlkv-buf-{me}-{os.urandom(6).hex()}"
        os.link(region, link)
        made.append(link)
        sym = f"/dev/shm/cxlkv-buf-{me}-{os.urandom(6).hex()}"
        os.symlink(_buffer_file(4096), sym)
        made += [sym, os.readlink(sym)]
        good = _buffer_file(4096)
        made.append(good)
        theirs = _buffer_file(4096, pid=sleeper.pid)
        made.append(theirs)
        R = client_pb2.RegisterBufferRequest
        cases = [
            (R(path=region, size_bytes=region_size, pid=me), "cxlkv-buf-"),          # the region itself
            (R(path=region, size_bytes=region_size, pid=0), "pid"),                   # … with pid 0
            (R(path=link, size_bytes=region_size, pid=me), "region|links"),           # hard link to it
            (R(path=sym, size_bytes=4096, pid=me), "symbolic link"),
            (R(path=good, size_bytes=4096, pid=0), "pid"),
            (R(path=good, size_bytes=4096, pid=2**32 - 1), "named after|pid"),
            (R(path="/dev/shm/not-a-buffer", size_bytes=4096, pid=me), "cxlkv-buf-"),
            (R(path=theirs, size_bytes=4096, pid=me), "named after"),                 # another process's name
        ]
        for req, why in cases:
            for name, call in (("grpc", lambda r: _grpc_register(stub, r)), ("lean", lambda r: _lean_register(raw, r))):
                code, msg, bid = call(req)
                assert code == CODE.INVALID_ARGUMENT, (name, req, code, msg)
                assert "\n" not in msg and re.search(why, msg), (name, req, msg)
        # on the lean socket the pid must be the caller's own (SO_PEERCRED)
        code, msg, _ = _lean_register(raw, R(path=theirs, size_bytes=4096, pid=sleeper.pid))
        assert code == CODE.INVALID_ARGUMENT and f"not the caller's pid {me}" in msg
        # the caller's own SDK-style buffer is accepted on both sockets
        for call in (lambda r: _grpc_register(stub, r), lambda r: _lean_register(raw, r)):
            code, msg, bid = call(R(path=good, size_bytes=4096, pid=me))
            assert code == 0 and bid, msg
            assert raw.call("UnregisterBuffer", client_pb2.UnregisterBufferRequest(buffer_id=bid))[0] == 0
    finally:
        sleeper.kill()
        sleeper.wait()
        raw.close()
        ch.close()
        for p in made:
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
    assert _digest(region) == before  # nothing wrote into the region
    for p in cl.clientds:
        assert p.alive()


def test_sdk_buffers_still_work(module_cluster) -> None:
    with module_cluster.client(0) as c:
        buf = c.buffer(1 << 16)
        buf[:5] = b"hello"
        c.put_from("acl/k", buf[:5])
        out = c.buffer(16)
        assert c.get_into("acl/k", out) == 5 and bytes(out[:5]) == b"hello"
