"""The master process: gRPC server, health and reflection, the sweep, graceful stop.

:class:`MasterServer` owns one :class:`~cxlkv.master.state.MasterState`, serves
``cxlkv.v1.MasterService`` plus ``grpc.health.v1.Health`` and server reflection
on one grpc.aio server, and runs the periodic sweep (client expiry, put
timeouts, lease expiry and deferred frees, watermark eviction) on the same event
loop — so every state call happens on one thread and the state needs no lock.

Start-up writes the bound ``host:port`` to ``address_file`` (write a temporary
file, then rename) only once the server is serving; ``cxlkv cluster`` and the
tests wait for that file. SIGTERM/SIGINT: health NOT_SERVING, stop accepting,
drain in-flight calls (``grace_s``), exit 0; a process still up :data:`EXIT_MARGIN_S`
past the three drains' bound exits 1 with its threads' stacks in its log.

With ``metrics_address`` set, Prometheus ``/metrics`` is served too
(:mod:`cxlkv.master.metrics`); under systemd (``Type=notify``) the master
reports READY=1 once both are bound, STATUS= lines, STOPPING=1 on SIGTERM and
watchdog pings (:class:`cxlkv.runtime.systemd.Notifier`).

With ``tls_ca_file``/``tls_cert_file``/``tls_key_file`` set, the gRPC port, the
lean port and /metrics take only mutual-TLS connections from certificates the
CA signed, and :class:`~cxlkv.master.auth.Authorizer` checks every call's
identity (client-id binding, admin calls). Without them the configuration only
allows loopback addresses (``allow_insecure`` aside; :mod:`cxlkv.config`).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import socket
import time
import uuid
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from cxlkv.wire.reflection import enable_reflection

from cxlkv.config import MasterConfig, format_size
from cxlkv.errors import ConfigError, NotLeader
from cxlkv.wire.lean import LeanFrameServer
from cxlkv.runtime.loops import StallMonitor
from cxlkv.master.owner import Deposed, RegionOwnership
from cxlkv.master.recovery import check_recover_specs, parse_recover_spec, recover_regions
from cxlkv.master.service import MasterServicer
from cxlkv.master.publish import NoIndex, OverflowAlarm, overflow_warning
from cxlkv.master.state import MasterState
from cxlkv.runtime.stopping import arm_exit_deadline
from cxlkv.runtime.systemd import Notifier
from cxlkv.v1 import master_pb2
from cxlkv.wire.parse import add_service

__all__ = ["MasterServer", "ListenError", "run_master", "SERVICE_NAME"]

log = logging.getLogger("cxlkv.master")

#: Seconds past its three drains (``grace_s`` each: gRPC, lean TCP, lean Unix) at
#: which a master still up after the stop signal writes its threads' stacks and
#: exits with code 1 (cxlkv/runtime/stopping.py); under the unit's TimeoutStopSec=30.
EXIT_MARGIN_S = 6.0

#: Full name of the master's gRPC service (health and reflection use it).
SERVICE_NAME = master_pb2.DESCRIPTOR.services_by_name["MasterService"].full_name

_WILDCARD_HOSTS = {"", "0.0.0.0", "::", "[::]"}
_MAX_MESSAGE_BYTES = 64 << 20
#: Seconds between the STATUS= lines sent to systemd while serving.
STATUS_INTERVAL_S = 10.0


class ListenError(ConfigError):
    """The listen address cannot be bound (in use, or not a local address)."""


def _split_host_port(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"listen_address {address!r}: expected HOST:PORT (port 0 picks a free one)")
    return host, int(port)


def _probe_listen(address: str, host: str, port: int) -> None:
    """Fail early, with one clear line, when ``host:port`` is taken or not local.

    gRPC would report the same failure with a C-level log line and a hint about
    GRPC_VERBOSITY; a plain bind (SO_REUSEADDR, as gRPC binds) tells it
    cleanly. Port 0 and names that do not resolve are left to gRPC.

    Raises:
        ListenError: the address cannot be bound (the reason from the OS).
    """
    if port == 0:
        return
    bind_host = "::" if host in ("[::]", "::") else ("0.0.0.0" if host in _WILDCARD_HOSTS else host.strip("[]"))
    try:
        infos = socket.getaddrinfo(bind_host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return
    family, kind, proto, _, sockaddr = infos[0]
    probe = socket.socket(family, kind, proto)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(sockaddr)
    except OSError as exc:
        raise ListenError(f"cannot listen on {address} (listen_address): {exc.strerror or exc}") from None
    finally:
        probe.close()


def _write_atomically(path: Path, text: str, what: str = "address_file") -> None:
    """Write ``text`` to ``path`` through a temporary file beside it.

    Raises:
        ConfigError: it cannot be written (a full or read-only filesystem): one
            line naming ``what`` and the path; no temporary file is left.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        tmp.replace(path)
    except OSError as exc:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise ConfigError(f"cannot write {what} {path}: {exc.strerror or exc}") from None


#: How often the master moves what the garbage collector has seen into its permanent
#: generation (``gc.freeze``), seconds.
GC_FREEZE_INTERVAL_S = 5.0


class MasterServer:
    """One master: state, gRPC server, sweep task.

    Args:
        config: validated configuration.
        grace_s: how long :meth:`stop` lets in-flight calls finish.

    Raises:
        ConfigError: unknown allocation strategy or eviction policy (known
            names listed), a plugin that fails to load, bad segments, or a
            region of ``recover_from_region`` that cannot be recovered.
    """

    def __init__(self, config: MasterConfig, *, grace_s: float = 2.0, fence: Any = None, min_epoch: int = 0,
                 id_floor: int = 0, warm: Any = None) -> None:
        self.config = config
        self.grace_s = grace_s
        self.owner_id = warm.owner_id if warm is not None else uuid.uuid4()
        self.master_id = self.owner_id.hex[:12]
        #: With leader election (master/ha.py): the term's :class:`~cxlkv.master.election.LeaderFence`.
        self.fence = fence
        # Counters start at wall-clock microseconds so that epochs, versions and
        # lease ids keep growing across master restarts (and above the floor a
        # previous leader recorded in etcd).
        if warm is not None:  # a warm standby's state (master/warm.py), kept up with the index
            warm.bump_counters(id_floor)
            self.state = warm.state
        else:
            self.state = MasterState(config, master_id=self.master_id,
                                     id_base=max(time.time_ns() // 1000, id_floor))
        # before any region is taken: a spec that fails must leave every index as it was
        check_recover_specs(config.recover_from_region)
        #: The regions this master maps and owns, and the index it publishes (master/owner.py).
        self.ownership = RegionOwnership(self.state, config, self.owner_id, min_epoch=min_epoch)
        self.ownership.warm = warm
        try:
            owned = self.ownership.paths()
            specs = list(config.recover_from_region)
            from_index = [s for s in specs if os.path.realpath(parse_recover_spec(s)[0]) in owned]
            self.ownership.check_recover_specs(from_index)
            #: What recovery from the index found ({} without recovery or index).
            self.index_recovery = self.ownership.start_index(bool(from_index), time.monotonic())
            #: One report per other region of ``recover_from_region`` (rebuilt from region scans).
            self.recovered = recover_regions(self.state, [s for s in specs if s not in from_index],
                                             time.monotonic())
        except BaseException:
            self.ownership.close()
            raise
        self.servicer = MasterServicer(self.state)
        ir = self.ownership.index_region
        if ir is not None:
            self.servicer.index_region_uuid = str(ir.identity.region_uuid)
            self.servicer.index_epoch = ir.epoch
        if fence is not None:
            from cxlkv.master.election import FencedIndex

            fence.epoch = ir.epoch if ir is not None else 0
            if ir is not None:
                fence.region_epoch = self.ownership.index_epoch
            self.state.index = FencedIndex(self.state.index, fence)
            self.servicer.fence = fence
        if config.tls.enabled:
            from cxlkv.master.auth import Authorizer

            self.servicer.auth = Authorizer(config.admin_identities)
        self.address = ""
        #: ``http://host:port/metrics`` once serving with ``metrics_address`` set, else "".
        self.metrics_url = ""
        self._metrics: Any = None
        self._server: grpc.aio.Server | None = None
        self._lean: LeanFrameServer | None = None
        self._lean_unix: LeanFrameServer | None = None
        self._health: health.aio.HealthServicer | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._owner_task: asyncio.Task[None] | None = None
        #: Why this master stopped on its own ("" unless deposed).
        self.deposed = ""
        self._stopped = asyncio.Event()
        #: How long the event loop is held (cxlkv_event_loop_stall_* metrics).
        self.stalls = StallMonitor()
        #: When the sweep warns of objects that overflowed the region's index.
        self.overflow_alarm = OverflowAlarm()

    async def start(self) -> str:
        """Bind, start serving, start the sweep, write the address file.

        Returns:
            The bound ``host:port``.

        Raises:
            ConfigError: malformed listen or metrics address, or a TLS file that
                cannot be read or holds no certificate/key.
            ListenError: the listen or metrics address cannot be bound.
        """
        cfg = self.config
        host, want_port = _split_host_port(cfg.listen_address)
        _probe_listen(cfg.listen_address, host, want_port)
        server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", cfg.max_request_bytes),
            ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
        ])
        # safe deserializers: a request that does not parse answers INVALID_ARGUMENT/INVALID_KEY (cxlkv.wire.parse)
        add_service(server, master_pb2.DESCRIPTOR.services_by_name["MasterService"], self.servicer)
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        enable_reflection((SERVICE_NAME, health.SERVICE_NAME), server)  # v1 and v1alpha
        tls = cfg.tls
        ssl_ctx = None
        if tls.enabled:
            from cxlkv.wire.tls import grpc_server_credentials, server_context

            creds = grpc_server_credentials(tls)
            ssl_ctx = server_context(tls)
        try:
            port = (server.add_secure_port(cfg.listen_address, creds) if tls.enabled
                    else server.add_insecure_port(cfg.listen_address))
        except RuntimeError as exc:
            reason = str(exc).split("; set GRPC_VERBOSITY")[0]
            raise ListenError(f"cannot listen on {cfg.listen_address}: {reason}") from None
        if not port:
            raise ListenError(f"cannot listen on {cfg.listen_address}: address in use or not local")
        if cfg.metrics_address:
            self._start_metrics()
        if cfg.lean_listen_address != "off":
            lean_host, lean_port = (_split_host_port(cfg.lean_listen_address) if cfg.lean_listen_address
                                    else (host, 0))
            self._lean = LeanFrameServer(self.servicer.lean_routes(), ssl=ssl_ctx, max_frame_bytes=cfg.max_request_bytes)
            try:
                self.servicer.lean_port = await self._lean.start_tcp(lean_host, lean_port)
            except OSError as exc:
                raise ListenError(f"cannot listen on {cfg.lean_listen_address or lean_host + ':0'} "
                                  f"(lean_listen_address): {exc.strerror or exc}") from None
            if cfg.lean_socket_path and not tls.enabled:  # plaintext: never beside TLS
                await self._start_lean_unix(cfg.lean_socket_path, cfg.max_request_bytes)
        await server.start()
        self._server = server
        await self._health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self._health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
        shown_host = "127.0.0.1" if host in _WILDCARD_HOSTS else host
        self.address = f"{shown_host}:{port}"
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep_loop(), name="sweep")
        if self.ownership.owned:
            self._owner_task = asyncio.get_running_loop().create_task(self._owner_loop(), name="owner-lease")
        self.stalls.start()
        segs = ", ".join(f"{s.name}={format_size(s.size_bytes)}" for s in self.state.segments()) or "none"
        log.info(
            "master %s serving on %s, lean port %s (%s; strategy %s, eviction %s, segments: %s)", self.master_id,
            self.address, self.servicer.lean_port or "off", "mutual TLS" if tls.enabled else "plaintext",
            self.state.strategy.name, self.state.policy.name, segs,
        )
        if self.metrics_url:
            log.info("metrics on %s", self.metrics_url)
        if cfg.address_file:
            _write_atomically(Path(cfg.address_file), self.address + "\n")
        return self.address

    async def _start_lean_unix(self, path: str, max_frame_bytes: int) -> None:
        """Serve the lean routes on the Unix socket ``path`` too (a socket file left by a
        master that died is replaced; one another process listens on is an error)."""
        if os.path.exists(path):
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(path)
            except OSError:
                os.unlink(path)  # nobody listens: left behind
            else:
                raise ListenError(f"cannot listen on {path} (lean_socket_path): another process serves it")
            finally:
                probe.close()
        self._lean_unix = LeanFrameServer(self.servicer.lean_routes(), max_frame_bytes=max_frame_bytes)
        try:
            await self._lean_unix.start_unix(path)
        except OSError as exc:
            self._lean_unix = None
            raise ListenError(f"cannot listen on {path} (lean_socket_path): {exc.strerror or exc}") from None
        self.servicer.lean_socket_path = path

    def _start_metrics(self) -> None:
        from cxlkv.master.metrics import start_master_metrics

        try:
            ir = self.ownership.index_region
            self._metrics, url, observer = start_master_metrics(
                self.config.metrics_address, self.state, asyncio.get_running_loop(), tls=self.config.tls,
                stalls=self.stalls, lone_epoch=lambda: ir.epoch if ir is not None else 0)
        except OSError as exc:
            raise ListenError(str(exc)) from None
        self.metrics_url = self.servicer.metrics_url = url
        self.servicer.observe = observer

    def status_line(self) -> str:
        """One line for systemd's STATUS=: address, keys, space, clients."""
        st = self.state
        mounted = st.segments()
        cap = sum(s.capacity_bytes for s in mounted)
        used = sum(s.used_bytes for s in mounted)
        alive = sum(1 for c in st.clients() if c.alive)
        pct = f" ({used / cap:.0%})" if cap else ""
        return (f"serving on {self.address}: {st.key_count} keys, {format_size(used)} of "
                f"{format_size(cap)} used{pct}, {alive} client(s)")

    async def _sweep_loop(self) -> None:
        interval = self.config.sweep_interval_s
        frozen_at = time.monotonic()
        self.state.registrations.loop_tick = frozen_at  # from now on a stall of this process is credited to clients
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            credited = self.state.registrations.credit_stall(now)
            if credited:
                log.warning("the master did not run for %.1f s (stopped or its loop held): that time is not "
                            "counted against the clientds' heartbeats", credited + interval)
            if self.fence is not None and not self.fence.valid():
                continue  # leadership ended: nothing is expired, reclaimed or evicted any more
            if now - frozen_at >= GC_FREEZE_INTERVAL_S:
                # Long-lived metadata (millions of objects) moves out of the collector's
                # view: a full collection over 2M objects held the loop 1.5-2 s (heartbeats
                # late, clientds expired). They hold no reference cycles; freed by refcount.
                gc.freeze()
                frozen_at = now
            try:
                done = self.state.sweep(time.monotonic())
                self.state.index.sync()
            except NotLeader as exc:  # the term ended during the pass (the fence refused its writes)
                log.debug("sweep: %s", exc.message)
                continue
            except Exception:  # a bug; keep the master up and say so once per sweep
                log.exception("sweep failed")
                continue
            if done["clients_expired"] or done["puts_reclaimed"]:
                log.warning("sweep: %d client(s) expired, %d put(s) reclaimed",
                            done["clients_expired"], done["puts_reclaimed"])
            if done["evicted"]:
                log.debug("sweep: evicted %d object(s) to the low watermark", done["evicted"])
            self._check_index_overflow()

    def _check_index_overflow(self) -> None:
        """Warn when objects first overflow the region's index, then each time their
        count doubles (:class:`~cxlkv.master.publish.OverflowAlarm`); once per sweep, O(1)."""
        usage = self.state.index.usage()
        if usage is not None and self.overflow_alarm.check(usage.overflow_objects):
            log.warning("%s", overflow_warning(usage))

    async def _owner_loop(self) -> None:
        """Renew the owner leases every quarter of their TTL; stop when deposed."""
        period = self.config.owner_lease_ttl_s / 4
        while True:
            await asyncio.sleep(period)
            if self.fence is not None and not self.fence.valid():
                return  # leadership ended: never renew the region's lease again (master/ha.py steps down)
            try:
                self.ownership.heartbeat()
            except Deposed as exc:
                self.deposed = str(exc)
                log.critical("%s", exc)
                self.state.index = NoIndex()  # write nothing more into the region
                self.request_stop()
                return
            except Exception:  # a bug or an I/O error: keep trying, say so
                log.exception("owner lease heartbeat failed")

    def request_stop(self) -> None:
        """Ask :meth:`wait` to return (signal-handler safe on the loop thread)."""
        self._stopped.set()

    async def wait(self) -> None:
        """Block until :meth:`request_stop`."""
        await self._stopped.wait()

    async def stop(self) -> None:
        """Health NOT_SERVING, stop accepting, drain for ``grace_s``, stop the sweep."""
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        if self._server is not None:
            await self._server.stop(self.grace_s)
            self._server = None
        if self._lean is not None:
            await self._lean.stop(self.grace_s)
            self._lean = None
        if self._lean_unix is not None:
            await self._lean_unix.stop(self.grace_s)
            self._lean_unix = None
            try:
                os.unlink(self.servicer.lean_socket_path)
            except OSError:
                pass
        if self._owner_task is not None:
            self._owner_task.cancel()
            try:
                await self._owner_task
            except asyncio.CancelledError:
                pass
            self._owner_task = None
        if not self.deposed:
            self.ownership.release()
        self.ownership.close()
        self.stalls.stop()
        if self._sweeper is not None:
            self._sweeper.cancel()
            try:
                await self._sweeper
            except asyncio.CancelledError:
                pass
            self._sweeper = None
        if self._metrics is not None:
            metrics, self._metrics = self._metrics, None
            await asyncio.to_thread(metrics.shutdown)
            metrics.server_close()
        path = self.config.address_file
        if path:
            try:
                if Path(path).read_text().strip() == self.address:
                    Path(path).unlink()
            except OSError:
                pass
        if self.address:
            log.info("master %s stopped", self.master_id)


async def _report_status(server: MasterServer, notifier: Notifier) -> None:
    while True:
        await asyncio.sleep(STATUS_INTERVAL_S)
        notifier.status(server.status_line())


async def run_master(config: MasterConfig, *, notifier: Notifier | None = None) -> int:
    """Run a master until SIGTERM/SIGINT; returns the process exit code (0).

    Args:
        config: validated configuration.
        notifier: systemd notifications (READY=1 once serving, STATUS= every
            :data:`STATUS_INTERVAL_S`, STOPPING=1 on a stop signal, watchdog
            pings); ``None`` sends none.

    Raises:
        ConfigError: as :class:`MasterServer` and :meth:`MasterServer.start`.
    """
    if config.etcd_endpoints:
        from cxlkv.master.ha import run_ha_master

        return await run_ha_master(config, notifier=notifier)
    notify = notifier if notifier is not None else Notifier()
    with notify.extending("starting: mapping regions" + (", scanning them (recover_from_region)"
                                                         if config.recover_from_region else "")):
        server = MasterServer(config)  # region scans run here: minutes for a large region
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        arm_exit_deadline(3 * server.grace_s + EXIT_MARGIN_S, "master", log)  # the drains are bounded, an exit is not
        server.request_stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    tasks = [loop.create_task(notify.run_watchdog(), name="watchdog")]
    try:
        notify.status("starting")
        await server.start()
        notify.ready(server.status_line())
        if notify.enabled:
            tasks.append(loop.create_task(_report_status(server, notify), name="status"))
        await server.wait()
        notify.stopping("draining")
        log.info("signal received: draining")
    finally:
        for task in tasks:
            task.cancel()
        await server.stop()
    return 1 if server.deposed else 0
