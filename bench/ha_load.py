"""Mixed load against a cluster with several masters, and what it saw (bench/ha.py, tests/cluster/test_ha.py).

:class:`MixedLoad` runs writer and reader threads, each with its own
:class:`cxlkv.Client` on one clientd: writers put unique keys whose bytes are a
function of the key and record every acknowledged put with its time; readers
get keys already acknowledged and check every byte. :meth:`MixedLoad.report`
says how long writes were refused around an event (the write gap), how many
reads failed, and :meth:`MixedLoad.verify` reads back every acknowledged key.
"""

from __future__ import annotations

import hashlib
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MixedLoad", "value_of", "follow_leader"]


def value_of(key: str, size_bytes: int) -> bytes:
    """The bytes ``key`` is written with: its BLAKE2b digest repeated to ``size_bytes``."""
    d = hashlib.blake2b(key.encode(), digest_size=64).digest()
    return (d * (size_bytes // 64 + 1))[:size_bytes]


@dataclass
class LoadStats:
    """Counts and times of one load run."""

    acked: dict[str, float] = field(default_factory=dict)   # key -> monotonic time of the acknowledgement
    put_failures: list[tuple[float, str]] = field(default_factory=list)
    reads: int = 0
    read_failures: list[tuple[float, str]] = field(default_factory=list)
    wrong_bytes: int = 0


class MixedLoad:
    """Writers and readers on the clientds of ``cluster`` until :meth:`stop`.

    Args:
        cluster: a started :class:`~cxlkv.deploy.cluster.LocalCluster`.
        prefix: key prefix of this run (keys are ``<prefix>-<writer>-<n>``).
        writers, readers: threads of each kind (spread over the clientds).
        value_bytes: size of each value.
        pause_s: sleep between a writer's puts (keeps 2 cores usable for the masters).
    """

    def __init__(self, cluster: Any, prefix: str, *, writers: int = 2, readers: int = 2,
                 value_bytes: int = 4096, pause_s: float = 0.002) -> None:
        self.cluster = cluster
        self.prefix = prefix
        self.value_bytes = value_bytes
        self.pause_s = pause_s
        self.stats = LoadStats()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        n = max(1, cluster.n_clientds)
        self._threads = [threading.Thread(target=self._writer, args=(w, w % n), daemon=True, name=f"w{w}")
                         for w in range(writers)]
        self._threads += [threading.Thread(target=self._reader, args=(r, (r + 1) % n), daemon=True, name=f"r{r}")
                          for r in range(readers)]

    def __enter__(self) -> "MixedLoad":
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop every thread and wait for them."""
        self._stop.set()
        for t in self._threads:
            t.join(30)

    def _writer(self, w: int, clientd: int) -> None:
        from cxlkv.errors import CxlkvError

        with _client(self.cluster, clientd) as c:
            n = 0
            while not self._stop.is_set():
                key = f"{self.prefix}-{w}-{n}"
                try:
                    c.put(key, value_of(key, self.value_bytes))
                except CxlkvError as exc:
                    with self._lock:
                        self.stats.put_failures.append((time.monotonic(), f"{type(exc).__name__}: {exc}"))
                    time.sleep(0.01)
                    n += 1  # a put whose outcome is unknown is never retried under the same key
                    continue
                with self._lock:
                    self.stats.acked[key] = time.monotonic()
                n += 1
                if self.pause_s:
                    time.sleep(self.pause_s)

    def _reader(self, r: int, clientd: int) -> None:
        from cxlkv.errors import CxlkvError

        rnd = random.Random(r)
        with _client(self.cluster, clientd) as c:
            while not self._stop.is_set():
                with self._lock:
                    keys = list(self.stats.acked) if len(self.stats.acked) < 64 or rnd.random() < 0.05 else None
                if keys is None:
                    keys = self._recent
                if not keys:
                    time.sleep(0.01)
                    continue
                key = rnd.choice(keys)
                try:
                    got = c.get(key)
                except (CxlkvError, KeyError) as exc:
                    with self._lock:
                        self.stats.reads += 1
                        self.stats.read_failures.append((time.monotonic(), f"{key}: {type(exc).__name__}: {exc}"))
                    continue
                with self._lock:
                    self.stats.reads += 1
                    if got != value_of(key, self.value_bytes):
                        self.stats.wrong_bytes += 1
                        self.stats.read_failures.append((time.monotonic(), f"{key}: wrong bytes"))

    @property
    def _recent(self) -> list[str]:
        with self._lock:
            keys = list(self.stats.acked)
        return keys

    def wait_acked(self, n: int, timeout_s: float = 30.0) -> None:
        """Wait until ``n`` more puts than now are acknowledged.

        Raises:
            TimeoutError: not within ``timeout_s`` (the last put failures included).
        """
        with self._lock:
            want = len(self.stats.acked) + n
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                if len(self.stats.acked) >= want:
                    return
                fails = self.stats.put_failures[-3:]
            if time.monotonic() > deadline:
                raise TimeoutError(f"{n} more puts not acknowledged within {timeout_s} s; last failures: {fails}")
            time.sleep(0.01)

    def write_gap_after(self, t_event: float) -> float | None:
        """Seconds from ``t_event`` (monotonic) to the first put acknowledged after it
        whose writer had a put refused after the event (None: no put failed — the
        event did not interrupt writes — or none succeeded yet)."""
        with self._lock:
            failed = [t for t, _ in self.stats.put_failures if t >= t_event]
            if not failed:
                return 0.0
            after = [t for t in self.stats.acked.values() if t > failed[0]]
        return (min(after) - t_event) if after else None

    def verify(self, cluster: Any, clientd: int = 0) -> tuple[int, int]:
        """Read every acknowledged key back; returns ``(lost, wrong)``."""
        lost = wrong = 0
        with self._lock:
            keys = list(self.stats.acked)
        with _client(cluster, clientd) as c:
            for i in range(0, len(keys), 256):
                chunk = keys[i:i + 256]
                for k, r in zip(chunk, c.get_many(chunk)):
                    if not r.ok:
                        lost += 1
                    elif r.value != value_of(k, self.value_bytes):
                        wrong += 1
        return lost, wrong


def _client(cluster: Any, i: int) -> Any:
    from cxlkv import Client

    return Client(cluster.socket_path(i))


def follow_leader(cluster: Any, timeout_s: float = 20.0, other_than: int | None = None) -> int:
    """Wait for a leader (not ``other_than``), point the test cluster's master
    stub at it; returns its index in ``cluster.masters``."""
    i = cluster.wait_leader(timeout_s, other_than=other_than)
    cluster.master = cluster.masters[i]
    cluster.master_address = cluster.master_addresses[i]
    if getattr(cluster, "_channel", None) is not None:
        cluster._channel.close()
        cluster._channel = None
    return i
