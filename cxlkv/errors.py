"""One error hierarchy for all of cxlkv, and its one mapping to the wire.

Every error cxlkv raises is a :class:`CxlkvError` carrying an :class:`ErrorCode`
(the ``cxlkv.v1.ErrorCode`` enum of ``proto/cxlkv/v1/common.proto``) and optional
fields (``key``, ``requested_bytes``, ``free_bytes``). Subclasses double as the
natural builtin where one exists (``NotFound`` is a ``KeyError``, ``InvalidKey``
a ``ValueError``, ``Unavailable`` a ``ConnectionError``) so callers may catch
either.

On the wire:

* single-item RPCs fail with a gRPC status whose details hold a
  ``cxlkv.v1.ErrorDetail`` (:func:`abort_with` on the server,
  :func:`from_rpc_error` on the caller);
* batch RPCs carry a ``cxlkv.v1.Status`` per item (:meth:`CxlkvError.to_status`,
  :func:`raise_for_status`).

``GRPC_STATUS`` is the one table that maps codes to gRPC status codes.
docs/errors.md documents each code.
"""

from __future__ import annotations

import enum
from typing import NoReturn

import grpc
from google.rpc import status_pb2
from grpc_status import rpc_status

from cxlkv.v1 import common_pb2

__all__ = [
    "ErrorCode",
    "CxlkvError",
    "NotFound",
    "AlreadyExists",
    "NoSpace",
    "TooLarge",
    "LimitExceeded",
    "HasLease",
    "LeaseExpired",
    "InvalidKey",
    "InvalidArgument",
    "StaleToken",
    "NotReady",
    "ChecksumMismatch",
    "Unavailable",
    "NotLeader",
    "DaemonUnreachable",
    "Internal",
    "UnknownClient",
    "UnknownBuffer",
    "OutOfRange",
    "PermissionDenied",
    "RegionError",
    "ConfigError",
    "GRPC_STATUS",
    "error_for",
    "from_status",
    "raise_for_status",
    "from_rpc_error",
    "abort_with",
    "rpc_status_for",
]

class ErrorCode(enum.IntEnum):
    """The wire enum ``cxlkv.v1.ErrorCode`` (common.proto), spelled out for type checkers.

    tests/core/test_proto_stubs.py checks it equals the generated proto enum member by member.
    """

    OK = 0
    NOT_FOUND = 1
    ALREADY_EXISTS = 2
    NO_SPACE = 3
    TOO_LARGE = 4
    HAS_LEASE = 5
    LEASE_EXPIRED = 6
    INVALID_KEY = 7
    INVALID_ARGUMENT = 8
    STALE_TOKEN = 9
    NOT_READY = 10
    CHECKSUM_MISMATCH = 11
    UNAVAILABLE = 12
    INTERNAL = 13
    UNKNOWN_CLIENT = 14
    UNKNOWN_BUFFER = 15
    OUT_OF_RANGE = 16
    PERMISSION_DENIED = 17


class CxlkvError(Exception):
    """Base of every cxlkv error.

    Attributes:
        code: the wire :class:`ErrorCode`.
        message: one human-readable line (never a stack trace).
        key: the key concerned, or ``None``.
        requested_bytes: bytes asked for (NO_SPACE / TOO_LARGE), or ``None``.
        free_bytes: free bytes in the best segment (NO_SPACE), or ``None``.
    """

    code: ErrorCode = ErrorCode.INTERNAL

    def __init__(
        self,
        message: str = "",
        *,
        key: str | None = None,
        requested_bytes: int | None = None,
        free_bytes: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message or self.code.name.lower().replace("_", " ")
        self.key = key
        self.requested_bytes = requested_bytes
        self.free_bytes = free_bytes

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"

    def __reduce__(self):  # picklable across processes, fields included
        return (
            _rebuild,
            (type(self), self.message, self.key, self.requested_bytes, self.free_bytes),
        )

    # -- wire forms ---------------------------------------------------------
    def to_status(self) -> common_pb2.Status:
        """The per-item ``cxlkv.v1.Status`` for batch responses."""
        return common_pb2.Status(code=int(self.code), message=self.message)

    def to_detail(self) -> common_pb2.ErrorDetail:
        """The ``cxlkv.v1.ErrorDetail`` packed into a failed RPC's status."""
        return common_pb2.ErrorDetail(
            code=int(self.code),
            message=self.message,
            key=self.key or "",
            requested_bytes=self.requested_bytes or 0,
            free_bytes=self.free_bytes or 0,
        )


def _rebuild(cls, message, key, requested_bytes, free_bytes):
    return cls(message, key=key, requested_bytes=requested_bytes, free_bytes=free_bytes)


class NotFound(CxlkvError, KeyError):
    """The key is absent, not yet committed, or removed."""

    code = ErrorCode.NOT_FOUND


class AlreadyExists(CxlkvError):
    """Put of a committed key without ``upsert``."""

    code = ErrorCode.ALREADY_EXISTS


class NoSpace(CxlkvError, MemoryError):
    """No segment could hold the value, even after eviction."""

    code = ErrorCode.NO_SPACE


class TooLarge(CxlkvError, ValueError):
    """Larger than every segment (nothing evicted) or than the inline limit."""

    code = ErrorCode.TOO_LARGE


class LimitExceeded(TooLarge):
    """A call over one of a daemon's documented per-call limits (docs/protocol.md, "Limits"):
    more items in one batch call than ``max_batch_items``, or a request larger than
    ``max_request_bytes``. Code ``TOO_LARGE``; the message names the limit and its
    configuration key. Split the call (the SDK does this itself).

    Attributes:
        limit_name: the configuration key of the limit (``"max_batch_items"``, ...).
        limit: the limit's value (items or bytes, as its name says).
        requested: what the call asked for, in the same unit.
    """

    def __init__(self, message: str = "", *, limit_name: str = "", limit: int = 0, requested: int = 0,
                 **fields) -> None:
        super().__init__(message, **fields)
        self.limit_name = limit_name
        self.limit = limit
        self.requested = requested

    def __reduce__(self):
        return (_rebuild_limit, (self.message, self.limit_name, self.limit, self.requested, self.requested_bytes))


def _rebuild_limit(message, limit_name, limit, requested, requested_bytes):
    return LimitExceeded(message, limit_name=limit_name, limit=limit, requested=requested,
                         requested_bytes=requested_bytes)


class HasLease(CxlkvError):
    """Remove of a leased object without ``force``."""

    code = ErrorCode.HAS_LEASE


class LeaseExpired(CxlkvError):
    """A lease ended before the reader finished."""

    code = ErrorCode.LEASE_EXPIRED


class InvalidArgument(CxlkvError, ValueError):
    """A malformed argument (sizes, offsets, options)."""

    code = ErrorCode.INVALID_ARGUMENT


class InvalidKey(InvalidArgument):
    """Key empty, over 4096 UTF-8 bytes, not UTF-8, or holding NUL."""

    code = ErrorCode.INVALID_KEY


class StaleToken(CxlkvError):
    """PutEnd/PutRevoke from a stale put attempt or an old client epoch."""

    code = ErrorCode.STALE_TOKEN


class NotReady(CxlkvError):
    """The object is still PROCESSING, or the daemon is starting."""

    code = ErrorCode.NOT_READY


class ChecksumMismatch(CxlkvError):
    """Bytes read back do not match the object's checksum."""

    code = ErrorCode.CHECKSUM_MISMATCH


class Unavailable(CxlkvError, ConnectionError):
    """Master, daemon or segment unreachable; retry later."""

    code = ErrorCode.UNAVAILABLE


class DaemonUnreachable(Unavailable):
    """The SDK could not reach its clientd, or the connection broke before the
    answer came (the daemon stopped or restarted). Code ``UNAVAILABLE``.

    A read that fails this way is retried by :class:`cxlkv.Client` for up to its
    ``retry_s``; a write is not (whether it took effect is unknown).
    """


class NotLeader(Unavailable):
    """This master is not (or no longer) the cluster's leader: it answers nothing
    that changes the cluster (docs/ha.md). Code ``UNAVAILABLE``: a clientd tries
    the next master of its ``master_address`` list."""


class Internal(CxlkvError):
    """A bug in cxlkv; the message says what."""

    code = ErrorCode.INTERNAL


class UnknownClient(CxlkvError):
    """Client id unknown or expired: register again."""

    code = ErrorCode.UNKNOWN_CLIENT


class UnknownBuffer(CxlkvError):
    """Buffer id never registered, or already unregistered."""

    code = ErrorCode.UNKNOWN_BUFFER


class OutOfRange(CxlkvError, IndexError):
    """An offset/length outside a buffer or a region."""

    code = ErrorCode.OUT_OF_RANGE


class PermissionDenied(CxlkvError, PermissionError):
    """The caller's identity may not make this call: an admin call from a
    non-admin certificate, or a client id bound to another certificate."""

    code = ErrorCode.PERMISSION_DENIED


class RegionError(CxlkvError, OSError):
    """A region could not be opened, sized or mapped.

    Attributes:
        path: the device or file concerned.
        errno: the OS errno when one applies, else 0.
    """

    code = ErrorCode.UNAVAILABLE

    def __init__(self, message: str = "", *, path: str = "", errno: int = 0, **fields) -> None:
        CxlkvError.__init__(self, message, **fields)
        self.path = path
        self.errno = errno

    def __reduce__(self):
        return (_rebuild_region, (self.message, self.path, self.errno))


def _rebuild_region(message, path, errno):
    return RegionError(message, path=path, errno=errno)


class ConfigError(InvalidArgument):
    """A configuration file, variable or flag is invalid; the message names the key."""


_BY_CODE: dict[int, type[CxlkvError]] = {
    cls.code: cls
    for cls in (
        NotFound, AlreadyExists, NoSpace, TooLarge, HasLease, LeaseExpired, InvalidKey,
        InvalidArgument, StaleToken, NotReady, ChecksumMismatch, Unavailable, Internal,
        UnknownClient, UnknownBuffer, OutOfRange, PermissionDenied,
    )
}

#: The one table from cxlkv codes to gRPC status codes.
GRPC_STATUS: dict[ErrorCode, grpc.StatusCode] = {
    ErrorCode.OK: grpc.StatusCode.OK,
    ErrorCode.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    ErrorCode.NO_SPACE: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorCode.TOO_LARGE: grpc.StatusCode.OUT_OF_RANGE,
    ErrorCode.HAS_LEASE: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorCode.LEASE_EXPIRED: grpc.StatusCode.ABORTED,
    ErrorCode.INVALID_KEY: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.STALE_TOKEN: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorCode.NOT_READY: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.CHECKSUM_MISMATCH: grpc.StatusCode.DATA_LOSS,
    ErrorCode.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.INTERNAL: grpc.StatusCode.INTERNAL,
    ErrorCode.UNKNOWN_CLIENT: grpc.StatusCode.UNAUTHENTICATED,
    ErrorCode.UNKNOWN_BUFFER: grpc.StatusCode.NOT_FOUND,
    ErrorCode.OUT_OF_RANGE: grpc.StatusCode.OUT_OF_RANGE,
    ErrorCode.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
}

# gRPC status codes seen without cxlkv details (transport failures, parse errors).
_FROM_GRPC: dict[grpc.StatusCode, type[CxlkvError]] = {
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: Unavailable,
    grpc.StatusCode.CANCELLED: Unavailable,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.UNIMPLEMENTED: Internal,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
}


def error_for(code: int, message: str = "", **fields) -> CxlkvError:
    """Build the exception for a wire code (unknown codes become :class:`Internal`)."""
    cls = _BY_CODE.get(int(code), Internal)
    if cls is Internal and int(code) not in _BY_CODE:
        message = f"unknown error code {int(code)}: {message}"
    return cls(message, **fields)


def from_status(status: common_pb2.Status, key: str | None = None) -> CxlkvError | None:
    """The exception for a per-item ``Status``, or ``None`` when it is OK."""
    if status.code == 0:
        return None
    return error_for(status.code, status.message, key=key)


def raise_for_status(status: common_pb2.Status, key: str | None = None) -> None:
    """Raise the exception a per-item ``Status`` stands for; return if OK."""
    err = from_status(status, key)
    if err is not None:
        raise err


def rpc_status_for(err: CxlkvError) -> status_pb2.Status:
    """A ``google.rpc.Status`` carrying ``err`` as an ``ErrorDetail``."""
    detail = status_pb2.Status(code=GRPC_STATUS[err.code].value[0], message=err.message)
    detail.details.add().Pack(err.to_detail())
    return detail


def abort_with(context: grpc.ServicerContext, err: CxlkvError) -> NoReturn:
    """Fail the current (sync) RPC with ``err`` in its status details.

    For ``grpc.aio`` servicers use ``await context.abort_with_status(...)`` with
    :func:`rpc_status_for`; this helper is the sync form.
    """
    context.abort_with_status(rpc_status.to_status(rpc_status_for(err)))
    raise AssertionError("unreachable")  # abort_with_status raises


def from_rpc_error(exc: grpc.RpcError, *, target: str = "") -> CxlkvError:
    """Translate a failed call into the cxlkv exception it carries.

    Uses the ``ErrorDetail`` in the status details when present; otherwise maps
    the bare gRPC status (connection refused → :class:`Unavailable`, …), naming
    ``target`` in the message.
    """
    try:
        status = rpc_status.from_call(exc)  # type: ignore[arg-type]
    except Exception:  # malformed trailers: fall back to the bare status
        status = None
    if status is not None:
        for any_detail in status.details:
            detail = common_pb2.ErrorDetail()
            if any_detail.Unpack(detail):
                return error_for(
                    detail.code,
                    detail.message,
                    key=detail.key or None,
                    requested_bytes=detail.requested_bytes or None,
                    free_bytes=detail.free_bytes or None,
                )
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        # Without an ErrorDetail (cxlkv's NO_SPACE always carries one) this is gRPC's
        # own message limit, not a full store: most often a request over the server's
        # max_request_bytes (else an answer over this side's receive limit). Told by
        # the code and the missing detail, never by gRPC's wording.
        where = f" ({target})" if target else ""
        return LimitExceeded(f"message refused{where}: {details} (the server's max_request_bytes, "
                             "or this side's receive limit); split the call", limit_name="max_request_bytes")
    if code == grpc.StatusCode.UNAVAILABLE and "failed to connect" in details and "Socket closed" in details:
        # The server took the connection and closed it before any answer: what a TLS
        # server does to a plaintext client (its first bytes are no TLS ClientHello)
        details = (f"{details} (the server closed the connection at once: if it serves TLS, this side must "
                   "use TLS too: tls_ca_file, tls_cert_file and tls_key_file in its configuration, or "
                   "--tls-ca/--tls-cert/--tls-key on the command line)")
    cls = _FROM_GRPC.get(code, Internal)  # type: ignore[arg-type]
    name = getattr(code, "name", "error")
    if name == cls.code.name:  # the error's own code says it: never "UNAVAILABLE: UNAVAILABLE (…)"
        return cls(f"{target}: {details}" if target else str(details))
    where = f" ({target})" if target else ""
    return cls(f"gRPC {name}{where}: {details}")
