"""Prometheus /metrics of the master (config ``metrics_address``).

Nothing here instruments the state machine: :class:`MasterCollector` reads
:attr:`MasterState.counters`, the segments, the clients and the gauges of
:class:`~cxlkv.master.state.MasterState` at scrape time, and
:class:`~cxlkv.runtime.metrics.RequestStats` is fed by an observer the servicer calls
once per RPC (method, result code, seconds, batch size).

The state is confined to the event-loop thread, while prometheus-client serves
HTTP from its own thread; so a scrape asks the loop for a snapshot
(``call_soon_threadsafe``) and builds the metric families from that plain
copy. A scrape therefore never races a state change, and costs the loop one
short callback (O(segments + clients)).

Metrics (docs/operations.md has the full list with meanings):

* ``cxlkv_master_segment_{capacity,used,largest_free}_bytes{segment,tier}``,
  ``cxlkv_master_segment_objects{segment,tier}``, ``cxlkv_master_segment_mounted``;
* ``cxlkv_master_keys``, ``cxlkv_master_puts_in_flight``, ``cxlkv_master_leases``,
  ``cxlkv_master_deferred_frees_pending``, ``cxlkv_master_clients{state}``,
  ``cxlkv_master_{high,low}_watermark_ratio``;
* ``cxlkv_master_index_slots``, ``cxlkv_master_index_slots_used{kind="object"|"grant"}``,
  ``cxlkv_master_index_overflow_objects`` (none without a region index);
* one ``cxlkv_master_<counter>_total`` per entry of ``MasterState.counters``
  (puts, leases, evictions, reclaims, …);
* ``cxlkv_master_rpcs_total{method,result}``,
  ``cxlkv_master_rpc_duration_seconds{method}``,
  ``cxlkv_master_rpc_batch_items{method}``;
* ``cxlkv_build_info`` and the ``process_*`` metrics of prometheus-client.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from dataclasses import dataclass
from time import perf_counter
from typing import Any, Iterator

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from cxlkv.master.publish import IndexUsage
from cxlkv.master.segments import Tier
from cxlkv.master.state import MasterState
from cxlkv.runtime.metrics import RequestStats, StallCollector, build_info, serve_metrics

__all__ = ["MasterCollector", "RpcObserver", "COUNTER_HELP", "BATCH_FIELDS", "start_master_metrics"]

log = logging.getLogger(__name__)

#: Seconds a scrape waits for the event loop's snapshot.
SNAPSHOT_TIMEOUT_S = 5.0

#: Help text of each ``MasterState.counters`` entry (exported as ``cxlkv_master_<name>_total``).
#: A counter the state gains later is exported too, with a generic help text.
COUNTER_HELP: dict[str, str] = {
    "puts_started": "puts started (space reserved, PROCESSING)",
    "puts_committed": "puts committed (PutEnd accepted; the object became visible)",
    "puts_revoked": "puts revoked: PutRevoke, timeout or writer expiry (space freed)",
    "puts_reclaimed": "puts reclaimed by the master: writer expired or put_timeout_s passed",
    "upserts": "committed puts that replaced an existing version",
    "lease_grants": "read leases granted (each found key of GetReplicaList/MatchPrefix)",
    "lease_releases": "read leases released early by clientds",
    "lease_expiries": "read leases that ran out (lease_ttl_s) without a release",
    "get_misses": "GetReplicaList lookups of a key that is absent or not committed",
    "removes": "objects removed by Remove and RemoveAll (with or without a pattern)",
    "evictions": "objects evicted (watermark sweep or to make room for a put)",
    "evicted_bytes": "bytes of extents freed by eviction",
    "deferred_frees": "removed versions freed when their last lease ended",
    "no_space": "puts refused with NO_SPACE after eviction",
    "too_large": "puts refused with TOO_LARGE (larger than every segment, or than any keeps past a sweep to low_watermark)",
    "clients_registered": "clientd registrations (including re-registrations)",
    "clients_expired": "clientd registrations expired (no heartbeat for client_ttl_s)",
    "clients_deregistered": "clientd registrations ended by the clientd itself (a planned stop: DeregisterClient)",
    "segments_mounted": "segments mounted",
    "segments_unmounted": "segments unmounted",
    "demotions_started": "DEMOTE tasks queued: CXL → SSD copies of objects with no SSD replica (docs/tiers.md)",
    "demotions": ("objects demoted: CXL replica dropped, SSD replica kept; = demotions_no_copy + "
                  "DEMOTE tasks completed"),
    "demotions_no_copy": ("demotions that needed no task: the object already had an SSD replica (copied "
                          "ahead, promoted earlier, or both found by --recover-from-region)"),
    "promotions_started": "SSD → CXL move tasks queued for hot SSD-only objects",
    "promotions": "objects copied back into CXL (promoted)",
    "promotions_skipped": "promotions not started: no CXL room",
    "dram_caches_started": "copies into a host's DRAM tier queued",
    "dram_caches": "DRAM-tier replicas committed",
    "dram_uncached": "DRAM-tier replicas dropped to make room for hotter ones",
    "moves_failed": "move tasks failed after task_retries attempts (object left where it was)",
    "moves_retried": "move tasks given again (reported failure or task_timeout_s passed)",
    "moves_dropped": "finished moves discarded: the object was removed, replaced or moved meanwhile",
    "moves_fenced": "move destinations held for a clientd that did not report in time (it may still write them)",
    "moves_fence_released": "held move destinations freed when their clientd reported late",
    "ssd_puts": "puts placed on the SSD tier directly (CXL full while demotions run)",
    "ssd_evictions": "SSD-only objects dropped because the SSD tier was full",
    "ssd_copies_started": "CXL → SSD copies queued ahead of demotion (CXL past copy_ahead_watermark)",
    "ssd_copies": "SSD copies committed beside a CXL replica (a later demotion frees CXL at once)",
    "tier_write_refusals": ("move tasks a clientd could not write because the destination tier's filesystem is "
                            "full (NO_SPACE): the tier takes nothing new for full_tier_backoff_s, doubling"),
    "replicas_lost": "replicas lost with an unmounted segment",
    "objects_lost": "objects whose last replica was lost with an unmounted segment",
    "objects_recovered": "objects rebuilt from a region scan at start (--recover-from-region)",
    "puts_fenced": ("puts revoked by put_timeout_s while their writer was alive: the space stays held "
                    "until the writer ends the attempt or expires"),
    "index_hits": "reads served from the region's index (no lease), reported afterwards in batches",
    "objects_damaged_dropped": "objects a reader found destroyed and the master confirmed in the region: dropped",
    "damage_reports_unverified": "damage reports the master could not check in a region it maps (nothing dropped)",
    "damage_reports_ssd": ("damage reports of objects only on the SSD tier (which clientds read, not the master): "
                           "trusted, the object dropped (counted in objects_damaged_dropped too)"),
    "grants_recovered": "extents a previous master had handed to writers, held for them at start",
    "grants_unrecorded": "puts refused (NOT_READY) because the index had no slot left to record their grant",
    "reservations": "extents reserved ahead of need for clientds (puts in one round trip)",
    "reservations_returned": "reserved extents given back unused",
    "commits": "puts committed into a reserved extent (Commit: one master round trip)",
    "quarantined": ("puts and reservations of ended registrations quarantined: their writer may still be "
                    "writing; held until it is known to have stopped"),
    "quarantine_released_bytes": "bytes freed from quarantine (the writer stopped, or an operator said so)",
}

#: Repeated field holding the items of each batch RPC (its length is the batch size).
BATCH_FIELDS: dict[str, str] = {
    "PutStart": "keys",
    "PutEnd": "keys",
    "PutRevoke": "keys",
    "GetReplicaList": "keys",
    "ExistKey": "keys",
    "MatchPrefix": "queries",
    "Remove": "keys",
    "Commit": "keys",
    "ReportReads": "keys",
}


class RpcObserver:
    """Feeds :class:`RequestStats` from the servicer (``MasterServicer.observe``).

    Called on the event-loop thread after every RPC; costs a few dictionary
    operations and one ``bisect`` (about 1 µs).
    """

    def __init__(self, stats: RequestStats) -> None:
        self.stats = stats
        self._methods: dict[str, Any] = {}

    def __call__(self, method: str, code: int, request: Any, seconds: float) -> None:
        """Record one call of ``method`` that ended with ``code`` (0 = OK) after ``seconds``."""
        st = self._methods.get(method)
        if st is None:
            st = self._methods[method] = self.stats.method(method)
        st.done(code, seconds)
        field = BATCH_FIELDS.get(method)
        if field is not None:
            st.items.observe(len(getattr(request, field)))


@dataclass
class _Snapshot:
    """What one scrape reports, copied on the event-loop thread (bytes, counts, ratios)."""

    segments: list[tuple[str, str, int, int, int, int, bool]]
    keys: int
    processing: int
    leases: int
    deferred: int
    reserved_bytes: int
    quarantined_bytes: int
    counters: dict[str, int]
    clients_alive: int
    clients_expired: int
    high_watermark: float
    low_watermark: float
    index: IndexUsage | None = None  # None: no region index


def _tier_name(tier: int) -> str:
    try:
        return Tier(tier).name.lower()
    except ValueError:
        return str(tier)


class MasterCollector:
    """Builds the master's metric families from a snapshot taken on the event loop.

    Args:
        state: the master's state (event-loop confined).
        rpc: the servicer's request stats.
        loop: the event loop that owns ``state``.
    """

    def __init__(self, state: MasterState, rpc: RequestStats, loop: asyncio.AbstractEventLoop) -> None:
        self.state = state
        self.rpc = rpc
        self.loop = loop
        self._loop_thread = threading.get_ident()

    def snapshot(self) -> _Snapshot:
        """Copy what the metrics need (call on the event-loop thread)."""
        st = self.state
        segs = [
            (s.name, _tier_name(s.tier), s.capacity_bytes, s.used_bytes, s.largest_free_bytes,
             s.object_count, s.mounted)
            for s in st.segments(include_unmounted=True)
        ]
        alive = expired = 0
        for c in st.clients():
            if c.alive:
                alive += 1
            else:
                expired += 1
        return _Snapshot(
            segments=segs, keys=st.key_count, processing=st.processing_count, leases=len(st.leases),
            deferred=st.deferred_count, reserved_bytes=st.reserved_bytes, quarantined_bytes=st.quarantined_bytes,
            counters=dict(st.counters), clients_alive=alive,
            clients_expired=expired, high_watermark=st.config.high_watermark,
            low_watermark=st.config.low_watermark, index=st.index.usage(),
        )

    def _snapshot_from_thread(self) -> _Snapshot | None:
        if threading.get_ident() == self._loop_thread:
            return self.snapshot()
        fut: concurrent.futures.Future[_Snapshot] = concurrent.futures.Future()

        def take() -> None:
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(self.snapshot())
                except BaseException as exc:  # a bug: hand it to the scraping thread
                    fut.set_exception(exc)

        try:
            self.loop.call_soon_threadsafe(take)
            return fut.result(SNAPSHOT_TIMEOUT_S)
        except RuntimeError:  # the loop is closed: the master is stopping
            return None
        except concurrent.futures.TimeoutError:
            fut.cancel()
            log.warning("metrics scrape: the event loop did not answer within %.0f s", SNAPSHOT_TIMEOUT_S)
            return None

    #: A master without leader election is its own leader: ``cxlkv_master_is_leader`` 1 and
    #: this owner epoch (a callable; master/ha_metrics.py exports both with election).
    lone_epoch: Any = None

    def collect(self) -> Iterator[Any]:
        """prometheus-client collector protocol."""
        yield build_info("master")
        if self.lone_epoch is not None:
            from cxlkv.master.ha_metrics import lone_master_families

            yield from lone_master_families(self.lone_epoch())
        t0 = perf_counter()
        snap = self._snapshot_from_thread()
        if snap is None:
            return
        labels = ["segment", "tier"]
        cap = GaugeMetricFamily("cxlkv_master_segment_capacity_bytes",
                                "allocatable bytes of the segment (region minus header)", labels=labels)
        used = GaugeMetricFamily("cxlkv_master_segment_used_bytes",
                                 "bytes in live extents of the segment (committed, in flight, or leased after removal)",
                                 labels=labels)
        largest = GaugeMetricFamily("cxlkv_master_segment_largest_free_bytes",
                                    "largest extent that could be allocated now (fragmentation)", labels=labels)
        objects = GaugeMetricFamily("cxlkv_master_segment_objects", "live replicas placed in the segment",
                                    labels=labels)
        mounted = GaugeMetricFamily("cxlkv_master_segment_mounted", "1 while the segment is mounted", labels=labels)
        for name, tier, c, u, lf, n, m in snap.segments:
            lv = [name, tier]
            cap.add_metric(lv, c if m else 0)
            used.add_metric(lv, u if m else 0)
            largest.add_metric(lv, lf if m else 0)
            objects.add_metric(lv, n if m else 0)
            mounted.add_metric(lv, 1 if m else 0)
        yield from (cap, used, largest, objects, mounted)
        yield GaugeMetricFamily("cxlkv_master_keys", "committed keys (visible to Get)", value=snap.keys)
        yield GaugeMetricFamily("cxlkv_master_puts_in_flight", "puts started and not yet ended (PROCESSING)",
                                value=snap.processing)
        yield GaugeMetricFamily("cxlkv_master_leases", "live read leases", value=snap.leases)
        yield GaugeMetricFamily("cxlkv_master_deferred_frees_pending",
                                "removed versions whose space waits for their last lease", value=snap.deferred)
        yield GaugeMetricFamily("cxlkv_master_reserved_bytes",
                                "bytes clientds hold reserved ahead of need", value=snap.reserved_bytes)
        yield GaugeMetricFamily("cxlkv_master_quarantined_bytes",
                                "bytes held for writers of ended registrations until they are known to have stopped",
                                value=snap.quarantined_bytes)
        clients = GaugeMetricFamily("cxlkv_master_clients",
                                    "clientd registrations: alive, or expired (the most recent 256 kept)",
                                    labels=["state"])
        clients.add_metric(["alive"], snap.clients_alive)
        clients.add_metric(["expired"], snap.clients_expired)
        yield clients
        if snap.index is not None:
            yield from _index_families(snap.index)
        yield GaugeMetricFamily("cxlkv_master_high_watermark_ratio",
                                "used/capacity at which a segment starts evicting", value=snap.high_watermark)
        yield GaugeMetricFamily("cxlkv_master_low_watermark_ratio",
                                "used/capacity eviction frees down to", value=snap.low_watermark)
        for name, value in snap.counters.items():
            doc = COUNTER_HELP.get(name, f"master counter {name}")
            yield CounterMetricFamily(f"cxlkv_master_{name}_total", doc, value=value)
        yield from self.rpc.collect()
        yield GaugeMetricFamily("cxlkv_master_scrape_duration_seconds",
                                "time this scrape spent collecting (snapshot included), seconds",
                                value=perf_counter() - t0)


def _index_families(ix: IndexUsage) -> Iterator[Any]:
    """The region index's gauges (docs/index.md, "Sizing and cost")."""
    yield GaugeMetricFamily("cxlkv_master_index_slots",
                            "slots in the region's index table (fixed at format time: --expected-objects)",
                            value=ix.slots)
    used = GaugeMetricFamily("cxlkv_master_index_slots_used",
                             "index slots in use: committed objects, or grants (extents handed to writers)",
                             labels=["kind"])
    used.add_metric(["object"], ix.object_slots)
    used.add_metric(["grant"], ix.grant_slots)
    yield used
    yield GaugeMetricFamily("cxlkv_master_index_overflow_objects",
                            "committed objects without an index slot: their reads and every miss take the leased "
                            "RPC path", value=ix.overflow_objects)


def start_master_metrics(address: str, state: MasterState, loop: asyncio.AbstractEventLoop,
                         tls: Any = None, stalls: Any = None,
                         lone_epoch: Any = None) -> tuple[Any, str, RpcObserver]:
    """Serve the master's /metrics on ``address`` (call on the event-loop thread).

    ``stalls`` (a :class:`cxlkv.runtime.loops.StallMonitor`, or ``None``) adds the event
    loop's stall metrics.

    Returns:
        ``(server, url, observer)``: stop ``server`` with ``shutdown()`` and
        ``server_close()``; install ``observer`` as ``MasterServicer.observe``.

    Raises:
        ConfigError: malformed ``address``.
        MetricsBindError: it cannot be bound (an ``OSError``, one line).
    """
    rpc = RequestStats("cxlkv_master_rpc", "master RPC")
    registry = CollectorRegistry()
    collector = MasterCollector(state, rpc, loop)
    collector.lone_epoch = lone_epoch  # a master without election: its own leader
    registry.register(collector)  # type: ignore[arg-type]
    if stalls is not None:
        registry.register(StallCollector(stalls))  # type: ignore[arg-type]
    ProcessCollector(registry=registry)
    server, url = serve_metrics(address, registry, tls=tls)
    return server, url, RpcObserver(rpc)
