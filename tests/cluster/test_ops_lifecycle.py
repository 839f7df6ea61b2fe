"""What operators see over a daemon's life (issue 21): a planned clientd stop
deregisters (no expiry, no "host died"), health follows the master link,
reflection answers v1 and v1alpha, and a script that never closes its Client exits.

Real master and clientd processes on a /dev/shm region; real gRPC.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2

from cxlkv.v1 import master_pb2

SERVICE = "cxlkv.v1.ClientService"


def _counters(cl) -> dict[str, int]:
    return dict(cl.master_stat().counters)


def test_planned_clientd_restart_deregisters(make_cluster) -> None:
    # a short TTL: an expiry, if the stop were taken for a host failure, would show within the test
    cl = make_cluster(master_options={"client_ttl_s": 1.0, "heartbeat_interval_s": 0.2})
    before = cl.master_stat()
    assert sum(1 for c in before.clients if c.alive) == 2
    old_ids = {c.client_id for c in before.clients if c.name == "clientd-0"}
    cl.clientds[0].stop()  # SIGTERM: systemctl stop
    time.sleep(2.5)  # well past client_ttl_s
    counters = _counters(cl)
    assert counters["clients_expired"] == 0, counters
    assert counters["clients_deregistered"] == 1, counters
    st = cl.master_stat()
    assert [(c.name, c.alive) for c in st.clients] == [("clientd-1", True)]  # not listed, not "expired"
    out = subprocess.run([sys.executable, "-m", "cxlkv.cli", "status", "--master", cl.master_address, "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    status = json.loads(out.stdout)
    assert status["clients_expired"] == 0 and status["clients_alive"] == 1, status
    assert "deregistered from the master" in cl.clientds[0].log_path.read_text()

    cl.restart_clientd(0)  # the new process registers under the id its incarnation file recorded
    st = cl.master_stat()
    assert sorted((c.name, c.alive) for c in st.clients) == [("clientd-0", True), ("clientd-1", True)]
    assert {c.client_id for c in st.clients if c.name == "clientd-0"} == old_ids
    assert _counters(cl)["clients_expired"] == 0
    with cl.client(0) as c:
        c.put("dereg/after", b"y")
        assert c.get("dereg/after") == b"y"


def test_killed_clientd_still_expires(make_cluster) -> None:
    """The other side: a host that dies without a word is still counted expired."""
    cl = make_cluster(clientds=2, master_options={"client_ttl_s": 1.0, "heartbeat_interval_s": 0.2})
    cl.kill_clientd(1)
    cl.wait_until(lambda: _counters(cl)["clients_expired"] == 1, 10, "the killed clientd to expire")
    assert _counters(cl)["clients_deregistered"] == 0
    cl.restart_clientd(1)


def _health(path: str) -> int:
    with grpc.insecure_channel(f"unix:{path}") as ch:
        return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=5).status


def test_health_not_serving_while_the_master_is_lost(make_cluster) -> None:
    cl = make_cluster(clientds=1, master_options={"heartbeat_interval_s": 0.2})
    SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
    assert _health(cl.socket_path(0)) == SERVING
    cl.stop_master()
    cl.wait_until(lambda: _health(cl.socket_path(0)) == NOT_SERVING, 10, "health NOT_SERVING without a master")
    cl.start_master_again()
    cl.wait_until(lambda: _health(cl.socket_path(0)) == SERVING, 20, "health SERVING once the master is back")
    with cl.client(0, retry_s=10) as c:
        c.put("health/after", b"x")
        assert c.get("health/after") == b"x"


def _reflect(channel: grpc.Channel, version: str) -> set[str]:
    call = channel.stream_stream(f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo",
                                 request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
                                 response_deserializer=reflection_pb2.ServerReflectionResponse.FromString)
    req = reflection_pb2.ServerReflectionRequest(list_services="")
    resp = next(call(iter([req]), timeout=10))
    return {s.name for s in resp.list_services_response.service}


def test_reflection_v1_and_v1alpha(module_cluster) -> None:
    # v1 and v1alpha share their messages on the wire (grpc-proto); a v1 path answering proves v1 is served
    for target, svc in ((f"unix:{module_cluster.socket_path(0)}", SERVICE),
                        (module_cluster.master_address, "cxlkv.v1.MasterService")):
        with grpc.insecure_channel(target, options=[("grpc.enable_http_proxy", 0)]) as ch:
            for version in ("v1", "v1alpha"):
                names = _reflect(ch, version)
                assert {svc, "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection",
                        "grpc.reflection.v1alpha.ServerReflection"} <= names, (target, version, names)
            # a symbol lookup through v1 returns the service's file
            call = ch.stream_stream("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
                                    request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
                                    response_deserializer=reflection_pb2.ServerReflectionResponse.FromString)
            resp = next(call(iter([reflection_pb2.ServerReflectionRequest(file_containing_symbol=svc)]), timeout=10))
            assert resp.file_descriptor_response.file_descriptor_proto


@pytest.mark.parametrize("protocol", ["grpc", "lean"])
def test_script_that_never_closes_exits(module_cluster, protocol) -> None:
    script = textwrap.dedent(f"""
        import cxlkv
        c = cxlkv.Client({module_cluster.socket_path(0)!r}, protocol={protocol!r})
        c.put("noclose/{protocol}", b"v" * 100)
        assert c.get("noclose/{protocol}") == b"v" * 100
        print("done")
    """)
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "done", out.stderr
    assert time.monotonic() - t0 < 30
    assert "Traceback" not in out.stderr and "Exception ignored" not in out.stderr, out.stderr


def test_deregister_rpc_refuses_unknown_and_stale(module_cluster) -> None:
    stub = module_cluster.master_stub()
    with pytest.raises(grpc.RpcError) as e:
        stub.DeregisterClient(master_pb2.DeregisterClientRequest(client_id="nobody", epoch=1), timeout=10)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND or "UNKNOWN_CLIENT" in str(e.value.trailing_metadata()) \
        or "unknown" in e.value.details()
    live = [c for c in module_cluster.master_stat().clients if c.alive][0]
    with pytest.raises(grpc.RpcError):
        stub.DeregisterClient(master_pb2.DeregisterClientRequest(client_id=live.client_id, epoch=live.epoch + 99),
                              timeout=10)
    assert sum(1 for c in module_cluster.master_stat().clients if c.alive) == 2  # nothing ended


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    e = {k: v for k, v in os.environ.items() if k != "CXLKV_SOCKET"}
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "cxlkv.cli", *args], capture_output=True, text=True, timeout=60,
                          env=e, stdin=subprocess.DEVNULL)


def test_socket_errors_name_the_setting_and_the_path(tmp_path, module_cluster) -> None:
    from cxlkv import Client
    from cxlkv.errors import DaemonUnreachable

    regular = tmp_path / "regular"
    regular.write_text("")
    cases = {
        str(tmp_path / "none.sock"): "none.sock: no such socket (is clientd running? --socket or $CXLKV_SOCKET",
        str(tmp_path): f"{tmp_path} is a directory, not a socket (--socket or $CXLKV_SOCKET must name",
        str(regular): f"{regular} is a regular file, not a socket",
        str(tmp_path / "nodir" / "x.sock"): f"directory {tmp_path / 'nodir'} does not exist",
    }
    for path, want in cases.items():
        r = _cli("get", "k", "--socket", path)
        assert r.returncode == 22 and len(r.stderr.splitlines()) == 1, r.stderr
        assert want in r.stderr and ".lean" not in r.stderr, (path, r.stderr)
    # the SDK names its own argument
    for protocol in ("lean", "grpc"):
        with pytest.raises(DaemonUnreachable, match=r"is a directory, not a socket \(socket_path or \$CXLKV_SOCKET"):
            Client(str(tmp_path), protocol=protocol).get("k")
    # naming the lean socket itself works (the gRPC one is beside it), for the CLI and the SDK
    with module_cluster.client(0) as c:
        c.put("sock/lean-path", b"ok")
    r = _cli("get", "sock/lean-path", "--socket", module_cluster.lean_socket_path(0))
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    with Client(module_cluster.lean_socket_path(0)) as c:
        assert c.socket_path == module_cluster.socket_path(0) and c.get("sock/lean-path") == b"ok"


def test_region_format_refuses_a_region_its_master_runs_on(cluster) -> None:
    """`cxlkv region format --force` on a region a running master owns used to succeed:
    the index and owner record were zeroed under the master, which stopped ("taken
    over: no owner record") with every object dropped. It is refused in one line
    naming the master, and nothing changes; after a clean stop it formats."""
    with cluster.client(0) as c:
        c.put("fmt/kept", b"still here")
    path = cluster.region_paths[0]
    argv = [sys.executable, "-m", "cxlkv.cli", "region", "format", path, "--segment", "cxl0", "--force"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0, out.stdout
    assert "is in use: master" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    time.sleep(1.5)  # past a few owner-lease renewals: the master would have stopped by now
    assert cluster.master is not None and cluster.master.alive()
    with cluster.client(1) as c:
        assert c.get("fmt/kept") == b"still here"
    cluster.assert_invariants()
    for p in cluster.clientds:
        p.stop()
    cluster.master.stop()  # a clean stop releases the owner lease
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_sigusr1_writes_the_threads_stacks_and_the_daemon_goes_on(module_cluster) -> None:
    """``kill -USR1`` (docs/operations.md): master and clientd each write every thread's
    Python stack to their log and keep serving."""
    for p in (module_cluster.master, module_cluster.clientds[0]):
        assert p is not None
        before = p.log_path.stat().st_size
        p.signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while "Current thread" not in p.log_path.read_bytes()[before:].decode(errors="replace"):
            assert time.monotonic() < deadline, p.log_tail(40)
            time.sleep(0.05)
        dumped = p.log_path.read_bytes()[before:].decode(errors="replace")
        assert 'File "' in dumped and p.alive(), dumped[-2000:]
    with module_cluster.client(0) as c:
        c.put("usr1/after", b"still serving")
        assert c.get("usr1/after") == b"still serving"


@pytest.mark.filterwarnings("ignore:clientd-.* stopped slowly")  # its master steps overrun on purpose
def test_clientd_stops_in_bounded_time_while_the_master_does_not_answer(make_cluster) -> None:
    """SIGTERM to a clientd while its master is paused (SIGSTOP): the steps that wait
    on the master (giving reservations back, closing the link) are cut at their
    bound and named in the log; the daemon exits 0 within the bound, no SIGKILL.
    Before, each step waited out master_timeout_s in turn (10.3 s measured)."""
    from cxlkv.clientd.daemon import MASTER_STEP_S

    cl = make_cluster(clientds=1)
    with cl.client(0) as c:
        for i in range(50):
            c.put(f"stop/{i}", bytes([i]) * 4096)  # reservations held, hits and leases pending
        assert c.get("stop/7") == bytes([7]) * 4096
    p = cl.clientds[0]
    cl.master.signal(signal.SIGSTOP)
    try:
        t = time.monotonic()
        rc, killed = p.stop(timeout_s=2 * MASTER_STEP_S + 6.0)
        took = time.monotonic() - t
    finally:
        cl.master.signal(signal.SIGCONT)
    text = p.log_path.read_text(errors="replace")
    assert not killed and rc == 0, (rc, killed, text[-3000:])
    assert took < 2 * MASTER_STEP_S + 2.0, (took, text[-3000:])
    assert "stopping: giving reservations back to the master did not finish within" in text, text[-3000:]
    assert "Traceback" not in text and "did not exit within" not in text, text[-3000:]
    cl.restart_clientd(0)  # the master, answering again, takes the host back
    with cl.client(0) as c:
        assert c.get("stop/7") == bytes([7]) * 4096
