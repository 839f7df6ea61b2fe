"""``cxlkv.Client``: the synchronous SDK an inference process imports.

See docs/sdk.md for the guide; the docstrings here are the reference.

The Client checks arguments, asks :func:`cxlkv.client._paths.plan` which paths a
value takes, and calls them in that order: reads from the region's index
(:mod:`._index`), direct mode (:mod:`._direct`), the daemon's inline, pool and
staged paths (:mod:`._daemon`), CUDA tensors (:mod:`._cuda`). It speaks to the
daemon through one :class:`~cxlkv.client._conn.Connection` interface, whichever
framing ``protocol`` names (:mod:`._link`). The batch calls are in
:mod:`._batches`; the plumbing of every call (results, retries, checks) in
:mod:`._api`.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from cxlkv.client import _daemon
from cxlkv.client._api import (
    MAX_SHARED_BYTES, MAX_TIMEOUT_S, KeyInfo, Result, _number, _options, _retried, _utf8_keys,
    default_socket_path,
)
from cxlkv.client._conn import connector
from cxlkv.client._cuda import CudaCopier, CudaSource, CudaTarget, host_copy, read_through_host
from cxlkv.client._daemon import DaemonPath
from cxlkv.client._commit import MAX_VALUE_BYTES as MAX_COMMIT_VALUE_BYTES
from cxlkv.client._direct import FALLBACK, DirectPath
from cxlkv.client._index import FALLBACK as _IX_FALLBACK, MISS as _IX_MISS, _not_found
from cxlkv.client._batches import BatchCalls
from cxlkv.client._memory import dst_array, src_array
from cxlkv.client._paths import Memory, Offers, Op, Path, daemon_path, memory_of, plan, starts_at_index
from cxlkv.client._pool import BufferPool
from cxlkv.client.framing import METHODS_BY_NAME
from cxlkv.errors import CxlkvError, InvalidArgument
from cxlkv.v1 import client_pb2, common_pb2

__all__ = ["Client", "Result", "KeyInfo", "DEFAULT_POOL_BYTES", "default_socket_path"]

MiB = 1 << 20
#: Default size of the managed shared-buffer pool, in bytes.
DEFAULT_POOL_BYTES = 64 * MiB
#: Values up to this size travel inside the message by default, in bytes; larger
#: ones are staged through the shared-buffer pool.
DEFAULT_INLINE_BYTES = 64 << 10
#: Most items in one batch request (:data:`cxlkv.client._daemon.BATCH_ITEMS`).
BATCH_ITEMS = _daemon.BATCH_ITEMS
#: Most inline value bytes in one batch request.
BATCH_INLINE_BYTES = _daemon.BATCH_INLINE_BYTES

_M = METHODS_BY_NAME
Opts = common_pb2.PutOptions | None


class Client(BatchCalls):
    """A connection to the clientd of this host.

    Args:
        socket_path: the daemon's gRPC socket; default (also for ``""``)
            ``$CXLKV_SOCKET``, else ``<runtime dir>/clientd.sock``. The lean socket is this path plus
            ``".lean"`` unless ``lean_socket_path`` is given; a path ending in ``".lean"`` is taken
            as the lean socket, the gRPC one being beside it without the suffix.
        timeout_s: longest wait for one answer, in seconds.
        retry_s: how long a read (``get``, ``get_into``, ``exists``, their batch
            forms, ``get_prefix_into``, ``stat``) keeps trying, in seconds, when the
            daemon cannot be reached or the connection breaks before the answer
            (:class:`~cxlkv.errors.DaemonUnreachable`: a clientd restart; raised or
            in a batch item's result) or a daemon just started says ``NotReady``,
            pausing 10 ms, doubling to 0.5 s, between tries. 0 (the default) fails at once,
            so a cache read costs no wait and the caller can recompute instead.
            Writes are never retried: whether the broken one took effect is unknown.
        buffer_pool_bytes: size of the managed shared-buffer pool (and of each
            further pool segment), in bytes. Memory is only created when first needed.
        protocol: ``"lean"`` (default; the fast framing) or ``"grpc"``.
        lean_socket_path: the daemon's lean socket, when not ``socket_path + ".lean"``.
        inline_threshold_bytes: values up to this size travel inside the message;
            larger ones are staged through the pool (daemon limit permitting).
        direct: use direct mode when the daemon offers it and this process can
            map its regions (docs/sdk.md "Direct mode"): values of at least
            ``direct_threshold_bytes`` are copied between the caller's memory and
            the region by this process, the daemon only answering metadata. When
            the region cannot be mapped here (permission, identity mismatch, the
            daemon's ``direct_mode = false``), the shared-buffer path is used
            instead, transparently (:attr:`direct_status` says why).
        direct_threshold_bytes: smallest value moved in direct mode, in bytes
            (default: just above ``inline_threshold_bytes``; smaller values travel
            inline, one round trip instead of two).
        direct_prefault: fault in this process's mapping of every region at start
            (no first-touch page faults on the data path; takes time for large regions).
        cuda_register: register the region mapping with CUDA (lazily, on the first
            CUDA tensor) so the GPU copies by DMA; ``False`` measures the
            unregistered path (the driver stages every copy).

    Raises:
        Unavailable: the daemon is not running (the message names the socket).
        InvalidArgument: a bad argument.

    Values (``src``/``dst`` arguments) may be ``bytes``, ``bytearray``,
    ``memoryview``, numpy arrays or CPU torch tensors. Memory obtained from
    :meth:`buffer` is inside a registered shared buffer: ``put_from`` /
    ``get_into`` on it are zero-copy (the daemon copies between it and the CXL
    region). Any other memory is staged through the pool: one extra memcpy.

    Thread-safety: a ``Client`` may be shared by threads. With the lean protocol
    each thread gets its own connection (so threads run calls in parallel); the
    pool is guarded by a lock; the gRPC channel is thread-safe. After ``fork`` the
    child must create its own ``Client`` (the parent's connections and buffers
    belong to the parent; the child's copy refuses to be used).
    """

    def __init__(
        self,
        socket_path: str | os.PathLike[str] | None = None,
        *,
        timeout_s: float = 30.0,
        retry_s: float = 0.0,
        buffer_pool_bytes: int = DEFAULT_POOL_BYTES,
        protocol: str = "lean",
        lean_socket_path: str | os.PathLike[str] | None = None,
        inline_threshold_bytes: int = DEFAULT_INLINE_BYTES,
        direct: bool = True,
        direct_threshold_bytes: int | None = None,
        direct_prefault: bool = False,
        cuda_register: bool = True,
    ) -> None:
        if protocol not in ("lean", "grpc"):
            raise InvalidArgument(f"protocol must be \"lean\" or \"grpc\", got {protocol!r}")
        timeout_s = _number("timeout_s", timeout_s, float, above=0.0, most=MAX_TIMEOUT_S)
        retry_s = _number("retry_s", retry_s, float, least=0.0, most=MAX_TIMEOUT_S)
        buffer_pool_bytes = _number("buffer_pool_bytes", buffer_pool_bytes, int, least=1, most=MAX_SHARED_BYTES)
        inline_threshold_bytes = _number("inline_threshold_bytes", inline_threshold_bytes, int, least=0,
                                         most=MAX_SHARED_BYTES)
        self.socket_path = os.fspath(socket_path) if socket_path else default_socket_path()
        if lean_socket_path is None and self.socket_path.endswith(".lean"):
            # the lean socket itself was named: the gRPC one is beside it
            lean_socket_path, self.socket_path = self.socket_path, self.socket_path[:-len(".lean")]
        self.lean_socket_path = (os.fspath(lean_socket_path) if lean_socket_path is not None
                                 else self.socket_path + ".lean")
        self.protocol = protocol
        self.timeout_s = float(timeout_s)
        self.retry_s = float(retry_s)
        self.inline_threshold_bytes = int(inline_threshold_bytes)
        self._pid = os.getpid()
        self._local = threading.local()
        self._lock = threading.Lock()
        #: This Client's connections, of the framing ``protocol`` names.
        self._links = connector(protocol, self.socket_path, self.lean_socket_path, self.timeout_s)
        self._closed = False
        self._offer_table: list[Offers | None] = [None] * 8
        share = _daemon_uid(self.socket_path) not in (None, os.geteuid())
        self._pool = BufferPool(self._register_buffer, self._unregister_buffer, int(buffer_pool_bytes),
                                share_with_group=share)
        # Late-bound: the daemon path calls whatever _call/_call_many are at the time
        # (as every call did when they were the Client's own code; tests wrap them).
        self._daemon = DaemonPath(lambda name, req: self._call(name, req),
                                  lambda name, reqs: self._call_many(name, reqs), self._pool)
        self._direct: DirectPath | None = None
        self._index_check_at = 0.0
        #: Hit reports of reads from the index dropped because the daemon was not
        #: taking requests (stopped, or its socket full): the eviction policy's loss only.
        self.reports_dropped = 0
        #: The daemon could not yet say whether it maps the regions direct mode mapped.
        self._direct_unsure = False
        self._conn()  # fail fast when the daemon is not running
        self.direct_threshold_bytes = (self.inline_threshold_bytes + 1 if direct_threshold_bytes is None
                                       else max(0, int(direct_threshold_bytes)))
        self._cuda: CudaCopier | None = None
        self._cuda_register = bool(cuda_register)
        #: Why direct mode is or is not in use (one line).
        self.direct_status = "off (direct=False)"
        if direct:
            self._direct, why = DirectPath.open(self._call, prefault=direct_prefault, send=self._send,
                                                report=self._send_nowait, commit_timeout_s=self.timeout_s)
            if self._direct is not None:
                self.direct_status = "on" + (f" (skipped: {why})" if why else "")
            else:
                self.direct_status = f"off: {why}"

    @property
    def direct(self) -> bool:
        """Whether direct mode is in use (see :attr:`direct_status` for why not)."""
        return self._direct is not None and not self._direct.disabled

    def _copier(self) -> CudaCopier:
        """The CUDA copier, made on the first CUDA tensor."""
        if self._cuda is None:
            with self._lock:
                if self._cuda is None:
                    self._cuda = CudaCopier(register=self._cuda_register)
        return self._cuda

    def close(self) -> None:
        """Unregister the pool's buffers and close every connection (idempotent).

        Memory views from :meth:`buffer` must not be used afterwards.
        """
        if self._closed:
            return
        if self._pid == os.getpid():
            try:
                self._pool.close()
            except CxlkvError:
                pass
        if self._direct is not None and self._direct.index is not None and self._pid == os.getpid():
            try:
                self._direct.index.flush_hits(wait=True)
            except Exception:  # noqa: BLE001 - closing must not fail on a lost report
                pass
        if self._direct is not None and self._direct.commits is not None and self._pid == os.getpid():
            self._direct.commits.close()  # reservations held go back while the daemon is still reachable
        self._closed = True
        d, self._direct = self._direct, None
        cu, self._cuda = self._cuda, None
        if d is not None and self._pid == os.getpid():
            if cu is not None:
                cu.close()
                for r in d.regions.values():
                    cu.release(r)
            d.close()
        self._links.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if not self._closed and self._pid == os.getpid():
                self.close()
        except Exception:  # interpreter shutdown
            pass

    def __repr__(self) -> str:
        return f"<cxlkv.Client {self.protocol} {self.socket_path}{' closed' if self._closed else ''}>"

    # ========================================================= shared memory
    def buffer(self, size_bytes: int) -> memoryview:
        """Shared memory for zero-copy ``put_from`` / ``get_into``.

        The memory lies inside a buffer registered with the daemon, so calls on
        it (or on any slice of it) move no bytes through the socket and copy
        once, between this memory and the CXL region. It is returned to the pool
        when the last reference to it (or to a view of it) is gone.

        Args:
            size_bytes: size in bytes (>= 0).

        Returns:
            A writable ``memoryview`` (format ``"B"``); ``numpy.frombuffer`` and
            ``torch.frombuffer`` wrap it without copying.

        Raises:
            InvalidArgument: negative size.
            NoSpace: /dev/shm cannot hold more shared memory.
        """
        size_bytes = _number("size_bytes", size_bytes, int, least=0, most=MAX_SHARED_BYTES)
        self._conn(check=True)
        seg, off = self._pool.alloc(size_bytes)
        arr = seg.array[off:off + size_bytes]
        weakref.finalize(arr, self._pool.free_later, seg, off)
        return memoryview(arr)  # type: ignore[arg-type]  # ndarrays export the buffer protocol

    @property
    def staged_bytes(self) -> int:
        """Bytes this client copied through its staging pool (memory outside shared
        memory, each copied once more than zero-copy memory is), since it was made."""
        return self._pool.staged_bytes

    # ===================================================== single-key values
    @_utf8_keys
    def put(self, key: str, value: Any, *, upsert: bool = False, replica_num: int = 1,
            soft_pin: bool = False, hard_pin: bool = False) -> int:
        """Store ``value`` under ``key``.

        Small values travel inline; larger ones through the shared-buffer pool
        (or zero-copy when ``value`` lives in :meth:`buffer` memory).

        Args:
            key: 1-4096 UTF-8 bytes, no NUL.
            value: bytes-like, numpy array or CPU tensor (0 bytes is a value).
            upsert: replace a committed key with a new version.
            replica_num: replicas on distinct segments (best effort).
            soft_pin: evicted last (the pin expires).
            hard_pin: never evicted.

        Returns:
            The new object's version.

        Raises:
            AlreadyExists: ``key`` is committed and ``upsert`` is false.
            NotReady: another put of ``key`` is in flight.
            NoSpace, TooLarge, InvalidKey, InvalidArgument, Unavailable: see docs/sdk.md.
        """
        opts = _options(upsert, replica_num, soft_pin, hard_pin)
        return self._put_one(key, value, memory_of(value, put_value=True), opts)

    def _put_one(self, key: str, src: Any, memory: str, opts: Opts) -> int:
        """One put along its :func:`~cxlkv.client._paths.plan`."""
        if memory == Memory.CUDA:
            a, nbytes = None, 0
        elif memory == Memory.BYTES and len(src) <= self.inline_threshold_bytes:
            a, nbytes = None, len(src)  # rides inline: made an array only if it must be staged
        else:
            a = src_array(src)
            nbytes = a.nbytes
        return self._put_along(key, src, a, plan(Op.PUT, memory, nbytes, self._offers()), opts)

    def _put_along(self, key: str, src: Any, a: np.ndarray | None, paths: Sequence[str], opts: Opts,
                   loc: tuple[int, int] | None = None) -> int:
        """Try ``paths`` in order until one takes the put; its version.

        ``src`` is the caller's value, ``a`` it as an array (``None`` for ``bytes``
        riding inline and for a CUDA tensor), ``loc`` its pool location (``POOL``).
        """
        for path in paths:
            if path == Path.INLINE:
                if self._direct is not None and self._direct.commit_available:  # to the master from here
                    r = self._commit_one(key, src_array(src) if a is None else a, opts)
                    if r is not FALLBACK:
                        return r
                r = self._daemon.put_inline(key, src if a is None else a.tobytes(), opts)
            elif path == Path.STAGED:
                return self._daemon.put_staged(key, src_array(src) if a is None else a, opts)
            elif path == Path.POOL:
                assert a is not None and loc is not None
                return self._daemon.put_pool(key, loc, a.nbytes, opts)
            elif path == Path.DIRECT or path == Path.CUDA_DIRECT:
                self._conn()
                item = a if path == Path.DIRECT else CudaSource(src, self._copier())
                r = self._direct.put([(0, key, item, opts)])[0]  # type: ignore[union-attr]
                if isinstance(r, CxlkvError):
                    raise r
            elif path == Path.CUDA_HOST:
                h = host_copy(src)
                return self._put_along(key, h, h, (Path.DAEMON,), opts)
            else:  # DAEMON: the memory is located only now (it may register shared memory)
                assert a is not None
                if (self._direct is not None and self._direct.commit_available
                        and a.nbytes <= MAX_COMMIT_VALUE_BYTES):  # this process can do it all
                    r = self._commit_one(key, a, opts)
                    if r is not FALLBACK:
                        return r
                loc = self._daemon.locate(a)
                return self._put_along(key, src, a, daemon_path(Op.PUT, loc is not None, a.nbytes, self._offers()),
                                       opts, loc)
            if r is not FALLBACK:
                return r
        raise AssertionError(f"put of {key!r}: no path in {paths} took it")  # every plan ends in one that does

    def _commit_one(self, key: str, a: np.ndarray, opts: Opts) -> Any:
        """One put by direct commit: its version, or :data:`FALLBACK` (raises its error)."""
        r = self._direct.commit([(0, key, a, opts)])[0]  # type: ignore[union-attr]
        if isinstance(r, CxlkvError):
            raise r
        return r

    @_utf8_keys
    def upsert(self, key: str, value: Any, **options: Any) -> int:
        """``put(key, value, upsert=True, ...)``: replace atomically; returns the new version."""
        return self.put(key, value, upsert=True, **options)

    def get(self, key: str) -> bytes:
        """The value of ``key``.

        Read from the region's index with no RPC when this process maps the region
        (docs/sdk.md "Reads from the index"), else through the daemon.

        Raises:
            NotFound: absent, not committed yet, or removed (also a ``KeyError``).
            LeaseExpired: the read could not finish within its lease (retry).
            ChecksumMismatch, InvalidKey, Unavailable: see docs/sdk.md.
        """
        return self._get_one_versioned(key)[0]

    def _get_one_versioned(self, key: str) -> tuple[bytes, int]:
        """:meth:`get`, and the version of the value read."""
        ix = self._index_path(key)
        if starts_at_index(Op.GET, Memory.NONE, ix is not None):
            got = ix.get_versioned(key)  # type: ignore[union-attr]
            v = got[0]
            if v is not _IX_FALLBACK:
                if v is _IX_MISS:
                    raise _not_found(key)
                return got  # type: ignore[return-value]
        return self._get_daemon(key)

    @_retried
    @_utf8_keys
    def _get_daemon(self, key: str) -> tuple[bytes, int]:
        """:meth:`get` past the index: ``INLINE``, then by the value's size; ``(value, version)``."""
        size = self._daemon.get_inline(key)
        if not isinstance(size, int):
            return size
        for path in plan(Op.GET, Memory.NONE, size, self._offers()):
            if path == Path.DIRECT:
                (r,) = self._direct.get([key], [None])  # type: ignore[union-attr]
                if isinstance(r, CxlkvError):
                    raise r
                if r is not FALLBACK:
                    return r[2], r[1]
            else:  # STAGED
                return self._daemon.get_staged(key, size)
        raise AssertionError("a sized get's plan ends in STAGED")

    def exists(self, key: str) -> bool:
        """Whether ``key`` is committed (grants no lease; from the index when mapped).

        Raises:
            InvalidKey, Unavailable.
        """
        ix = self._index_path(key)
        if starts_at_index(Op.EXISTS, Memory.NONE, ix is not None):
            (v,) = ix.exists_many([key])  # type: ignore[union-attr]
            if v is not _IX_FALLBACK:
                return bool(v)
        return self._exists_daemon(key)

    @_retried
    @_utf8_keys
    def _exists_daemon(self, key: str) -> bool:
        return self._daemon.exists(key)

    @_utf8_keys
    def remove(self, key: str, force: bool = False) -> None:
        """Remove ``key``.

        Args:
            force: remove even while readers hold a lease (their bytes stay until it ends).

        Raises:
            NotFound: absent.
            HasLease: leased and not ``force``.
            InvalidKey, Unavailable.
        """
        self._call("Remove", client_pb2.ClientRemoveRequest(key=key, force=force))

    @_utf8_keys
    def remove_all(self, force: bool = False, regex: str = "") -> int:
        """Remove every committed object, or those whose key matches ``regex``.

        ``regex`` is an RE2 pattern searched in the key (anchor with ``^``): Python's
        ``re`` syntax without backreferences and look-around, matched in time
        linear in the key's length, so no pattern can stall the master (docs/sdk.md).
        The master runs the removal by slices, answering other calls meanwhile:
        millions of keys take seconds (about 18 s for 2M on 2 vCPUs); keep
        ``timeout_s`` above that.

        Returns:
            Objects removed (leased ones are skipped unless ``force``).

        Raises:
            InvalidArgument: ``regex`` does not compile with RE2 (the message says why).
            PermissionDenied: a TLS cluster, where this is an admin's call and
                the daemon's certificate is not an admin's.
            Unavailable.
        """
        return self._call("RemoveAll", client_pb2.ClientRemoveAllRequest(force=force, regex=regex)).removed

    # ========================================================= zero-copy forms
    @_utf8_keys
    def put_from(self, key: str, src: Any, *, upsert: bool = False, replica_num: int = 1,
                 soft_pin: bool = False, hard_pin: bool = False) -> int:
        """Store the bytes of ``src`` (zero-copy when ``src`` is :meth:`buffer` memory).

        Returns:
            The new object's version.

        Raises:
            As :meth:`put`.
        """
        return self._put_one(key, src, memory_of(src), _options(upsert, replica_num, soft_pin, hard_pin))

    def get_into(self, key: str, dst: Any) -> int:
        """Copy the value of ``key`` into the start of ``dst``.

        Zero-copy when ``dst`` is :meth:`buffer` memory; other memory is staged.

        Returns:
            The value's size in bytes (``dst[nbytes:]`` is untouched).

        Raises:
            NotFound: absent.
            OutOfRange: the value is larger than ``dst`` (``requested_bytes`` = its size).
            InvalidArgument: ``dst`` is read-only or not contiguous.
            LeaseExpired, ChecksumMismatch, InvalidKey, Unavailable.
        """
        ix = self._index_path(key)
        # The index step is planned here; what follows once the daemon connection is
        # checked (it may turn direct mode off), in _get_into_rest.
        if ix is not None and starts_at_index(Op.GET_INTO, memory_of(dst), True):
            n = ix.get_into_size(key, dst_array(dst))
            if n is not _IX_FALLBACK:
                return n  # type: ignore[return-value]
        return self._get_into_rest(key, dst)

    @_retried
    @_utf8_keys
    def _get_into_rest(self, key: str, dst: Any) -> int:
        """:meth:`get_into` in direct mode (leased) or through the daemon."""
        memory = memory_of(dst)
        if memory == Memory.CUDA:
            return self._get_into_cuda(key, dst)
        a = dst_array(dst)
        for path in plan(Op.GET_INTO, memory, a.nbytes, self._offers()):
            if path == Path.DIRECT:
                self._conn()
                (r,) = self._direct.get([key], [a])  # type: ignore[union-attr]
                if isinstance(r, CxlkvError):
                    raise r
                if r is not FALLBACK:
                    return r[0]
            else:  # DAEMON
                return self._get_into_daemon(key, a)
        raise AssertionError("a get_into's plan ends in DAEMON")

    def _get_into_cuda(self, key: str, dst: Any) -> int:
        """``get_into`` a CUDA tensor: ``CUDA_DIRECT`` (DMA from the region in direct
        mode), else ``CUDA_HOST`` (through a pinned host buffer)."""
        target = CudaTarget(dst, self._copier())
        for path in plan(Op.GET_INTO, Memory.CUDA, target.nbytes, self._offers()):
            if path == Path.CUDA_DIRECT:
                self._conn()
                (r,) = self._direct.get([key], [target])  # type: ignore[union-attr]
                if isinstance(r, CxlkvError):
                    raise r
                if r is not FALLBACK:
                    return r[0]
            else:  # CUDA_HOST
                return read_through_host(target, lambda host: self._get_into_daemon(key, host))
        raise AssertionError("a CUDA get_into's plan ends in CUDA_HOST")

    def _get_into_daemon(self, key: str, a: np.ndarray) -> int:
        """The ``DAEMON`` step of a read into ``a``: ``POOL`` or ``STAGED``."""
        loc = self._daemon.locate(a)
        (path,) = daemon_path(Op.GET_INTO, loc is not None, a.nbytes, self._offers())
        return self._daemon.get_into(key, a, loc if path == Path.POOL else None)

    # ============================================================ inspection
    @_retried
    def stat(self) -> dict[str, Any]:
        """The daemon's state: identity, master connection, segments, key count,
        space, buffers, counters (ClientStatResponse as a dict: proto field names,
        every field present, integers as ints, enums by name).

        Raises:
            Unavailable: the daemon cannot be reached.
        """
        from cxlkv.wire.protodict import message_dict

        return message_dict(self._call("Stat", client_pb2.ClientStatRequest()))

    def list(self, prefix: str = "", *, page_size: int = 1000) -> Iterator[KeyInfo]:
        """Committed keys starting with ``prefix``, in key order (fetched page by page).

        Raises:
            PermissionDenied: a TLS cluster (listing is an admin's call).
            Unavailable: the daemon cannot be reached.
        """
        token = ""
        while True:
            r = self._call("List", client_pb2.ListRequest(prefix=prefix, page_size=page_size, page_token=token))
            for e in r.entries:
                yield KeyInfo(e.key, e.value_size_bytes, e.version, e.replica_count)
            token = r.next_page_token
            if not token:
                return


def _daemon_uid(socket_path: str) -> int | None:
    try:
        return os.stat(socket_path).st_uid
    except OSError:
        return None
