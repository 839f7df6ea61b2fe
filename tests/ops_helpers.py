"""Helpers of the operations tests: scrape /metrics, read samples, find metric names in PromQL."""

from __future__ import annotations

import re
import urllib.request
from dataclasses import dataclass
from typing import Iterable

from prometheus_client.parser import text_string_to_metric_families

#: Options that turn /metrics on for every daemon of a test cluster.
METRICS_ON = {
    "master_options": {"metrics_address": "127.0.0.1:0"},
    "clientd_options": {"metrics_address": "127.0.0.1:0"},
}

_PROMQL_NAME = re.compile(r"\b((?:cxlkv|process)_[a-zA-Z0-9_]+|up)\b")
_HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


@dataclass
class Scrape:
    """One scrape of one endpoint: its text and its parsed families."""

    url: str
    text: str
    families: list

    def samples(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """(sample name, sorted labels) → value."""
        out = {}
        for fam in self.families:
            for s in fam.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out

    def value(self, name: str, **labels: str) -> float:
        """The sum of the samples called ``name`` whose labels include ``labels`` (0 if none)."""
        total = 0.0
        for fam in self.families:
            for s in fam.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    total += s.value
        return total

    def sample_names(self) -> set[str]:
        """Every sample name (``x_total``, ``x_bucket`` …)."""
        return {s.name for fam in self.families for s in fam.samples}

    def family(self, name: str):
        """The family called ``name`` (counters without ``_total``), or ``None``."""
        for fam in self.families:
            if fam.name == name:
                return fam
        return None


def scrape(url: str, timeout_s: float = 10.0) -> Scrape:
    """GET ``url`` and parse the Prometheus text format."""
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        assert resp.status == 200, url
        assert resp.headers.get("Content-Type", "").startswith("text/plain"), resp.headers
        text = resp.read().decode()
    return Scrape(url, text, list(text_string_to_metric_families(text)))


def metric_urls(cluster) -> tuple[str, list[str]]:
    """(master's metrics URL, each alive clientd's metrics URL) from the master's Stat."""
    st = cluster.master_stat(False)
    return st.metrics_url, [c.metrics_url for c in st.clients if c.alive]


def promql_metric_names(exprs: Iterable[str]) -> set[str]:
    """Metric names used in PromQL expressions (histogram suffixes kept as written).

    Label values inside quotes and ``{{ }}`` legend templates are ignored.
    """
    names: set[str] = set()
    for expr in exprs:
        bare = re.sub(r'"[^"]*"', '""', expr)
        names.update(_PROMQL_NAME.findall(bare))
    return names


def exists_in(name: str, sample_names: set[str]) -> bool:
    """Whether a PromQL metric name is served: as a sample, or as a histogram's base name."""
    if name in sample_names:
        return True
    return any(name + suffix in sample_names for suffix in _HISTOGRAM_SUFFIXES)
