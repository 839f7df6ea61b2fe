"""The clientd process: wires regions, master link, core and front-ends together.

Start-up order:

1. map every configured region and check its identity (a wrong, unformatted or
   resized region stops the daemon: exit code 2, one line);
2. bind the gRPC and lean sockets (a socket another live daemon serves is an
   error; a stale one left by a crash is removed) — calls answer NOT_READY
   until step 3 is done;
3. register with the master (waiting for it if it is not up yet; a refusal is
   fatal, exit code 2); then report SERVING on grpc.health and write
   ``ready_file``.

SIGTERM or SIGINT stops it: no new calls, running calls get
:data:`SHUTDOWN_GRACE_S` to finish, unused reservations go back to the master,
pending lease releases and hits are sent and the registration ended, buffers and
regions are unmapped, sockets and the ready file removed. The stop is bounded:
its steps share :data:`STOP_LIMIT_S` (those that wait on the master at most
:data:`MASTER_STEP_S` each, so a master that does not answer costs seconds, not
``master_timeout_s`` per step), a step that overruns is logged by name and left
behind (what the master was not told, it learns when the registration expires),
and a process still up :data:`EXIT_LIMIT_S` after the signal writes every thread's
stack to its log and exits with code 1 (:mod:`cxlkv.runtime.stopping`).

Under systemd (``Type=notify``) the daemon sends STATUS= lines through start-up,
READY=1 after step 3, STOPPING=1 when a stop signal arrives, and watchdog
pings from its event loop (:class:`cxlkv.runtime.systemd.Notifier`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import stat
from typing import Any
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cxlkv.clientd.api import ClientApi
from cxlkv.clientd.buffers import BufferRegistry
from cxlkv.clientd.core import ClientdCore
from cxlkv.clientd.grpc_service import GrpcFrontEnd
from cxlkv.clientd.lean import LeanServer
from cxlkv.clientd.master_link import MasterLink
from cxlkv.clientd.regions import RegionSet, StartupError
from cxlkv.clientd.writers import Incarnation, running
from cxlkv.config import ClientdConfig
from cxlkv.errors import CxlkvError
from cxlkv.runtime.loops import StallMonitor
from cxlkv.runtime.stopping import StopBudget, arm_exit_deadline
from cxlkv.runtime.systemd import Notifier

__all__ = ["Daemon", "SHUTDOWN_GRACE_S", "STOP_LIMIT_S", "MASTER_STEP_S", "EXIT_LIMIT_S", "BUFFER_REAP_INTERVAL_S",
           "EXIT_STARTUP", "tune_malloc"]

log = logging.getLogger(__name__)

#: Seconds running calls get to finish at shutdown.
SHUTDOWN_GRACE_S = 5.0
#: Seconds the steps of a stop share, from the signal: the two drains
#: (:data:`SHUTDOWN_GRACE_S` each at most) and the steps that wait on the master.
STOP_LIMIT_S = 15.0
#: Most seconds one stop step that waits on the master gets (giving reservations
#: back; closing the link: releases, hits, deregistration).
MASTER_STEP_S = 3.0
#: Seconds after the stop signal at which a process still up exits with code 1,
#: stacks logged (under the unit's ``TimeoutStopSec=30``).
EXIT_LIMIT_S = STOP_LIMIT_S + 5.0
#: Period of the check for buffers whose owner process exited, in seconds.
BUFFER_REAP_INTERVAL_S = 1.0
#: Exit code of a start-up failure (wrong region, socket in use, master refusal).
EXIT_STARTUP = 2


def tune_malloc() -> bool:
    """Keep freed large blocks in glibc's heap instead of returning them to the kernel.

    By default glibc serves every allocation of 128 KiB or more (an inline value,
    its serialized message) with a fresh ``mmap`` and unmaps it on free, so each one
    pays a page fault per 4 KiB again — measured at ~0.5 ms per MiB on a 2-vCPU VM,
    four times the cost of the copies themselves. Raising the mmap threshold to its
    maximum (32 MiB) and the trim threshold to 256 MiB lets those blocks be reused.
    Larger buffers still come from ``mmap``. The daemon's resident memory then
    stays near its peak use.

    Returns:
        Whether both settings took (``False`` on a C library without ``mallopt``).
    """
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # from <malloc.h>
    ok = mallopt(m_mmap_threshold, 32 << 20) == 1
    return mallopt(m_trim_threshold, 256 << 20) == 1 and ok


def _prepare_socket_path(path: str) -> None:
    """Make ``path`` free for a new socket: remove a stale socket, refuse a live one.

    A socket in the default runtime directory (:func:`cxlkv.config.default_runtime_dir`)
    gets that directory checked, or created 0700, under the XDG rules
    (:func:`cxlkv.runtime.rundir.check_private_dir`); the directory of an explicitly
    configured path is the operator's choice and only created when missing.

    Raises:
        StartupError: another process serves the socket, the path is not a socket,
            or the runtime directory is unsafe (another owner, group/other-writable).
    """
    from cxlkv.config import default_runtime_dir
    from cxlkv.runtime.rundir import check_private_dir

    p = Path(path)
    if p.parent == default_runtime_dir():
        try:
            check_private_dir(p.parent, create=True,
                              create_mode=0o755 if str(p.parent) == "/run/cxlkv" else 0o700)
        except (CxlkvError, OSError) as exc:
            raise StartupError(str(exc)) from None
    else:
        p.parent.mkdir(parents=True, exist_ok=True)
    try:
        st = p.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise StartupError(f"socket path {path} exists and is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(0.5)
        probe.connect(path)
    except OSError:
        p.unlink(missing_ok=True)  # stale: left by a daemon that died
        return
    finally:
        probe.close()
    raise StartupError(f"socket {path} is in use by another running daemon")


class Daemon:
    """One clientd.

    Args:
        cfg: the validated configuration.
        notifier: systemd notifications (``None``: none are sent).
    """

    def __init__(self, cfg: ClientdConfig, *, notifier: Notifier | None = None) -> None:
        self.cfg = cfg
        self.notifier = notifier if notifier is not None else Notifier()
        self.socket_path = cfg.resolved_socket_path()
        self.lean_socket_path = cfg.resolved_lean_socket_path()
        self._stop = asyncio.Event()
        #: The stop's time (:data:`STOP_LIMIT_S`), started by :meth:`request_stop`.
        self._stop_budget = StopBudget(STOP_LIMIT_S, log)
        self._health_tasks: set[asyncio.Task[None]] = set()
        self._sockets_owned: list[str] = []
        self.tier_worker = None
        self.core: ClientdCore | None = None
        self.incarnation: Incarnation | None = None
        self._release_prev: asyncio.Future[Any] | None = None
        #: How long the event loop is held (cxlkv_event_loop_stall_* metrics).
        self.stalls = StallMonitor()

    def request_stop(self) -> None:
        """Ask the daemon to shut down (signal handlers call this)."""
        self._stop_budget.start()
        self._stop.set()

    def _on_signal(self) -> None:
        """SIGTERM/SIGINT: stop, and exit regardless :data:`EXIT_LIMIT_S` from now."""
        arm_exit_deadline(EXIT_LIMIT_S, "clientd", log)
        self.request_stop()

    async def run(self) -> int:
        """Run until stopped.

        Returns:
            The process exit code: 0 after a clean stop, :data:`EXIT_STARTUP` when
            start-up failed (the reason has been logged as one line).
        """
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal)
        if not tune_malloc():
            log.debug("mallopt unavailable: large transient buffers are not reused")
        cfg = self.cfg
        regions: RegionSet | None = None
        copy_threads = max(2, min(8, os.cpu_count() or 2))
        executor = ThreadPoolExecutor(max_workers=copy_threads, thread_name_prefix="clientd-copy")
        buffers = BufferRegistry()
        link: MasterLink | None = None
        grpc_fe: GrpcFrontEnd | None = None
        lean: LeanServer | None = None
        metrics = None
        notify = self.notifier
        watchdog = asyncio.ensure_future(notify.run_watchdog())
        self.stalls.start()
        try:
            try:
                notify.status("mapping regions")
                if not cfg.regions:
                    raise StartupError("no regions configured ([[regions]] with segment and path)")
                from cxlkv.transport import install_sigbus_guard

                install_sigbus_guard()  # a region file that shrinks: errors, never a SIGBUS death
                with self.notifier.extending("mapping regions" + (" (prefault)" if cfg.prefault else "")):
                    regions = RegionSet.open(cfg.regions, prefault=cfg.prefault)
                if cfg.dram_tier_bytes:
                    from cxlkv.clientd.tiers import open_dram_tier

                    try:
                        regions.add_local(open_dram_tier(cfg.name, cfg.dram_tier_bytes, prefault=cfg.prefault))
                    except CxlkvError as exc:
                        raise StartupError(f"DRAM tier of {cfg.dram_tier_bytes} bytes: {exc.message}") from None
                buffers.protect(regions.file_ids())  # never a "buffer" the daemon writes into
                for path in (self.socket_path, self.lean_socket_path):
                    _prepare_socket_path(path)
                # no other process of this daemon runs from here on; what the last one left (clientd/writers.py)
                incarnation = self.incarnation = Incarnation(self.socket_path)
                prev = incarnation.acquire()
                metrics_url = ""
                link = MasterLink(cfg, regions)
                if prev is not None:
                    link.client_id = prev.client_id  # registers again under it: its old epochs get fenced
                core = self.core = ClientdCore(cfg, regions, link, executor, copy_threads=copy_threads)
                api = ClientApi(cfg, core, buffers)
                api.direct.incarnation = incarnation
                link.on_registered.append(lambda *_: incarnation.record_registration(link.client_id, link.epoch))
                if cfg.metrics_address:
                    from cxlkv.clientd.metrics import start_metrics

                    metrics, metrics_url = start_metrics(cfg.metrics_address, core, buffers, api, tls=cfg.tls,
                                                         stalls=self.stalls)
                    link.metrics_url = api.metrics_url = metrics_url
                    log.info("metrics on %s", metrics_url)
                grpc_fe = GrpcFrontEnd(api, self.socket_path, cfg.socket_mode)
                await grpc_fe.start()
                self._sockets_owned.append(self.socket_path)
                lean = LeanServer(api, self.lean_socket_path, cfg.socket_mode)
                await lean.start()
                self._sockets_owned.append(self.lean_socket_path)
                log.info("serving gRPC on %s and lean frames on %s", self.socket_path, self.lean_socket_path)
                notify.status(f"registering with the master at {cfg.master_address}")
                start = asyncio.ensure_future(link.start())
                stop = asyncio.ensure_future(self._stop.wait())
                await asyncio.wait({start, stop}, return_when=asyncio.FIRST_COMPLETED)
                if not start.done():
                    notify.stopping("stopped before the master answered")
                    start.cancel()
                    stop.cancel()
                    return 0
                stop.cancel()
                start.result()  # raises StartupError
            except StartupError as exc:
                log.error("%s", exc)
                return EXIT_STARTUP
            except OSError as exc:
                log.error("cannot start: %s", exc)
                return EXIT_STARTUP
            from cxlkv.clientd.tiers import TaskWorker

            tier_worker = TaskWorker(link, regions, executor, batch=cfg.task_batch,
                                     flush_mode=cfg.coherence == "flush")
            tier_worker.start()
            self.tier_worker = tier_worker
            if prev is not None:
                alive = running(prev.direct)  # one look per writer process
                kept = {w.put_token for w in alive}
                incarnation.direct_ended(w.put_token for w in prev.direct if w.put_token not in kept)
                api.direct.adopt_previous(alive)
                self._release_prev = asyncio.ensure_future(core.release_when_drained(
                    prev.epoch, -1, tuple(w.put_token for w in alive)))
            await grpc_fe.set_serving(link.connected)
            # grpc.health follows the master link: NOT_SERVING while every call would answer UNAVAILABLE
            link.on_connected.append(lambda _up: self._follow_link(grpc_fe, link))
            if cfg.ready_file:
                try:
                    Path(cfg.ready_file).write_text(f"{os.getpid()}\n")
                except OSError as exc:  # a full run directory: serve all the same, say why it is missing
                    log.error("cannot write ready_file %s: %s (serving anyway)", cfg.ready_file,
                              exc.strerror or exc)
            log.info("clientd %s ready", cfg.name)
            notify.ready(f"serving on {self.socket_path} as client {link.client_id} of {cfg.master_address}"
                         + (f"; metrics {metrics_url}" if metrics_url else ""))
            reaper = asyncio.ensure_future(self._reap_buffers(buffers))
            watcher = asyncio.ensure_future(self._watch_regions(regions))
            await self._stop.wait()
            notify.stopping("shutting down")
            reaper.cancel()
            watcher.cancel()
            log.info("shutting down")
            return 0
        finally:
            watchdog.cancel()
            self.stalls.stop()
            await self._shutdown(grpc_fe, lean, link, buffers, regions, executor, metrics)

    def _follow_link(self, grpc_fe: Any, link: MasterLink) -> None:
        """Set health from the link's state when the task runs (the latest state wins)."""
        async def follow() -> None:
            try:
                await grpc_fe.set_serving(link.connected and link.registered)
            except Exception:  # the health servicer is gone at shutdown
                log.debug("health update failed", exc_info=True)

        task = asyncio.ensure_future(follow())
        self._health_tasks.add(task)
        task.add_done_callback(self._health_tasks.discard)

    async def _watch_regions(self, regions: RegionSet) -> None:
        """Every ``region_check_interval_s``: retire regions whose file shrank (docs/clientd.md)."""
        while True:
            await asyncio.sleep(self.cfg.region_check_interval_s)
            try:
                for why in regions.check_files():
                    log.error("%s", why)
            except Exception:  # a bug; keep the daemon up
                log.exception("region check failed")

    async def _reap_buffers(self, buffers: BufferRegistry) -> None:
        while True:
            await asyncio.sleep(BUFFER_REAP_INTERVAL_S)
            try:
                buffers.reap_dead_owners()
                buffers.reap_orphan_files()
            except Exception:  # a bug; keep the daemon up
                log.exception("buffer reaper failed")

    async def _shutdown(self, grpc_fe, lean, link, buffers, regions, executor, metrics) -> None:
        if self.cfg.ready_file:
            Path(self.cfg.ready_file).unlink(missing_ok=True)
        budget = self._stop_budget
        budget.start()  # a stop without request_stop (start-up failed): counted from here
        if grpc_fe is not None:
            await budget.step("draining gRPC calls", grpc_fe.stop(SHUTDOWN_GRACE_S), SHUTDOWN_GRACE_S + 1.0)
        if lean is not None:
            await budget.step("draining lean calls", lean.stop(SHUTDOWN_GRACE_S), SHUTDOWN_GRACE_S + 1.0)
        if self.tier_worker is not None:
            await budget.step("stopping the tier worker", self.tier_worker.close())
        if self.core is not None:  # unused reservations back to the master
            await budget.step("giving reservations back to the master", self.core.reserve.close(), MASTER_STEP_S)
        if link is not None:  # releases, hits, deregistration: a planned stop is no host failure
            await budget.step("closing the master link", link.close(deregister=True), MASTER_STEP_S)
        if self.incarnation is not None:
            self.incarnation.release()
        executor.shutdown(wait=True)
        buffers.close()
        if regions is not None:
            regions.close()
        if metrics is not None:
            metrics.shutdown()
        for path in self._sockets_owned:
            Path(path).unlink(missing_ok=True)
