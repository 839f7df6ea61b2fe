"""A local multi-process cluster: one master and N clientds on emulated CXL regions.

Used by ``cxlkv cluster up|down|status``, ``cxlkv replay --embedded``, the
benchmarks and the test suite (the way dask's ``gen_cluster`` starts real
processes). Everything a cluster owns lives in one run directory: configs,
logs, sockets, the address file; its regions are files in ``/dev/shm`` (each one
standing for a CXL device mapped by every host) and are deleted on stop.

Processes are real: ``python -m cxlkv.cli master|clientd --config FILE``. Stop
escalates SIGTERM → SIGKILL and reports any process that had to be killed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import tomli_w

from cxlkv.errors import CxlkvError
from cxlkv.runtime.procs import process_start_time

__all__ = ["ClusterError", "ManagedProcess", "LocalCluster", "wait_for_file"]

MiB = 1 << 20


class ClusterError(CxlkvError):
    """A local cluster process failed to start or stop; the message has its log tail."""


def _log_tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


@dataclass
class ManagedProcess:
    """One daemon subprocess with its log file.

    Attributes:
        name: e.g. ``"master"`` or ``"clientd-0"``.
        argv: the command line.
        log_path: stdout and stderr go here.
        proc: the running process (``None`` before :meth:`start`).
    """

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None

    def start(self) -> None:
        """Start the process, appending to its log (stdin closed, own process group)."""
        env = dict(os.environ)
        env.update(self.env)
        env["PYTHONUNBUFFERED"] = "1"
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=env, start_new_session=True,
            )
        finally:
            log.close()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        """Whether the process is running."""
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        """Send ``sig`` (e.g. ``signal.SIGKILL`` to simulate a crash)."""
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(sig)

    def stop(self, timeout_s: float = 10.0) -> tuple[int | None, bool]:
        """SIGTERM, wait up to ``timeout_s``, then SIGUSR1 (the daemon writes its
        threads' stacks to its log: cxlkv/runtime/logs.py) and SIGKILL.

        Returns:
            (exit code, whether SIGKILL was needed).
        """
        if self.proc is None:
            return None, False
        if self.proc.poll() is not None:
            return self.proc.returncode, False
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s), False
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGUSR1)
            try:
                return self.proc.wait(1.0), True  # it stopped meanwhile: still report the slow stop
            except subprocess.TimeoutExpired:
                pass
            self.proc.kill()
            return self.proc.wait(5.0), True

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the log."""
        return _log_tail(self.log_path, lines)


def wait_for_file(path: Path, timeout_s: float, proc: ManagedProcess | None = None) -> None:
    """Wait until ``path`` exists.

    Raises:
        ClusterError: ``proc`` exited first or the timeout passed (with its log tail).
    """
    deadline = time.monotonic() + timeout_s
    delay = 0.005
    while not path.exists():
        if proc is not None and not proc.alive():
            raise ClusterError(
                f"{proc.name} exited with code {proc.proc.returncode if proc.proc else '?'} "
                f"before it was ready; log {proc.log_path}:\n{proc.log_tail()}"
            )
        if time.monotonic() > deadline:
            tail = f"; log {proc.log_path}:\n{proc.log_tail()}" if proc else ""
            raise ClusterError(f"timed out after {timeout_s:.0f} s waiting for {path}{tail}")
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


class LocalCluster:
    """A master and ``clientds`` clientd processes sharing emulated CXL regions.

    Args:
        run_dir: directory for configs, logs, sockets and ``cluster.json``.
        clientds: number of clientd processes (each stands for one host).
        region_size_bytes: size of each emulated region (header included).
        segments: number of CXL regions (segments ``cxl0``, ``cxl1`` …).
        region_dir: where region files live (``/dev/shm``: memory, like CXL).
        master_options: extra MasterConfig keys (e.g. ``{"lease_ttl_s": 1}``).
        clientd_options: extra ClientdConfig keys for every clientd.
        python: interpreter for the daemons.
        ssd_size_bytes: size of an SSD tier (segment ``ssd0``: a file in
            ``ssd_dir``, opened by every clientd with pread/pwrite); 0 = none.
        ssd_dir: where the SSD tier file lives (default: the run directory, on disk).
        tls: generate a CA and certificates in ``<run_dir>/certs``
            (:func:`cxlkv.deploy.certs.local_cluster_certs`: ``master``, ``clientd-<i>``
            each, ``admin``) and run every link to the master over mutual TLS;
            :meth:`tls_files` names the files of each identity.
        index_objects: objects to size each region's committed-object index for
            (``None``: the default, one per 16 KiB of region; cxlkv.layout.index).
        certs_dir: with ``tls``, use the certificates already in this directory
            (the same file names) instead of generating them.
        masters: number of masters; more than one starts a local etcd (the
            ``etcd`` binary of Debian's ``etcd-server``) and runs the masters
            with leader election (docs/ha.md): clientds get every master's
            address, ``master_address``/``master`` name the leader at start.

    Raises:
        InvalidArgument: a negative number of clientds (0 starts the master
            alone), or fewer than one segment.

    Every daemon serves Prometheus /metrics on a free port of 127.0.0.1 (its URL
    is in the master's Stat and in each log; ``cxlkv status`` shows them); pass
    ``{"metrics_address": ""}`` in the options to turn that off.

    Use as a context manager, or call :meth:`start` / :meth:`stop`. Not thread-safe.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        clientds: int = 2,
        region_size_bytes: int = 64 * MiB,
        segments: int = 1,
        region_dir: str = "/dev/shm",
        master_options: Mapping[str, Any] | None = None,
        clientd_options: Mapping[str, Any] | None = None,
        python: str = sys.executable,
        start_timeout_s: float = 30.0,
        ssd_size_bytes: int = 0,
        ssd_dir: str | None = None,
        tls: bool = False,
        index_objects: int | None = None,
        certs_dir: str | os.PathLike[str] | None = None,
        masters: int = 1,
    ) -> None:
        if clientds < 0 or segments < 1:
            from cxlkv.errors import InvalidArgument

            raise InvalidArgument(f"a local cluster needs clientds >= 0 and at least one segment, "
                                  f"got {clientds} and {segments}")
        self.run_dir = Path(run_dir).resolve()
        self.n_clientds = clientds
        self.region_size_bytes = int(region_size_bytes)
        self.n_segments = segments
        self.region_dir = Path(region_dir)
        self.master_options = dict(master_options or {})
        self.clientd_options = dict(clientd_options or {})
        self.python = python
        self.start_timeout_s = start_timeout_s
        self.cluster_id = uuid.uuid4().hex[:8]
        self.master: ManagedProcess | None = None
        self.n_masters = max(1, int(masters))
        #: Every master process (one without election); ``master`` is the leader at start.
        self.masters: list[ManagedProcess] = []
        #: gRPC address of each master of ``masters`` (fixed ports with election).
        self.master_addresses: list[str] = []
        #: The local etcd (``masters > 1``), its client endpoint and data directory.
        self.etcd: ManagedProcess | None = None
        self.etcd_endpoint = ""
        self.etcd_prefix = f"/cxlkv/{self.cluster_id}"
        self.clientds: list[ManagedProcess] = []
        self.master_address = ""
        self.region_paths = [
            str(self.region_dir / f"cxlkv-{self.cluster_id}-cxl{i}") for i in range(segments)
        ]
        self.tls = tls
        self.index_objects = index_objects
        #: Where the certificates are (``tls``), else "".
        self.certs_dir = (str(certs_dir or self.run_dir / "certs")) if tls else ""
        self._make_certs = tls and certs_dir is None
        self.ssd_size_bytes = int(ssd_size_bytes)
        self.ssd_path = (str(Path(ssd_dir or self.run_dir) / f"cxlkv-{self.cluster_id}-ssd0")
                         if ssd_size_bytes else "")

    # -- paths --------------------------------------------------------------
    def socket_path(self, i: int) -> str:
        """gRPC Unix socket of clientd ``i``."""
        return str(self.run_dir / f"clientd-{i}.sock")

    def lean_socket_path(self, i: int) -> str:
        """Lean-framing Unix socket of clientd ``i``."""
        return self.socket_path(i) + ".lean"

    def tls_files(self, name: str) -> Any:
        """The :class:`cxlkv.wire.tls.TlsFiles` of identity ``name`` (``master``,
        ``clientd-<i>``, ``admin``) of a ``tls`` cluster."""
        from cxlkv.wire.tls import TlsFiles

        d = Path(self.certs_dir)
        return TlsFiles(str(d / "ca.pem"), str(d / f"{name}.pem"), str(d / f"{name}-key.pem"))

    def _tls_options(self, name: str) -> dict[str, str]:
        if not self.tls:
            return {}
        f = self.tls_files(name)
        return {"tls_ca_file": f.ca_file, "tls_cert_file": f.cert_file, "tls_key_file": f.key_file}

    @property
    def socket_paths(self) -> list[str]:
        return [self.socket_path(i) for i in range(self.n_clientds)]

    # -- lifecycle ----------------------------------------------------------
    def __enter__(self) -> "LocalCluster":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> "LocalCluster":
        """Format the regions, start the master, then every clientd; wait until ready.

        Raises:
            ClusterError: a process exited or did not become ready (log tail included).
        """
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._format_regions()
            if self._make_certs:
                from cxlkv.deploy.certs import local_cluster_certs

                local_cluster_certs(self.certs_dir, [f"clientd-{i}" for i in range(self.n_clientds)])
            if self.n_masters > 1:
                self._start_etcd()
                self._start_masters()
            else:
                self._start_master()
            for i in range(self.n_clientds):
                self.clientds.append(self._make_clientd(i))
            for i, p in enumerate(self.clientds):
                p.start()
            for i, p in enumerate(self.clientds):
                wait_for_file(self.run_dir / f"clientd-{i}.ready", self.start_timeout_s, p)
            self._write_state()
        except BaseException:
            self.stop()
            raise
        return self

    def _format_regions(self) -> None:
        from cxlkv.layout.region import format_region
        from cxlkv.transport import Region

        for i, path in enumerate(self.region_paths):
            with Region.open(path, size=self.region_size_bytes, create=True) as region:
                format_region(region, f"cxl{i}", expected_objects=self.index_objects)
        if self.ssd_path:
            from cxlkv.clientd.tiers import FileRegion

            with FileRegion.open(self.ssd_path, size=self.ssd_size_bytes, create=True) as ssd:
                format_region(ssd, "ssd0", index=False)  # type: ignore[arg-type]  # read through clientd

    def _start_master(self) -> None:
        address_file = self.run_dir / "master.address"
        address_file.unlink(missing_ok=True)
        cfg: dict[str, Any] = {
            "listen_address": "127.0.0.1:0",
            "address_file": str(address_file),
            # clientds and direct-mode writers of this host reach it there (not with TLS)
            "lean_socket_path": str(self.run_dir / "master.lean"),
            "metrics_address": "127.0.0.1:0",
            "segments": [
                {"name": f"cxl{i}", "size_bytes": self.region_size_bytes, "path": p}
                for i, p in enumerate(self.region_paths)
            ] + ([{"name": "ssd0", "size_bytes": self.ssd_size_bytes, "path": self.ssd_path, "tier": "ssd"}]
                 if self.ssd_path else []),
        }
        cfg.update(self._tls_options("master"))
        cfg.update(self.master_options)
        conf = self.run_dir / "master.toml"
        conf.write_text(tomli_w.dumps(cfg))
        self.master = ManagedProcess(
            "master", [self.python, "-m", "cxlkv.cli", "master", "--config", str(conf)],
            self.run_dir / "master.log",
        )
        self.master.start()
        wait_for_file(address_file, self.start_timeout_s, self.master)
        self.master_address = address_file.read_text().strip()

    # -- several masters on etcd (docs/ha.md) ---------------------------------
    def _etcd_process(self) -> ManagedProcess:
        import shutil

        binary = shutil.which("etcd") or ("/usr/bin/etcd" if Path("/usr/bin/etcd").exists() else "")
        if not binary:
            raise ClusterError("several masters need etcd, which is not installed: apt-get install -y etcd-server")
        if not self.etcd_endpoint:
            self.etcd_endpoint = f"127.0.0.1:{_free_port()}"
            self._etcd_peer = f"127.0.0.1:{_free_port()}"
        client = f"{'https' if self.tls else 'http'}://{self.etcd_endpoint}"
        peer = f"http://{self._etcd_peer}"
        tls_flags: list[str] = []
        if self.tls:  # clients (the masters, cxlkv status) present certificates of the cluster CA
            f = self.tls_files("master")
            tls_flags = ["--cert-file", f.cert_file, "--key-file", f.key_file, "--trusted-ca-file", f.ca_file,
                         "--client-cert-auth"]
        # A 50 ms raft heartbeat and 500 ms election timeout let etcd grant 1 s leases
        # (its minimum is 1.5 election timeouts, rounded up to whole seconds).
        return ManagedProcess("etcd", [
            binary, *tls_flags, "--name", "cxlkv", "--data-dir", str(self.run_dir / "etcd"),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"cxlkv={peer}", "--heartbeat-interval", "50", "--election-timeout", "500",
        ], self.run_dir / "etcd.log", env={"ETCD_UNSUPPORTED_ARCH": os.environ.get("ETCD_UNSUPPORTED_ARCH", "")})

    @property
    def etcd_url(self) -> str:
        """The etcd endpoint as masters are given it (``https://`` on a TLS cluster)."""
        return f"https://{self.etcd_endpoint}" if self.tls else self.etcd_endpoint

    def _start_etcd(self) -> None:
        self.etcd = self._etcd_process()
        self.etcd.start()
        _wait_port(self.etcd_endpoint, self.start_timeout_s, self.etcd)

    def start_etcd(self) -> None:
        """Start the local etcd again (after :meth:`stop_etcd`), same data directory."""
        self._start_etcd()
        self._write_state()

    def stop_etcd(self, sig: int = signal.SIGKILL) -> None:
        """Stop (by default kill) the local etcd."""
        assert self.etcd is not None
        self.etcd.signal(sig)
        assert self.etcd.proc is not None
        self.etcd.proc.wait(10)

    def _master_process(self, i: int) -> ManagedProcess:
        address_file = self.run_dir / f"master-{i}.address"
        address_file.unlink(missing_ok=True)
        cfg: dict[str, Any] = {
            "listen_address": self.master_addresses[i],
            "address_file": str(address_file),
            "metrics_address": "127.0.0.1:0",
            "etcd_endpoints": [self.etcd_url],
            "etcd_prefix": self.etcd_prefix,
            "segments": [
                {"name": f"cxl{s}", "size_bytes": self.region_size_bytes, "path": p}
                for s, p in enumerate(self.region_paths)
            ] + ([{"name": "ssd0", "size_bytes": self.ssd_size_bytes, "path": self.ssd_path, "tier": "ssd"}]
                 if self.ssd_path else []),
        }
        cfg.update(self._tls_options("master"))
        cfg.update(self.master_options)
        conf = self.run_dir / f"master-{i}.toml"
        conf.write_text(tomli_w.dumps(cfg))
        return ManagedProcess(f"master-{i}", [self.python, "-m", "cxlkv.cli", "master", "--config", str(conf)],
                              self.run_dir / f"master-{i}.log")

    def _start_masters(self) -> None:
        self.master_addresses = [f"127.0.0.1:{_free_port()}" for _ in range(self.n_masters)]
        self.masters = [self._master_process(i) for i in range(self.n_masters)]
        for p in self.masters:
            p.start()
        i = self.wait_leader(self.start_timeout_s)
        self.master = self.masters[i]
        self.master_address = self.master_addresses[i]

    def leader(self) -> tuple[int, dict[str, Any]] | None:
        """``(index in masters, leader record)`` from etcd's leader key, or None (no leader now).

        Raises:
            Unavailable: etcd unreachable.
        """
        import asyncio

        from cxlkv.master.election import MasterInfo
        from cxlkv.master.etcd import EtcdClient

        async def get() -> Any:
            c = EtcdClient([self.etcd_url], timeout_s=2.0, tls=self.tls_files("master") if self.tls else None)
            try:
                return await c.get(f"{self.etcd_prefix}/leader".encode())
            finally:
                await c.close()

        kv = asyncio.run(get())
        info = MasterInfo.decode(kv.value) if kv is not None else None
        if info is None or info.epoch == 0 or info.address not in self.master_addresses:
            return None
        import dataclasses

        return self.master_addresses.index(info.address), dataclasses.asdict(info)

    def members(self) -> list[dict[str, Any]]:
        """Every running master's record in etcd (``P/masters/``: leader and standbys).

        Raises:
            Unavailable: etcd unreachable.
        """
        import asyncio
        import dataclasses

        from cxlkv.master.election import MasterInfo
        from cxlkv.master.etcd import EtcdClient

        async def get() -> Any:
            c = EtcdClient([self.etcd_url], timeout_s=2.0, tls=self.tls_files("master") if self.tls else None)
            try:
                return await c.get_prefix(f"{self.etcd_prefix}/masters/".encode())
            finally:
                await c.close()

        infos = [MasterInfo.decode(kv.value) for kv in asyncio.run(get())]
        return [dataclasses.asdict(i) for i in infos if i is not None]

    def wait_members(self, n: int, timeout_s: float) -> None:
        """Wait until ``n`` masters are up (listed in etcd).

        Raises:
            ClusterError: not within ``timeout_s``.
        """
        from cxlkv.errors import Unavailable

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if len(self.members()) >= n:
                    return
            except Unavailable:
                pass
            time.sleep(0.05)
        raise ClusterError(f"fewer than {n} masters up after {timeout_s:.0f} s")

    def wait_leader(self, timeout_s: float, *, other_than: int | None = None) -> int:
        """Wait until a master (not ``other_than``) leads and serves; returns its index.

        Raises:
            ClusterError: none within ``timeout_s`` (the masters' log tails included).
        """
        from cxlkv.errors import Unavailable

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                got = self.leader()
            except Unavailable:
                got = None
            if got is not None and got[0] != other_than and self.masters[got[0]].alive():
                if (self.run_dir / f"master-{got[0]}.address").exists():
                    return got[0]
            time.sleep(0.02)
        tails = "\n".join(f"{p.name}: {p.log_tail(8)}" for p in self.masters)
        raise ClusterError(f"no master became the leader within {timeout_s:.0f} s:\n{tails}")

    def restart_ha_master(self, i: int, *, stop: bool = True) -> ManagedProcess:
        """Start master ``i`` again (stopping it first with ``stop``, SIGTERM → SIGKILL)."""
        if stop:
            self.masters[i].stop()
        p = self._master_process(i)
        p.start()
        self.masters[i] = p
        self._write_state()
        return p

    def _make_clientd(self, i: int) -> ManagedProcess:
        ready = self.run_dir / f"clientd-{i}.ready"
        ready.unlink(missing_ok=True)
        cfg: dict[str, Any] = {
            "name": f"clientd-{i}",
            "master_address": ",".join(self.master_addresses) if self.masters else self.master_address,
            "socket_path": self.socket_path(i),
            "ready_file": str(ready),
            "metrics_address": "127.0.0.1:0",
            "regions": [{"segment": f"cxl{s}", "path": p} for s, p in enumerate(self.region_paths)]
            + ([{"segment": "ssd0", "path": self.ssd_path, "tier": "ssd"}] if self.ssd_path else []),
        }
        if self.masters:
            cfg["master_timeout_s"] = 3.0  # a stopped leader's port accepts: give up on it sooner (docs/ha.md)
        cfg.update(self._tls_options(f"clientd-{i}"))
        cfg.update(self.clientd_options)
        conf = self.run_dir / f"clientd-{i}.toml"
        conf.write_text(tomli_w.dumps(cfg))
        return ManagedProcess(
            f"clientd-{i}", [self.python, "-m", "cxlkv.cli", "clientd", "--config", str(conf)],
            self.run_dir / f"clientd-{i}.log",
        )

    def restart_clientd(self, i: int) -> ManagedProcess:
        """Start clientd ``i`` again (after it was stopped or killed); wait until ready."""
        old = self.clientds[i]
        old.stop()
        p = self._make_clientd(i)
        p.start()
        self.clientds[i] = p
        wait_for_file(self.run_dir / f"clientd-{i}.ready", self.start_timeout_s, p)
        self._write_state()
        return p

    def stop(self, timeout_s: float = 10.0) -> list[str]:
        """Stop clientds, then the master; delete the region files.

        Returns:
            Names of processes that had to be killed (a clean stop returns ``[]``).
        """
        killed: list[str] = []
        for p in self.clientds:
            _, was_killed = p.stop(timeout_s)
            if was_killed:
                killed.append(p.name)
        for m in (self.masters or ([self.master] if self.master is not None else [])):
            _, was_killed = m.stop(timeout_s)
            if was_killed:
                killed.append(m.name)
        if self.etcd is not None:
            _, was_killed = self.etcd.stop(timeout_s)
            if was_killed:
                killed.append(self.etcd.name)
        for path in self.region_paths + ([self.ssd_path] if self.ssd_path else []):
            Path(path).unlink(missing_ok=True)
        (self.run_dir / "cluster.json").unlink(missing_ok=True)
        return killed

    # -- state file for `cxlkv cluster status|down` ---------------------------
    def _write_state(self) -> None:
        state = {
            "cluster_id": self.cluster_id,
            "master_address": self.master_address,
            "master_pid": self.master.pid if self.master else None,
            # start times (clock ticks since boot) name the processes across pid reuse
            "master_start_time": process_start_time(self.master.pid) if self.master else None,
            "clientds": [
                {"name": p.name, "pid": p.pid, "start_time": process_start_time(p.pid),
                 "socket_path": self.socket_path(i), "lean_socket_path": self.lean_socket_path(i),
                 "ready_file": str(self.run_dir / f"clientd-{i}.ready"), "log": str(p.log_path)}
                for i, p in enumerate(self.clientds)
            ],
            "regions": self.region_paths,
            "region_size_bytes": self.region_size_bytes,
            "run_dir": str(self.run_dir),
            "certs_dir": self.certs_dir,
            "masters": [
                {"name": p.name, "pid": p.pid, "start_time": process_start_time(p.pid),
                 "address": self.master_addresses[i] if self.master_addresses else self.master_address,
                 "log": str(p.log_path)}
                for i, p in enumerate(self.masters or ([self.master] if self.master else []))
            ],
            "etcd": ({"pid": self.etcd.pid, "start_time": process_start_time(self.etcd.pid),
                      "endpoint": self.etcd_endpoint, "url": self.etcd_url, "prefix": self.etcd_prefix,
                      "log": str(self.etcd.log_path)}
                     if self.etcd is not None else None),
        }
        tmp = self.run_dir / "cluster.json.tmp"
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.run_dir / "cluster.json")


def _free_port() -> int:
    """A TCP port of 127.0.0.1 free right now (bound and released)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_port(address: str, timeout_s: float, proc: ManagedProcess) -> None:
    """Wait until ``host:port`` accepts connections.

    Raises:
        ClusterError: ``proc`` exited first or the timeout passed.
    """
    import socket

    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=0.2):
                return
        except OSError:
            pass
        if not proc.alive():
            raise ClusterError(f"{proc.name} exited before it served; log {proc.log_path}:\n{proc.log_tail()}")
        if time.monotonic() > deadline:
            raise ClusterError(f"timed out after {timeout_s:.0f} s waiting for {proc.name} on {address}")
        time.sleep(0.02)
