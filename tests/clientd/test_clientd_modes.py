"""Daemon modes and surfaces: non-coherent (flush) mode, health, reflection, metrics,
SDK timeouts and fork safety."""

from __future__ import annotations

import os
import socket
import threading
import time
import urllib.request

import grpc
import pytest
import xxhash
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cxlkv.errors import InvalidArgument, Unavailable
from cxlkv.v1 import master_pb2

from master_harness import locate

MiB = 1 << 20


def test_flush_mode_round_trip_with_checksums(make_cluster) -> None:
    cl = make_cluster(clientd_options={"coherence": "flush", "metrics_address": "127.0.0.1:0"})
    with cl.client(0) as a, cl.client(1) as b:
        values = {f"flush/{n}": os.urandom(n) for n in (0, 1, 4096, 300_000, 5 * MiB)}
        for k, v in values.items():
            a.put(k, v)
        for k, v in values.items():
            assert b.get(k) == v
        buf = b.buffer(5 * MiB)
        assert b.get_into("flush/5242880", buf) == 5 * MiB and bytes(buf) == values["flush/5242880"]
        # the master recorded the writer's xxh3 checksum of every value (the empty one too)
        for e in cl.list_master_keys():
            loc = locate(cl.master_stub(), e.key, no_lease=True)
            assert loc.checksum == xxhash.xxh3_64_intdigest(values[e.key])
        url = a.stat()["metrics_url"]
    body = urllib.request.urlopen(url, timeout=10).read().decode()
    assert 'cxlkv_clientd_items_total{op="put"} 5.0' in body
    assert "cxlkv_clientd_master_calls_total" in body and "cxlkv_clientd_master_connected 1.0" in body
    cl.assert_invariants()


def test_health_and_reflection(module_cluster) -> None:
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    with grpc.insecure_channel(f"unix:{module_cluster.socket_path(0)}") as ch:
        h = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service="cxlkv.v1.ClientService"),
                                                 timeout=10)
        assert h.status == health_pb2.HealthCheckResponse.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        resp = next(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                              timeout=10))
        names = {s.name for s in resp.list_services_response.service}
        assert "cxlkv.v1.ClientService" in names and "grpc.health.v1.Health" in names
    mode = os.stat(module_cluster.socket_path(0)).st_mode & 0o777
    assert mode == 0o660 and os.stat(module_cluster.lean_socket_path(0)).st_mode & 0o777 == 0o660


def test_sdk_times_out_on_a_silent_daemon(tmp_path) -> None:
    from cxlkv import Client

    path = str(tmp_path / "silent.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path + ".lean")
    srv.listen(8)
    conns: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                conns.append(srv.accept()[0])  # accept, never answer
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        c = Client(path, timeout_s=0.3)
        t0 = time.monotonic()
        with pytest.raises(Unavailable, match="did not answer"):
            c.exists("k")
        assert time.monotonic() - t0 < 5
        with pytest.raises(Unavailable, match="did not answer"):
            c.exists_many(["a", "b"])
    finally:
        stop.set()
        t.join(5)
        srv.close()
        for s in conns:
            s.close()


def test_client_refuses_use_after_fork(module_cluster) -> None:
    with module_cluster.client(0) as c:
        c.put("fork/parent", b"p")
        pid = os.fork()
        if pid == 0:  # child: the parent's client refuses; a new one works
            code = 1
            try:
                try:
                    c.get("fork/parent")
                except InvalidArgument:
                    from cxlkv import Client

                    with Client(module_cluster.socket_path(0)) as mine:
                        code = 0 if mine.get("fork/parent") == b"p" else 3
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert c.get("fork/parent") == b"p"
        c.remove("fork/parent")


def test_sdk_falls_back_to_shared_memory_below_its_inline_threshold(make_cluster) -> None:
    cl = make_cluster(clientds=1, clientd_options={"max_inline_bytes": 1024})
    # the daemon's paths (direct mode would commit these values itself)
    with cl.client(0, direct=False) as a:  # SDK inlines up to 64 KiB; this daemon only 1 KiB
        v = os.urandom(8000)
        a.put("small-limit/one", v)
        assert a.get("small-limit/one") == v
        res = a.put_many([("small-limit/a", v), ("small-limit/b", b"tiny")])
        assert all(r.ok for r in res)
        got = a.get_many(["small-limit/a", "small-limit/b"])
        assert [g.value for g in got] == [v, b"tiny"]
        assert a.stat()["buffers_registered"] >= 1  # the pool carried them
    cl.assert_invariants()
