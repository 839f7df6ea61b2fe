"""The daemon path: values the clientd copies for this process.

Three of the paths of :mod:`cxlkv.client._paths`:

* ``INLINE``: the bytes ride inside the request or the answer (``Put``,
  ``BatchPut``, ``Get``, ``BatchGet``); the daemon refuses a value over its
  inline limit with ``TOO_LARGE`` (its size in ``requested_bytes`` for a read).
* ``POOL``: the caller's memory lies in a shared buffer registered with the
  daemon; the request names ``(buffer_id, offset, length)`` and the daemon
  copies between it and the region (``PutFrom``, ``GetInto``, the packed forms).
* ``STAGED``: other memory borrows a range of the pool for the call (one extra
  memcpy; :attr:`BufferPool.staged_bytes` counts it), then goes as ``POOL``.

Batches are cut into calls of at most :data:`BATCH_ITEMS` items (and
:data:`BATCH_INLINE_BYTES` inline bytes), sent pipelined.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from cxlkv.client._api import Result
from cxlkv.client._direct import FALLBACK
from cxlkv.client._memory import address_of, dst_array
from cxlkv.client._pool import BufferPool, PoolBuffer
from cxlkv.client.framing import METHODS_BY_NAME
from cxlkv.errors import CxlkvError, ErrorCode, Internal, InvalidArgument, OutOfRange, TooLarge, error_for
from cxlkv.v1 import client_pb2, common_pb2
from cxlkv.wire.limits import SDK_BATCH_INLINE_BYTES, SDK_BATCH_ITEMS

__all__ = ["DaemonPath", "BATCH_ITEMS", "BATCH_INLINE_BYTES", "chunks", "registered"]

#: Most items in one batch request (the daemons' ``max_batch_items`` is never
#: below it: larger batches are split into several calls, cxlkv.wire.limits).
BATCH_ITEMS = SDK_BATCH_ITEMS
#: Most inline value bytes in one batch request.
BATCH_INLINE_BYTES = SDK_BATCH_INLINE_BYTES
#: Keys per ``BatchGet`` call (inline answers: kept small).
GET_MANY_ITEMS = 128

_M = METHODS_BY_NAME
_PutRequest = client_pb2.PutRequest
_GetRequest = client_pb2.GetRequest
_BufferRange = client_pb2.BufferRange
_GetIntoRequest = client_pb2.GetIntoRequest
_PutFromRequest = client_pb2.PutFromRequest
Opts = common_pb2.PutOptions | None


def status_error(st: common_pb2.Status, key: str | None) -> CxlkvError:
    """The :class:`CxlkvError` of a per-item status."""
    return error_for(st.code, st.message, key=key)


def registered(conn: Any, buffer_ids: list[int]) -> list[bool]:
    """BufferStatus over ``conn``: whether the daemon knows each id. A daemon older
    than BufferStatus cannot tell: every id counts as known then.

    Decided by code: BufferStatus itself never answers INVALID_ARGUMENT (too many
    ids is TOO_LARGE), so INVALID_ARGUMENT is the lean server refusing a method
    number it does not know, i.e. an older daemon."""
    try:
        resp = conn.call(_M["BufferStatus"], client_pb2.BufferStatusRequest(buffer_ids=buffer_ids))
    except InvalidArgument as exc:
        if exc.code == ErrorCode.INVALID_ARGUMENT:  # not a subclass with its own code
            return [True] * len(buffer_ids)
        raise
    known = list(resp.registered)
    if len(known) != len(buffer_ids):
        raise Internal(f"BufferStatus: {len(known)} answers for {len(buffer_ids)} buffer ids")
    return known


def _ids(buffer_ids: list[int]) -> list[int]:
    """``buffer_ids`` as sent in a packed request: one id when every item shares it."""
    first = buffer_ids[0] if buffer_ids else 0
    return [first] if buffer_ids and buffer_ids.count(first) == len(buffer_ids) else buffer_ids


def _packed_ranges(keys: list[str], targets: Sequence[tuple[int, int, int]]) -> client_pb2.PackedRangesRequest:
    """A packed read request for ``keys`` into ``(buffer_id, offset, length)`` targets."""
    return client_pb2.PackedRangesRequest(
        keys=keys, buffer_ids=_ids([t[0] for t in targets]),
        offsets_bytes=[t[1] for t in targets], lengths_bytes=[t[2] for t in targets])


def _packed_errors(resp: Any, n: int, name: str) -> dict[int, tuple[int, str]]:
    """Position → ``(code, message)`` of the failed items of a packed answer for ``n`` items.

    Raises:
        Internal: the answer's arrays are inconsistent (a daemon bug, never guessed around).
    """
    codes = resp.codes
    pos = resp.error_positions
    msgs = resp.messages
    if len(codes) != n or len(resp.versions) != n or len(pos) != len(msgs) or \
            any(p >= n or not codes[p] for p in pos) or sum(1 for c in codes if c) != len(pos):
        raise Internal(f"{name}: inconsistent answer for {n} items ({len(codes)} codes, {len(resp.versions)} "
                       f"versions, {len(pos)} error positions, {len(msgs)} messages)")
    return {p: (codes[p], m) for p, m in zip(pos, msgs)}


def chunks(n: int, size: int) -> Iterator[range]:
    """``range(n)`` in consecutive pieces of at most ``size``."""
    for start in range(0, n, size):
        yield range(start, min(start + size, n))


class _Staged:
    """Pool ranges borrowed for one call; freed on exit."""

    __slots__ = ("pool", "ranges")

    def __init__(self, pool: BufferPool) -> None:
        self.pool = pool
        self.ranges: list[tuple[PoolBuffer, int]] = []

    def take(self, nbytes: int) -> tuple[PoolBuffer, int]:
        seg, off = self.pool.alloc(nbytes)
        self.pool.staged_bytes += nbytes
        self.ranges.append((seg, off))
        return seg, off

    def __enter__(self) -> "_Staged":
        return self

    def __exit__(self, *exc: object) -> None:
        for seg, off in self.ranges:
            self.pool.free(seg, off)
        self.ranges.clear()


class DaemonPath:
    """The inline, pool and staged paths (the module's docstring).

    Args:
        call: ``call(method_name, request) -> response`` on this thread's connection.
        call_many: ``call_many(method_name, requests) -> [response or CxlkvError]``, pipelined.
        pool: the Client's shared-buffer pool.

    Every method raises what the daemon answers for a single call (``NotFound``,
    ``OutOfRange``, ``TooLarge``, ``Unavailable`` …); batch methods put per-item
    errors into their results and raise only ``Unavailable``.
    Thread-safety: as the Client (the pool locks itself; calls use this thread's connection).
    """

    def __init__(self, call: Callable[[str, Any], Any], call_many: Callable[[str, list[Any]], list[Any]],
                 pool: BufferPool) -> None:
        self._call = call
        self._call_many = call_many
        self.pool = pool

    def locate(self, a: np.ndarray) -> tuple[int, int] | None:
        """``(buffer_id, offset)`` of ``a`` when it lies in a registered shared buffer.

        May register shared memory made outside the pool (:meth:`BufferPool.locate`)."""
        return self.pool.locate(address_of(a), a.nbytes) if a.nbytes else None

    # ================================================================ puts
    def put_inline(self, key: str, value: bytes, opts: Opts) -> Any:
        """``INLINE``: the new version, or :data:`FALLBACK` when the daemon refuses it
        as too large (over its inline limit: go ``STAGED``; a value larger than every
        segment answers TOO_LARGE there too, and that is raised)."""
        try:
            return self._call("Put", _PutRequest(key=key, value=value, options=opts)).version
        except TooLarge:
            return FALLBACK

    def put_pool(self, key: str, loc: tuple[int, int], nbytes: int, opts: Opts) -> int:
        """``POOL``: the value at ``loc`` = ``(buffer_id, offset)``; its new version."""
        return self._call("PutFrom", _PutFromRequest(key=key, options=opts, source=_BufferRange(
            buffer_id=loc[0], offset_bytes=loc[1], length_bytes=nbytes))).version

    def put_staged(self, key: str, a: np.ndarray, opts: Opts) -> int:
        """``STAGED``: ``a`` copied into a pool range, then put from there; its new version."""
        with _Staged(self.pool) as st:
            seg, off = st.take(a.nbytes)
            seg.array[off:off + a.nbytes] = a
            return self.put_pool(key, (seg.buffer_id, off), a.nbytes, opts)

    def put_inline_many(self, keys: list[str], values: list[Any], positions: list[int], opts: Opts,
                        results: list[Result | None]) -> list[int]:
        """``INLINE`` for ``values[i]`` (``bytes``), ``i`` in ``positions``: into ``results[i]``.

        Returns:
            The positions refused as too large (to go ``STAGED``: a final one fails again there).
        """
        if not positions:
            return []
        groups: list[list[int]] = []
        cur: list[int] = []
        size = 0
        for i in positions:
            if cur and (len(cur) >= BATCH_ITEMS or size + len(values[i]) > BATCH_INLINE_BYTES):
                groups.append(cur)
                cur, size = [], 0
            cur.append(i)
            size += len(values[i])
        groups.append(cur)
        reqs = [client_pb2.BatchPutRequest(items=[_PutRequest(key=keys[i], value=values[i], options=opts)
                                                  for i in g]) for g in groups]
        for g, resp in zip(groups, self._call_many("BatchPut", reqs)):
            if isinstance(resp, CxlkvError):
                for i in g:
                    results[i] = Result(False, error=resp)
                continue
            for i, r in zip(g, resp.results):
                if r.status.code:
                    results[i] = Result(False, error=status_error(r.status, keys[i]))
                else:
                    results[i] = Result(True, version=r.version)
        over = []
        for i in positions:
            r = results[i]
            if r is not None and isinstance(r.error, TooLarge):
                over.append(i)
        return over

    def put_ranges_many(self, keys: list[str], by_buffer: list[tuple[int, int, int, int]],
                        staged: list[tuple[int, np.ndarray]], opts: Opts, results: list[Result | None]) -> None:
        """``POOL`` for ``by_buffer`` items ``(position, buffer_id, offset, length)`` and
        ``STAGED`` for ``staged`` items ``(position, array)``: into ``results[position]``."""
        with _Staged(self.pool) as st:
            for i, a in staged:
                seg, off = st.take(a.nbytes)
                seg.array[off:off + a.nbytes] = a
                by_buffer.append((i, seg.buffer_id, off, a.nbytes))
            for chunk in chunks(len(by_buffer), BATCH_ITEMS):
                part = [by_buffer[j] for j in chunk]
                positions = [p[0] for p in part]
                req = client_pb2.PackedPutFromRequest(
                    keys=[keys[i] for i in positions], buffer_ids=_ids([p[1] for p in part]),
                    offsets_bytes=[p[2] for p in part], lengths_bytes=[p[3] for p in part], options=opts)
                (resp,) = self._call_many("PackedPutFrom", [req])
                if isinstance(resp, CxlkvError):
                    for i in positions:
                        results[i] = Result(False, error=resp)
                    continue
                errors = _packed_errors(resp, len(part), "PackedPutFrom")
                for j, (i, version) in enumerate(zip(positions, resp.versions)):
                    e = errors.get(j)
                    results[i] = Result(True, version=version) if e is None else \
                        Result(False, error=error_for(e[0], e[1], key=keys[i]))

    # ================================================================ gets
    def get_inline(self, key: str) -> tuple[bytes, int] | int:
        """``INLINE``: ``(value, version)``, or the value's size (an ``int``) when it
        is too large to ride inline (read it ``DIRECT`` or ``STAGED``).

        Raises:
            TooLarge: without a size (never for a committed value).
        """
        try:
            r = self._call("Get", _GetRequest(key=key))
            return r.value, r.version
        except TooLarge as exc:
            if not exc.requested_bytes:
                raise
            return int(exc.requested_bytes)

    def get_staged(self, key: str, size: int) -> tuple[bytes, int]:
        """``STAGED`` read of a value of about ``size`` bytes into new bytes: ``(value, version)``.

        Raises:
            OutOfRange: the value kept growing (replaced by larger ones) over three tries.
        """
        for _ in range(3):  # the value may be replaced by a larger one meanwhile
            with _Staged(self.pool) as st:
                seg, off = st.take(size)
                try:
                    r = self._call("GetInto", _GetIntoRequest(key=key, target=_BufferRange(
                        buffer_id=seg.buffer_id, offset_bytes=off, length_bytes=size)))
                except OutOfRange as exc:
                    if not exc.requested_bytes:
                        raise
                    size = exc.requested_bytes
                    continue
                return seg.array[off:off + r.value_size_bytes].tobytes(), r.version
        raise OutOfRange(f"value of key {key!r} kept growing while being read", key=key)

    def get_into(self, key: str, a: np.ndarray, loc: tuple[int, int] | None) -> int:
        """``POOL`` (``loc`` given) or ``STAGED`` read into ``a``; the value's size."""
        if loc is not None:
            return self._call("GetInto", _GetIntoRequest(key=key, target=_BufferRange(
                buffer_id=loc[0], offset_bytes=loc[1], length_bytes=a.nbytes))).value_size_bytes
        with _Staged(self.pool) as st:
            seg, off = st.take(a.nbytes)
            r = self._call("GetInto", _GetIntoRequest(key=key, target=_BufferRange(
                buffer_id=seg.buffer_id, offset_bytes=off, length_bytes=a.nbytes)))
            n = r.value_size_bytes
            a[:n] = seg.array[off:off + n]
            return n

    def get_many_inline(self, keys: list[str]) -> tuple[list[Result | None], list[int]]:
        """``INLINE`` reads of ``keys``: the results, and the positions whose value is
        too large to ride inline (their result is ``None``: read them one by one)."""
        n = len(keys)
        results: list[Result | None] = [None] * n
        large: list[int] = []
        parts = list(chunks(n, GET_MANY_ITEMS))
        resps = self._call_many("BatchGet", [client_pb2.BatchGetRequest(keys=keys[c.start:c.stop]) for c in parts])
        for c, resp in zip(parts, resps):
            if isinstance(resp, CxlkvError):
                for i in c:
                    results[i] = Result(False, error=resp)
                continue
            for i, r in zip(c, resp.results):
                if not r.status.code:
                    results[i] = Result(True, value=r.value, version=r.version)
                elif r.status.code == int(TooLarge.code):
                    large.append(i)
                else:
                    results[i] = Result(False, error=status_error(r.status, keys[i]))
        return results, large

    def _targets(
        self, dsts: Sequence[Any], st: _Staged
    ) -> tuple[list[np.ndarray], list[tuple[int, int, int]], list[tuple[int, PoolBuffer, int]]]:
        """Destinations as arrays, their ``(buffer_id, offset, length)`` targets
        (:func:`~cxlkv.client._paths.daemon_path`: ``POOL`` when located, else
        ``STAGED``), and the staged ones to copy back."""
        arrays = [dst_array(d) for d in dsts]
        targets: list[tuple[int, int, int]] = []
        copy_back: list[tuple[int, PoolBuffer, int]] = []
        locate = self.pool.locate
        for i, a in enumerate(arrays):
            n = a.nbytes
            loc = locate(address_of(a), n) if n else None
            if loc is None:
                seg, off = st.take(n)
                copy_back.append((i, seg, off))
                loc = (seg.buffer_id, off)
            targets.append((loc[0], loc[1], n))
        return arrays, targets, copy_back

    def get_into_many(self, keys: list[str], dsts: list[Any]) -> list[Result]:
        """``POOL``/``STAGED`` reads of ``keys[i]`` into ``dsts[i]``; one result each
        (``value`` = bytes copied)."""
        n = len(keys)
        sub: list[Result | None] = [None] * n
        if not n:
            return []  # type: ignore[return-value]
        with _Staged(self.pool) as st:
            arrays, targets, copy_back = self._targets(dsts, st)
            parts = list(chunks(n, BATCH_ITEMS))
            reqs = [_packed_ranges(keys[c.start:c.stop], targets[c.start:c.stop]) for c in parts]
            for c, resp in zip(parts, self._call_many("PackedGetInto", reqs)):
                if isinstance(resp, CxlkvError):
                    for i in c:
                        sub[i] = Result(False, error=resp)
                    continue
                errors = _packed_errors(resp, len(c), "PackedGetInto")
                for j, (i, size, version) in enumerate(zip(c, resp.value_sizes_bytes, resp.versions)):
                    e = errors.get(j)
                    sub[i] = Result(True, size, version) if e is None else \
                        Result(False, error=error_for(e[0], e[1], key=keys[i]))
            for i, seg, off in copy_back:
                r = sub[i]
                if r is not None and r.ok:
                    arrays[i][:r.value] = seg.array[off:off + r.value]
        return sub  # type: ignore[return-value]

    def get_prefix_into(self, keys: Sequence[str], dsts: Sequence[Any], tiers: list[int] | None) -> int:
        """``POOL``/``STAGED``: the longest cached prefix of ``keys`` (at most
        :data:`BATCH_ITEMS`) into ``dsts``, leased and copied by the daemon; how many matched.

        Raises:
            Internal: an inconsistent answer.
        """
        if not keys:
            return 0
        with _Staged(self.pool) as st:
            arrays, targets, copy_back = self._targets(dsts, st)
            r = self._call("PackedGetPrefixInto", _packed_ranges(list(keys), targets))
            matched = r.matched
            sizes = r.value_sizes_bytes
            if matched > len(keys) or len(sizes) < matched or len(r.tiers) < matched:
                raise Internal(f"PackedGetPrefixInto: matched {matched} of {len(keys)} keys with "
                               f"{len(sizes)} sizes and {len(r.tiers)} tiers")
            if tiers is not None:
                tiers.extend(r.tiers[:matched])
            for i, seg, off in copy_back:
                if i < matched:
                    n = sizes[i]
                    arrays[i][:n] = seg.array[off:off + n]
            return matched

    # ============================================================ no bytes
    def exists(self, key: str) -> bool:
        """Whether ``key`` is committed (``Exist``)."""
        return self._call("Exist", client_pb2.ExistRequest(key=key)).exists

    def exists_many(self, keys: list[str]) -> list[bool]:
        """Whether each key is committed (``BatchExist``).

        Raises:
            CxlkvError: a call failed (the whole batch).
        """
        parts = list(chunks(len(keys), BATCH_ITEMS))
        out: list[bool] = []
        for resp in self._call_many("BatchExist", [client_pb2.BatchExistRequest(keys=keys[c.start:c.stop])
                                                    for c in parts]):
            if isinstance(resp, CxlkvError):
                raise resp
            out.extend(resp.exists)
        return out

    def remove_many(self, keys: list[str], force: bool) -> list[Result]:
        """``BatchRemove``; one result per key."""
        results: list[Result] = []
        parts = list(chunks(len(keys), BATCH_ITEMS))
        reqs = [client_pb2.ClientBatchRemoveRequest(keys=keys[c.start:c.stop], force=force) for c in parts]
        for c, resp in zip(parts, self._call_many("BatchRemove", reqs)):
            if isinstance(resp, CxlkvError):
                results.extend(Result(False, error=resp) for _ in c)
                continue
            for i, st in zip(c, resp.results):
                results.append(Result(True) if not st.code else Result(False, error=status_error(st, keys[i])))
        return results
