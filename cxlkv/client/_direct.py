"""Direct mode, the SDK's side: map the region here and copy the bytes ourselves.

When the local clientd offers direct mode (``DirectInfo``) and this process can
open a region's file or device read-write and reads the identity header the
daemon reports (uuid, size, segment name — the same check clientd makes), the
SDK asks the daemon only for metadata and moves the bytes itself: one copy
between the caller's memory and the region, none in the daemon.

* **Put** (``DirectPutStart`` → copy + xxh3_64 (``flush`` mode: the transport's
  non-coherent copy, in memory on return) → header
  written and flushed after the value → ``DirectPutEnd``): the same extent layout,
  object header and checksum as clientd writes (:mod:`cxlkv.layout.objheader`). A large
  value's hash runs in a helper thread while the start call is in flight and the
  copy runs (or in one pass with the copy, :meth:`Region.copy_in_hashed`, when
  the transport has it). A copy that fails is revoked; an exception between start
  and end revokes the started puts; if the process dies there, the daemon revokes
  them (it owns the put token and watches our pid).
* **Get** (``DirectGet`` leases → copy out (``flush`` mode verifies first: the
  first copy goes through the cache and is hashed; a GPU destination's range is
  dropped before the DMA) →
  verify the object header (its lines dropped first in ``flush`` mode) and the
  value's checksum exactly as clientd does — a mismatch (a stale line, a racing
  writer) is retried once with every line dropped, then answered CHECKSUM_MISMATCH,
  never data → check the lease had not ended before the copy finished (retried
  once, then LEASE_EXPIRED) → ``DirectRelease``).
* Items the SDK cannot serve itself — placed on a segment it does not map (a DRAM
  or SSD tier, a region it may not open) — are answered ``fallback`` per item and
  go through the daemon path instead (:class:`Fallback`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import xxhash

from cxlkv.errors import (
    ChecksumMismatch, CxlkvError, DaemonUnreachable, ErrorCode, LeaseExpired, OutOfRange, RegionError, error_for,
)
from cxlkv.layout.objheader import MAX_KEY_BYTES, check_copy, header_bytes_for, pack_header
from cxlkv.v1 import client_pb2, common_pb2

try:
    from cxlkv.transport.bindings import cxlkv_guard_total_hits as _guard_total_hits
except ImportError:  # no C transport: no direct mode either
    def _guard_total_hits() -> int:
        return 0

__all__ = ["DirectPath", "Fallback", "HASH_IN_THREAD_BYTES"]

log = logging.getLogger(__name__)

#: Values of at least this many bytes are hashed in a helper thread while the
#: start call is in flight and the copy runs (measured, 16 MiB on 2 cores: the
#: hash then costs nothing on the put's latency; a fused copy+hash pass adds
#: ~0.4 ms to the copy).
HASH_IN_THREAD_BYTES = 1 << 20
#: Hash puts in a helper thread (True) or with the copy in one pass when the
#: transport can (False).
PUT_HASH_OVERLAP = os.environ.get("CXLKV_DIRECT_PUT_FUSED", "") != "1"

#: Longest wait for the master's answer to a direct commit, seconds (as clientd's
#: ``master_timeout_s``; a commit is asked twice before the daemon's path is tried).
MAX_COMMIT_WAIT_S = 10.0
#: Items of a batch committed directly per call (reservations asked for and one
#: Commit each; the daemon hands a writer at most 256 per size and call).
COMMIT_CALL_ITEMS = 256

_xxh3 = xxhash.xxh3_64_intdigest
_UNKNOWN_CLIENT = int(ErrorCode.UNKNOWN_CLIENT)
#: Header sizes of keys of 1 to MAX_KEY_BYTES bytes (what write_headers takes in one call).
_HEADER_MIN, _HEADER_MAX = header_bytes_for(1), header_bytes_for(MAX_KEY_BYTES)


class Fallback:
    """Marker result: this item must go through the daemon path."""

    __slots__ = ()


FALLBACK = Fallback()


@dataclass(slots=True)
class _PutItem:
    pos: int
    key: str
    src: Any                  # 1-D uint8 array, or a device source (see cxlkv.client._cuda)
    size: int
    opts: common_pb2.PutOptions | None
    checksum: Future[int] | int | None = None
    token: int = 0


class DirectPath:
    """The mapped regions of this process and the direct put/get protocols.

    Args:
        call: ``call(method_name, request) -> response`` on the daemon (raises CxlkvError).
        send: ``send(method_name, request)`` without waiting for the answer (lease
            releases); default ``call``.
        regions: segment id → mapped :class:`cxlkv.transport.Region` (identity checked).
        flush: the daemon's coherence mode is ``flush``.
        verify_first: flush mode's reads copy a value through the cache first and
            check it (the daemon's ``flush_reads``; docs/transport.md).

    Thread-safety: safe to share between threads (no mutable state but the
    lazily created hash thread pool).
    """

    def __init__(self, call: Callable[[str, Any], Any], regions: dict[int, Any], *, flush: bool,
                 send: Callable[[str, Any], None] | None = None,
                 identities: dict[int, str] | None = None, verify_first: bool = True) -> None:
        self._call = call
        self._send = send or call
        self.regions = regions
        #: segment id → region uuid of each mapped region (as the daemon listed it).
        self.identities = dict(identities or {})
        #: Why direct mode was turned off after start (:meth:`disable`); "" while on.
        self.disabled = ""
        #: Reads from the region's index (:mod:`cxlkv.client._index`), or None.
        self.index: Any = None
        #: Puts committed to the master by this process (:mod:`cxlkv.client._commit`), or None.
        self.commits: Any = None
        self.flush = flush
        self.verify_first = verify_first
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._puts_in_flight = 0
        self._fused = all(hasattr(r, "copy_in_hashed") and hasattr(r, "copy_out_hashed")
                          for r in regions.values())
        from cxlkv.transport.bindings import fresh_bytes  # the regions are mapped: the transport is here

        self._fresh_bytes = fresh_bytes

    # ------------------------------------------------------------ set-up
    @classmethod
    def open(cls, call: Callable[[str, Any], Any], *, prefault: bool = False,
             send: Callable[[str, Any], None] | None = None,
             report: Callable[[str, Any], Any] | None = None,
             commit_timeout_s: float = 5.0) -> tuple["DirectPath | None", str]:
        """Ask the daemon for the offer and map every region it lists, checking identity.

        ``send`` sends without waiting for the answer (lease releases); ``report``, which
        the index path's hit reports use, must never block (a stopped daemon must not
        stop reads from the index): default ``send``. ``commit_timeout_s``: longest
        wait for the master's answer to a direct commit, seconds.

        Returns:
            ``(path, why)``: ``path`` is ``None`` when direct mode cannot be used
            here; ``why`` says why (or which regions were skipped).
        """
        try:
            info = call("DirectInfo", client_pb2.DirectInfoRequest())
        except CxlkvError as exc:  # an older daemon: no such method
            return None, f"the daemon does not offer direct mode ({exc.message})"
        if not info.offered:
            return None, "the daemon's config has direct_mode = false"
        if not info.regions:
            return None, "the daemon lists no region a direct caller may map"
        from cxlkv.layout.region import read_identity
        from cxlkv.transport import Region, install_sigbus_guard

        install_sigbus_guard()  # a region file that shrinks: zeros and errors, not a SIGBUS death
        mapped: dict[int, Any] = {}
        skipped: list[str] = []
        for r in info.regions:
            try:
                region = Region.open(r.path, size=r.size_bytes)
            except CxlkvError as exc:
                skipped.append(f"{r.path}: {exc.message}")
                continue
            try:
                ident = read_identity(region)
            except CxlkvError as exc:
                region.close()
                skipped.append(f"{r.path}: {exc.message}")
                continue
            if (str(ident.region_uuid) != r.region_uuid or ident.segment_name != r.segment_name
                    or ident.size_bytes != r.size_bytes):
                region.close()
                skipped.append(f"{r.path} here is segment {ident.segment_name!r} uuid {ident.region_uuid}, "
                               f"the daemon maps segment {r.segment_name!r} uuid {r.region_uuid} (not the same region)")
                continue
            if prefault:
                try:
                    region.prefault()
                except CxlkvError as exc:
                    region.close()
                    skipped.append(f"{r.path}: prefault failed: {exc.message}")
                    continue
            mapped[r.segment_id] = region
        why = "; ".join(skipped)
        if skipped:
            log.info("direct mode: regions not mapped: %s", why)
        if not mapped:
            return None, why or "no region could be mapped"
        idents = {r.segment_id: r.region_uuid for r in info.regions if r.segment_id in mapped}
        path = cls(call, mapped, flush=info.coherence == "flush", send=send, identities=idents,
                   verify_first=info.flush_reads != "invalidate_first")
        path.index, index_why = _open_index(info, mapped, idents, flush=path.flush, send=report or send or call,
                                            call=call, verify_first=path.verify_first)
        if index_why:
            log.info("direct mode: index reads off: %s", index_why)
        from cxlkv.client._commit import DirectCommits

        reader = path.index.reader if path.index is not None else None
        path.commits = DirectCommits(call, path.write_reserved, (lambda k: reader.probe(k).version) if reader else None,
                                     min(commit_timeout_s, MAX_COMMIT_WAIT_S))
        return path, why

    def changed(self, info: client_pb2.DirectInfoResponse) -> str | None:
        """Whether ``info`` (a daemon's DirectInfo) still matches the regions
        mapped here: ``""`` when it does; why not when a segment mapped here is
        now another region (a daemon back on a reformatted or another device) or
        no longer listed, or the offer was withdrawn; ``None`` when it cannot tell
        yet (a daemon that has not registered with its master lists no region:
        ask again later)."""
        if not info.offered:
            return "the daemon no longer offers direct mode"
        now = {r.segment_id: r.region_uuid for r in info.regions}
        if not now:
            return None
        for sid, uuid in self.identities.items():
            if sid not in now:
                return f"the daemon no longer lists segment {sid}"
            if now[sid] != uuid:
                return f"segment {sid} is now region {now[sid]}, not {uuid}"
        return ""

    def disable(self, why: str) -> None:
        """Stop copying directly: every later put and get answers FALLBACK (the
        daemon's path). The mappings stay until the Client closes, so a copy
        running in another thread is never unmapped under it."""
        self.disabled = why

    def close(self) -> None:
        """Unmap the regions and stop the helper thread (idempotent)."""
        commits, self.commits = self.commits, None
        if commits is not None:
            commits.close()
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        regions, self.regions = self.regions, {}
        for r in regions.values():
            try:
                r.close()
            except CxlkvError:
                pass

    def _hash_async(self, a: np.ndarray) -> Future[int]:
        pool = self._pool
        if pool is None:
            with self._pool_lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="cxlkv-direct-hash")
                pool = self._pool
        return pool.submit(_xxh3, a)

    def _region(self, ext: client_pb2.DirectExtent) -> Any | None:
        return self.regions.get(ext.extent.segment_id) if ext.direct else None

    # ================================================================= puts
    def put(self, items: list[tuple[int, str, Any, common_pb2.PutOptions | None]]) -> dict[int, Any]:
        """Put ``(position, key, 1-D uint8 array or device source, options)`` items directly.

        Returns:
            Position → version (``int``), a :class:`CxlkvError`, or :data:`FALLBACK`
            (the daemon placed it where this process cannot copy: nothing was started).

        Raises:
            Unavailable: the daemon cannot be reached (started puts are revoked,
                or reclaimed by the daemon when this process exits).
        """
        if self.disabled:
            return {pos: FALLBACK for pos, *_ in items}
        out: dict[int, Any] = {}
        todo = [_PutItem(pos, key, src, _nbytes(src), opts) for pos, key, src, opts in items]
        commits = self.commits
        if commits is not None and commits.available:  # host values first to the master, directly
            host = [it for it in todo if isinstance(it.src, np.ndarray)]
            if host:
                done = commits.put(host, FALLBACK)
                out.update((pos, r) for pos, r in done.items() if r is not FALLBACK)
                todo = [it for it in todo if it.pos not in out]
        for attempt in range(2):
            if not todo:
                break
            todo = self._put_attempt(todo, out, retry_allowed=attempt == 0)
        return out

    def commit(self, items: list[tuple[int, str, np.ndarray, common_pb2.PutOptions | None]]) -> dict[int, Any]:
        """:meth:`put` by direct commit only (small values: the daemon's inline path
        is cheaper than DirectPutStart/End for what cannot be committed directly).

        Returns:
            Position → version, a :class:`CxlkvError`, or :data:`FALLBACK`.
        """
        commits = self.commits
        if self.disabled or commits is None or not commits.available:
            return {pos: FALLBACK for pos, *_ in items}
        out: dict[int, Any] = {}
        todo = [_PutItem(pos, key, a, a.nbytes, opts) for pos, key, a, opts in items]
        for start in range(0, len(todo), COMMIT_CALL_ITEMS):
            out.update(commits.put(todo[start:start + COMMIT_CALL_ITEMS], FALLBACK))
        return out

    @property
    def commit_available(self) -> bool:
        """Whether :meth:`commit` may take puts now."""
        c = self.commits
        return c is not None and not self.disabled and c.available

    def put_batch(self, items: list[tuple[int, str, Any, common_pb2.PutOptions | None]],
                  per_call: int) -> dict[int, Any]:
        """:meth:`put` of a batch, ``per_call`` items at a time; a part that raises a
        :class:`CxlkvError` answers it for each of its items."""
        out: dict[int, Any] = {}
        for start in range(0, len(items), per_call):
            part = items[start:start + per_call]
            try:
                out.update(self.put(part))
            except CxlkvError as exc:
                out.update({p[0]: exc for p in part})
        return out

    def _put_attempt(self, todo: list[_PutItem], out: dict[int, Any], *, retry_allowed: bool) -> list[_PutItem]:
        with self._pool_lock:
            alone = self._puts_in_flight == 0
            self._puts_in_flight += 1
        try:
            return self._put_attempt_counted(todo, out, retry_allowed=retry_allowed, alone=alone)
        finally:
            with self._pool_lock:
                self._puts_in_flight -= 1

    def _put_attempt_counted(self, todo: list[_PutItem], out: dict[int, Any], *, retry_allowed: bool,
                             alone: bool) -> list[_PutItem]:
        # A lone put hashes large host values in a helper thread while the start call
        # is in flight and the copy runs (lowest latency); with other puts of this
        # process in flight the cores are busy, so copy and hash in one pass (least
        # CPU) when the transport can.
        overlap = not self._fused or (PUT_HASH_OVERLAP and alone)
        for it in todo:
            if (it.checksum is None and overlap and isinstance(it.src, np.ndarray)
                    and it.size >= HASH_IN_THREAD_BYTES):
                it.checksum = self._hash_async(it.src)
        req = client_pb2.DirectPutStartRequest(pid=os.getpid())
        add = req.items.add
        for it in todo:
            m = add(key=it.key, value_size_bytes=it.size)
            if it.opts is not None:
                m.options.CopyFrom(it.opts)
        resp = self._call("DirectPutStart", req)
        started: list[tuple[_PutItem, client_pb2.DirectPutStartResult]] = []
        for it, r in zip(todo, resp.results):
            if r.status.code:
                out[it.pos] = error_for(r.status.code, r.status.message, key=it.key)
            elif r.fallback:
                out[it.pos] = FALLBACK
            else:
                it.token = r.put_token
                started.append((it, r))
        if not started:
            return []
        ends: list[tuple[_PutItem, bool]] = []
        try:
            for it, r in started:
                err = self._write(it, r.version, r.header_bytes, r.extents)
                if err is not None:
                    out[it.pos] = err
                ends.append((it, err is not None))
        except BaseException:
            self._revoke_quietly([it for it, _ in started])
            raise
        end_req = client_pb2.DirectPutEndRequest()
        add_end = end_req.items.add
        for it, revoke in ends:
            add_end(key=it.key, put_token=it.token, checksum=0 if revoke else _value(it.checksum), revoke=revoke)
        try:
            statuses = self._call("DirectPutEnd", end_req).results
        except DaemonUnreachable:
            # The daemon went away between start and end. The one that answers now (a
            # restarted daemon knows this writer's pending puts from its predecessor's
            # record, clientd/writers.py) is told this process is done with them, so the
            # space held for it is freed; the puts themselves failed.
            self._revoke_quietly([it for it, _ in started])
            raise
        retry: list[_PutItem] = []
        for (it, revoke), st in zip(ends, statuses):
            if revoke:
                continue
            if not st.code:
                out[it.pos] = _version_of(started, it)
            elif st.code == _UNKNOWN_CLIENT and retry_allowed:
                # the daemon re-registered meanwhile: nothing was committed, start again. Not
                # STALE_TOKEN (the attempt was revoked, e.g. past put_timeout_s): redone now,
                # it could land after newer puts of the key; the caller decides.
                retry.append(it)
            else:
                out[it.pos] = error_for(st.code, st.message, key=it.key)
        return retry

    def _write(self, it: _PutItem, version: int, header_bytes: int, extents: Any) -> CxlkvError | None:
        """Copy the value into every extent (``DirectExtent`` messages), hash it,
        write the header of ``version`` (flushing in flush mode); the error that
        stopped it, or ``None``. ``header_bytes`` 0: the size for the key."""
        key_utf8 = it.key.encode("utf-8")
        hb = header_bytes or header_bytes_for(len(key_utf8))
        faults = _guard_total_hits()
        try:
            for n, ext in enumerate(extents):
                region = self._region(ext)
                if region is None:  # the daemon vouched for these; defensive
                    return CxlkvError(f"segment {ext.extent.segment_id} is not mapped by this process")
                if ext.extent.length_bytes < hb + it.size:
                    return CxlkvError(f"extent of {ext.extent.length_bytes} bytes for a {it.size}-byte value "
                                      f"and a {hb}-byte header (daemon bug)")
                off = ext.extent.offset_bytes + hb
                if it.size:
                    # flush mode: the transport's non-coherent copy (in memory on return)
                    it.checksum = _copy_in(region, off, it.src, it.checksum if n == 0 else _value(it.checksum),
                                           fused=self._fused, flush=self.flush)
                elif it.checksum is None:
                    it.checksum = _xxh3(b"")
            checksum = _value(it.checksum)
            it.checksum = checksum
            head = pack_header(key_utf8, version, it.size, checksum) + key_utf8
            head += bytes(hb - len(head))
            for ext in extents:
                region = self._region(ext)
                # Written back in both modes (one or two lines): the daemon checks it
                # from its own mapping before PutEnd, on coherent and non-coherent memory.
                region.copy_in(ext.extent.offset_bytes, head, flush=True)
        except CxlkvError as exc:
            return exc
        except (TypeError, ValueError, BufferError) as exc:
            return CxlkvError(f"copy failed: {exc}")
        if _guard_total_hits() != faults:  # some mapping's file shrank meanwhile: was it ours?
            for ext in extents:
                region = self._region(ext)
                if region is not None and getattr(region, "guard_hits", 0):
                    return RegionError(f"region {region.path} shrank under this process: the value was not "
                                       "written", path=region.path)
        return None

    def write_reserved(self, entries: list[tuple[_PutItem, int, int, tuple[int, int, int]]]
                       ) -> list[CxlkvError | None]:
        """Write direct commits' objects: ``(item, version, header_bytes, (segment_id,
        offset_bytes, length_bytes))`` each, one extent per object.

        Host values go region by region in two C calls (copy and hash every value
        with ``copy_in_gather_hashed``, then ``write_headers``, written back in
        both modes); any other source, or a region without those calls, takes
        :meth:`_write` one at a time. Sets each item's ``checksum``.

        Returns:
            Per entry, the error that stopped it, or ``None`` (written).
        """
        out: list[CxlkvError | None] = [None] * len(entries)
        by_region: dict[int, list[int]] = {}
        for i, (it, version, hb, (sid, off, length)) in enumerate(entries):
            region = self.regions.get(sid)
            if (region is None or not isinstance(it.src, np.ndarray) or it.checksum is not None
                    or not _HEADER_MIN <= hb <= _HEADER_MAX or not hasattr(region, "copy_in_gather_hashed")):
                # one at a time: a key write_headers refuses (empty or over MAX_KEY_BYTES, as
                # its header size says; the master answers INVALID_KEY for that one alone), a
                # device source, a region without the batch calls
                ext = client_pb2.DirectExtent(extent=common_pb2.Extent(
                    segment_id=sid, offset_bytes=off, length_bytes=length), direct=region is not None)
                out[i] = self._write(it, version, hb, [ext])
            elif length < hb + it.size:
                out[i] = CxlkvError(f"extent of {length} bytes for a {it.size}-byte value and a {hb}-byte "
                                    "header (daemon bug)")
            else:
                by_region.setdefault(sid, []).append(i)
        if not by_region:
            return out
        faults = _guard_total_hits()
        for sid, idx in by_region.items():
            region = self.regions[sid]
            group = [entries[i] for i in idx]
            keys = [it.key.encode("utf-8") for it, *_ in group]
            sizes = [it.size for it, *_ in group]
            try:
                sums = _copy_in_gather(region, [it.src for it, *_ in group],
                                       [off + hb for _, _, hb, (_, off, _) in group], sizes, flush=self.flush)
                koffs, pos = [], 0
                for k in keys:
                    koffs.append(pos)
                    pos += len(k)
                # written back in both modes (one or two lines): readers on other hosts check it
                region.write_headers([off for *_, (_, off, _) in group], [hb for _, _, hb, _ in group],
                                     b"".join(keys), koffs, [len(k) for k in keys],
                                     [v for _, v, _, _ in group], sizes, sums, flush=True)
            except CxlkvError as exc:
                for i in idx:
                    out[i] = exc
                continue
            except (TypeError, ValueError, BufferError) as exc:
                for i in idx:
                    out[i] = CxlkvError(f"copy failed: {exc}")
                continue
            for (it, *_), h in zip(group, sums):
                it.checksum = h
        if _guard_total_hits() != faults:  # some mapping's file shrank meanwhile: was it one of ours?
            for sid, idx in by_region.items():
                region = self.regions[sid]
                if getattr(region, "guard_hits", 0):
                    for i in idx:
                        out[i] = RegionError(f"region {region.path} shrank under this process: the value was "
                                             "not written", path=region.path)
        return out

    def _revoke_quietly(self, items: list[_PutItem]) -> None:
        req = client_pb2.DirectPutEndRequest()
        for it in items:
            req.items.add(key=it.key, put_token=it.token, revoke=True)
        try:
            self._call("DirectPutEnd", req)
        except BaseException:  # the daemon reclaims them when this process exits
            pass

    # ================================================================= gets
    def get(self, keys: list[str], dsts: list[Any]) -> list[Any]:
        """Read ``keys[i]`` into ``dsts[i]`` (a writable 1-D uint8 array, a device
        destination, or ``None`` to return new ``bytes``).

        Returns:
            Per key: ``(size_bytes, version, bytes or None)``, a :class:`CxlkvError`
            (NOT_FOUND, OUT_OF_RANGE with ``requested_bytes``, CHECKSUM_MISMATCH,
            LEASE_EXPIRED, …), or :data:`FALLBACK` (no replica this process may copy).

        Raises:
            Unavailable: the daemon cannot be reached.
        """
        n = len(keys)
        if self.disabled:
            return [FALLBACK] * n
        out: list[Any] = [None] * n
        todo = list(range(n))
        for attempt in range(2):
            if not todo:
                break
            todo = self._get_attempt(keys, dsts, todo, out, retry_allowed=attempt == 0)
        return out

    def get_batch(self, keys: list[str], dsts: list[Any], per_call: int) -> list[Any]:
        """:meth:`get` of a batch, ``per_call`` keys at a time; a part that raises a
        :class:`CxlkvError` answers it for each of its keys."""
        out: list[Any] = []
        for start in range(0, len(keys), per_call):
            try:
                out.extend(self.get(keys[start:start + per_call], dsts[start:start + per_call]))
            except CxlkvError as exc:
                out.extend([exc] * len(keys[start:start + per_call]))
        return out

    def _get_attempt(self, keys: list[str], dsts: list[Any], todo: list[int], out: list[Any], *,
                     retry_allowed: bool) -> list[int]:
        t0 = time.monotonic()
        resp = self._call("DirectGet", client_pb2.DirectGetRequest(keys=[keys[i] for i in todo]))
        leases = [r.lease_id for r in resp.results if r.lease_id]
        retry: list[int] = []
        redone: list[str] = []  # keys whose first copy did not verify (reported with the release)
        try:
            for i, r in zip(todo, resp.results):
                if r.status.code:
                    out[i] = error_for(r.status.code, r.status.message, key=keys[i])
                    continue
                size = r.value_size_bytes
                dst = dsts[i]
                if dst is not None and size > _nbytes(dst):
                    out[i] = OutOfRange(f"value of key {keys[i]!r} is {size} bytes, the target holds "
                                        f"{_nbytes(dst)}", key=keys[i], requested_bytes=size)
                    continue
                ext = next((e for e in r.replicas if self._region(e) is not None), None)
                if ext is None:
                    out[i] = FALLBACK
                    continue
                got = self._read_one(keys[i], r, ext, dst, redone)
                deadline = t0 + r.lease_ttl_ms / 1000.0 if r.lease_ttl_ms else float("inf")
                if time.monotonic() > deadline:
                    if retry_allowed:
                        retry.append(i)
                    else:
                        out[i] = LeaseExpired(
                            f"the lease on key {keys[i]!r} ended before the copy finished "
                            f"(lease_ttl {r.lease_ttl_ms} ms); bytes discarded", key=keys[i])
                    continue
                out[i] = got
        finally:
            bad = sum(1 for i in todo if isinstance(out[i], ChecksumMismatch))
            if leases or bad or redone:
                try:  # the answer does not matter: not waited for
                    self._send("DirectRelease", client_pb2.DirectReleaseRequest(
                        lease_ids=leases, checksum_failures=bad, reads_copied_again=len(redone)))
                except CxlkvError:  # the leases end by themselves after lease_ttl
                    pass
        return retry

    def _read_one(self, key: str, r: client_pb2.DirectGetResult, ext: client_pb2.DirectExtent, dst: Any,
                  redone: list[str] | None = None) -> Any:
        """Copy one located value out and verify it; ``(size, version, bytes|None)`` or the error.
        A key whose first copy did not verify (copied again) is appended to ``redone``."""
        region = self._region(ext)
        size = r.value_size_bytes
        off = ext.extent.offset_bytes + r.header_bytes
        why = None
        value: bytes | None = None
        for attempt in range(2):  # once more, from memory: a stale line or a writer racing the lease
            try:
                # flush mode verifies first (docs/transport.md): the first copy goes
                # through the cache and is hashed; a stale line fails the check
                # below and the second copy drops every line. A GPU's DMA copy is
                # checked by a CPU hash of the region, not of what the GPU got: its
                # lines are always dropped first.
                invalidate = bool(attempt) or (self.flush and (not self.verify_first or (
                    dst is not None and not isinstance(dst, np.ndarray))))
                if dst is None and size >= 2:  # one pass, straight into the bytes returned
                    value, target = self._fresh_bytes(size)
                    if self._fused:
                        got = int(region.copy_out_hashed(off, target, invalidate=invalidate))
                    else:
                        region.copy_out(off, target, invalidate=invalidate)
                        got = _xxh3(value)
                    del target
                elif dst is None:
                    if invalidate and size:
                        region.invalidate(off, size)
                    value = bytes(region.view(off, size)) if size else b""
                    got = _xxh3(value)
                else:  # the transport's non-coherent copy when invalidating
                    got = _copy_out(region, off, dst, size, fused=self._fused, invalidate=invalidate)
            except CxlkvError as exc:
                return exc
            why = _check_header(region, ext, key, r, size, got, flush=self.flush)
            if attempt and redone is not None:
                redone.append(key)
            if why is None:
                return (size, r.version, value)
        return ChecksumMismatch(f"key {key!r}: {why} (stale, torn or corrupt read; reported as a miss)", key=key)


# ===================================================================== helpers
def _open_index(info: client_pb2.DirectInfoResponse, mapped: dict[int, Any], idents: dict[int, str], *,
                flush: bool, send: Callable[[str, Any], Any],
                call: Callable[[str, Any], Any] | None = None, verify_first: bool = True) -> tuple[Any, str]:
    """An :class:`~cxlkv.client._index.IndexPath` over the regions mapped here, when
    the daemon reports a published index in one of them; else ``(None, why)``."""
    if not info.index_region_uuid:
        return None, "the daemon reads no index (none published, or not mapped there)"
    by_uuid = {idents[sid]: r for sid, r in mapped.items() if sid in idents}
    home = by_uuid.get(info.index_region_uuid)
    if home is None:
        return None, f"the index region {info.index_region_uuid} is not mapped here"
    from cxlkv.client._index import MAX_VALUE_BYTES, IndexPath
    from cxlkv.layout.index import read_index_header
    from cxlkv.layout.region import read_identity
    from cxlkv.transport.index import IndexReader

    try:
        geo = read_identity(home).index
        if geo is None:
            return None, f"region {home.path} has no index"
        header = read_index_header(home, geo)
        regions = [by_uuid.get(str(u)) for u in header.region_uuids]
        reader = IndexReader(home, geo.index_offset_bytes, geo.table_offset_bytes, geo.buckets, regions,
                             invalidate=flush, verify_first=verify_first, max_value_bytes=MAX_VALUE_BYTES)
    except CxlkvError as exc:
        return None, f"region {home.path}: {exc.message}"
    return IndexPath(reader, send, call), ""


def _nbytes(obj: Any) -> int:
    n = getattr(obj, "nbytes", None)
    return int(n) if n is not None else len(obj)


def _value(c: Future[int] | int | None) -> int:
    if isinstance(c, Future):
        return c.result()
    assert c is not None
    return c


def _version_of(started: list[tuple[_PutItem, client_pb2.DirectPutStartResult]], it: _PutItem) -> int:
    for s, r in started:
        if s is it:
            return int(r.version)
    return 0


def _copy_in(region: Any, offset: int, src: Any, checksum: Future[int] | int | None, *, fused: bool,
             flush: bool = False) -> Future[int] | int:
    """Copy ``src`` into the region at ``offset``; the value's checksum (or its future).
    ``flush``: non-coherent mode (the bytes in memory when it returns)."""
    if not isinstance(src, np.ndarray):  # a device source hashes what it wrote
        got = src.copy_in(region, offset, checksum)
        if flush:
            region.flush(offset, _nbytes(src))
        return got
    if checksum is not None:
        region.copy_in(offset, src, flush=flush)
        return checksum
    if fused:
        return int(region.copy_in_hashed(offset, src, flush=flush))
    region.copy_in(offset, src, flush=flush)
    return _xxh3(src)


def _copy_in_gather(region: Any, srcs: list[np.ndarray], offsets: list[int], sizes: list[int], *,
                    flush: bool = False) -> list[int]:
    """Copy each host array ``srcs[i]`` into the region at ``offsets[i]`` in one C call;
    each one's xxh3_64. ``flush``: non-coherent mode (the bytes in memory when it returns)."""
    return region.copy_in_gather_hashed(srcs, offsets, sizes, flush=flush)


def _copy_out(region: Any, offset: int, dst: Any, size: int, *, fused: bool, invalidate: bool = False) -> int:
    """Copy ``size`` bytes out of the region at ``offset`` into the start of ``dst``;
    the xxh3_64 of the bytes copied. ``invalidate``: non-coherent mode (no line
    this CPU cached before is read)."""
    if not isinstance(dst, np.ndarray):
        if invalidate and size:
            region.invalidate(offset, size)
        return dst.copy_out(region, offset, size)
    d = dst[:size]
    if fused:
        return int(region.copy_out_hashed(offset, d, invalidate=invalidate))
    region.copy_out(offset, d, invalidate=invalidate)
    return _xxh3(d)


def _check_header(region: Any, ext: client_pb2.DirectExtent, key: str, r: client_pb2.DirectGetResult,
                  size: int, got: int, *, flush: bool) -> str | None:
    """Why the bytes read from ``ext`` are not ``key`` at ``r.version`` (``None``: they
    are): :func:`cxlkv.layout.objheader.check_copy`, the rule clientd applies too."""
    return check_copy(region, ext.extent.offset_bytes, r.header_bytes, key.encode("utf-8"), r.version, size,
                      got, r.checksum, invalidate=flush)
