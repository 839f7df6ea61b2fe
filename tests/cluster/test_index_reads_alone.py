"""A process that only reads from the region's index never blocks on its daemon.

Reads from the index send their hits to clientd now and then (ReportHits, without
waiting for the answer). Two ways that used to stall every read for the connection's
whole timeout (30 s), now covered:

* nobody read the daemon's answers to those reports: after some millions of reads
  (81k reads with a report per read) the answers filled the daemon's side, it stopped
  reading the connection, and the next report blocked;
* the daemon stopped (SIGSTOP, a paused container): once its socket was full, the
  next report blocked. Reports are now dropped instead (``Client.reports_dropped``),
  the reads go on, and reports flow again once the daemon runs.

Reports are sent per read here (``HITS_BATCH = 1``) to reach those counts in seconds.
"""

from __future__ import annotations

import signal
import time

import pytest

import cxlkv.client._index as index_path

#: A read from the index must never wait anywhere near the connection's timeout.
READ_BOUND_S = 1.0


@pytest.fixture()
def report_every_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index_path, "HITS_BATCH", 1)


def _stored(c, prefix: str) -> list[str]:
    """100 small keys put through ``c`` (read back from the index afterwards)."""
    keys = [f"{prefix}/{i}" for i in range(100)]
    for k in keys:
        c.put(k, b"r" * 200, upsert=True)
    return keys


def _reads(c, keys: list[str], seconds: float) -> tuple[int, float]:
    n, slowest, end = 0, 0.0, time.monotonic() + seconds
    while time.monotonic() < end:
        for k in keys:
            t = time.monotonic()
            c.get(k)
            slowest = max(slowest, time.monotonic() - t)
            n += 1
    return n, slowest


@pytest.mark.parametrize("protocol", ["lean", "grpc"])
def test_only_reads_from_the_index_never_block(cluster, report_every_read, protocol: str) -> None:
    with cluster.client(0, protocol=protocol) as c:
        keys = _stored(c, "alone")
        n, slowest = 0, 0.0
        while n < 120_000:  # past the 81k reads that filled the answers before
            got, worst = _reads(c, keys, 1.0)
            n, slowest = n + got, max(slowest, worst)
        assert slowest < READ_BOUND_S, (n, slowest)
        # a report per read outruns the daemon, which then drops some (never blocks)
        assert int(c.stat()["counters"]["get_items"]) + c.reports_dropped >= n // 2
        before = int(c.stat()["counters"]["get_items"])
        c.get(keys[0])
        c.get(keys[1])
        assert int(c.stat()["counters"]["get_items"]) > before  # the reports arrived


@pytest.mark.parametrize("protocol", ["lean", "grpc"])
def test_reads_from_the_index_go_on_while_the_daemon_is_stopped(cluster, report_every_read, protocol: str) -> None:
    with cluster.client(0, protocol=protocol) as c:
        keys = _stored(c, "paused")
        proc = cluster.clientds[0]
        proc.signal(signal.SIGSTOP)
        try:
            n, slowest = _reads(c, keys, 3.0)
        finally:
            proc.signal(signal.SIGCONT)
        assert slowest < READ_BOUND_S, (n, slowest)
        assert c.reports_dropped > 0, n  # its socket filled: reports dropped, reads went on
        before = int(c.stat()["counters"]["get_items"])
        _reads(c, keys, 0.5)
        assert int(c.stat()["counters"]["get_items"]) > before  # reports flow again
