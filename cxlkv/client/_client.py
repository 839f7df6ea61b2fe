"""``cxlkv.Client``: the synchronous SDK an inference process imports.

See docs/sdk.md for the guide; the docstrings here are the reference.
"""

from __future__ import annotations

import functools
import math
import numbers
import operator
import os
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cxlkv.client._conn import GrpcConnection, LeanConnection
from cxlkv.client._cuda import CudaCopier, CudaSource, CudaTarget, is_cuda_tensor
from cxlkv.client._direct import FALLBACK, DirectPath
from cxlkv.client._index import FALLBACK as _IX_FALLBACK
from cxlkv.client._index import MISS as _IX_MISS
from cxlkv.client._index import IndexPath
from cxlkv.client._memory import address_of, dst_array, src_array
from cxlkv.client._pool import BufferPool, PoolBuffer
from cxlkv.client.framing import METHODS_BY_NAME
from cxlkv.errors import (
    CxlkvError, DaemonUnreachable, ErrorCode, Internal, InvalidArgument, InvalidKey, NotFound, NotReady, OutOfRange,
    TooLarge, UnknownBuffer, error_for,
)
from cxlkv.keys import key_error, validate_key, validate_replica_num
from cxlkv.wire.limits import SDK_BATCH_INLINE_BYTES, SDK_BATCH_ITEMS
from cxlkv.v1 import client_pb2, common_pb2

__all__ = ["Client", "Result", "KeyInfo", "DEFAULT_POOL_BYTES", "default_socket_path"]

MiB = 1 << 20
#: Default size of the managed shared-buffer pool, in bytes.
DEFAULT_POOL_BYTES = 64 * MiB
#: How often reads from the index check the daemon connection (seconds): a
#: daemon restarted on another region is noticed within this long.
INDEX_CHECK_S = 0.2
_NO_KEY = object()  # _index_path: a batch call (keys checked per item)
#: Values up to this size travel inside the message by default, in bytes; larger
#: ones are staged through the shared-buffer pool.
DEFAULT_INLINE_BYTES = 64 << 10
#: Most items in one batch request (the daemons' ``max_batch_items`` is never
#: below it: larger batches are split into several calls, cxlkv.wire.limits).
BATCH_ITEMS = SDK_BATCH_ITEMS
#: Most inline value bytes in one batch request.
BATCH_INLINE_BYTES = SDK_BATCH_INLINE_BYTES

_M = METHODS_BY_NAME
_PutRequest = client_pb2.PutRequest
_GetRequest = client_pb2.GetRequest
_BufferRange = client_pb2.BufferRange
_GetIntoRequest = client_pb2.GetIntoRequest
_PutFromRequest = client_pb2.PutFromRequest


def default_socket_path() -> str:
    """``$CXLKV_SOCKET``, else ``<runtime dir>/clientd.sock`` (the daemon's default).

    Raises:
        UnsafeRuntimeDir: the runtime directory exists but another user owns it or
            may write into it (:func:`cxlkv.runtime.rundir.check_private_dir`).
    """
    env = os.environ.get("CXLKV_SOCKET")
    if env:
        return env
    from cxlkv.config import default_runtime_dir
    from cxlkv.runtime.rundir import check_private_dir

    run = default_runtime_dir()
    try:
        check_private_dir(run, create=False)
    except FileNotFoundError:
        pass  # no daemon there: connecting says so
    return str(run / "clientd.sock")


@dataclass
class Result:
    """The outcome of one position of a batch call.

    Attributes:
        ok: whether this item succeeded.
        value: the bytes (``get_many``), the byte count (``get_into_many``), else ``None``.
        version: the object's version (puts and gets), else 0.
        error: the item's error when not ``ok`` (a :class:`~cxlkv.errors.CxlkvError`).
    """

    ok: bool
    value: Any = None
    version: int = 0
    error: CxlkvError | None = None

    def unwrap(self) -> Any:
        """``value`` if ok, else raise ``error``."""
        if not self.ok:
            assert self.error is not None
            raise self.error
        return self.value


@dataclass(frozen=True)
class KeyInfo:
    """One committed key, as :meth:`Client.list` yields it.

    Attributes:
        key: the key.
        size_bytes: value size.
        version: current version.
        replica_count: replicas placed.
    """

    key: str
    size_bytes: int
    version: int
    replica_count: int


def _check_keys(keys: Any) -> list[str]:
    """``keys`` as a list, every one a ``str`` (empty, too long or NUL-holding keys
    are answered per position by the daemon).

    Raises:
        InvalidArgument: ``keys`` is a single ``str``/``bytes`` or not iterable.
        InvalidKey: a key is not a ``str`` (the message gives its position).
    """
    if isinstance(keys, (str, bytes, bytearray, memoryview)):
        raise InvalidArgument(f"keys must be a sequence of str, got a single {type(keys).__name__}")
    try:
        out = list(keys)
    except TypeError:
        raise InvalidArgument(f"keys must be a sequence of str, got {type(keys).__name__}") from None
    for i, k in enumerate(out):
        if not isinstance(k, str):
            raise InvalidKey(f"keys[{i}] must be a str, got {type(k).__name__}")
    return out


def _utf8_keys(fn: Any) -> Any:
    """Check the key argument before anything is sent, and turn protobuf's
    UnicodeEncodeError (a key or prefix holding a lone surrogate, which no UTF-8
    string can carry) into the documented :class:`InvalidKey`.

    A method whose first parameter is ``key`` gets the full key rules
    (:func:`cxlkv.keys.validate_key`); one whose first parameter is ``keys`` gets
    a list of ``str`` (:func:`_check_keys`).

    The connection is made (again, after a failure) before anything else: a
    restarted daemon's forgotten buffers are then replaced before the call picks
    any (:meth:`Client._conn`). A call refused with ``UnknownBuffer`` because
    the daemon restarted unnoticed (gRPC learns of a reconnection only after
    it) is made once more with new buffers: the daemon did nothing with it.
    """
    first = fn.__code__.co_varnames[1] if fn.__code__.co_argcount > 1 else ""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        args[0]._conn(check=True)
        if first in ("key", "keys"):
            if len(args) > 1:
                value = args[1]
                checked = validate_key(value) if first == "key" else _check_keys(value)
                args = (args[0], checked) + args[2:]
            elif first in kwargs:
                kwargs[first] = validate_key(kwargs[first]) if first == "key" else _check_keys(kwargs[first])
        try:
            try:
                return fn(*args, **kwargs)
            except UnknownBuffer:
                # Refused before anything was done: if the daemon forgot the pool's
                # buffers (restarted unnoticed), go once more with new ones.
                if not args[0]._forgotten_buffers():
                    raise
                return fn(*args, **kwargs)
        except UnicodeEncodeError as exc:
            raise InvalidKey(f"key is not valid UTF-8 ({exc.reason}); keys are UTF-8 strings") from None

    return wrapper


#: First pause before a read is tried again on a new connection, in seconds; it
#: doubles up to :data:`RETRY_MAX_PAUSE_S`.
RETRY_FIRST_PAUSE_S = 0.01
#: Longest pause between two tries of a read, in seconds.
RETRY_MAX_PAUSE_S = 0.5


def _retried(fn: Any) -> Any:
    """Try a read again while its daemon is away (``Client.retry_s``).

    Retried (raised, or standing in an item's :class:`Result`: a batch whose
    daemon went away mid-way is read again whole):

    * :class:`DaemonUnreachable`: the daemon stopped, restarted or broke the
      connection before answering;
    * :class:`NotReady`: a daemon that just started has not registered with its
      master yet;
    * ``UnknownBuffer`` after one of those, or when the daemon turns out to have
      forgotten the pool's buffers (a gRPC channel back on a new daemon before
      the SDK heard of the reconnection): the buffers are checked, then the read
      goes again.

    Never an answer (a miss, the daemon's own ``Unavailable`` for an unreachable
    master) nor a call past ``timeout_s``. Each try reconnects and re-checks the
    pool's buffers like any call after a restart. Calls made inside a retried
    read (``get_many`` reading a large value through ``get``) share its budget
    instead of starting their own. Applied to reads only: they can run twice
    without effect.
    """

    @functools.wraps(fn)
    def wrapper(self: "Client", *args: Any, **kwargs: Any) -> Any:
        budget = self.retry_s
        local = self._local
        if budget <= 0 or getattr(local, "retrying", False):
            return fn(self, *args, **kwargs)
        deadline = time.monotonic() + budget
        pause = RETRY_FIRST_PAUSE_S
        lost = False  # a try failed: the daemon went away, its buffers may be forgotten
        local.retrying = True
        try:
            while True:
                failed: CxlkvError | None = None
                try:
                    out = fn(self, *args, **kwargs)
                    if not self._items_lost(out, lost):
                        return out
                except (DaemonUnreachable, NotReady) as exc:
                    failed = exc
                except UnknownBuffer as exc:
                    if not lost:  # not a restart: the call itself re-ran once if buffers were forgotten
                        raise
                    failed = exc
                lost = True  # whatever failed, a new daemon may answer the next try
                self._recheck_buffers_next_call()
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    if failed is None:
                        return out  # the per-item errors say which items failed
                    raise failed
                time.sleep(min(pause, left))
                pause = min(pause * 2, RETRY_MAX_PAUSE_S)
        finally:
            local.retrying = False

    return wrapper


def _status_error(st: common_pb2.Status, key: str | None) -> CxlkvError:
    return error_for(st.code, st.message, key=key)


def _options(upsert: bool, replica_num: int, soft_pin: bool, hard_pin: bool) -> common_pb2.PutOptions | None:
    """Wire options for a put.

    Raises:
        InvalidArgument: ``replica_num`` is not an int in 1..``cxlkv.keys.MAX_REPLICA_NUM``.
    """
    validate_replica_num(replica_num)
    if not upsert and replica_num == 1 and not soft_pin and not hard_pin:
        return None
    return common_pb2.PutOptions(upsert=bool(upsert), replica_num=replica_num,
                                 soft_pin=bool(soft_pin), hard_pin=bool(hard_pin))


#: Longest ``timeout_s`` a Client accepts, in seconds.
MAX_TIMEOUT_S = 1e6
#: Largest shared-memory size a Client accepts (pool, ``buffer()``), in bytes: 64 TiB.
MAX_SHARED_BYTES = 1 << 46


def _number(name: str, value: Any, kind: type, *, least: float | None = None, above: float | None = None,
            most: float | None = None) -> Any:
    """``value`` as an ``int`` (no float, no bool) or a finite ``float`` (from a real number: no
    bool, no string), within bounds.

    Raises:
        InvalidArgument: not a number of that kind, not finite, or out of bounds.
    """
    try:
        if kind is int:
            if isinstance(value, bool):
                raise TypeError
            v = operator.index(value)
        else:
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError  # "5", b"1", True: not a number, even if float() takes it
            v = float(value)
            if not math.isfinite(v):
                raise ValueError
    except (TypeError, ValueError):
        raise InvalidArgument(f"{name} must be {'an integer' if kind is int else 'a finite number (int or float)'}, "
                              f"got {value!r}") from None
    if (least is not None and v < least) or (above is not None and v <= above) or (most is not None and v > most):
        low = f">= {least}" if least is not None else f"> {above}" if above is not None else ""
        top = f"<= {most:g}" if isinstance(most, float) else f"<= {most}" if most is not None else ""
        raise InvalidArgument(f"{name} must be {' and '.join(x for x in (low, top) if x)}, got {v!r}")
    return v


def _registered(conn: Any, buffer_ids: list[int]) -> list[bool]:
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


def _chunks(n: int, size: int) -> Iterator[range]:
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


class Client:
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
        self._conns: list[Any] = []
        self._grpc: GrpcConnection | None = None
        self._closed = False
        share = _daemon_uid(self.socket_path) not in (None, os.geteuid())
        self._pool = BufferPool(self._register_buffer, self._unregister_buffer, int(buffer_pool_bytes),
                                share_with_group=share)
        self._direct: DirectPath | None = None
        self._index_check_at = 0.0
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
            self._direct, why = DirectPath.open(self._call, prefault=direct_prefault, send=self._send)
            if self._direct is not None:
                self.direct_status = "on" + (f" (skipped: {why})" if why else "")
            else:
                self.direct_status = f"off: {why}"

    @property
    def direct(self) -> bool:
        """Whether direct mode is in use (see :attr:`direct_status` for why not)."""
        return self._direct is not None and not self._direct.disabled

    def _index_path(self, key: Any = _NO_KEY) -> IndexPath | None:
        """The index reader when reads may use it now, else ``None`` (the daemon path).

        ``key`` (single-key calls) must be a valid key, else the daemon path says
        why. Every :data:`INDEX_CHECK_S` the daemon connection is checked as any
        call checks it (a restarted daemon on another region turns direct mode
        off); a daemon that is down does not stop reads from the index."""
        d = self._direct
        if d is None or d.index is None or d.disabled or self._closed or self._pid != os.getpid():
            return None
        if key is not _NO_KEY and (type(key) is not str or key_error(key) is not None):
            return None
        now = time.monotonic()
        if now >= self._index_check_at:
            self._index_check_at = now + INDEX_CHECK_S
            try:
                self._conn(check=True)
            except CxlkvError:
                pass
            if d.disabled:
                return None
        return d.index

    def _use_direct(self, nbytes: int) -> bool:
        d = self._direct
        return d is not None and not d.disabled and nbytes >= self.direct_threshold_bytes

    def _check_direct(self, conn: Any) -> None:
        """On a new connection (the daemon may have restarted): if the daemon now
        maps other regions than the ones direct mode mapped here (it came back on
        a reformatted or another region), turn direct mode off for this Client —
        its values go through the daemon — instead of failing every direct read
        with CHECKSUM_MISMATCH. A daemon that cannot tell yet (not registered)
        is asked again at the next call."""
        d = self._direct
        if d is None or d.disabled:
            return
        try:
            info = conn.call(_M["DirectInfo"], client_pb2.DirectInfoRequest())
        except CxlkvError:
            return  # cannot tell (an older daemon): the identity checks of each copy still hold
        why = d.changed(info)
        self._direct_unsure = why is None
        if why:
            d.disable(why)
            self.direct_status = f"off: {why} since this Client mapped it (make a new Client to map it again)"

    def _forgotten_buffers(self) -> bool:
        """Whether the daemon forgot some of the pool's buffers — it restarted and
        this connection has not noticed yet (gRPC tells of a reconnection only
        after its first call). They are dropped from the pool, and direct mode is
        checked too."""
        conn = self._conn()
        if not self._pool.revalidate(lambda ids: _registered(conn, ids)):
            return False
        self._check_direct(conn)
        return True

    def _copier(self) -> CudaCopier:
        if self._cuda is None:
            with self._lock:
                if self._cuda is None:
                    self._cuda = CudaCopier(register=self._cuda_register)
        return self._cuda

    # ================================================================ plumbing
    def _conn(self, check: bool = False) -> Any:
        """This thread's connection, made (again) when needed.

        Args:
            check: first see whether the daemon closed an idle connection (one
                non-blocking peek; done once per public call). A new connection
                asks the daemon which of the pool's buffers it knows
                (BufferStatus) and drops the others: a restarted daemon has
                forgotten them all; in direct mode it also checks that the
                daemon still maps the regions this process mapped
                (:meth:`_check_direct`).
        """
        if self._pid != os.getpid():
            raise InvalidArgument("this Client was created in the parent process; create a new one after fork")
        if self._closed:
            raise InvalidArgument("this Client is closed")
        if self.protocol == "grpc":
            if self._grpc is None:
                with self._lock:
                    if self._grpc is None:
                        self._grpc = GrpcConnection(self.socket_path, self.timeout_s)
            g = self._grpc
            if check and g.reconnected:  # the channel found the daemon again
                g.reconnected = False
                try:
                    self._pool.revalidate(lambda ids: _registered(g, ids))
                    self._check_direct(g)
                except BaseException:
                    g.reconnected = True  # ask again at the next call
                    raise
            elif check and self._direct_unsure:
                self._check_direct(g)
            return g
        c = getattr(self._local, "conn", None)
        if check and c is not None and not c.closed and c.peer_closed():
            c.close()
        if c is not None and not c.closed:
            if check and self._direct_unsure:
                self._check_direct(c)
            return c
        c = LeanConnection(self.lean_socket_path, self.timeout_s)
        self._local.conn = c
        with self._lock:
            self._conns = [x for x in self._conns if not x.closed]
            self._conns.append(c)
        try:
            self._pool.revalidate(lambda ids: _registered(c, ids))
            self._check_direct(c)
        except BaseException:
            c.close()  # the next call reconnects and asks again
            raise
        return c

    def _recheck_buffers_next_call(self) -> None:
        """The daemon went away during a call: check the pool's buffers before the
        next one (a new lean connection does so anyway; the gRPC channel only once
        it has told us it reconnected, which may come after that call)."""
        g = self._grpc
        if g is not None:
            g.reconnected = True

    def _items_lost(self, out: Any, lost: bool) -> bool:
        """Whether a batch answer holds items to read again under ``retry_s``
        (see :func:`_retried`); ``lost``: an earlier try of this call failed."""
        if not isinstance(out, list):
            return False
        errors = [getattr(r, "error", None) for r in out]
        if any(isinstance(e, (DaemonUnreachable, NotReady)) for e in errors):
            return True
        return any(isinstance(e, UnknownBuffer) for e in errors) and (lost or self._forgotten_buffers())

    def _call(self, name: str, request: Any) -> Any:
        return self._conn().call(_M[name], request)

    def _send(self, name: str, request: Any) -> None:
        """Send without waiting for the answer where the protocol allows (lean), else call."""
        conn = self._conn()
        send = getattr(conn, "send", None)
        if send is not None:
            send(_M[name], request)
        else:
            conn.call(_M[name], request)

    def _call_many(self, name: str, requests: list[Any]) -> list[Any]:
        m = _M[name]
        return self._conn().call_many([(m, r) for r in requests])

    def _register_buffer(self, path: str, size_bytes: int, pid: int) -> int:
        r = self._call("RegisterBuffer", client_pb2.RegisterBufferRequest(path=path, size_bytes=size_bytes, pid=pid))
        return r.buffer_id

    def _unregister_buffer(self, buffer_id: int) -> None:
        if self._pid != os.getpid():
            return
        # A connection idle since a daemon restart is replaced first: else the
        # request is lost and the new daemon keeps the buffer for this process's life.
        self._conn(check=True).call(_M["UnregisterBuffer"], client_pb2.UnregisterBufferRequest(buffer_id=buffer_id))

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
        self._closed = True
        d, self._direct = self._direct, None
        cu, self._cuda = self._cuda, None
        if d is not None and self._pid == os.getpid():
            if cu is not None:
                cu.close()
                for r in d.regions.values():
                    cu.release(r)
            d.close()
        with self._lock:
            conns, self._conns = self._conns, []
            g, self._grpc = self._grpc, None
        for c in conns:
            c.close()
        if g is not None:
            g.close()

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

    def _locate(self, a: np.ndarray) -> tuple[int, int] | None:
        return self._pool.locate(address_of(a), a.nbytes) if a.nbytes else None

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
        if isinstance(value, bytes) and len(value) <= self.inline_threshold_bytes:
            return self._put_inline(key, value, opts)
        return self._put_from(key, value, opts)

    def _put_inline(self, key: str, value: bytes, opts: common_pb2.PutOptions | None) -> int:
        try:
            return self._call("Put", _PutRequest(key=key, value=value, options=opts)).version
        except TooLarge:
            # over the daemon's inline limit: through shared memory (a value larger
            # than every segment answers TOO_LARGE there too, and that is raised)
            return self._put_staged(key, src_array(value), opts)

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
        ix = self._index_path(key)
        if ix is not None:
            v = ix.get(key)
            if v is _IX_MISS:
                raise NotFound(f"key {key!r} not found", key=key)
            if v is not _IX_FALLBACK:
                return v  # type: ignore[return-value]
        return self._get_daemon(key)

    @_retried
    @_utf8_keys
    def _get_daemon(self, key: str) -> bytes:
        try:
            return self._call("Get", _GetRequest(key=key)).value
        except TooLarge as exc:
            if not exc.requested_bytes:
                raise
            size = exc.requested_bytes
        if self._use_direct(size):
            (r,) = self._direct.get([key], [None])  # type: ignore[union-attr]
            if isinstance(r, CxlkvError):
                raise r
            if r is not FALLBACK:
                return r[2]
        for _ in range(3):  # the value may be replaced by a larger one meanwhile
            with _Staged(self._pool) as st:
                seg, off = st.take(size)
                try:
                    r = self._call("GetInto", _GetIntoRequest(key=key, target=_BufferRange(
                        buffer_id=seg.buffer_id, offset_bytes=off, length_bytes=size)))
                except OutOfRange as exc:
                    if not exc.requested_bytes:
                        raise
                    size = exc.requested_bytes
                    continue
                return seg.array[off:off + r.value_size_bytes].tobytes()
        raise OutOfRange(f"value of key {key!r} kept growing while being read", key=key)

    def exists(self, key: str) -> bool:
        """Whether ``key`` is committed (grants no lease; from the index when mapped).

        Raises:
            InvalidKey, Unavailable.
        """
        ix = self._index_path(key)
        if ix is not None:
            (v,) = ix.exists_many([key])
            if v is not _IX_FALLBACK:
                return bool(v)
        return self._exists_daemon(key)

    @_retried
    @_utf8_keys
    def _exists_daemon(self, key: str) -> bool:
        return self._call("Exist", client_pb2.ExistRequest(key=key)).exists

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
        return self._put_from(key, src, _options(upsert, replica_num, soft_pin, hard_pin))

    def _put_from(self, key: str, src: Any, opts: common_pb2.PutOptions | None) -> int:
        if is_cuda_tensor(src):
            if self._direct is not None:
                self._conn()
                r = self._direct.put([(0, key, CudaSource(src, self._copier()), opts)])[0]
                if isinstance(r, CxlkvError):
                    raise r
                if r is not FALLBACK:
                    return r
            return self._put_daemon(key, _host_copy(src), opts)
        a = src_array(src)
        if self._use_direct(a.nbytes):
            self._conn()
            r = self._direct.put([(0, key, a, opts)])[0]  # type: ignore[union-attr]
            if isinstance(r, CxlkvError):
                raise r
            if r is not FALLBACK:
                return r
        return self._put_daemon(key, a, opts)

    def _put_daemon(self, key: str, a: np.ndarray, opts: common_pb2.PutOptions | None) -> int:
        loc = self._locate(a)
        if loc is not None:
            return self._call("PutFrom", _PutFromRequest(key=key, options=opts, source=_BufferRange(
                buffer_id=loc[0], offset_bytes=loc[1], length_bytes=a.nbytes))).version
        if a.nbytes <= self.inline_threshold_bytes:
            return self._put_inline(key, a.tobytes(), opts)
        return self._put_staged(key, a, opts)

    def _put_staged(self, key: str, a: np.ndarray, opts: common_pb2.PutOptions | None) -> int:
        with _Staged(self._pool) as st:
            seg, off = st.take(a.nbytes)
            seg.array[off:off + a.nbytes] = a
            return self._call("PutFrom", _PutFromRequest(key=key, options=opts, source=_BufferRange(
                buffer_id=seg.buffer_id, offset_bytes=off, length_bytes=a.nbytes))).version

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
        if ix is not None and not is_cuda_tensor(dst):
            a = dst_array(dst)
            n = ix.get_into(key, a)
            if n is _IX_MISS:
                raise NotFound(f"key {key!r} not found", key=key)
            if n is not _IX_FALLBACK:
                if n < 0:  # type: ignore[operator]
                    raise OutOfRange(f"value of key {key!r} is {-n} bytes, the destination holds {a.nbytes}",
                                     key=key, requested_bytes=-n)  # type: ignore[operator]
                return n  # type: ignore[return-value]
        return self._get_into_rest(key, dst)

    @_retried
    @_utf8_keys
    def _get_into_rest(self, key: str, dst: Any) -> int:
        """:meth:`get_into` in direct mode (leased) or through the daemon."""
        if is_cuda_tensor(dst):
            return self._get_into_cuda(key, dst)
        a = dst_array(dst)
        if self._use_direct(a.nbytes):
            self._conn()
            (r,) = self._direct.get([key], [a])  # type: ignore[union-attr]
            if isinstance(r, CxlkvError):
                raise r
            if r is not FALLBACK:
                return r[0]
        return self._get_into_daemon(key, a)

    def _get_into_cuda(self, key: str, dst: Any) -> int:
        """``get_into`` a CUDA tensor: DMA from the region in direct mode, else
        through a pinned host buffer."""
        target = CudaTarget(dst, self._copier())
        if self._direct is not None:
            self._conn()
            (r,) = self._direct.get([key], [target])
            if isinstance(r, CxlkvError):
                raise r
            if r is not FALLBACK:
                return r[0]
        import torch

        host = torch.empty(target.nbytes, dtype=torch.uint8, pin_memory=True)
        n = self._get_into_daemon(key, host.numpy())
        dst.reshape(-1).view(torch.uint8)[:n].copy_(host[:n])
        return n

    def _get_into_daemon(self, key: str, a: np.ndarray) -> int:
        loc = self._locate(a)
        if loc is not None:
            return self._call("GetInto", _GetIntoRequest(key=key, target=_BufferRange(
                buffer_id=loc[0], offset_bytes=loc[1], length_bytes=a.nbytes))).value_size_bytes
        with _Staged(self._pool) as st:
            seg, off = st.take(a.nbytes)
            r = self._call("GetInto", _GetIntoRequest(key=key, target=_BufferRange(
                buffer_id=seg.buffer_id, offset_bytes=off, length_bytes=a.nbytes)))
            n = r.value_size_bytes
            a[:n] = seg.array[off:off + n]
            return n

    # ================================================================ batches
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

    def _put_values(self, keys: list[str], values: list[Any], opts: common_pb2.PutOptions | None) -> list[Result]:
        n = len(keys)
        results: list[Result | None] = [None] * n
        inline: list[int] = []
        by_buffer: list[tuple[int, int, int, int]] = []  # (pos, buffer_id, offset, length)
        staged: list[tuple[int, np.ndarray]] = []
        direct: list[tuple[int, str, np.ndarray, Any]] = []
        for i, v in enumerate(values):
            if isinstance(v, bytes) and len(v) <= self.inline_threshold_bytes:
                inline.append(i)
                continue
            if is_cuda_tensor(v):
                if self._direct is not None:
                    direct.append((i, keys[i], CudaSource(v, self._copier()), opts))
                    continue
                v = values[i] = _host_copy(v)
            a = src_array(v)
            if self._use_direct(a.nbytes):
                direct.append((i, keys[i], a, opts))
                continue
            loc = self._locate(a)
            if loc is not None:
                by_buffer.append((i, loc[0], loc[1], a.nbytes))
            elif a.nbytes <= self.inline_threshold_bytes:
                values[i] = a.tobytes()
                inline.append(i)
            else:
                staged.append((i, a))
        for chunk in _chunks(len(direct), BATCH_ITEMS):
            part = [direct[j] for j in chunk]
            try:
                done = self._direct.put(part)  # type: ignore[union-attr]
            except CxlkvError as exc:
                done = {p[0]: exc for p in part}
            for i, _, a, _ in part:
                r = done.get(i)
                if r is FALLBACK:
                    if isinstance(a, CudaSource):
                        a = _host_copy(a.tensor)
                    loc = self._locate(a)
                    if loc is not None:
                        by_buffer.append((i, loc[0], loc[1], a.nbytes))
                    else:
                        staged.append((i, a))
                elif isinstance(r, CxlkvError):
                    results[i] = Result(False, error=r)
                else:
                    results[i] = Result(True, version=int(r))  # type: ignore[arg-type]
        if inline:
            reqs: list[client_pb2.BatchPutRequest] = []
            groups: list[list[int]] = []
            cur: list[int] = []
            size = 0
            for i in inline:
                if cur and (len(cur) >= BATCH_ITEMS or size + len(values[i]) > BATCH_INLINE_BYTES):
                    groups.append(cur)
                    cur, size = [], 0
                cur.append(i)
                size += len(values[i])
            groups.append(cur)
            for g in groups:
                reqs.append(client_pb2.BatchPutRequest(items=[
                    _PutRequest(key=keys[i], value=values[i], options=opts) for i in g]))
            for g, resp in zip(groups, self._call_many("BatchPut", reqs)):
                self._fill_put(results, g, keys, resp)
            # Inline items refused as too large for this daemon go through the pool.
            for i in inline:
                r = results[i]
                if r is not None and isinstance(r.error, TooLarge):  # a final one fails again there
                    staged.append((i, src_array(values[i])))
        with _Staged(self._pool) as st:
            for i, a in staged:
                seg, off = st.take(a.nbytes)
                seg.array[off:off + a.nbytes] = a
                by_buffer.append((i, seg.buffer_id, off, a.nbytes))
            for chunk in _chunks(len(by_buffer), BATCH_ITEMS):
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
        return results  # type: ignore[return-value]

    @staticmethod
    def _fill_put(results: list[Result | None], positions: list[int], keys: list[str], resp: Any) -> None:
        if isinstance(resp, CxlkvError):
            for i in positions:
                results[i] = Result(False, error=resp)
            return
        for i, r in zip(positions, resp.results):
            if r.status.code:
                results[i] = Result(False, error=_status_error(r.status, keys[i]))
            else:
                results[i] = Result(True, version=r.version)

    def get_many(self, keys: Sequence[str]) -> list[Result]:
        """Read many values; one :class:`Result` per key (``value`` = bytes when ok).

        Values over the daemon's inline limit are fetched through the pool.

        Raises:
            Unavailable: the daemon cannot be reached.
        """
        keys = _check_keys(keys)
        ix = self._index_path()
        if ix is not None and keys:
            out: list[Result | None] = [None] * len(keys)
            rest: list[int] = []
            for i, v in enumerate(ix.get_many(keys)):
                if v is _IX_FALLBACK:
                    rest.append(i)
                elif v is _IX_MISS:
                    out[i] = Result(False, error=NotFound(f"key {keys[i]!r} not found", key=keys[i]))
                else:
                    out[i] = Result(True, value=v)
            if rest:
                for i, r in zip(rest, self._get_many_daemon([keys[i] for i in rest])):
                    out[i] = r
            return out  # type: ignore[return-value]
        return self._get_many_daemon(keys)

    @_retried
    @_utf8_keys
    def _get_many_daemon(self, keys: list[str]) -> list[Result]:
        n = len(keys)
        results: list[Result | None] = [None] * n
        chunks = list(_chunks(n, 128))
        resps = self._call_many("BatchGet", [client_pb2.BatchGetRequest(keys=keys[c.start:c.stop]) for c in chunks])
        for c, resp in zip(chunks, resps):
            if isinstance(resp, CxlkvError):
                for i in c:
                    results[i] = Result(False, error=resp)
                continue
            for i, r in zip(c, resp.results):
                if not r.status.code:
                    results[i] = Result(True, value=r.value, version=r.version)
                elif r.status.code == int(TooLarge.code):
                    try:
                        results[i] = Result(True, value=self.get(keys[i]))
                    except CxlkvError as exc:
                        results[i] = Result(False, error=exc)
                else:
                    results[i] = Result(False, error=_status_error(r.status, keys[i]))
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
        if ix is not None and keys and not any(is_cuda_tensor(d) for d in dsts):
            arrays = [dst_array(d) for d in dsts]
            rest = []
            for i, v in enumerate(ix.get_into_many(keys, arrays)):
                if v is _IX_FALLBACK:
                    rest.append(i)
                elif v is _IX_MISS:
                    results[i] = Result(False, error=NotFound(f"key {keys[i]!r} not found", key=keys[i]))
                elif v < 0:  # type: ignore[operator]
                    results[i] = Result(False, error=OutOfRange(
                        f"value of key {keys[i]!r} is {-v} bytes, the destination holds {arrays[i].nbytes}",
                        key=keys[i], requested_bytes=-v))  # type: ignore[operator]
                else:
                    results[i] = Result(True, v)
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
        n = len(keys)
        sub: list[Result | None] = [None] * n
        if n:
            with _Staged(self._pool) as st:
                arrays, targets, copy_back = self._targets(dsts, st)
                chunks = list(_chunks(n, BATCH_ITEMS))
                reqs = [_packed_ranges(keys[c.start:c.stop], targets[c.start:c.stop]) for c in chunks]
                for c, resp in zip(chunks, self._call_many("PackedGetInto", reqs)):
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
        for j, pos in enumerate(positions):
            results[pos] = sub[j]
        return results  # type: ignore[return-value]

    def _get_direct_many(
        self, keys: list[str], dsts: list[Any], results: list[Result | None]
    ) -> tuple[list[str], list[Any], list[int]]:
        """Read the items large enough for direct mode (and CUDA tensors) into
        ``results``; the rest (and the direct items that fall back) as ``(keys,
        dsts, positions)``."""
        if self._direct is None:
            if not any(is_cuda_tensor(d) for d in dsts):
                return keys, dsts, list(range(len(keys)))
            rest = []
            for i, d in enumerate(dsts):
                if is_cuda_tensor(d):
                    try:
                        results[i] = Result(True, self._get_into_cuda(keys[i], d))
                    except CxlkvError as exc:
                        results[i] = Result(False, error=exc)
                else:
                    rest.append(i)
            return [keys[i] for i in rest], [dsts[i] for i in rest], rest
        self._conn()
        direct: list[int] = []
        rest: list[int] = []
        arrays: dict[int, np.ndarray] = {}
        cuda_fallback: list[int] = []
        for i, d in enumerate(dsts):
            if is_cuda_tensor(d):
                arrays[i] = CudaTarget(d, self._copier())  # type: ignore[assignment]
                direct.append(i)
                continue
            a = dst_array(d)
            if self._use_direct(a.nbytes):
                arrays[i] = a
                direct.append(i)
            else:
                rest.append(i)
        for chunk in _chunks(len(direct), BATCH_ITEMS):
            part = [direct[j] for j in chunk]
            try:
                got = self._direct.get([keys[i] for i in part], [arrays[i] for i in part])
            except CxlkvError as exc:
                got = [exc] * len(part)
            for i, r in zip(part, got):
                if r is FALLBACK and isinstance(arrays[i], CudaTarget):
                    cuda_fallback.append(i)
                elif r is FALLBACK:
                    rest.append(i)
                elif isinstance(r, CxlkvError):
                    results[i] = Result(False, error=r)
                else:
                    results[i] = Result(True, r[0], r[1])
        for i in cuda_fallback:  # one by one, through a pinned host buffer
            try:
                results[i] = Result(True, self._get_into_cuda(keys[i], dsts[i]))
            except CxlkvError as exc:
                results[i] = Result(False, error=exc)
        rest.sort()
        return [keys[i] for i in rest], [dsts[i] for i in rest], rest

    def _targets(
        self, dsts: Sequence[Any], st: _Staged
    ) -> tuple[list[np.ndarray], list[tuple[int, int, int]], list[tuple[int, PoolBuffer, int]]]:
        """Destinations as arrays, their ``(buffer_id, offset, length)`` targets, and the
        staged ones to copy back (memory outside the pool borrows a pool range)."""
        arrays = [dst_array(d) for d in dsts]
        targets: list[tuple[int, int, int]] = []
        copy_back: list[tuple[int, PoolBuffer, int]] = []
        locate = self._pool.locate
        for i, a in enumerate(arrays):
            n = a.nbytes
            loc = locate(address_of(a), n) if n else None
            if loc is None:
                seg, off = st.take(n)
                copy_back.append((i, seg, off))
                loc = (seg.buffer_id, off)
            targets.append((loc[0], loc[1], n))
        return arrays, targets, copy_back

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
        if len(keys) > BATCH_ITEMS:  # calls under the daemon's max_batch_items, prefix after prefix
            matched = 0
            for c in _chunks(len(keys), BATCH_ITEMS):
                got = self.get_prefix_into(keys[c.start:c.stop], dsts[c.start:c.stop], tiers)
                matched += got
                if got < len(c):
                    break
            return matched
        ix = self._index_path()
        if ix is not None and not any(is_cuda_tensor(d) for d in dsts):
            bad = next((k for k in keys if key_error(k) is not None), None)
            if bad is not None:
                raise InvalidKey(key_error(bad) or "invalid key", key=bad[:64] if isinstance(bad, str) else None)
            arrays = [dst_array(d) for d in dsts]
            matched, too_large, done = ix.get_prefix_into(keys, arrays)
            if too_large:
                raise OutOfRange(f"value of key {keys[matched]!r} is {too_large} bytes, the destination holds "
                                 f"{arrays[matched].nbytes}", key=keys[matched], requested_bytes=too_large)
            if tiers is not None:
                tiers.extend([common_pb2.CXL] * matched)
            if done:
                return matched
            return matched + self._get_prefix_daemon(list(keys[matched:]), list(dsts[matched:]), tiers)
        return self._get_prefix_daemon(keys, dsts, tiers)

    @_retried
    @_utf8_keys
    def _get_prefix_daemon(self, keys: Sequence[str], dsts: Sequence[Any], tiers: list[int] | None) -> int:
        if not keys:
            return 0
        with _Staged(self._pool) as st:
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

    def exists_many(self, keys: Sequence[str]) -> list[bool]:
        """Whether each key is committed (invalid keys answer ``False``).

        Raises:
            Unavailable: the daemon cannot be reached.
        """
        keys = _check_keys(keys)
        ix = self._index_path()
        if ix is not None and keys:
            found = ix.exists_many(keys)
            rest = [i for i, v in enumerate(found) if v is _IX_FALLBACK]
            if rest:
                for i, v in zip(rest, self._exists_many_daemon([keys[i] for i in rest])):
                    found[i] = v
            return [bool(v) for v in found]
        return self._exists_many_daemon(keys)

    @_retried
    @_utf8_keys
    def _exists_many_daemon(self, keys: list[str]) -> list[bool]:
        chunks = list(_chunks(len(keys), BATCH_ITEMS))
        out: list[bool] = []
        for resp in self._call_many("BatchExist", [client_pb2.BatchExistRequest(keys=keys[c.start:c.stop])
                                                    for c in chunks]):
            if isinstance(resp, CxlkvError):
                raise resp
            out.extend(resp.exists)
        return out

    @_utf8_keys
    def remove_many(self, keys: Sequence[str], force: bool = False) -> list[Result]:
        """Remove many keys; one :class:`Result` per key.

        Raises:
            Unavailable: the daemon cannot be reached.
        """
        keys = list(keys)
        results: list[Result] = []
        chunks = list(_chunks(len(keys), BATCH_ITEMS))
        reqs = [client_pb2.ClientBatchRemoveRequest(keys=keys[c.start:c.stop], force=force) for c in chunks]
        for c, resp in zip(chunks, self._call_many("BatchRemove", reqs)):
            if isinstance(resp, CxlkvError):
                results.extend(Result(False, error=resp) for _ in c)
                continue
            for i, st in zip(c, resp.results):
                results.append(Result(True) if not st.code else Result(False, error=_status_error(st, keys[i])))
        return results

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


def _host_copy(t: Any) -> np.ndarray:
    """A CUDA tensor's bytes in host memory (the path without direct mode)."""
    import torch

    if not t.is_contiguous():
        raise InvalidArgument("source CUDA tensor is not contiguous; pass tensor.contiguous()")
    return t.detach().reshape(-1).view(torch.uint8).cpu().numpy()


def _daemon_uid(socket_path: str) -> int | None:
    try:
        return os.stat(socket_path).st_uid
    except OSError:
        return None
