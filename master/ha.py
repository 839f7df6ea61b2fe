"""A master process with leader election: standby until it wins, leader until it loses.

``cxlkv master`` with ``etcd_endpoints`` set runs :func:`run_ha_master` instead of
a lone :class:`~cxlkv.master.server.MasterServer` (docs/ha.md):

1. **standby** — the process holds an etcd lease (:class:`~cxlkv.master.election.Elector`),
   lists itself under ``P/masters/``, watches ``P/leader`` and campaigns the moment it
   is deleted. It serves nothing on its gRPC port (clientds find the leader by trying
   the masters of their list; a closed port answers at once).
2. **taking over** — having created ``P/leader``, it builds a fresh
   :class:`MasterServer` in a worker thread (the keep-alives go on meanwhile): the
   region's owner lease is taken with an epoch above both the region's record and
   etcd's ``P/epoch`` (waiting for the previous owner's lease to lapse), the state
   is rebuilt from the region's index (``recover_from_region`` of every configured
   CXL segment) with its counters above ``P/meta``'s version floor; it binds its
   ports, then records the epoch and its address in etcd with a Txn guarded by
   its leader key.
3. **leader** — it serves until the term ends: the leader key deleted or
   replaced, the lease lapsed locally (etcd unreachable, or the process was
   stopped), or another epoch in the region. Then the fence is already closed
   (every call answers NOT_LEADER, no index write happens), the server stops
   without draining and without touching the owner record, the state is
   dropped, and the process is a standby again.

On SIGTERM a leader stops cleanly: it lets the region's owner lease lapse and
revokes its etcd lease, so a standby takes over at once instead of after the TTL.
The stop is bounded: each step of it (the warm state, the resignation, the etcd
channel, the metrics server) gets what is left of :data:`STOP_LIMIT_S`, and a step
that overruns is logged by name and left behind; should the process still be up
2.5 s past :data:`STOP_LIMIT_S` after the signal (an interpreter exit that hangs, a
takeover still rebuilding its state), it writes every thread's stack to its log and
exits with code 1.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import signal
import time
import uuid
from typing import Any

from cxlkv.config import MasterConfig
from cxlkv.errors import ConfigError, CxlkvError, Unavailable
from cxlkv.master.election import ClusterMeta, Elector, MasterInfo, Term
from cxlkv.master.etcd import EtcdClient
from cxlkv.master.publish import NoIndex
from cxlkv.runtime.stopping import StopBudget, arm_exit_deadline
from cxlkv.runtime.systemd import Notifier

__all__ = ["HaNode", "run_ha_master", "META_INTERVAL_S", "STOP_LIMIT_S"]

log = logging.getLogger("cxlkv.master")

#: How often the leader rewrites ``P/meta`` (segments, version floor), seconds.
META_INTERVAL_S = 2.0
#: Seconds the clean steps of a stop share (each gets at least 0.5 s); 2.5 s after
#: them the process exits regardless (systemd's ``TimeoutStopSec=`` is longer).
STOP_LIMIT_S = 6.0
#: The version floor recorded in ``P/meta`` runs this far ahead of the counters
#: (so a new leader starts above anything handed out until the next write).
FLOOR_HEADROOM = 1 << 32


class HaNode:
    """One master process taking part in leader election.

    Args:
        config: validated configuration with ``etcd_endpoints``.
        notifier: systemd notifications.

    Attributes:
        role: ``"standby"``, ``"taking-over"`` or ``"leader"``.
        server: the :class:`MasterServer` while leading, else None.
        leader_changes: terms this process won or lost (metrics).
        last_takeover_s: seconds from winning the campaign to serving, last term.
    """

    def __init__(self, config: MasterConfig, *, notifier: Notifier | None = None) -> None:
        self.config = config
        self.notify = notifier if notifier is not None else Notifier()
        self.node_id = uuid.uuid4().hex[:12]
        self.address = config.advertise_address or config.listen_address
        self.client = EtcdClient(config.etcd_endpoints, tls=config.tls)
        self.elector = Elector(self.client, config.etcd_prefix, MasterInfo(self.node_id, self.address),
                               int(config.leader_lease_ttl_s))
        self.role = "standby"
        self.server: Any = None
        self.leader_changes = 0
        self.last_takeover_s = 0.0
        self.epoch = 0
        self._stop = asyncio.Event()
        #: The stop's time, started by :meth:`request_stop`.
        self._stop_budget = StopBudget(STOP_LIMIT_S, log)
        #: The standby's warm state (master/warm.py) and the task keeping it up.
        self.warm: Any = None
        self._warm_task: asyncio.Task[None] | None = None
        self._warm_stop = False
        #: The process's metrics server (``metrics_address``), standby or leader.
        self.metrics: Any = None

    def request_stop(self) -> None:
        """Stop at the end of the current step (signal-handler safe on the loop thread)."""
        self._stop_budget.start()
        self._stop.set()

    def _term_config(self) -> MasterConfig:
        """This term's configuration: recover every configured CXL region from its
        index, the owner lease on the election's TTL."""
        specs = list(self.config.recover_from_region)
        for sc in self.config.segments:
            if sc.tier == "cxl" and sc.path and not any(s.split("=")[0] == sc.path for s in specs):
                specs.append(f"{sc.path}={sc.name}")
        return dataclasses.replace(self.config, recover_from_region=specs, metrics_address="",
                                   owner_lease_ttl_s=float(self.elector.granted_ttl_s))

    async def run(self) -> int:
        """Campaign, lead, step down, until :meth:`request_stop`; returns the exit code.

        Raises:
            ListenError: ``metrics_address`` cannot be bound.
        """
        if self.config.metrics_address:
            from cxlkv.master.ha_metrics import HaMetrics
            from cxlkv.master.server import ListenError

            try:
                self.metrics = HaMetrics(self, self.config.metrics_address, tls=self.config.tls)
            except OSError as exc:
                raise ListenError(str(exc)) from None
            self.elector.info = dataclasses.replace(self.elector.info, metrics_url=self.metrics.url)
            log.info("metrics on %s", self.metrics.url)
        await self.elector.start()
        self.notify.ready(f"standby (master {self.node_id}, {self.address})")
        log.info("master %s: standby for %s on etcd %s (prefix %s, lease %d s)", self.node_id, self.address,
                 ",".join(self.config.etcd_endpoints), self.config.etcd_prefix, self.elector.granted_ttl_s)
        try:
            while not self._stop.is_set():
                self._start_warm()
                term = await self.elector.campaign(self._stop)
                if term is None:
                    break
                await self._lead(term)
        finally:
            self.notify.stopping("resigning")
            await self._stop_budget.step("stopping the warm standby", self._stop_warm())
            if self.warm is not None and self._warm_task is None:
                self.warm.close()
                self.warm = None
            await self._stop_budget.step("resigning (revoking the etcd lease)", self.elector.close(resign=True))
            await self._stop_budget.step("closing the etcd channel", self.client.close())
            if self.metrics is not None:
                await self._stop_budget.step("stopping the metrics server", self.metrics.close())
        return 0

    async def _lead(self, term: Term) -> None:
        t0 = time.monotonic()
        self.role = "taking-over"
        self.leader_changes += 1
        was = self.elector.leader
        try:
            epoch_floor = await self.elector.read_epoch()
            meta = await self.elector.read_meta()
            overflow = await self.elector.read_overflow()
        except Unavailable as exc:
            log.warning("won the campaign but cannot read etcd: %s; standing down", exc.message)
            await self._stand_down(term)
            return
        from cxlkv.master.server import MasterServer

        await self._stop_warm()
        warm, self.warm = self.warm, None  # its state becomes this term's (or is dropped)
        cfg = self._term_config()
        if meta is not None:
            self._check_meta(meta)
        log.info("master %s: won the campaign; taking the region over (epoch > %d) and rebuilding from its index",
                 self.node_id, epoch_floor)
        try:
            server = await asyncio.to_thread(MasterServer, cfg, fence=term.fence, min_epoch=epoch_floor + 1,
                                             id_floor=meta.version_floor if meta is not None else 0, warm=warm)
        except (ConfigError, CxlkvError) as exc:
            if warm is not None:
                warm.close()
            log.error("could not take over: %s; standing down", exc)
            await self._stand_down(term)
            await asyncio.sleep(1.0)
            return
        if overflow:
            restored = await asyncio.to_thread(restore_overflow, server, overflow)
            log.info("restored %d of %d object(s) the previous leader's index had no slot for (recorded in etcd)",
                     restored, len(overflow))
        if not term.fence.valid():
            await self._drop(server, term.fence.closed)
            await self._stand_down(term)
            return
        try:
            await server.start()
        except CxlkvError as exc:
            log.error("could not serve: %s; standing down", exc)
            await self._drop(server, "could not serve")
            await self._stand_down(term)
            await asyncio.sleep(1.0)
            return
        ir = server.ownership.index_region
        self.epoch = ir.epoch if ir is not None else epoch_floor + 1
        if self.metrics is not None:
            self.metrics.attach(server, asyncio.get_running_loop())
        info = dataclasses.replace(self.elector.info, role="leader", epoch=self.epoch, since_s=time.time())
        try:
            ok = await self.elector.announce(term, info, self.epoch)
        except Unavailable as exc:
            ok = False
            log.warning("cannot record the epoch in etcd: %s", exc.message)
        if not ok or not term.fence.valid():
            term.fence.close("the leader key changed before the epoch was recorded")
            await self._drop(server, term.fence.closed)
            self.role = "standby"
            return
        self.server = server
        self.role = "leader"
        self.last_takeover_s = time.monotonic() - t0
        rec = server.index_recovery
        log.warning("master %s is the leader at epoch %d (%s): rebuilt %d object(s) from the region index in "
                    "%.3f s; serving %.3f s after winning the campaign%s", self.node_id, self.epoch,
                    server.address, rec.get("restored", 0), float(rec.get("seconds", 0.0)), self.last_takeover_s,
                    f" (previous leader {was.master_id} at {was.address})" if was and was.master_id != self.node_id
                    else "")
        self.notify.status(f"leader at epoch {self.epoch}: {server.status_line()}")
        meta_task = asyncio.get_running_loop().create_task(self._meta_loop(term, server), name="etcd-meta")
        deposed_task = asyncio.get_running_loop().create_task(server.wait(), name="server-wait")
        watch = asyncio.get_running_loop().create_task(self.elector.watch_term(term, self._stop), name="term")
        try:
            done, _ = await asyncio.wait({watch, deposed_task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            meta_task.cancel()
            if not deposed_task.done():
                deposed_task.cancel()
        reason = ""
        if watch in done:
            reason = watch.result()
        else:
            watch.cancel()
            reason = server.deposed or ("" if self._stop.is_set() else "the server stopped")
            if reason:
                term.fence.close(reason)
        if not reason:  # a clean stop: hand over at once
            log.info("leader stopping: refusing new calls, releasing the region and the leader key")
            term.fence.close("stopping: handed over to a standby")
            server.ownership.release()
            server.deposed = "handed over"  # stop() must not write the owner record again: it may be the successor's
            # Deleting the leader key hands over at once; should etcd not answer, the
            # lease revoked at exit (or its TTL) does it.
            await self._stop_budget.step("deleting the leader key", self.elector.step_down(term), cap_s=2.5)
            server.grace_s = 0.5
            await server.stop()
        else:
            await self._drop(server, reason)
            self.elector.term = None
        self.server = None
        self.role = "standby"
        self.leader_changes += 1
        if self.metrics is not None:
            self.metrics.detach()
        self.notify.status(f"standby (master {self.node_id}, {self.address})")

    def _start_warm(self) -> None:
        """As a standby, keep a warm copy of the state (``standby_refresh_s``; master/warm.py)."""
        if self.config.standby_refresh_s > 0 and self._warm_task is None:
            self._warm_stop = False  # before the task runs: a takeover may stop it before its first step
            self._warm_task = asyncio.get_running_loop().create_task(self._warm_loop(), name="warm-standby")

    async def _stop_warm(self) -> None:
        """Stop keeping warm (a pass under way finishes first: it runs in a thread).

        Cancelling this wait leaves the task running and :attr:`_warm_task` set: the
        warm state must not be closed under a pass (its regions would be unmapped).
        """
        task = self._warm_task
        if task is not None:
            self._warm_stop = True
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                if task.done():  # the task itself was cancelled, not this wait
                    self._warm_task = None
                raise
            except Exception:  # logged in the loop
                pass
            self._warm_task = None

    async def _warm_loop(self) -> None:
        from cxlkv.master.warm import WarmState

        try:
            if self.warm is None and not self._warm_stop:
                t0 = time.monotonic()
                self.warm = await asyncio.to_thread(WarmState, self.config)
                n = await asyncio.to_thread(self.warm.refresh)
                log.info("warm standby: %d slot(s) of the index applied to a copy of the state in %.3f s; "
                         "following it every %.1f s", n, time.monotonic() - t0, self.config.standby_refresh_s)
            while not self._warm_stop:
                for _ in range(max(1, int(self.config.standby_refresh_s / 0.05))):
                    if self._warm_stop:
                        return
                    await asyncio.sleep(0.05)
                await asyncio.to_thread(self.warm.refresh)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the standby rebuilds cold at takeover instead
            log.warning("warm standby off (a takeover rebuilds from the index): %s", exc)
            if self.warm is not None:
                self.warm.close()
                self.warm = None

    async def _drop(self, server: Any, reason: str) -> None:
        """Stop a server whose term ended: no drain, no owner-record write, state dropped."""
        if self.metrics is not None:
            self.metrics.detach()
        server.deposed = server.deposed or reason
        server.state.index = NoIndex()
        server.grace_s = 0.0
        try:
            await server.stop()
        except Exception:  # stopping must not kill the standby
            log.exception("stopping the deposed server failed")
        fence = getattr(server, "fence", None)
        log.warning("master %s: stepped down (%s); %d call(s) and index write(s) refused after the term ended; "
                    "standby again", self.node_id, reason, fence.refused if fence is not None else 0)

    async def _stand_down(self, term: Term) -> None:
        term.fence.close("stood down")
        await self.elector.step_down(term)
        self.role = "standby"

    def _check_meta(self, meta: ClusterMeta) -> None:
        mine = _config_digest(self.config)
        for k, v in meta.config.items():
            if mine.get(k) != v:
                log.warning("this master's %s is %r, the previous leader's was %r: masters of one cluster "
                            "should share one configuration", k, mine.get(k), v)
        names = {sc.name for sc in self.config.segments}
        for seg in meta.segments:
            if seg.get("tier") == "cxl" and seg.get("name") not in names:
                log.warning("segment %s (%s) of the previous leader is not in this master's configuration: its "
                            "objects are not rebuilt", seg.get("name"), seg.get("path"))

    async def _meta_loop(self, term: Term, server: Any) -> None:
        from cxlkv.master.election import OVERFLOW_RECORDS_MAX, overflow_records

        last_overflow = None
        unrecorded_warned = 0  # the count last warned about (0: none unrecorded)
        while True:
            try:
                st = server.state
                writer = server.ownership.writer
                records = overflow_records(st, writer) if writer is not None else []
                encoded = json.dumps(records).encode()
                overflow = encoded if encoded != last_overflow else None
                meta = ClusterMeta(
                    segments=[{"name": s.name, "tier": str(getattr(s.tier, "value", s.tier)),
                               "size_bytes": s.size_bytes, "region_uuid": s.region_uuid,
                               "path": s.device_path} for s in st.segments()],
                    version_floor=int(getattr(st, "_seq", 0)) + FLOOR_HEADROOM,
                    config=_config_digest(self.config))
                if not await self.elector.write_meta(term, meta, overflow):
                    term.fence.close("the leader key changed (P/meta write refused)")
                    return
                if overflow is not None:
                    last_overflow = overflow
                    if records:
                        log.info("index overflow: %d committed object(s) without a slot recorded in etcd for the "
                                 "next leader", len(records))
                total = int(getattr(writer, "overflow", 0)) if writer is not None else 0
                unrecorded = total - len(records) if len(records) >= OVERFLOW_RECORDS_MAX else 0
                if unrecorded > 0 and (not unrecorded_warned or unrecorded >= 2 * unrecorded_warned):
                    log.warning("index overflow: %d committed object(s) have no slot in the index and only %d can be "
                                "recorded in etcd: %d would be lost if this leader failed now; size the index above "
                                "the object count (cxlkv region format --expected-objects, docs/ha.md)",
                                total, len(records), unrecorded)
                    unrecorded_warned = unrecorded
                elif unrecorded <= 0:
                    unrecorded_warned = 0
            except Unavailable as exc:
                log.debug("meta: %s", exc.message)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug; keep leading
                log.exception("writing the cluster metadata failed")
            await asyncio.sleep(META_INTERVAL_S)


def restore_overflow(server: Any, records: list[list[Any]]) -> int:
    """Restore the objects of ``P/overflow`` records whose extent's object header still
    describes them exactly (and that the state does not hold yet); returns how many.
    Called before the new leader serves."""
    from types import SimpleNamespace

    from cxlkv.master.recovery import _verified_key
    from cxlkv.master.objects import RestoredObject
    from cxlkv.layout.objheader import OBJECT_HEADER_BYTES, key_hash, parse_header

    st = server.state
    regions = {o.segment.name: o for o in server.ownership.owned}
    per_segment: dict[int, list[Any]] = {}
    for key, seg_name, off, size, hb, version, checksum in records:
        o = regions.get(seg_name)
        if o is None or not isinstance(key, str):
            continue
        cur = st.get_object(key)
        if cur is not None and cur.version >= version:
            continue
        probe = SimpleNamespace(extent_offset_bytes=off, header_bytes=hb, value_len_bytes=size,
                                key_hash=key_hash(key.encode()), version=version, value_checksum=checksum)
        if _verified_key(o.region, probe, OBJECT_HEADER_BYTES, parse_header) != key:
            continue
        per_segment.setdefault(o.segment.segment_id, []).append(
            RestoredObject(key, off, size, hb, version, checksum))
    n = 0
    for sid, objs in per_segment.items():
        rep = st.restore_objects(sid, objs, time.monotonic())
        n += rep.restored
    st.index.sync()
    return n


def _config_digest(cfg: MasterConfig) -> dict[str, Any]:
    """The settings masters of one cluster must share."""
    return {"allocation_strategy": cfg.allocation_strategy, "eviction_policy": cfg.eviction_policy,
            "alignment_bytes": cfg.alignment_bytes,
            "segments": sorted(f"{s.name}:{s.tier}:{s.size_bytes}" for s in cfg.segments)}


async def run_ha_master(config: MasterConfig, *, notifier: Notifier | None = None) -> int:
    """Run one master of a leader-elected group until SIGTERM/SIGINT.

    Returns:
        The exit code (0; the process exits with 1 itself when the stop overruns
        :data:`STOP_LIMIT_S`, module docstring).

    Raises:
        ConfigError: as :class:`~cxlkv.master.server.MasterServer` for settings
            checked before the first campaign (a listen address with port 0:
            clientds could not find the master again after a takeover).
    """
    if config.listen_address.endswith(":0") and not config.advertise_address:
        raise ConfigError("listen_address: with etcd_endpoints every master needs a fixed port (clientds list "
                          "the masters' addresses), got port 0")
    node = HaNode(config, notifier=notifier)
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        arm_exit_deadline(STOP_LIMIT_S + 2.5, "master", log)
        node.request_stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    tasks = [loop.create_task(node.notify.run_watchdog(), name="watchdog")]
    try:
        return await node.run()
    finally:
        for t in tasks:
            t.cancel()
