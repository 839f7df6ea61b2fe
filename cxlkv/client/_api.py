"""The plumbing of the SDK's public calls: their results, argument checks, and
the two wrappers every call goes through (keys checked and the connection made
first; reads tried again while the daemon is away).

No I/O of its own: :func:`_utf8_keys` and :func:`_retried` call back into the
:class:`~cxlkv.client.Client` they wrap.
"""

from __future__ import annotations

import functools
import math
import numbers
import operator
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cxlkv.errors import CxlkvError, DaemonUnreachable, InvalidArgument, InvalidKey, NotReady, UnknownBuffer, error_for
from cxlkv.wire.keys import validate_key, validate_replica_num
from cxlkv.v1 import common_pb2

if TYPE_CHECKING:
    from cxlkv.client._client import Client

__all__ = ["Result", "KeyInfo", "default_socket_path", "MAX_TIMEOUT_S", "MAX_SHARED_BYTES",
           "RETRY_FIRST_PAUSE_S", "RETRY_MAX_PAUSE_S"]

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
    (:func:`cxlkv.wire.keys.validate_key`); one whose first parameter is ``keys`` gets
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
        InvalidArgument: ``replica_num`` is not an int in 1..``cxlkv.wire.keys.MAX_REPLICA_NUM``.
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
