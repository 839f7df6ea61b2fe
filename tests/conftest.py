"""Shared fixtures: real clusters (a master and clientd processes on /dev/shm regions).

* ``cluster``: a fresh :class:`TestCluster` per test (64 MiB region, 2 clientds);
  use it for tests that kill or restart processes.
* ``module_cluster``: one cluster per test module, for tests that do not disturb
  each other (use distinct key prefixes).
* ``make_cluster``: a factory for clusters with other options (region size,
  ``master_options`` such as a short ``client_ttl_s``, ``clientd_options``).
* ``tls_certs``: one CA and the certificates of a TLS cluster (``master``,
  ``clientd-0..2``, ``admin``) plus a certificate of another CA (``rogue``), made
  once per session; a TLS cluster is ``TestCluster(..., tls=True,
  certs_dir=tls_certs.dir)``, and ``master_stub(identity)`` calls as any of them.

Teardown fails the test if a process had to be killed, is still running, a
clientd logged a traceback (the daemon must never crash on bad input), or a
region or shared-buffer file of this test was left in /dev/shm.
"""

from __future__ import annotations

import glob
import os
import signal
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

import grpc
import pytest

from cxlkv.deploy.cluster import LocalCluster, ManagedProcess, wait_for_file
from cxlkv.errors import from_rpc_error
from cxlkv.v1 import master_pb2, master_pb2_grpc

MiB = 1 << 20


class TestCluster(LocalCluster):
    """A :class:`LocalCluster` with helpers for tests."""

    __test__ = False  # not a test class for pytest

    _channel: grpc.Channel | None = None
    _tls_channels: dict[str, grpc.Channel] | None = None

    def client(self, i: int = 0, **kwargs: Any):
        """A :class:`cxlkv.Client` of clientd ``i`` (close it, or use ``with``)."""
        from cxlkv import Client

        return Client(self.socket_path(i), **kwargs)

    def master_stub(self, identity: str = "admin") -> master_pb2_grpc.MasterServiceStub:
        """A gRPC stub on the master (channel reused; reset after a master restart).

        On a TLS cluster the channel presents ``identity``'s certificate
        (``admin`` by default); plaintext clusters ignore it."""
        if self.tls:
            from cxlkv.wire.tls import grpc_channel_credentials

            chans = self._tls_channels = self._tls_channels or {}
            if identity not in chans:
                chans[identity] = grpc.secure_channel(self.master_address,
                                                      grpc_channel_credentials(self.tls_files(identity)),
                                                      options=[("grpc.enable_http_proxy", 0)])
            return master_pb2_grpc.MasterServiceStub(chans[identity])
        if self._channel is None:
            self._channel = grpc.insecure_channel(self.master_address, options=[("grpc.enable_http_proxy", 0)])
        return master_pb2_grpc.MasterServiceStub(self._channel)

    def master_stat(self, check_invariants: bool = True) -> master_pb2.StatResponse:
        """The master's Stat (with its from-scratch accounting check by default)."""
        try:
            return self.master_stub().Stat(master_pb2.StatRequest(check_invariants=check_invariants), timeout=10)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, target="master") from None

    def list_master_keys(self) -> list[master_pb2.KeyEntry]:
        """Every committed key, from the master."""
        out: list[master_pb2.KeyEntry] = []
        token = ""
        while True:
            r = self.master_stub().ListKeys(master_pb2.ListKeysRequest(page_size=10_000, page_token=token), timeout=10)
            out.extend(r.entries)
            token = r.next_page_token
            if not token:
                return out

    def assert_invariants(self, *, processing: int | None = 0) -> master_pb2.StatResponse:
        """Space accounting is exact: the master's own check passes, used bytes equal
        the sum of the live extents of the listed keys, and (by default) no put is
        left PROCESSING.
        """
        st = self.master_stat()
        assert st.invariant_violation == "", st.invariant_violation
        if processing is not None:
            assert st.processing_count == processing, st
        if st.processing_count == 0 and st.lease_count == 0:
            entries = self.list_master_keys()
            assert len(entries) == st.key_count
            assert st.used_bytes == sum(s.used_bytes for s in st.segments if s.mounted)
        return st

    def wait_until(self, predicate: Callable[[], bool], timeout_s: float = 20.0, what: str = "condition") -> None:
        """Poll ``predicate`` every 50 ms until true, else fail."""
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
            time.sleep(0.05)

    def restart_master(self) -> None:
        """Stop the master and start a fresh one (empty state, new master_id) on the same address."""
        self.stop_master()
        self.start_master_again()

    def stop_master(self) -> None:
        """Stop the master (SIGTERM, then SIGKILL) and forget its channel."""
        assert self.master is not None
        self.master.stop()
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        for ch in (self._tls_channels or {}).values():
            ch.close()
        self._tls_channels = None

    def start_master_again(self) -> float:
        """Start a fresh master (empty state, new master_id) on the address of the stopped one.

        Returns:
            When it started serving: the wall-clock time (``time.time()``) its
            address file was written, which it does once serving.
        """
        assert self.master is not None
        conf = self.run_dir / "master.toml"
        import tomllib

        import tomli_w

        cfg = tomllib.loads(conf.read_text())
        cfg["listen_address"] = self.master_address
        conf.write_text(tomli_w.dumps(cfg))
        address_file = self.run_dir / "master.address"
        address_file.unlink(missing_ok=True)
        self.master = ManagedProcess(self.master.name, self.master.argv, self.master.log_path)
        self.master.start()
        wait_for_file(address_file, self.start_timeout_s, self.master)
        assert address_file.read_text().strip() == self.master_address
        return address_file.stat().st_mtime

    def kill_clientd(self, i: int) -> None:
        """SIGKILL clientd ``i`` (a host crash) and reap it."""
        p = self.clientds[i]
        p.signal(signal.SIGKILL)
        assert p.proc is not None
        p.proc.wait(10)

    def stop(self, timeout_s: float = 10.0) -> list[str]:
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        for ch in (self._tls_channels or {}).values():
            ch.close()
        self._tls_channels = None
        return super().stop(timeout_s)


def _check_teardown(cl: TestCluster, killed: list[str]) -> None:
    problems: list[str] = []
    if killed:
        problems.append(f"processes had to be killed: {killed}")
        for p in [*cl.masters, cl.master, *cl.clientds]:  # their stacks, dumped on SIGUSR1 before the kill
            if p is not None and p.name in killed:
                problems.append(f"{p.name}'s log ends:\n{p.log_tail(80)}")
                killed = [k for k in killed if k != p.name]
    for p in [cl.master, *cl.clientds]:
        if p is not None and p.alive():
            problems.append(f"{p.name} (pid {p.pid}) still running")
            p.signal(signal.SIGKILL)
    for p in [*cl.masters, *cl.clientds]:  # a stop step that overran its bound (runtime/stopping.py): shown, not failed
        text = p.log_path.read_text(errors="replace") if p.log_path.exists() else ""
        slow = [ln for ln in text.splitlines() if "did not finish within" in ln or "did not exit within" in ln]
        if slow:
            warnings.warn(f"{p.name} stopped slowly: {slow[:3]}; log {p.log_path}", stacklevel=1)
    for p in cl.clientds:
        text = p.log_path.read_text(errors="replace") if p.log_path.exists() else ""
        if "Traceback" in text:
            problems.append(f"{p.name} logged a traceback:\n{text[-3000:]}")
    left = [path for path in cl.region_paths if os.path.exists(path)]
    if left:
        problems.append(f"region files left: {left}")
    bufs = glob.glob(f"/dev/shm/cxlkv-buf-{os.getpid()}-*")
    if bufs:
        problems.append(f"shared-buffer files left: {bufs}")
    if problems:
        pytest.fail("cluster teardown: " + "; ".join(problems))


@pytest.fixture()
def make_cluster(tmp_path: Path) -> Iterator[Callable[..., TestCluster]]:
    """Factory: ``make_cluster(clientds=2, region_size_bytes=64 MiB, master_options=…, …)``."""
    made: list[TestCluster] = []

    def make(**kwargs: Any) -> TestCluster:
        run_dir = tmp_path / f"cluster{len(made)}"
        kwargs.setdefault("clientds", 2)
        kwargs.setdefault("region_size_bytes", 64 * MiB)
        master_options = {"sweep_interval_s": 0.05}
        master_options.update(kwargs.pop("master_options", None) or {})
        cl = TestCluster(run_dir, master_options=master_options, **kwargs)
        made.append(cl)
        cl.start()
        return cl

    yield make
    for cl in made:
        killed = cl.stop()
        _check_teardown(cl, killed)


@pytest.fixture()
def cluster(make_cluster: Callable[..., TestCluster]) -> TestCluster:
    """A fresh cluster: one master, two clientds, one 64 MiB region."""
    return make_cluster()


@pytest.fixture(scope="module")
def module_cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    """One cluster (master + 2 clientds, 64 MiB region) shared by a test module.

    A module may set ``CLUSTER_OPTIONS = {...}`` (LocalCluster keyword arguments)
    to change it, e.g. a larger ``region_size_bytes``.
    """
    opts: dict[str, Any] = {"clientds": 2, "region_size_bytes": 64 * MiB}
    opts.update(getattr(request.module, "CLUSTER_OPTIONS", {}))
    master_options = {"sweep_interval_s": 0.05}
    master_options.update(opts.pop("master_options", None) or {})
    cl = TestCluster(tmp_path_factory.mktemp("cluster"), master_options=master_options, **opts)
    cl.start()
    yield cl
    killed = cl.stop()
    _check_teardown(cl, killed)


class TlsCerts:
    """Certificates made once per session (:func:`tls_certs`).

    Attributes:
        dir: the directory: ``ca.pem``, ``ca-key.pem``, ``NAME.pem``/``NAME-key.pem``
            for ``master``, ``clientd-0``, ``clientd-1``, ``clientd-2``, ``admin``.
        rogue_dir: another CA's ``ca.pem`` and its ``rogue.pem``/``rogue-key.pem``
            (CN clientd-0, OU admin: a look-alike the cluster must refuse).
    """

    def __init__(self, base: Path) -> None:
        from cxlkv.deploy.certs import issue, local_cluster_certs, make_ca

        self.dir = base / "ca"
        local_cluster_certs(self.dir, ["clientd-0", "clientd-1", "clientd-2"])
        self.rogue_dir = base / "rogue"
        rogue_ca = make_ca(self.rogue_dir, name="rogue-ca")
        cert, key = issue(rogue_ca, self.rogue_dir, "clientd-0", roles=["admin"], hosts=["localhost"])
        Path(cert).rename(self.rogue_dir / "rogue.pem")
        Path(key).rename(self.rogue_dir / "rogue-key.pem")

    def files(self, name: str) -> Any:
        """:class:`cxlkv.wire.tls.TlsFiles` of ``name`` (``rogue``: the other CA's)."""
        from cxlkv.wire.tls import TlsFiles

        if name == "rogue":
            d = self.rogue_dir
            return TlsFiles(str(self.dir / "ca.pem"), str(d / "rogue.pem"), str(d / "rogue-key.pem"))
        return TlsFiles(str(self.dir / "ca.pem"), str(self.dir / f"{name}.pem"), str(self.dir / f"{name}-key.pem"))


@pytest.fixture(scope="session")
def tls_certs(tmp_path_factory: pytest.TempPathFactory) -> TlsCerts:
    """A CA with the certificates of a TLS test cluster, and a rogue CA's look-alike."""
    return TlsCerts(tmp_path_factory.mktemp("certs"))


@pytest.fixture()
def region_cfg() -> Iterator[tuple[str, Any]]:
    """``(path, MasterConfig)`` for in-process master tests: a formatted 16 MiB region
    file in /dev/shm (segment ``cxl0``, index for 4,096 objects), deleted afterwards.
    (Here, not in a tests/master/conftest.py: a second ``conftest`` module would shadow
    this one for the tests that ``from conftest import TestCluster``.)"""
    import uuid

    from cxlkv.config import MasterConfig, SegmentConfig
    from cxlkv.layout.region import format_region
    from cxlkv.transport import Region

    path = f"/dev/shm/cxlkv-test-master-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    size = 16 * MiB
    with Region.open(path, size=size, create=True) as r:
        format_region(r, "cxl0", expected_objects=4096)
    cfg = MasterConfig(listen_address="127.0.0.1:0", metrics_address="", lean_listen_address="off",
                       segments=[SegmentConfig(name="cxl0", size_bytes=size, path=path)], owner_lease_ttl_s=1.0)
    yield path, cfg
    if os.path.exists(path):
        os.unlink(path)
