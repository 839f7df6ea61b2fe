"""Prometheus /metrics for clientd (config ``metrics_address``).

Values are read at scrape time from the daemon's counters (no instrumentation on
the hot path): operations and bytes by kind, master calls and items per
coalesced kind (their ratio is the mean batch size), registered buffers.

Requests are counted by :func:`instrument_api`, which wraps each ClientService
method of the :class:`~cxlkv.clientd.api.ClientApi` once at start (before the
front-ends look them up): calls by method and result (the error code's name),
latency and batch-size histograms (:class:`cxlkv.runtime.metrics.RequestStats`), about
1 µs per call. Prefix-match hits and misses (``cxlkv_clientd_prefix_blocks_total``)
give the cache hit rate; docs/operations.md lists every metric.
"""

from __future__ import annotations

from bisect import bisect_left
from time import perf_counter
from typing import Any, Awaitable, Callable, Iterator

from prometheus_client import ProcessCollector
from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily

from cxlkv.clientd.buffers import BufferRegistry
from cxlkv.clientd.core import ClientdCore
from cxlkv.errors import CxlkvError, ErrorCode
from cxlkv.runtime.metrics import MethodStats, RequestStats, StallCollector, build_info, serve_metrics

__all__ = ["ClientdCollector", "start_metrics", "instrument_api", "BATCH_FIELDS"]

#: Repeated field holding the items of each batch method (its length is the batch size).
BATCH_FIELDS: dict[str, str] = {
    "BatchPut": "items",
    "BatchGet": "keys",
    "BatchExist": "keys",
    "BatchRemove": "keys",
    "BatchPutFrom": "items",
    "BatchGetInto": "items",
    "GetPrefixInto": "items",
    "PackedPutFrom": "keys",
    "PackedGetInto": "keys",
    "PackedGetPrefixInto": "keys",
}

_INTERNAL = int(ErrorCode.INTERNAL)


def _observed(handler: Callable[[Any], Awaitable[Any]], st: MethodStats,
              field: str | None) -> Callable[[Any], Awaitable[Any]]:
    hist = st.latency
    counts = hist.counts
    bounds = hist.bounds
    items = st.items

    async def call(request: Any) -> Any:
        t0 = perf_counter()
        try:
            response = await handler(request)
        except CxlkvError as exc:
            st.done(int(exc.code), perf_counter() - t0)
            raise
        except Exception:  # a bug: the front-end answers INTERNAL
            st.done(_INTERNAL, perf_counter() - t0)
            raise
        dt = perf_counter() - t0
        st.ok += 1
        counts[bisect_left(bounds, dt)] += 1
        hist.total += dt
        if field is not None:
            items.observe(len(getattr(request, field)))
        return response

    call.__name__ = getattr(handler, "__name__", "call")
    call.__doc__ = getattr(handler, "__doc__", None)
    return call


def instrument_api(api: Any, stats: RequestStats) -> None:
    """Wrap every ClientService method of ``api`` to feed ``stats``.

    Must run before the front-ends are built (they look the methods up once).
    Each wrapper times the call and records its result: ``OK``, or the
    :class:`~cxlkv.errors.CxlkvError` code name it raised (``INTERNAL`` for
    any other exception); batch methods also record their item count.
    """
    from cxlkv.client.framing import METHODS

    for m in METHODS:
        setattr(api, m.name, _observed(getattr(api, m.name), stats.method(m.name), BATCH_FIELDS.get(m.name)))


#: Error series exported at 0 before the first such error, so queries and alerts
#: find them (Prometheus practice: initialise the label values you know).
_ERROR_CODES_AT_ZERO = {
    "put": ("NO_SPACE", "TOO_LARGE", "UNAVAILABLE", "INTERNAL"),
    "get": ("CHECKSUM_MISMATCH", "LEASE_EXPIRED", "UNAVAILABLE", "INTERNAL"),
}


class ClientdCollector:
    """Reads one daemon's counters at scrape time.

    Args:
        core: the daemon's protocols (its ``counters``).
        buffers: the shared-buffer registry.
        requests: the API's request stats (``None``: not reported).
    """

    def __init__(self, core: ClientdCore, buffers: BufferRegistry, requests: RequestStats | None = None) -> None:
        self.core = core
        self.buffers = buffers
        self.requests = requests

    def collect(self) -> Iterator[Any]:
        yield build_info("clientd")
        c = self.core.counters
        items = CounterMetricFamily("cxlkv_clientd_items_total", "Items handled, by operation", labels=["op"])
        for op in ("put", "get", "exist", "remove"):
            items.add_metric([op], c.get(f"{op}_items", 0))
        yield items
        errors = CounterMetricFamily(
            "cxlkv_clientd_errors_total",
            "Failed items, by operation and error code (a get's NOT_FOUND and a put's ALREADY_EXISTS are not errors)",
            labels=["op", "code"])
        seen = {(op, code): 0 for op, codes in _ERROR_CODES_AT_ZERO.items() for code in codes}
        for key, n in c.items():
            op, dot, code = key.partition("_errors.")
            if dot and op in ("put", "get"):
                seen[op, code] = n
        for (op, code), n in sorted(seen.items()):
            errors.add_metric([op, code], n)
        yield errors
        yield CounterMetricFamily(
            "cxlkv_clientd_put_already_exists_total",
            "Puts of a key already committed (ALREADY_EXISTS: keys are immutable; SDKs may treat it as success)",
            value=c.get("put_already_exists", 0))
        moved = CounterMetricFamily("cxlkv_clientd_copied_bytes_total", "Bytes copied", labels=["direction"])
        moved.add_metric(["in"], c.get("bytes_in", 0))
        moved.add_metric(["out"], c.get("bytes_out", 0))
        yield moved
        yield CounterMetricFamily(
            "cxlkv_clientd_direct_commit_bytes_total",
            "Value bytes direct-mode writers of this host copied and committed themselves (direct commit; "
            "counted when the writer reports them, checked against the index)",
            value=c.get("direct_commit_bytes", 0))
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
        yield from self._collect_more(c)

    def _collect_more(self, c: Any) -> Iterator[Any]:
        """Prefix hit/miss, checksum, registration and request metrics."""
        hits = c.get("prefix_hits", 0)
        asked = c.get("prefix_keys", 0)
        blocks = CounterMetricFamily(
            "cxlkv_clientd_prefix_blocks_total",
            "keys of prefix queries (GetPrefixInto, PackedGetPrefixInto): hit = inside the longest cached prefix and copied out, "
            "miss = the rest", labels=["result"])
        blocks.add_metric(["hit"], hits)
        blocks.add_metric(["miss"], max(0, asked - hits))
        yield blocks
        yield CounterMetricFamily("cxlkv_clientd_prefix_queries_total", "prefix queries (GetPrefixInto and PackedGetPrefixInto calls)",
                                  value=c.get("prefix_queries", 0))
        yield CounterMetricFamily(
            "cxlkv_clientd_checksum_failures_total",
            "reads whose bytes did not match the object's checksum (flush mode: stale or torn; reported as a miss)",
            value=c.get("checksum_failures", 0))
        yield CounterMetricFamily(
            "cxlkv_clientd_reads_copied_again_total",
            "reads whose first copy did not verify and were copied again with every cache line dropped "
            "(flush mode: a stale line; either mode: a writer racing the read): this daemon's index and "
            "leased reads and those its SDK processes report",
            value=c.get("reads_copied_again", 0))
        yield CounterMetricFamily(
            "cxlkv_clientd_registrations_total",
            "registrations with the master (more than one: the master restarted or the registration expired)",
            value=self.core.link.generation)
        if self.requests is not None:
            yield from self.requests.collect()


def start_metrics(address: str, core: ClientdCore, buffers: BufferRegistry,
                  api: Any = None, tls: Any = None, stalls: Any = None) -> tuple[Any, str]:
    """Serve /metrics on ``host:port`` (port 0 picks one) in a daemon thread.

    Args:
        address: ``host:port`` (``metrics_address``).
        core: the daemon's protocols.
        buffers: the shared-buffer registry.
        api: the :class:`~cxlkv.clientd.api.ClientApi` to instrument with
            :func:`instrument_api` (before its front-ends are built), or ``None``.
        tls: :class:`cxlkv.wire.tls.TlsFiles`: serve https, scrapers need a CA-signed
            certificate (``None`` or disabled: plain HTTP).
        stalls: the daemon's :class:`cxlkv.runtime.loops.StallMonitor` (its event-loop
            stall metrics), or ``None``.

    Returns:
        (the HTTP server — call ``shutdown()`` to stop it, its URL).

    Raises:
        ConfigError: ``address`` is not ``host:port``.
        OSError: the port could not be bound (one line naming the address).
    """
    requests = None
    if api is not None:
        requests = RequestStats("cxlkv_clientd_request", "clientd API")
        instrument_api(api, requests)
    registry = CollectorRegistry()
    registry.register(ClientdCollector(core, buffers, requests))  # type: ignore[arg-type]
    if stalls is not None:
        registry.register(StallCollector(stalls))  # type: ignore[arg-type]
    ProcessCollector(registry=registry)
    return serve_metrics(address, registry, tls=tls)
