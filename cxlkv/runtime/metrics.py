"""Prometheus helpers shared by the master and clientd.

Both daemons serve ``/metrics`` (prometheus-client's HTTP server, in a daemon
thread) from a private :class:`~prometheus_client.CollectorRegistry` whose
collectors read the daemon's own counters at scrape time: the hot path pays a
dictionary increment, never a lock.

What lives here:

* :class:`RequestStats` — calls per method and result (the error code's name,
  ``OK`` on success), latency histograms in seconds and batch-size histograms.
  Written by the event-loop thread only; read from the HTTP thread through
  copies that are atomic under the GIL (``dict.copy``, ``list(...)``), so a
  scrape never sees a torn histogram (its count is the sum of its buckets).
* :func:`build_info` — the ``cxlkv_build_info`` gauge.
* :func:`serve_metrics` — bind ``host:port`` (port 0 picks one) and return the
  URL that Stat reports as ``metrics_url``.

Naming follows Prometheus conventions (docs/operations.md lists every metric):
the ``cxlkv_`` prefix, base units in the name (``_bytes``, ``_seconds``),
counters ending in ``_total``, and labels with bounded values only (method
names, error-code names, segment names, tiers) — never keys.
"""

from __future__ import annotations

import errno
import socket
import sys
from bisect import bisect_left
from typing import Any, Iterable, Iterator

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from cxlkv import __version__
from cxlkv.errors import ConfigError, ErrorCode

__all__ = [
    "LATENCY_BUCKETS_S",
    "BATCH_BUCKETS",
    "Histogram",
    "MethodStats",
    "RequestStats",
    "build_info",
    "histogram_family",
    "split_address",
    "serve_metrics",
    "MetricsBindError",
    "StallCollector",
]

#: Latency histogram upper bounds, in seconds (50 µs … 10 s).
LATENCY_BUCKETS_S: tuple[float, ...] = (
    50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)
#: Batch-size histogram upper bounds, in items per call.
BATCH_BUCKETS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)

_WILDCARD_HOSTS = {"", "0.0.0.0", "::", "[::]"}
_CODE_NAMES = {int(c): c.name for c in ErrorCode}
_ZEROS = {n: [0] * n for n in (len(LATENCY_BUCKETS_S) + 1, len(BATCH_BUCKETS) + 1)}


class Histogram:
    """A fixed-bucket histogram (non-cumulative counts; cumulated at scrape).

    Args:
        bounds: increasing upper bounds; a value ``v`` lands in the first bucket
            whose bound is ``>= v`` (Prometheus ``le`` semantics), or in +Inf.

    Thread-safety: one writer thread; :meth:`snapshot` may run in another.
    """

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        """Count one observation of ``value`` (in the histogram's unit)."""
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def snapshot(self) -> tuple[list[int], float]:
        """``(counts per bucket, sum)``, copied atomically with respect to the writer."""
        return list(self.counts), self.total


def histogram_family(name: str, doc: str, labels: list[str],
                     series: Iterable[tuple[list[str], Histogram]]) -> HistogramMetricFamily:
    """One Prometheus histogram family from ``(label values, Histogram)`` pairs."""
    fam = HistogramMetricFamily(name, doc, labels=labels)
    for values, hist in series:
        counts, total = hist.snapshot()
        cumulative = 0
        buckets = []
        for bound, n in zip(hist.bounds, counts):
            cumulative += n
            buckets.append((_le(bound), cumulative))
        buckets.append(("+Inf", cumulative + counts[-1]))
        fam.add_metric(values, buckets, sum_value=total)
    return fam


def _le(bound: float) -> str:
    return repr(float(bound)) if bound != int(bound) else f"{int(bound)}.0"


class MethodStats:
    """Counters of one method: successes, failures by code name, latency, batch sizes.

    Attributes:
        ok: calls that succeeded.
        errors: error code name → failed calls.
        latency: latency histogram of every call (successful or not), seconds.
        items: items per call histogram (batch methods only; empty otherwise).

    The hot path of a successful call may update ``ok`` and ``latency``
    directly (see :func:`cxlkv.clientd.metrics.instrument_api`).
    """

    __slots__ = ("ok", "errors", "latency", "items")

    def __init__(self) -> None:
        self.ok = 0
        self.errors: dict[str, int] = {}
        self.latency = Histogram(LATENCY_BUCKETS_S)
        self.items = Histogram(BATCH_BUCKETS)

    def done(self, code: int, seconds: float) -> None:
        """Record one call that ended with ``code`` (0 = OK) after ``seconds``."""
        if code:
            name = _CODE_NAMES.get(code) or str(code)
            errors = self.errors
            errors[name] = errors.get(name, 0) + 1
        else:
            self.ok += 1
        self.latency.observe(seconds)

    def results(self) -> dict[str, int]:
        """Result name (``"OK"`` or an error code name) → calls (a copy)."""
        out = {"OK": self.ok}
        out.update(self.errors.copy())
        return out


class RequestStats:
    """Calls per method and result, latency and batch sizes of one daemon's API.

    Args:
        prefix: metric name prefix, e.g. ``"cxlkv_master_rpc"`` gives
            ``cxlkv_master_rpcs_total``, ``cxlkv_master_rpc_duration_seconds``
            and ``cxlkv_master_rpc_batch_items``.
        what: the noun used in help texts (``"master RPC"``).

    Thread-safety: :meth:`method` and the :class:`MethodStats` it returns are
    written by one thread (the event loop); :meth:`collect` may run in another.
    """

    def __init__(self, prefix: str, what: str) -> None:
        self.prefix = prefix
        self.what = what
        self._methods: dict[str, MethodStats] = {}

    def method(self, name: str) -> MethodStats:
        """The stats of ``name``, created on first use (call once per method, not per call)."""
        st = self._methods.get(name)
        if st is None:
            st = self._methods[name] = MethodStats()
        return st

    def results(self) -> dict[str, dict[str, int]]:
        """method → result → calls (a copy)."""
        return {m: st.results() for m, st in self._methods.copy().items()}

    def collect(self) -> Iterator[Any]:
        """The three metric families (calls, latency, batch sizes)."""
        methods = sorted(self._methods.copy().items())
        calls = CounterMetricFamily(
            f"{self.prefix}s_total", f"{self.what} calls by method and result (error code name, OK on success)",
            labels=["method", "result"])
        for m, st in methods:
            for result, n in sorted(st.results().items()):
                calls.add_metric([m, result], n)
        yield calls
        yield histogram_family(
            f"{self.prefix}_duration_seconds", f"{self.what} latency, seconds", ["method"],
            (([m], st.latency) for m, st in methods if st.latency.counts != _ZEROS[len(st.latency.counts)]))
        yield histogram_family(
            f"{self.prefix}_batch_items", f"items per batch {self.what} call", ["method"],
            (([m], st.items) for m, st in methods if st.items.counts != _ZEROS[len(st.items.counts)]))


def build_info(component: str) -> GaugeMetricFamily:
    """``cxlkv_build_info{component, version, commit, python} 1``."""
    from cxlkv._version import commit

    fam = GaugeMetricFamily("cxlkv_build_info", "cxlkv build: always 1, the labels carry the information",
                            labels=["component", "version", "commit", "python"])
    fam.add_metric([component, __version__, commit(), ".".join(map(str, sys.version_info[:3]))], 1)
    return fam


def split_address(address: str, *, key: str = "metrics_address") -> tuple[str, int]:
    """``"host:port"`` (``"[::1]:9464"``, ``":9464"``) → ``(host, port)``.

    Raises:
        ConfigError: not ``host:port`` with a port in 0..65535 (names ``key``).
    """
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"{key}: expected HOST:PORT (port 0 picks a free one), got {address!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


class MetricsBindError(OSError):
    """The metrics address cannot be bound; ``str()`` is one line naming the key and address."""

    def __str__(self) -> str:
        return str(self.strerror)


def serve_metrics(address: str, registry: CollectorRegistry, *, key: str = "metrics_address",
                  tls: Any = None) -> tuple[Any, str]:
    """Serve ``registry`` on ``http://address/metrics`` in a daemon thread.

    Args:
        address: ``host:port``; port 0 picks a free port; a wildcard host
            (``0.0.0.0``, ``::``, empty) listens everywhere and is reported
            with this host's name.
        registry: what to serve.
        key: the configuration key named in error messages.
        tls: a :class:`cxlkv.wire.tls.TlsFiles` with TLS on: served as ``https://``,
            scrapers must present a certificate the cluster CA signed; ``None``
            or disabled: plain HTTP.

    Returns:
        ``(server, url)``: call ``server.shutdown()`` then ``server.server_close()``
        to stop; ``url`` is the bound address's ``/metrics`` URL.

    Raises:
        ConfigError: malformed ``address``.
        MetricsBindError: the address cannot be bound (an ``OSError`` whose
            message names ``key``, the address and the reason: in use, not a
            local address, …).
    """
    host, port = split_address(address, key=key)
    bind = host or "0.0.0.0"
    if bind in ("[::]",):
        bind = "::"
    try:
        if tls is not None and tls.enabled:
            server, _thread = start_http_server(
                port, addr=bind, registry=registry, certfile=tls.cert_file, keyfile=tls.key_file,
                client_cafile=tls.ca_file, client_auth_required=True)
        else:
            server, _thread = start_http_server(port, addr=bind, registry=registry)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise MetricsBindError(exc.errno or errno.EADDRNOTAVAIL,
                      f"cannot serve metrics on {address} ({key}): {reason}") from None
    bound_port = server.server_address[1]
    shown = socket.gethostname() if host in _WILDCARD_HOSTS else host
    if ":" in shown:
        shown = f"[{shown}]"
    scheme = "https" if tls is not None and tls.enabled else "http"
    return server, f"{scheme}://{shown}:{bound_port}/metrics"


class StallCollector:
    """The event loop's stalls (:class:`cxlkv.runtime.loops.StallMonitor`) as Prometheus metrics:
    ``cxlkv_event_loop_stall_seconds`` (histogram of every wake-up's delay) and
    ``cxlkv_event_loop_stall_max_seconds`` (gauge: the longest of the last window).

    Args:
        monitor: the daemon's monitor.
    """

    def __init__(self, monitor: Any) -> None:
        self.monitor = monitor

    def collect(self) -> Iterator[Any]:
        m = self.monitor
        yield histogram_family(
            "cxlkv_event_loop_stall_seconds",
            f"how late the event loop woke a task due every {m.interval_s:g} s: the time it was held", [],
            [([], m.histogram)])
        gauge = GaugeMetricFamily(
            "cxlkv_event_loop_stall_max_seconds",
            f"longest event-loop stall of the last {m.window_s:g} s", labels=[])
        gauge.add_metric([], m.max_s)
        yield gauge
