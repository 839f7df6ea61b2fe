"""Reads from the region's index, the SDK's side: a get that is a memory operation.

When the process maps the region (direct mode) and its clientd reports that the
master publishes a committed-object index there (``DirectInfo.index_region_uuid``,
docs/index.md), :class:`IndexPath` answers ``get``, ``get_into``, their batch
forms, ``get_prefix_into`` and ``exists`` with one C call each
(:class:`cxlkv.transport.index.IndexReader`: probe the slot, copy while hashing
the delivered bytes, check the extent's header) and no RPC at all.

What a read promises instead of a lease: the bytes returned are those of one
committed version of the key, verified (key, version, length, value checksum),
or the read is a miss; a value overwritten under the copy is detected and read
again once, then taken through the daemon (the leased RPC path). Lookups the
index cannot answer (another tier, a value over the reader's size limit, an
overflowed table, an index not published) answer :data:`FALLBACK` and go
through the daemon.

Hits are reported to the daemon in batches (``ReportHits``, sent without
waiting for an answer: at most :data:`HITS_BATCH` keys or :data:`HITS_DELAY_S`
late), which forwards them to the master's eviction policy.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Callable, Sequence

from cxlkv.errors import CxlkvError, InvalidKey, NotFound, OutOfRange
from cxlkv.wire.keys import key_error
from cxlkv.v1 import client_pb2, common_pb2

__all__ = ["IndexPath", "MISS", "FALLBACK", "HITS_BATCH", "HITS_DELAY_S", "MAX_VALUE_BYTES"]

#: What a process reports of its index reads (``ClientReportHitsRequest`` fields).
_STATS = ("get_items", "bytes_out", "prefix_queries", "prefix_keys", "prefix_hits", "reads_copied_again")

#: Hits are sent to the daemon once this many are pending...
HITS_BATCH = 512
#: ... or when the oldest pending one is this old (seconds), at the next read.
HITS_DELAY_S = 0.02
#: Longer values are read through the daemon (a lease protects a long copy), in bytes.
MAX_VALUE_BYTES = 4 << 20


class _Marker:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


_monotonic = time.monotonic
_INF = float("inf")

#: The key is not committed (a definite miss, from the index).
MISS = _Marker("MISS")
#: The index cannot answer: read through the daemon.
FALLBACK = _Marker("FALLBACK")


class IndexPath:
    """Lock-free reads of the cluster's index from this process.

    Args:
        reader: a :class:`cxlkv.transport.index.IndexReader` over regions this
            process maps.
        send: ``send(method_name, request)`` to the daemon without waiting (hit reports).
        call: ``call(method_name, request)`` waiting for the answer (the last report, at close).

    Thread-safety: safe to share; each thread has its own scratch buffer.
    """

    def __init__(self, reader: Any, send: Callable[[str, Any], None],
                 call: Callable[[str, Any], Any] | None = None) -> None:
        from cxlkv.transport.bindings import fresh_bytes
        from cxlkv.transport.index import IX_ELSEWHERE, IX_HIT, IX_MISS, IX_TOO_SMALL

        self._fresh_bytes = fresh_bytes
        self.reader = reader
        self._send = send
        self._call = call
        self._hit, self._miss, self._small, self._elsewhere = IX_HIT, IX_MISS, IX_TOO_SMALL, IX_ELSEWHERE
        # Single-key gets note their hit (key) and their bytes (0: a miss) with one
        # deque append each, lock-free (deque appends and pops are atomic): a report
        # takes exactly what was appended before it, never loses one appended meanwhile.
        self._hits: deque[str] = deque()
        self._get_bytes: deque[int] = deque()
        #: Monotonic time by which what is pending is reported (inf: nothing pending).
        self._due_at = _INF
        self._chain_keys: list[str] = []  # prefix queries since the last report (packed)
        self._chain_lengths: list[int] = []
        self._chain_matched: list[int] = []
        self._stats = dict.fromkeys(_STATS, 0)  # not yet reported (besides the deques)
        self._pending = False
        self._hits_lock = threading.Lock()
        #: Lookups answered (hit or miss) and handed to the daemon, since start.
        self.answered = 0
        self.fallbacks = 0

    # -- hits and statistics -----------------------------------------------------
    def _note(self, hits: Sequence[str] = (), chain: Sequence[str] | None = None, **stats: int) -> None:
        """Count what was read (for the daemon's metrics) and queue the hits (for the
        master's eviction policy) and the prefix query's ``chain`` (all its keys; the
        policy learns the prefix structure from it); report when :data:`HITS_BATCH`
        hits or :data:`HITS_DELAY_S` have accumulated."""
        now = _monotonic()
        with self._hits_lock:
            self._pending = True
            if self._due_at == _INF:
                self._due_at = now + HITS_DELAY_S
            self._hits.extend(hits)
            if chain is not None:
                self._chain_keys.extend(chain)
                self._chain_lengths.append(len(chain))
                self._chain_matched.append(len(hits))
            pending = self._stats
            for k, v in stats.items():
                pending[k] += v
            due = len(self._hits) + len(self._chain_keys) >= HITS_BATCH or now >= self._due_at
        if due:
            self.flush_hits()

    def _note_get(self, key: str | None, nbytes: int) -> None:
        """:meth:`_note` of one single-key get (a hit of ``nbytes`` when ``key`` is
        given, else a miss), without its generality or its lock: it runs on every read."""
        if key is not None:
            self._hits.append(key)
        self._get_bytes.append(nbytes)
        if self._due_at == _INF:
            self._due_at = _monotonic() + HITS_DELAY_S
        elif len(self._hits) >= HITS_BATCH or _monotonic() >= self._due_at:
            self.flush_hits()

    def flush_hits(self, wait: bool = False) -> None:
        """Send the pending report now; with ``wait``, as a call whose answer is
        awaited (``Client.close``: the daemon has counted it before close returns)."""
        with self._hits_lock:
            hits, sizes = self._hits, self._get_bytes
            if not self._pending and not hits and not sizes:
                self._due_at = _INF
                return
            keys = [hits.popleft() for _ in range(len(hits))]  # what was appended so far, exactly
            got = [sizes.popleft() for _ in range(len(sizes))]
            chains = (self._chain_keys, self._chain_lengths, self._chain_matched)
            self._chain_keys, self._chain_lengths, self._chain_matched = [], [], []
            stats, self._stats = self._stats, dict.fromkeys(_STATS, 0)
            self._pending = False
            self._due_at = _INF
        stats["get_items"] += len(got)
        stats["bytes_out"] += sum(got)
        try:
            (self._call if wait and self._call is not None else self._send)(
                "ReportHits", client_pb2.ClientReportHitsRequest(
                    keys=keys, chain_keys=chains[0], chain_lengths=chains[1], chain_matched=chains[2], **stats))
        except CxlkvError:
            pass  # only the eviction policy's and the metrics' information is lost, never data

    # -- reads -------------------------------------------------------------------
    def get(self, key: str) -> bytes | _Marker:
        """The value of ``key`` as bytes, :data:`MISS`, or :data:`FALLBACK`.

        A value of up to 64 KiB is copied into the thread's scratch buffer, then into
        the ``bytes`` returned (:meth:`~cxlkv.transport.index.IndexReader.get_small`);
        a larger one is copied once, straight into the ``bytes`` returned
        (:func:`cxlkv.transport.bindings.fresh_bytes`).
        """
        return self.get_versioned(key)[0]

    def get_versioned(self, key: str) -> tuple[bytes | _Marker, int]:
        """:meth:`get`, and the version read (0 unless a value is returned)."""
        k = key.encode()
        oc, n, retries, value, version = self.reader.get_small(k)
        if oc == self._small:
            value, target = self._fresh_bytes(n)
            r = self.reader.get(k, target)
            del target
            oc, retries, version = r.outcome, r.retries, r.version
            if oc == self._hit and r.value_len_bytes != n:  # upserted smaller in between
                n = r.value_len_bytes
                value = value[:n]
        if retries:
            self._note(reads_copied_again=1)
        if oc == self._hit:
            self.answered += 1
            self._note_get(key, n)
            return value, version  # type: ignore[return-value]
        if oc == self._miss:
            self.answered += 1
            self._note_get(None, 0)
            return MISS, 0
        self.fallbacks += 1
        return FALLBACK, 0

    def get_into(self, key: str, dst: Any) -> int | _Marker:
        """Copy ``key``'s value into ``dst`` (a writable contiguous buffer); its size,
        :data:`MISS` or :data:`FALLBACK`. A value larger than ``dst`` answers
        ``-size`` (the caller raises OutOfRange)."""
        r = self.reader.get(key.encode(), dst)
        oc = r.outcome
        if r.retries:
            self._note(reads_copied_again=1)
        if oc == self._hit:
            self.answered += 1
            self._note_get(key, r.value_len_bytes)
            return r.value_len_bytes
        if oc == self._miss:
            self.answered += 1
            self._note_get(None, 0)
            return MISS
        if oc == self._small:
            return -r.value_len_bytes
        self.fallbacks += 1
        return FALLBACK

    def get_many(self, keys: Sequence[str]) -> list[tuple[bytes | _Marker, int]]:
        """:meth:`get_versioned` per key (invalid keys answer :data:`FALLBACK`: the daemon says why)."""
        return [self.get_versioned(k) if key_error(k) is None else (FALLBACK, 0) for k in keys]

    def get_into_many(self, keys: Sequence[str], dsts: Sequence[Any],
                      versions: list[int] | None = None) -> list[int | _Marker]:
        """:meth:`get_into` per item, in one C call (invalid keys answer :data:`FALLBACK`);
        ``versions``, when given (``len(keys)`` zeros), gets each copied value's version."""
        valid = [i for i, k in enumerate(keys) if key_error(k) is None]
        out: list[int | _Marker] = [FALLBACK] * len(keys)
        if not valid:
            return out
        results = self.reader.get_many([keys[i].encode() for i in valid], [dsts[i] for i in valid])
        hits: list[str] = []
        nbytes = misses = redone = 0
        for i, r in zip(valid, results):
            redone += r.retries
            oc = r.outcome
            if oc == self._hit:
                out[i] = r.value_len_bytes
                if versions is not None:
                    versions[i] = r.version
                hits.append(keys[i])
                nbytes += r.value_len_bytes
            elif oc == self._miss:
                out[i] = MISS
                misses += 1
            elif oc == self._small:
                out[i] = -r.value_len_bytes
        self.answered += sum(1 for o in out if o is not FALLBACK)
        self._note(hits, get_items=len(hits) + misses, bytes_out=nbytes, reads_copied_again=redone)
        return out

    def get_prefix_into(self, keys: Sequence[str], dsts: Sequence[Any]) -> tuple[int, int, bool]:
        """Copy the leading committed keys into ``dsts``.

        Returns:
            ``(matched, too_large, done)``: ``keys[:matched]`` were copied;
            ``too_large`` is the size of ``keys[matched]``'s value when it did not
            fit its destination (else 0); ``done`` is false when the prefix
            stopped at a key the index cannot answer (continue through the daemon
            from ``matched``).
        """
        results = self.reader.get_many([k.encode() for k in keys], dsts, prefix=True)
        matched = nbytes = 0
        for r in results:
            if r.outcome != self._hit:
                break
            matched += 1
            nbytes += r.value_len_bytes
        done = True
        too_large = 0
        if matched < len(keys):
            oc = results[matched].outcome
            if oc == self._small:
                too_large = results[matched].value_len_bytes
            elif oc != self._miss:
                done = False  # the daemon answers from here on (and counts that part)
        if done:
            self.answered += 1
        else:
            self.fallbacks += 1
        self._note(keys[:matched], keys if done else None, bytes_out=nbytes, prefix_hits=matched,
                   prefix_queries=1 if done else 0, prefix_keys=len(keys) if done else matched,
                   reads_copied_again=sum(r.retries for r in results))
        return matched, too_large, done

    def exists_many(self, keys: Sequence[str]) -> list[bool | _Marker]:
        """Whether each key is committed: True, False, or :data:`FALLBACK`."""
        valid = [i for i, k in enumerate(keys) if key_error(k) is None]
        out: list[bool | _Marker] = [FALLBACK] * len(keys)
        if not valid:
            return out
        for i, r in zip(valid, self.reader.probe_many([keys[i].encode() for i in valid])):
            oc = r.outcome
            if oc == self._miss:
                out[i] = False
            elif oc in (self._hit, self._elsewhere, self._small):
                out[i] = True
        return out

    # -- the answers in the Client's terms ---------------------------------------
    def get_into_size(self, key: str, dst: Any) -> int | _Marker:
        """:meth:`get_into` (``dst`` an array): the value's size, or :data:`FALLBACK`.

        Raises:
            NotFound: a definite miss.
            OutOfRange: the value is larger than ``dst`` (``requested_bytes`` = its size).
        """
        n = self.get_into(key, dst)
        if n is MISS:
            raise _not_found(key)
        if n is not FALLBACK and n < 0:  # type: ignore[operator]
            raise _too_small(key, -n, dst.nbytes)  # type: ignore[operator]
        return n

    def get_many_results(self, keys: Sequence[str]) -> tuple[list[Any], list[int]]:
        """:meth:`get_many` as one :class:`~cxlkv.client.Result` per key, and the
        positions to read through the daemon (their result is ``None``)."""
        from cxlkv.client._api import Result

        out: list[Any] = [None] * len(keys)
        rest: list[int] = []
        for i, (v, version) in enumerate(self.get_many(keys)):
            if v is FALLBACK:
                rest.append(i)
            elif v is MISS:
                out[i] = Result(False, error=_not_found(keys[i]))
            else:
                out[i] = Result(True, value=v, version=version)
        return out, rest

    def get_into_many_results(self, keys: Sequence[str], dsts: Sequence[Any]) -> tuple[list[Any], list[int]]:
        """:meth:`get_into_many` (``dsts`` arrays) as one :class:`~cxlkv.client.Result`
        per key (``value`` = bytes copied), and the positions to read through the
        daemon (their result is ``None``)."""
        from cxlkv.client._api import Result

        out: list[Any] = [None] * len(keys)
        rest: list[int] = []
        versions = [0] * len(keys)
        for i, v in enumerate(self.get_into_many(keys, dsts, versions)):
            if v is FALLBACK:
                rest.append(i)
            elif v is MISS:
                out[i] = Result(False, error=_not_found(keys[i]))
            elif v < 0:  # type: ignore[operator]
                out[i] = Result(False, error=_too_small(keys[i], -v, dsts[i].nbytes))  # type: ignore[operator]
            else:
                out[i] = Result(True, v, version=versions[i])
        return out, rest

    def get_prefix_checked(self, keys: Sequence[str], dsts: Sequence[Any],
                           tiers: list[int] | None) -> tuple[int, bool]:
        """:meth:`get_prefix_into` (``dsts`` arrays) with every key checked first:
        ``(matched, done)``; the tier of each matched key (CXL) is appended to ``tiers``.

        Raises:
            InvalidKey: a key is invalid (nothing read).
            OutOfRange: ``keys[matched]``'s value is larger than its destination.
        """
        bad = next((k for k in keys if key_error(k) is not None), None)
        if bad is not None:
            raise InvalidKey(key_error(bad) or "invalid key", key=bad[:64] if isinstance(bad, str) else None)
        matched, too_large, done = self.get_prefix_into(keys, dsts)
        if too_large:
            raise OutOfRange(f"value of key {keys[matched]!r} is {too_large} bytes, the destination holds "
                             f"{dsts[matched].nbytes}", key=keys[matched], requested_bytes=too_large)
        if tiers is not None:
            tiers.extend([common_pb2.CXL] * matched)
        return matched, done


def _not_found(key: str) -> NotFound:
    return NotFound(f"key {key!r} not found", key=key)


def _too_small(key: str, value_bytes: int, dst_bytes: int) -> OutOfRange:
    return OutOfRange(f"value of key {key!r} is {value_bytes} bytes, the destination holds {dst_bytes}",
                      key=key, requested_bytes=value_bytes)
