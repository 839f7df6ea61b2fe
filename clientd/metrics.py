"""Prometheus /metrics for clientd (config ``metrics_address``).

Values are read at scrape time from the daemon's counters (no instrumentation on
the hot path): operations and bytes by kind, master calls and items per
coalesced kind (their ratio is the mean batch size), registered buffers.
"""

from __future__ import annotations

from typing import Any, Iterator

from prometheus_client import start_http_server
from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily

from cxlkv.clientd.buffers import BufferRegistry
from cxlkv.clientd.core import ClientdCore
from cxlkv.config import ConfigError

__all__ = ["ClientdCollector", "start_metrics"]


class ClientdCollector:
    """Reads one daemon's counters at scrape time."""

    def __init__(self, core: ClientdCore, buffers: BufferRegistry) -> None:
        self.core = core
        self.buffers = buffers

    def collect(self) -> Iterator[Any]:
        c = self.core.counters
        items = CounterMetricFamily("cxlkv_clientd_items_total", "Items handled, by operation", labels=["op"])
        for op in ("put", "get", "exist", "remove"):
            items.add_metric([op], c.get(f"{op}_items", 0))
        yield items
        errors = CounterMetricFamily("cxlkv_clientd_errors_total", "Failed items, by operation", labels=["op"])
        for op in ("put", "get"):
            errors.add_metric([op], c.get(f"{op}_errors", 0))
        yield errors
        moved = CounterMetricFamily("cxlkv_clientd_copied_bytes_total", "Bytes copied", labels=["direction"])
        moved.add_metric(["in"], c.get("bytes_in", 0))
        moved.add_metric(["out"], c.get("bytes_out", 0))
        yield moved
        calls = CounterMetricFamily("cxlkv_clientd_master_calls_total", "Coalesced master calls", labels=["kind"])
        sent = CounterMetricFamily("cxlkv_clientd_master_items_total", "Items in coalesced master calls",
                                   labels=["kind"])
        for co in self.core.link.coalescers():
            calls.add_metric([co.name], co.calls)
            sent.add_metric([co.name], co.items)
        yield calls
        yield sent
        n, size = self.buffers.stats()
        yield GaugeMetricFamily("cxlkv_clientd_buffers", "Registered shared buffers", value=n)
        yield GaugeMetricFamily("cxlkv_clientd_buffer_bytes", "Bytes of registered shared buffers", value=size)
        yield GaugeMetricFamily("cxlkv_clientd_master_connected", "1 when the last master call got through",
                                value=1 if self.core.link.connected else 0)


def start_metrics(address: str, core: ClientdCore, buffers: BufferRegistry) -> tuple[Any, str]:
    """Serve /metrics on ``host:port`` (port 0 picks one) in a daemon thread.

    Returns:
        (the HTTP server — call ``shutdown()`` to stop it, its URL).

    Raises:
        ConfigError: ``address`` is not ``host:port``.
        OSError: the port could not be bound.
    """
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"metrics_address: expected host:port, got {address!r}")
    registry = CollectorRegistry()
    registry.register(ClientdCollector(core, buffers))  # type: ignore[arg-type]
    server, _thread = start_http_server(int(port), addr=host or "0.0.0.0", registry=registry)
    bound = server.server_address[1]
    return server, f"http://{host or '127.0.0.1'}:{bound}/metrics"
