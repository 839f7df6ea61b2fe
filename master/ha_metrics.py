"""Prometheus /metrics of a master taking part in leader election (docs/ha.md).

A standby serves metrics too, so the process keeps one metrics server for its
whole life (``metrics_address``) and each term's
:class:`~cxlkv.master.server.MasterServer` runs without its own:
:class:`HaCollector` always exports

* ``cxlkv_master_is_leader`` — 1 while this process leads and serves, else 0;
* ``cxlkv_master_leader_changes_total`` — terms this process won or lost;
* ``cxlkv_master_epoch`` — the owner epoch of its current term (0 as standby);
* ``cxlkv_master_takeover_seconds`` — from winning the campaign to serving, last term;
* ``cxlkv_master_leader_lease_seconds`` — the etcd lease TTL granted;

and, while leading, every metric of :class:`~cxlkv.master.metrics.MasterCollector`
and the event loop's stall metrics for the term's state.
"""

from __future__ import annotations

import asyncio
from typing import Any, Iterator

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from cxlkv.runtime.metrics import RequestStats, StallCollector, serve_metrics

__all__ = ["HaCollector", "HaMetrics", "lone_master_families"]


def lone_master_families(epoch: int) -> Iterator[Any]:
    """The election metrics of a master without election (its own leader, never changes)."""
    g = GaugeMetricFamily("cxlkv_master_is_leader", "1 while this master leads and serves, else 0")
    g.add_metric([], 1.0)
    yield g
    c = CounterMetricFamily("cxlkv_master_leader_changes", "leadership terms this master won or lost")
    c.add_metric([], 0.0)
    yield c
    e = GaugeMetricFamily("cxlkv_master_epoch", "owner epoch of this master's current term (0: standby)")
    e.add_metric([], float(epoch))
    yield e
    t = GaugeMetricFamily("cxlkv_master_takeover_seconds",
                          "seconds from winning the campaign to serving, last term (region rebuilt from its index)")
    t.add_metric([], 0.0)
    yield t


class HaCollector:
    """The election metrics of ``node`` (a :class:`~cxlkv.master.ha.HaNode`) and,
    while it leads, its term's master metrics."""

    def __init__(self, node: Any) -> None:
        self.node = node
        #: The current term's collectors (set while leading).
        self.inner: list[Any] = []

    def collect(self) -> Iterator[Any]:
        """Yield the metric families (called from prometheus-client's thread)."""
        n = self.node
        leading = n.role == "leader"
        g = GaugeMetricFamily("cxlkv_master_is_leader", "1 while this master leads and serves, else 0")
        g.add_metric([], 1.0 if leading else 0.0)
        yield g
        c = CounterMetricFamily("cxlkv_master_leader_changes", "leadership terms this master won or lost")
        c.add_metric([], float(n.leader_changes))
        yield c
        e = GaugeMetricFamily("cxlkv_master_epoch", "owner epoch of this master's current term (0: standby)")
        e.add_metric([], float(n.epoch if leading else 0))
        yield e
        t = GaugeMetricFamily("cxlkv_master_takeover_seconds",
                              "seconds from winning the campaign to serving, last term (region rebuilt from its index)")
        t.add_metric([], float(n.last_takeover_s))
        yield t
        ttl = GaugeMetricFamily("cxlkv_master_leader_lease_seconds", "the etcd lease TTL granted to this master")
        ttl.add_metric([], float(n.elector.granted_ttl_s))
        yield ttl
        for inner in list(self.inner) if leading else []:
            yield from inner.collect()


class HaMetrics:
    """The metrics server of one election-taking master process.

    Args:
        node: the :class:`~cxlkv.master.ha.HaNode`.
        address: ``metrics_address``.
        tls: the master's TLS files (served as https when enabled).
    """

    def __init__(self, node: Any, address: str, tls: Any = None) -> None:
        from cxlkv.master.metrics import RpcObserver

        self.rpc = RequestStats("cxlkv_master_rpc", "master RPC")
        self.collector = HaCollector(node)
        registry = CollectorRegistry()
        registry.register(self.collector)  # type: ignore[arg-type]
        ProcessCollector(registry=registry)
        self.server, self.url = serve_metrics(address, registry, tls=tls)
        self.observer = RpcObserver(self.rpc)

    def attach(self, server: Any, loop: asyncio.AbstractEventLoop) -> None:
        """Export ``server``'s state for its term (and feed its RPC stats)."""
        from cxlkv.master.metrics import MasterCollector

        server.servicer.observe = self.observer
        server.servicer.metrics_url = server.metrics_url = self.url
        self.collector.inner = [MasterCollector(server.state, self.rpc, loop), StallCollector(server.stalls)]

    def detach(self) -> None:
        """The term ended: export the election metrics only."""
        self.collector.inner = []

    async def close(self) -> None:
        """Stop serving."""
        await asyncio.to_thread(self.server.shutdown)
        self.server.server_close()
