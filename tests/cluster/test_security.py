"""Only the cluster's own parts change the cluster: mutual TLS, identities, admin calls, safe defaults.

Real processes and real certificates (``tls_certs`` in conftest): a TLS cluster of
a master and two clientds (``clientd-0``, ``clientd-1``); ``clientd-2`` is a valid
clientd certificate of the same CA that belongs to no running daemon (another
host's clientd, or a stolen one); ``rogue`` is a look-alike (CN clientd-0, OU
admin) signed by another CA.

The attack list of issue 19 is replayed against the TLS cluster (plaintext, no
certificate, rogue CA, a valid non-admin certificate; gRPC and lean) and against
the default configuration (plaintext on loopback, reached from another address):
each is refused and the cluster's state is unchanged.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import grpc
import pytest
import tomli_w

from conftest import TestCluster, TlsCerts, _check_teardown
from cxlkv.errors import CxlkvError, PermissionDenied, Unavailable, from_rpc_error
from cxlkv.wire.lean import LeanChannel, service_methods
from cxlkv.wire.tls import Identity, TlsFiles, client_context, grpc_channel_credentials
from cxlkv.v1 import common_pb2, master_pb2, master_pb2_grpc

MiB = 1 << 20
PiB = 1 << 50
METHODS = service_methods(master_pb2.DESCRIPTOR.services_by_name["MasterService"])


@pytest.fixture(scope="module")
def tls_cluster(tls_certs: TlsCerts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    cl = TestCluster(tmp_path_factory.mktemp("tls-cluster"), clientds=2, region_size_bytes=64 * MiB,
                     master_options={"sweep_interval_s": 0.05}, tls=True, certs_dir=tls_certs.dir)
    cl.start()
    yield cl
    killed = cl.stop()
    _check_teardown(cl, killed)


def _lean_port(cl: TestCluster) -> int:
    assert cl.master is not None
    m = re.search(r"lean port (\d+)", cl.master.log_path.read_text())
    assert m, "the master logs its lean port"
    return int(m.group(1))


def _snapshot(cl: TestCluster) -> tuple[Any, ...]:
    """What an attack must not change: keys, segments, clients (ids, epochs), as an admin sees them."""
    st = cl.master_stat()
    keys = sorted((e.key, e.version) for e in cl.list_master_keys())
    segs = sorted((s.name, s.mounted, s.size_bytes, s.region_uuid) for s in st.segments)
    # the cluster's own daemons (a test's extra registration may expire meanwhile)
    clients = sorted((c.client_id, c.epoch, c.alive) for c in st.clients if c.name.startswith("clientd-"))
    return keys, segs, clients


def _client_of(cl: TestCluster, name: str) -> master_pb2.ClientInfo:
    return next(c for c in cl.master_stat().clients if c.name == name and c.alive)


def _attacks(cl: TestCluster) -> list[tuple[str, Any]]:
    """The calls of issue 19's attack list (and the client-bound calls of a hijack)."""
    victim = _client_of(cl, "clientd-0")
    seg = cl.master_stat().segments[0]
    return [
        ("Stat", master_pb2.StatRequest()),
        ("ListKeys", master_pb2.ListKeysRequest(page_size=100)),
        ("RemoveAll", master_pb2.RemoveAllRequest(force=True)),
        ("RemoveAll", master_pb2.RemoveAllRequest(pattern=".*", force=True)),
        ("UnmountSegment", master_pb2.UnmountSegmentRequest(name=seg.name)),
        ("RegisterClient", master_pb2.RegisterClientRequest(hostname="evil", name="clientd-0",
                                                            previous_client_id=victim.client_id)),
        ("MountSegment", master_pb2.MountSegmentRequest(name="fake", tier=common_pb2.CXL, size_bytes=PiB)),
        ("Heartbeat", master_pb2.HeartbeatRequest(client_id=victim.client_id, epoch=victim.epoch)),
        ("PutStart", master_pb2.PutStartRequest(
            client_id=victim.client_id, epoch=victim.epoch, keys=["sec/evil"], value_size_bytes=[4096])),
        ("ReleaseLeases", master_pb2.ReleaseLeasesRequest(client_id=victim.client_id, lease_ids=[1, 2, 3])),
    ]


def _grpc_call(cl: TestCluster, creds: Any, name: str, request: Any) -> Any:
    """Call ``name`` on the master with ``creds`` (``None``: plaintext); CxlkvError on failure."""
    ch = (grpc.secure_channel(cl.master_address, creds, options=[("grpc.enable_http_proxy", 0)])
          if creds is not None else grpc.insecure_channel(cl.master_address, options=[("grpc.enable_http_proxy", 0)]))
    try:
        return getattr(master_pb2_grpc.MasterServiceStub(ch), name)(request, timeout=5)
    except grpc.RpcError as exc:
        raise from_rpc_error(exc, target="master") from None
    finally:
        ch.close()


def _lean_call(cl: TestCluster, ctx: ssl.SSLContext | None, name: str, request: Any) -> Any:
    async def call() -> Any:
        ch = LeanChannel("127.0.0.1", _lean_port(cl), METHODS, ssl=ctx)
        try:
            return await ch.call(name, request, timeout=5)
        finally:
            ch.close()

    return asyncio.run(call())


def _no_cert_context(ca_file: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=ca_file)
    return ctx


# --------------------------------------------------------------------------- end to end


def test_tls_cluster_works_end_to_end(tls_cluster: TestCluster) -> None:
    """put through one clientd, get through the other; both links to the master are TLS."""
    with tls_cluster.client(0) as c0, tls_cluster.client(1) as c1:
        c0.put("sec/e2e", b"over mutual TLS")
        assert c1.get("sec/e2e") == b"over mutual TLS"
        c0.put_many({f"sec/e2e-{i}": bytes([i]) * 4096 for i in range(32)})
        got = c1.get_many([f"sec/e2e-{i}" for i in range(32)])
        assert [r.value for r in got] == [bytes([i]) * 4096 for i in range(32)]
        c1.remove("sec/e2e")  # a single-key removal is a member's call
        assert not c0.exists("sec/e2e")
        # a clientd's certificate is not an admin's: what its callers ask it to do
        # to the whole cluster is refused, with the reason
        with pytest.raises(PermissionDenied, match="RemoveAll needs an admin identity; 'clientd-0'"):
            c0.remove_all(force=True)
        with pytest.raises(PermissionDenied, match="ListKeys needs an admin identity"):
            list(c0.list("sec/"))
        assert c1.get("sec/e2e-3") == bytes([3]) * 4096
    for p in tls_cluster.clientds:
        assert "(mutual TLS)" in p.log_path.read_text(), "clientd's hot path is the lean link, over TLS"
    st = tls_cluster.assert_invariants()
    assert {c.name for c in st.clients if c.alive} == {"clientd-0", "clientd-1"}


# ------------------------------------------------------------------- outsiders get nothing


@pytest.mark.parametrize("who", ["plaintext", "no certificate", "rogue CA"])
def test_outsiders_get_nothing_and_change_nothing_grpc(tls_cluster: TestCluster, tls_certs: TlsCerts, who: str) -> None:
    with tls_cluster.client(0) as c:
        c.put(f"sec/outsider-grpc-{who}", b"keep me")
    before = _snapshot(tls_cluster)
    ca = tls_certs.files("admin").ca_file
    creds = {"plaintext": None,
             "no certificate": grpc.ssl_channel_credentials(root_certificates=Path(ca).read_bytes()),
             "rogue CA": grpc_channel_credentials(tls_certs.files("rogue"))}[who]
    for name, request in _attacks(tls_cluster):
        with pytest.raises(Unavailable) as exc:  # the handshake fails: no call reaches the master
            _grpc_call(tls_cluster, creds, name, request)
        if who == "plaintext":  # the error says what to fix, not only gRPC's "Socket closed"
            assert "if it serves TLS, this side must use TLS too" in exc.value.message, exc.value.message
    assert _snapshot(tls_cluster) == before


@pytest.mark.parametrize("who", ["plaintext", "no certificate", "rogue CA"])
def test_outsiders_get_nothing_and_change_nothing_lean(tls_cluster: TestCluster, tls_certs: TlsCerts, who: str) -> None:
    before = _snapshot(tls_cluster)
    ca = tls_certs.files("admin").ca_file
    ctx = {"plaintext": None, "no certificate": _no_cert_context(ca),
           "rogue CA": client_context(tls_certs.files("rogue"))}[who]
    for name, request in _attacks(tls_cluster):
        with pytest.raises(Unavailable):
            _lean_call(tls_cluster, ctx, name, request)
    assert _snapshot(tls_cluster) == before


def test_raw_bytes_on_the_tls_lean_port_get_no_answer(tls_cluster: TestCluster) -> None:
    """A plaintext lean frame on the TLS lean port: the connection closes with no frame answered."""
    from cxlkv.client.framing import HEADER, MIN_LENGTH

    payload = master_pb2.RemoveAllRequest(force=True).SerializeToString()
    number = next(m.number for m in METHODS if m.name == "RemoveAll")
    with socket.create_connection(("127.0.0.1", _lean_port(tls_cluster)), timeout=5) as s:
        s.sendall(HEADER.pack(MIN_LENGTH + len(payload), number, 0, 1) + payload)
        got = b""
        try:
            while chunk := s.recv(4096):
                got += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    # whatever came back is a TLS alert, never a lean answer frame for request id 1
    assert len(got) < 16 or HEADER.unpack_from(got)[3] != 1


def test_metrics_need_a_certificate(tls_cluster: TestCluster, tls_certs: TlsCerts) -> None:
    url = tls_cluster.master_stat().metrics_url
    assert url.startswith("https://127.0.0.1:")
    with pytest.raises(OSError):  # plain HTTP on a TLS port: no metrics
        urllib.request.urlopen(url.replace("https://", "http://"), timeout=5).read()
    with pytest.raises((ssl.SSLError, OSError)):  # TLS without a client certificate
        urllib.request.urlopen(url, timeout=5, context=_no_cert_context(tls_certs.files("admin").ca_file)).read()
    ctx = client_context(tls_certs.files("admin"))
    text = urllib.request.urlopen(url, timeout=5, context=ctx).read().decode()
    assert "cxlkv_master_" in text


# ------------------------------------------------------------------- members, by identity


@pytest.mark.parametrize("transport", ["grpc", "lean"])
def test_a_clientd_certificate_cannot_act_as_another(tls_cluster: TestCluster, tls_certs: TlsCerts,
                                                     transport: str) -> None:
    victim = _client_of(tls_cluster, "clientd-0")
    with tls_cluster.client(0) as c:
        c.put(f"sec/victim-{transport}", b"v")
    before = _snapshot(tls_cluster)
    other = tls_certs.files("clientd-2")  # a valid clientd certificate of this CA, not clientd-0's
    calls = [(n, r) for n, r in _attacks(tls_cluster)
             if n in ("RegisterClient", "Heartbeat", "PutStart", "ReleaseLeases")]
    calls += [
        ("PutEnd", master_pb2.PutEndRequest(client_id=victim.client_id, epoch=victim.epoch,
                                            keys=["sec/x"], put_tokens=[1])),
        ("Reserve", master_pb2.ReserveRequest(client_id=victim.client_id, epoch=victim.epoch,
                                              need_bytes=[4096], counts=[1])),
        ("GetReplicaList", master_pb2.GetReplicaListRequest(client_id=victim.client_id,
                                                            keys=[f"sec/victim-{transport}"])),
        ("ReleaseQuarantine", master_pb2.ReleaseQuarantineRequest(client_id=victim.client_id, epoch=victim.epoch,
                                                                  upto_epoch=victim.epoch)),
        ("ExchangeTasks", master_pb2.ExchangeTasksRequest(client_id=victim.client_id, epoch=victim.epoch)),
        ("MountSegment", master_pb2.MountSegmentRequest(client_id=victim.client_id, epoch=victim.epoch,
                                                        name="evil-dram", tier=common_pb2.DRAM, size_bytes=MiB)),
    ]
    for name, request in calls:
        with pytest.raises(PermissionDenied, match="belongs to 'clientd-0', not to 'clientd-2'"):
            if transport == "grpc":
                _grpc_call(tls_cluster, grpc_channel_credentials(other), name, request)
            else:
                _lean_call(tls_cluster, client_context(other), name, request)
    assert _snapshot(tls_cluster) == before
    # the real clientd-0 goes on, same registration, same epoch
    with tls_cluster.client(0) as c:
        assert c.get(f"sec/victim-{transport}") == b"v"
    assert _client_of(tls_cluster, "clientd-0").epoch == victim.epoch


def test_a_clientd_certificate_may_register_as_itself(tls_cluster: TestCluster, tls_certs: TlsCerts) -> None:
    """clientd-2's certificate registers its own client and heartbeats it; clientd-1's cannot touch it."""
    own = grpc_channel_credentials(tls_certs.files("clientd-2"))
    reg = _grpc_call(tls_cluster, own, "RegisterClient", master_pb2.RegisterClientRequest(hostname="h2", name="c2"))
    _grpc_call(tls_cluster, own, "Heartbeat", master_pb2.HeartbeatRequest(client_id=reg.client_id, epoch=reg.epoch))
    again = _grpc_call(tls_cluster, own, "RegisterClient", master_pb2.RegisterClientRequest(
        hostname="h2", name="c2", previous_client_id=reg.client_id))
    assert again.client_id == reg.client_id and again.epoch > reg.epoch
    with pytest.raises(PermissionDenied):
        _lean_call(tls_cluster, client_context(tls_certs.files("clientd-1")), "Heartbeat",
                   master_pb2.HeartbeatRequest(client_id=reg.client_id, epoch=again.epoch))


@pytest.mark.parametrize("transport", ["grpc", "lean"])
def test_a_non_admin_identity_cannot_call_admin_operations(tls_cluster: TestCluster, tls_certs: TlsCerts,
                                                           transport: str) -> None:
    with tls_cluster.client(0) as c:
        c.put(f"sec/admin-{transport}", b"stays")
    before = _snapshot(tls_cluster)
    member = tls_certs.files("clientd-1")
    seg = tls_cluster.master_stat().segments[0].name
    admin_calls = [
        ("RemoveAll", master_pb2.RemoveAllRequest(force=True)),
        ("RemoveAll", master_pb2.RemoveAllRequest(pattern="sec/.*", force=True)),
        ("UnmountSegment", master_pb2.UnmountSegmentRequest(name=seg)),
        ("ReleaseQuarantine", master_pb2.ReleaseQuarantineRequest(client_id="gone", writers_gone=True)),
        ("ListKeys", master_pb2.ListKeysRequest(page_size=100)),
        ("MountSegment", master_pb2.MountSegmentRequest(name="fake", tier=common_pb2.CXL, size_bytes=PiB)),
    ]

    def call(name: str, request: Any) -> Any:
        if transport == "grpc":
            return _grpc_call(tls_cluster, grpc_channel_credentials(member), name, request)
        return _lean_call(tls_cluster, client_context(member), name, request)

    for name, request in admin_calls:
        with pytest.raises(PermissionDenied, match="admin"):
            call(name, request)
    st = call("Stat", master_pb2.StatRequest())  # a member's Stat: counts, not the client table
    assert st.key_count == len(before[0]) and not st.clients and not st.metrics_url
    assert all(not s.region_uuid and not s.device_path for s in st.segments)
    assert _snapshot(tls_cluster) == before
    # the admin certificate may: its Stat is full, ListKeys answers
    full = tls_cluster.master_stat()
    assert full.clients and full.segments[0].region_uuid
    assert f"sec/admin-{transport}" in {e.key for e in tls_cluster.list_master_keys()}


def test_admin_identities_config_grants_the_role(tmp_path: Path, tls_certs: TlsCerts) -> None:
    """A CN listed in admin_identities is an admin without OU=admin (and others still are not)."""
    from master_harness import MasterProcess

    m = tls_certs.files("master")
    with MasterProcess(tmp_path, {"tls_ca_file": m.ca_file, "tls_cert_file": m.cert_file,
                                  "tls_key_file": m.key_file, "admin_identities": ["clientd-1"]},
                       ) as mp:
        ch = grpc.secure_channel(mp.address, grpc_channel_credentials(tls_certs.files("clientd-1")))
        stub = master_pb2_grpc.MasterServiceStub(ch)
        assert stub.ListKeys(master_pb2.ListKeysRequest(page_size=10), timeout=5).entries == []
        ch.close()
        ch = grpc.secure_channel(mp.address, grpc_channel_credentials(tls_certs.files("clientd-0")))
        with pytest.raises(grpc.RpcError) as err:
            master_pb2_grpc.MasterServiceStub(ch).ListKeys(master_pb2.ListKeysRequest(page_size=10), timeout=5)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        ch.close()


# ------------------------------------------------------------------------- safe defaults


def _cxlkv(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CXLKV_")}
    return subprocess.run([sys.executable, "-m", "cxlkv.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("kind,cfg,key", [
    ("master", {"listen_address": "0.0.0.0:0"}, "listen_address"),
    ("master", {"metrics_address": "0.0.0.0:0"}, "metrics_address"),
    ("master", {"lean_listen_address": "0.0.0.0:0"}, "lean_listen_address"),
    ("clientd", {"master_address": "192.0.2.1:50051", "regions": []}, "master_address"),
])
def test_non_loopback_without_tls_is_refused_at_start(tmp_path: Path, kind: str, cfg: dict[str, Any],
                                                      key: str) -> None:
    conf = tmp_path / f"{kind}.toml"
    conf.write_text(tomli_w.dumps(cfg))
    r = _cxlkv(kind, "--config", str(conf))
    assert r.returncode == 2, r
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and key in lines[0] and "not a loopback address" in lines[0], r.stderr
    assert "Traceback" not in r.stderr
    # the explicit switch for trusted networks
    conf.write_text(tomli_w.dumps({**cfg, "allow_insecure": True}))
    ok = _cxlkv("config", "check", str(conf), "--kind", kind)
    assert ok.returncode == 0, ok.stderr


def _other_local_address() -> str | None:
    """A non-loopback address of this host (a peer on the network dials it), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.254", 9))
            addr = s.getsockname()[0]
        except OSError:
            return None
    return None if addr.startswith("127.") or addr == "0.0.0.0" else addr


def test_default_configuration_refuses_the_network(cluster: TestCluster) -> None:
    """The default (plaintext) cluster listens on loopback only: from another address
    the attack list gets no connection at all, and nothing changes."""
    addr = _other_local_address()
    if addr is None:
        pytest.skip("this host has no non-loopback address to dial from")
    with cluster.client(0) as c:
        c.put("sec/default", b"x")
    before = _snapshot(cluster)
    port = int(cluster.master_address.rsplit(":", 1)[1])
    remote = f"{addr}:{port}"
    for name, request in _attacks(cluster):
        ch = grpc.insecure_channel(remote, options=[("grpc.enable_http_proxy", 0)])
        with pytest.raises(grpc.RpcError) as err:
            getattr(master_pb2_grpc.MasterServiceStub(ch), name)(request, timeout=3)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        ch.close()
    for p in (_lean_port(cluster), int(cluster.master_stat().metrics_url.rsplit(":", 1)[1].split("/")[0])):
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((addr, p), timeout=3).close()
    assert _snapshot(cluster) == before


# ----------------------------------------------------------------- certificate contents


def test_certificates_name_their_holder(tls_certs: TlsCerts) -> None:
    from cxlkv.wire.tls import _identity_from_pem

    admin = _identity_from_pem(Path(tls_certs.files("admin").cert_file).read_bytes())
    clientd = _identity_from_pem(Path(tls_certs.files("clientd-0").cert_file).read_bytes())
    assert admin == Identity("admin", frozenset({"admin"})) and admin.is_admin
    assert clientd == Identity("clientd-0", frozenset({"clientd"})) and not clientd.is_admin
    key_mode = os.stat(tls_certs.files("admin").key_file).st_mode & 0o777
    assert key_mode == 0o600


def test_partial_tls_configuration_is_refused(tmp_path: Path) -> None:
    conf = tmp_path / "master.toml"
    conf.write_text(tomli_w.dumps({"tls_cert_file": "/x.pem"}))
    r = _cxlkv("config", "check", str(conf), "--kind", "master")
    assert r.returncode == 2 and "tls_ca_file, tls_key_file not set" in r.stderr, r.stderr


def test_unreadable_certificate_is_one_line(tmp_path: Path, tls_certs: TlsCerts) -> None:
    m = tls_certs.files("master")
    conf = tmp_path / "master.toml"
    conf.write_text(tomli_w.dumps({"tls_ca_file": m.ca_file, "tls_cert_file": str(tmp_path / "missing.pem"),
                                   "tls_key_file": m.key_file, "listen_address": "127.0.0.1:0"}))
    r = _cxlkv("master", "--config", str(conf))
    assert r.returncode == 2, r
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "missing.pem" in lines[0], r.stderr


def _expired_certificate(tls_certs: TlsCerts, out: Path) -> tuple[str, str]:
    """An admin certificate signed by the cluster's CA that expired yesterday."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    ca_key = serialization.load_pem_private_key((tls_certs.dir / "ca-key.pem").read_bytes(), None)
    ca = x509.load_pem_x509_certificate((tls_certs.dir / "ca.pem").read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "old-admin"),
                                     x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "admin")]))
            .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=10)).not_valid_after(now - datetime.timedelta(days=1))
            .sign(ca_key, hashes.SHA256()))
    cert_path, key_path = out / "expired.pem", out / "expired-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)
    return str(cert_path), str(key_path)


def test_cli_bad_client_certificates_are_one_line(tls_cluster: TestCluster, tls_certs: TlsCerts,
                                                   tmp_path: Path) -> None:
    """``cxlkv status`` / ``cxlkv admin`` with a key that is not the certificate's, an
    expired certificate, a file that is no certificate, or another CA: one error line
    on stderr naming the cause, a non-zero exit, no gRPC C-core log lines."""
    admin, other = tls_certs.files("admin"), tls_certs.files("clientd-2")
    expired_cert, expired_key = _expired_certificate(tls_certs, tmp_path)
    cases = [
        ((admin.ca_file, admin.cert_file, other.key_file), "key values mismatch"),
        ((admin.ca_file, expired_cert, expired_key), "expired on"),
        ((admin.ca_file, str(tls_certs.dir / "ca-key.pem"), admin.key_file), "ca-key.pem"),
        ((str(tls_certs.rogue_dir / "ca.pem"), admin.cert_file, admin.key_file), "CERTIFICATE_VERIFY_FAILED"),
    ]
    env_had = os.environ.pop("GRPC_VERBOSITY", None)
    try:
        for (ca, cert, key), needle in cases:
            for cmd in (["status"], ["admin", "ls"]):
                r = _cxlkv(*cmd, "--master", tls_cluster.master_address, "--tls-ca", ca, "--tls-cert", cert,
                           "--tls-key", key)
                lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
                assert r.returncode != 0, (cmd, needle, r)
                assert len(lines) == 1 and needle in lines[0] and lines[0].startswith("error: "), (cmd, r.stderr)
                assert not r.stdout.strip(), r.stdout
    finally:
        if env_had is not None:
            os.environ["GRPC_VERBOSITY"] = env_had
    ok = _cxlkv("status", "--master", tls_cluster.master_address, "--tls-ca", admin.ca_file,
                "--tls-cert", admin.cert_file, "--tls-key", admin.key_file)
    assert ok.returncode == 0 and not ok.stderr.strip(), ok.stderr


@pytest.mark.parametrize("kind", ["master", "clientd"])
def test_daemon_with_an_expired_certificate_refuses_to_start(tmp_path: Path, tls_certs: TlsCerts,
                                                             kind: str) -> None:
    """An expired certificate stops master and clientd at start, in one line (exit 2):
    a clientd used to wait for its master forever on "Socket closed" (the master
    refuses the handshake without a reason the client sees)."""
    cert, key = _expired_certificate(tls_certs, tmp_path)
    tls = {"tls_ca_file": str(tls_certs.dir / "ca.pem"), "tls_cert_file": cert, "tls_key_file": key}
    if kind == "master":
        cfg: dict[str, Any] = {"listen_address": "127.0.0.1:0", **tls}
    else:
        cfg = {"name": "c-exp", "master_address": "127.0.0.1:1", "socket_path": str(tmp_path / "c.sock"),
               "regions": [{"segment": "cxl0", "path": str(tmp_path / "missing-region")}], **tls}
    conf = tmp_path / f"{kind}.toml"
    conf.write_text(tomli_w.dumps(cfg))
    r = _cxlkv(kind, "--config", str(conf), timeout=30)
    assert r.returncode == 2, r
    lines = [ln for ln in (r.stderr + r.stdout).splitlines() if ln.strip()]
    assert len(lines) == 1 and "expired on" in lines[0] and cert in lines[0], r


# ------------------------------------------------------------------ the state machine


def test_authorizer_binds_client_ids_and_guards_admin_calls() -> None:
    """The decisions alone, without a network: bind at registration, refuse others, admins by OU or name."""
    from master.auth import Authorizer

    auth = Authorizer(admin_names=["ops-bot"])
    a, b = Identity("host-a", frozenset({"clientd"})), Identity("host-b", frozenset({"clientd"}))
    admin, bot = Identity("alice", frozenset({"admin"})), Identity("ops-bot")
    auth.check("RegisterClient", master_pb2.RegisterClientRequest(name="x"), a)
    auth.registered("m-1", a, ["m-1"])
    assert auth.owner("m-1") == "host-a"
    hb = master_pb2.HeartbeatRequest(client_id="m-1", epoch=1)
    auth.check("Heartbeat", hb, a)
    for name, req in (("Heartbeat", hb), ("RegisterClient", master_pb2.RegisterClientRequest(previous_client_id="m-1")),
                      ("ReleaseLeases", master_pb2.ReleaseLeasesRequest(client_id="m-1"))):
        with pytest.raises(PermissionDenied, match="belongs to 'host-a', not to 'host-b'"):
            auth.check(name, req, b)
    with pytest.raises(PermissionDenied, match="no client certificate"):
        auth.check("Stat", master_pb2.StatRequest(), None)
    for who in (a, b):
        with pytest.raises(PermissionDenied, match="needs an admin identity"):
            auth.check("RemoveAll", master_pb2.RemoveAllRequest(), who)
        assert not auth.full_stat(who)
    for who in (admin, bot):
        auth.check("RemoveAll", master_pb2.RemoveAllRequest(), who)
        assert auth.full_stat(who)
    # a clientd mounts its own DRAM tier, never a shared segment
    auth.check("MountSegment", master_pb2.MountSegmentRequest(client_id="m-1", tier=common_pb2.DRAM), a)
    with pytest.raises(PermissionDenied, match="own DRAM tier only"):
        auth.check("MountSegment", master_pb2.MountSegmentRequest(client_id="m-1", tier=common_pb2.CXL), a)
    # an id no certificate bound here (the master restarted) is not taken over: registered afresh
    claim = master_pb2.RegisterClientRequest(previous_client_id="m-restarted")
    auth.check("RegisterClient", claim, b)
    assert claim.previous_client_id == ""
    # bindings of clients long gone are forgotten once they outnumber the live ones
    for i in range(200):
        auth.registered(f"old-{i}", a, ["m-1", f"old-{i}"])
    assert auth.owner("old-0") is None and auth.owner("m-1") == "host-a"


def test_cluster_up_tls_cli(tmp_path: Path) -> None:
    """`cxlkv cluster up --tls`: generated certificates, put/get through clientd, admin calls with the
    printed admin identity only."""
    run_dir = tmp_path / "run"
    up = _cxlkv("cluster", "up", "--tls", "--run-dir", str(run_dir), "--clientds", "1", "--region-size", "64MiB")
    try:
        assert up.returncode == 0, up.stderr
        exports = dict(re.findall(r"(CXLKV_TLS_\w+)=(\S+)", up.stdout))
        assert set(exports) == {"CXLKV_TLS_CA", "CXLKV_TLS_CERT", "CXLKV_TLS_KEY"}, up.stdout
        master = re.search(r"^master\s+(\S+)", up.stdout, re.M).group(1)  # type: ignore[union-attr]
        sock = str(run_dir / "clientd-0.sock")
        value = tmp_path / "v"
        value.write_bytes(b"tls cluster")
        env = {k: v for k, v in os.environ.items() if not k.startswith("CXLKV_")}

        def cli(*args: str, extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "cxlkv.cli", *args], capture_output=True, text=True,
                                  timeout=60, env={**env, **(extra or {})}, stdin=subprocess.DEVNULL)

        assert cli("put", "--socket", sock, "sec/cli", str(value)).returncode == 0
        got = cli("get", "--socket", sock, "sec/cli")
        assert got.returncode == 0 and got.stdout == "tls cluster", got
        listed = cli("admin", "ls", "--master", master, extra=exports)
        assert listed.returncode == 0 and listed.stdout.startswith("sec/cli\t"), listed
        plain = cli("admin", "remove-all", "--master", master)  # no certificate: no call
        assert plain.returncode == 10 + 12 and "UNAVAILABLE" in plain.stderr, plain
        certs = Path(exports["CXLKV_TLS_CA"]).parent
        member = cli("admin", "remove-all", "--master", master, extra={
            **exports, "CXLKV_TLS_CERT": str(certs / "clientd-0.pem"), "CXLKV_TLS_KEY": str(certs / "clientd-0-key.pem")})
        assert member.returncode == 10 + 17 and "PERMISSION_DENIED" in member.stderr, member
        assert cli("get", "--socket", sock, "sec/cli").stdout == "tls cluster"
        status = cli("status", "--master", master, "--json", extra=exports)
        assert status.returncode == 0, status.stderr
        assert '"clientd-0"' in status.stdout  # the admin's Stat has the client table
    finally:
        down = _cxlkv("cluster", "down", "--run-dir", str(run_dir))
        assert down.returncode == 0, down.stderr


def test_tls_master_on_the_network_refuses_peers_without_a_certificate(tmp_path: Path, tls_certs: TlsCerts) -> None:
    """With TLS a master may listen on every address; a peer dialling its network
    address without a certificate (or with a foreign one) is refused, gRPC and lean,
    and one with the cluster's certificate gets through."""
    from master_harness import MasterProcess

    addr = _other_local_address()
    if addr is None:
        pytest.skip("this host has no non-loopback address to dial from")

    class WideMaster(MasterProcess):
        def argv(self) -> list[str]:
            return [sys.executable, "-m", "cxlkv.cli", "master", "--config", str(self.config_path),
                    "--listen", "0.0.0.0:0", "--address-file", str(self.address_file)]

    m = tls_certs.files("master")
    with WideMaster(tmp_path, {"tls_ca_file": m.ca_file, "tls_cert_file": m.cert_file, "tls_key_file": m.key_file,
                               "lean_listen_address": "0.0.0.0:0"}) as mp:
        port = int(mp.address.rsplit(":", 1)[1])
        lean_port = int(re.search(r"lean port (\d+)", mp.log()).group(1))  # type: ignore[union-attr]
        remote = f"{addr}:{port}"
        # the master's certificate names localhost: a member dialling the address overrides the name checked
        name = [("grpc.ssl_target_name_override", "localhost"), ("grpc.enable_http_proxy", 0)]
        ca = Path(m.ca_file).read_bytes()
        for creds in (None, grpc.ssl_channel_credentials(root_certificates=ca),
                      grpc_channel_credentials(tls_certs.files("rogue"))):
            ch = (grpc.secure_channel(remote, creds, options=name) if creds is not None
                  else grpc.insecure_channel(remote, options=name))
            with pytest.raises(grpc.RpcError) as err:
                master_pb2_grpc.MasterServiceStub(ch).RemoveAll(master_pb2.RemoveAllRequest(force=True), timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            ch.close()

        async def lean(ctx: ssl.SSLContext | None) -> Any:
            ch = LeanChannel(addr, lean_port, METHODS, ssl=ctx)
            try:
                return await ch.call("Stat", master_pb2.StatRequest(), timeout=5)
            finally:
                ch.close()

        for ctx in (None, _no_cert_context(m.ca_file), client_context(tls_certs.files("rogue"))):
            if ctx is not None:
                ctx.check_hostname = False  # dialled by address; the refusal must come from the client certificate
            with pytest.raises(Unavailable):
                asyncio.run(lean(ctx))
        ch = grpc.secure_channel(remote, grpc_channel_credentials(tls_certs.files("admin")), options=name)
        st = master_pb2_grpc.MasterServiceStub(ch).Stat(master_pb2.StatRequest(), timeout=5)
        assert st.key_count == 0 and not st.clients
        ch.close()


def test_clientds_re_register_over_tls_after_a_master_restart(make_cluster, tls_certs: TlsCerts) -> None:
    """A restarted master knows no bindings: each clientd re-registers under a fresh id bound to its
    own certificate, and the cluster serves again."""
    cl = make_cluster(clientds=2, tls=True, certs_dir=tls_certs.dir,
                      master_options={"client_ttl_s": 3, "heartbeat_interval_s": 0.2})
    before = {c.name: c.client_id for c in cl.master_stat().clients}
    cl.restart_master()

    def both_back() -> bool:
        return {c.name for c in cl.master_stat().clients if c.alive} == {"clientd-0", "clientd-1"}

    cl.wait_until(both_back, 30, "both clientds to re-register")
    after = {c.name: c.client_id for c in cl.master_stat().clients}
    assert all(after[n] != before[n] for n in before), (before, after)
    with cl.client(0) as c0, cl.client(1) as c1:
        c0.put("sec/after-restart", b"back")
        assert c1.get("sec/after-restart") == b"back"
