"""The batch calls of :class:`~cxlkv.client.Client`: many keys in few requests.

Each item takes the paths :func:`cxlkv.client._paths.plan` gives it, as a
single-key call would; a batch sorts its items by their first path and sends
each group at once (direct items in :data:`~cxlkv.client._daemon.BATCH_ITEMS`
pieces, inline items in ``BatchPut``/``BatchGet`` calls, shared-memory items in
one packed request), then sends what a path handed back on to the next. Every
batch call answers one :class:`~cxlkv.client.Result` per input position;
one failing item never fails the others.

:class:`BatchCalls` is a base of ``Client`` (its methods are the Client's).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from cxlkv.client import _daemon
from cxlkv.client._api import Result, _check_keys, _options, _retried, _utf8_keys
from cxlkv.client._cuda import CudaSource, CudaTarget, host_copy
from cxlkv.client._daemon import DaemonPath
from cxlkv.client._direct import FALLBACK
from cxlkv.client._commit import MAX_VALUE_BYTES as MAX_COMMIT_VALUE_BYTES
from cxlkv.client._index import FALLBACK as _IX_FALLBACK
from cxlkv.client._link import DaemonLink
from cxlkv.client._memory import dst_array, src_array
from cxlkv.client._paths import Memory, Op, Path, daemon_path, memory_of, plan, starts_at_index
from cxlkv.errors import CxlkvError, InvalidArgument
from cxlkv.v1 import common_pb2

__all__ = ["BatchCalls"]

Opts = common_pb2.PutOptions | None


class BatchCalls(DaemonLink):
    """The Client's batch calls (the module's docstring)."""

    _daemon: DaemonPath

    if TYPE_CHECKING:  # the Client's single-key parts a batch uses
        def _get_one_versioned(self, key: str) -> tuple[bytes, int]: ...
        def _get_into_cuda(self, key: str, dst: Any) -> int: ...
        def _copier(self) -> Any: ...

    @_utf8_keys
    def put_many(self, items: Mapping[str, Any] | Iterable[tuple[str, Any]], *, upsert: bool = False,
                 replica_num: int = 1, soft_pin: bool = False, hard_pin: bool = False) -> list[Result]:
        """Store many values; one :class:`Result` per item, in order (``version`` set when ok).

        Small ``bytes`` values travel inline, others through the pool (zero-copy
        for :meth:`buffer` memory). One failing item never fails the others.

        Raises:
            Unavailable: the daemon cannot be reached.
            InvalidArgument: a value is not bytes-like.
        """
        opts = _options(upsert, replica_num, soft_pin, hard_pin)
        try:
            pairs = list(items.items()) if isinstance(items, Mapping) else [(k, v) for k, v in items]
        except (TypeError, ValueError):
            raise InvalidArgument("items must be a mapping or (key, value) pairs") from None
        keys = _check_keys([k for k, _ in pairs])
        values = [v for _, v in pairs]
        return self._put_values(keys, values, opts)

    @_utf8_keys
    def put_from_many(self, keys: Sequence[str], srcs: Sequence[Any], *, upsert: bool = False,
                      replica_num: int = 1, soft_pin: bool = False, hard_pin: bool = False) -> list[Result]:
        """Store ``srcs[i]`` under ``keys[i]``; one :class:`Result` per key.

        Raises:
            InvalidArgument: ``keys`` and ``srcs`` differ in length; a value is not bytes-like.
            Unavailable: the daemon cannot be reached.
        """
        if len(keys) != len(srcs):
            raise InvalidArgument(f"{len(keys)} keys but {len(srcs)} sources")
        return self._put_values(list(keys), list(srcs), _options(upsert, replica_num, soft_pin, hard_pin))

    def _put_values(self, keys: list[str], values: list[Any], opts: Opts) -> list[Result]:
        """A batch put: each item sorted by the first path of its plan; direct items
        first, then the inline ones, then one shared-memory request for the rest."""
        n = len(keys)
        results: list[Result | None] = [None] * n
        inline: list[int] = []
        by_buffer: list[tuple[int, int, int, int]] = []  # (pos, buffer_id, offset, length)
        staged: list[tuple[int, np.ndarray]] = []
        direct: list[tuple[int, str, Any, Any]] = []
        offers = self._offers(batch=True)
        d = self._direct
        commit = d is not None and d.commit_available  # small host values committed to the master from here
        committed: list[tuple[int, str, Any, Any]] = []

        def through_daemon(i: int, a: np.ndarray, handed_back: bool = False) -> None:
            loc = self._daemon.locate(a)
            (path, *_) = daemon_path(Op.PUT, loc is not None, a.nbytes, offers, handed_back=handed_back)
            if path == Path.POOL:
                by_buffer.append((i, loc[0], loc[1], a.nbytes))  # type: ignore[index]
            elif path == Path.INLINE:
                values[i] = a.tobytes()
                inline.append(i)
            else:
                staged.append((i, a))

        for i, v in enumerate(values):
            memory = memory_of(v, put_value=True)
            if memory == Memory.BYTES and len(v) <= offers.inline_threshold_bytes:
                a, nbytes = None, len(v)
            elif memory == Memory.CUDA:
                a, nbytes = None, 0
            else:
                a = src_array(v)
                nbytes = a.nbytes
            first = plan(Op.PUT, memory, nbytes, offers)[0]
            if first == Path.INLINE:
                inline.append(i)
            elif first == Path.CUDA_DIRECT:
                direct.append((i, keys[i], CudaSource(v, self._copier()), opts))
            elif first == Path.CUDA_HOST:
                values[i] = h = host_copy(v)
                through_daemon(i, h)
            elif first == Path.DIRECT:
                direct.append((i, keys[i], a, opts))
            elif commit and nbytes <= MAX_COMMIT_VALUE_BYTES:  # DAEMON, but this process can do it all
                committed.append((i, keys[i], a, opts))
            else:  # DAEMON
                through_daemon(i, a)  # type: ignore[arg-type]
        if committed:
            back = _committed_into(d, committed, results)
            if back:
                arrays = {i: a for i, _, a, _ in committed}
                for i in back:
                    through_daemon(i, arrays[i])
        if direct:
            done = self._direct.put_batch(direct, _daemon.BATCH_ITEMS)  # type: ignore[union-attr]
            for i, _, a, _ in direct:
                r = done.get(i)
                if r is FALLBACK:
                    through_daemon(i, host_copy(a.tensor) if isinstance(a, CudaSource) else a, handed_back=True)
                elif isinstance(r, CxlkvError):
                    results[i] = Result(False, error=r)
                else:
                    results[i] = Result(True, version=int(r))  # type: ignore[arg-type]
        if inline and commit:  # committed to the master from here
            inline = _committed_into(d, [(i, keys[i], src_array(values[i]), opts) for i in inline], results)
        # Inline items refused as too large for this daemon go through the pool.
        over = self._daemon.put_inline_many(keys, values, inline, opts, results)
        staged.extend((i, src_array(values[i])) for i in over)
        self._daemon.put_ranges_many(keys, by_buffer, staged, opts, results)
        return results  # type: ignore[return-value]

    def get_many(self, keys: Sequence[str]) -> list[Result]:
        """Read many values; one :class:`Result` per key (``value`` = bytes when ok).

        Values over the daemon's inline limit are fetched through the pool.

        Raises:
            Unavailable: the daemon cannot be reached.
        """
        keys = _check_keys(keys)
        ix = self._index_path()
        if keys and starts_at_index(Op.GET, Memory.NONE, ix is not None):
            out, rest = ix.get_many_results(keys)  # type: ignore[union-attr]
            if rest:
                for i, r in zip(rest, self._get_many_daemon([keys[i] for i in rest])):
                    out[i] = r
            return out  # type: ignore[return-value]
        return self._get_many_daemon(keys)

    @_retried
    @_utf8_keys
    def _get_many_daemon(self, keys: list[str]) -> list[Result]:
        """``INLINE`` reads; a value too large to ride inline is read as :meth:`get` reads it."""
        results, large = self._daemon.get_many_inline(keys)
        for i in large:
            try:
                value, version = self._get_one_versioned(keys[i])
                results[i] = Result(True, value=value, version=version)
            except CxlkvError as exc:
                results[i] = Result(False, error=exc)
        return results  # type: ignore[return-value]

    def get_into_many(self, keys: Sequence[str], dsts: Sequence[Any]) -> list[Result]:
        """Copy the value of ``keys[i]`` into ``dsts[i]``; one :class:`Result` per key
        (``value`` = bytes copied when ok).

        Raises:
            InvalidArgument: lengths differ; a destination is read-only or not contiguous.
            Unavailable: the daemon cannot be reached.
        """
        if len(keys) != len(dsts):
            raise InvalidArgument(f"{len(keys)} keys but {len(dsts)} destinations")
        keys, dsts = _check_keys(keys), list(dsts)
        n = len(keys)
        results: list[Result | None] = [None] * n
        ix = self._index_path()
        # A batch is read from the index whole or not at all (Offers.index).
        index = ix is not None and bool(keys) and not any(memory_of(d) == Memory.CUDA for d in dsts)
        if index and starts_at_index(Op.GET_INTO, Memory.HOST, True):
            results, rest = ix.get_into_many_results(keys, [dst_array(d) for d in dsts])  # type: ignore[union-attr]
            if not rest:
                return results  # type: ignore[return-value]
            sub = self._get_into_many_rest([keys[i] for i in rest], [dsts[i] for i in rest])
            for i, r in zip(rest, sub):
                results[i] = r
            return results  # type: ignore[return-value]
        return self._get_into_many_rest(keys, dsts)

    @_retried
    @_utf8_keys
    def _get_into_many_rest(self, keys: list[str], dsts: list[Any]) -> list[Result]:
        """:meth:`get_into_many` in direct mode (leased) or through the daemon."""
        results: list[Result | None] = [None] * len(keys)
        keys, dsts, positions = self._get_direct_many(keys, dsts, results)
        for pos, r in zip(positions, self._daemon.get_into_many(keys, dsts)):
            results[pos] = r
        return results  # type: ignore[return-value]

    def _get_direct_many(
        self, keys: list[str], dsts: list[Any], results: list[Result | None]
    ) -> tuple[list[str], list[Any], list[int]]:
        """Read the items whose plan begins ``DIRECT``, ``CUDA_DIRECT`` or ``CUDA_HOST``
        into ``results``; the rest (and the direct host items handed back) as ``(keys,
        dsts, positions)``, for the daemon. A CUDA item handed back is read as
        :meth:`get_into` reads one."""
        offers = self._offers()
        if offers.direct:
            self._conn()
        direct: list[int] = []
        rest: list[int] = []
        cuda_host: list[int] = []
        targets: dict[int, Any] = {}
        for i, d in enumerate(dsts):
            memory = memory_of(d)
            a = dst_array(d) if offers.direct and memory != Memory.CUDA else None
            first = plan(Op.GET_INTO, memory, None if a is None else a.nbytes, offers)[0]
            if first == Path.CUDA_DIRECT:
                targets[i] = CudaTarget(d, self._copier())
                direct.append(i)
            elif first == Path.CUDA_HOST:
                cuda_host.append(i)
            elif first == Path.DIRECT:
                targets[i] = a
                direct.append(i)
            else:  # DAEMON
                rest.append(i)
        if direct:
            got = self._direct.get_batch([keys[i] for i in direct], [targets[i] for i in direct],  # type: ignore[union-attr]
                                         _daemon.BATCH_ITEMS)
            for i, r in zip(direct, got):
                if r is FALLBACK and isinstance(targets[i], CudaTarget):
                    cuda_host.append(i)
                elif r is FALLBACK:
                    rest.append(i)
                elif isinstance(r, CxlkvError):
                    results[i] = Result(False, error=r)
                else:
                    results[i] = Result(True, r[0], r[1])
        for i in cuda_host:  # one by one, through a pinned host buffer
            try:
                results[i] = Result(True, self._get_into_cuda(keys[i], dsts[i]))
            except CxlkvError as exc:
                results[i] = Result(False, error=exc)
        rest.sort()
        return [keys[i] for i in rest], [dsts[i] for i in rest], rest

    def get_prefix_into(self, keys: Sequence[str], dsts: Sequence[Any], tiers: list[int] | None = None) -> int:
        """The longest cached prefix of ``keys``, copied into ``dsts`` in one call.

        ``keys`` are the blocks of one prompt, in order. The daemon finds how many
        leading keys are committed, leases them, copies each into its destination
        and releases the leases. With ``tiers`` (a list), the ``cxlkv.v1.Tier``
        that served each matched key is appended to it (docs/tiers.md).

        Returns:
            ``matched``: ``dsts[:matched]`` now hold the values of ``keys[:matched]``.

        Raises:
            InvalidArgument: lengths differ; a destination is read-only or not contiguous.
            InvalidKey: a key is invalid.
            OutOfRange: a matched value is larger than its destination.
            Unavailable: the daemon cannot be reached.
        """
        if len(keys) != len(dsts):
            raise InvalidArgument(f"{len(keys)} keys but {len(dsts)} destinations")
        if not keys:
            return 0
        per_call = _daemon.BATCH_ITEMS
        if len(keys) > per_call:  # calls under the daemon's max_batch_items, prefix after prefix
            matched = 0
            for c in _daemon.chunks(len(keys), per_call):
                got = self.get_prefix_into(keys[c.start:c.stop], dsts[c.start:c.stop], tiers)
                matched += got
                if got < len(c):
                    break
            return matched
        ix = self._index_path()
        # A prefix is read from the index whole or not at all (Offers.index).
        cuda = ix is not None and any(memory_of(d) == Memory.CUDA for d in dsts)
        if starts_at_index(Op.PREFIX, Memory.CUDA if cuda else Memory.HOST, ix is not None):
            matched, done = ix.get_prefix_checked(keys, [dst_array(d) for d in dsts], tiers)  # type: ignore[union-attr]
            if done:
                return matched
            return matched + self._get_prefix_daemon(list(keys[matched:]), list(dsts[matched:]), tiers)
        return self._get_prefix_daemon(keys, dsts, tiers)

    @_retried
    @_utf8_keys
    def _get_prefix_daemon(self, keys: Sequence[str], dsts: Sequence[Any], tiers: list[int] | None) -> int:
        """``DAEMON``: the daemon matches, leases and copies (``POOL`` or ``STAGED`` per destination)."""
        return self._daemon.get_prefix_into(keys, dsts, tiers)

    def exists_many(self, keys: Sequence[str]) -> list[bool]:
        """Whether each key is committed (invalid keys answer ``False``).

        Raises:
            Unavailable: the daemon cannot be reached.
        """
        keys = _check_keys(keys)
        ix = self._index_path()
        if keys and starts_at_index(Op.EXISTS, Memory.NONE, ix is not None):
            found = ix.exists_many(keys)  # type: ignore[union-attr]
            rest = [i for i, v in enumerate(found) if v is _IX_FALLBACK]
            if rest:
                for i, v in zip(rest, self._exists_many_daemon([keys[i] for i in rest])):
                    found[i] = v
            return [bool(v) for v in found]
        return self._exists_many_daemon(keys)

    @_retried
    @_utf8_keys
    def _exists_many_daemon(self, keys: list[str]) -> list[bool]:
        return self._daemon.exists_many(keys)

    @_utf8_keys
    def remove_many(self, keys: Sequence[str], force: bool = False) -> list[Result]:
        """Remove many keys; one :class:`Result` per key.

        Raises:
            Unavailable: the daemon cannot be reached.
        """
        return self._daemon.remove_many(list(keys), force)


def _committed_into(direct: Any, items: list[tuple[int, str, Any, Any]], results: list[Any]) -> list[int]:
    """Commit ``items`` (position, key, array, options) directly, each answer into
    ``results``; the positions handed back (:data:`FALLBACK`: the daemon's paths)."""
    done = direct.commit(items)
    back: list[int] = []
    for i, *_ in items:
        r = done.get(i, FALLBACK)
        if r is FALLBACK:
            back.append(i)
        elif isinstance(r, CxlkvError):
            results[i] = Result(False, error=r)
        else:
            results[i] = Result(True, version=int(r))
    return back
