"""Mooncake's error codes, and the one table that maps cxlkv's codes onto them.

Mooncake's Python API reports failures as negative integers: the values of
``mooncake::ErrorCode`` (``mooncake-store/include/types.h``). :class:`ErrorCode`
reproduces that enum value for value, and :data:`MOONCAKE_CODES` is the only
place where a cxlkv :class:`~cxlkv.errors.ErrorCode` becomes a Mooncake code.

Two return conventions are applied *on top of* the table by the store, as
Mooncake applies them itself: a ``put`` of a key that is already committed
(``ALREADY_EXISTS`` → -705) succeeds with 0 without overwriting, and ``get``
answers ``b""`` for any failure. Both are documented where they happen.
"""

from __future__ import annotations

import enum

from cxlkv.errors import CxlkvError
from cxlkv.errors import ErrorCode as CxlkvCode

__all__ = ["ErrorCode", "MOONCAKE_CODES", "mooncake_code"]


class ErrorCode(enum.IntEnum):
    """``mooncake::ErrorCode``: 0 for success, a negative value for each failure."""

    OK = 0
    INTERNAL_ERROR = -1
    BUFFER_OVERFLOW = -10
    SHARD_INDEX_OUT_OF_RANGE = -100
    SEGMENT_NOT_FOUND = -101
    SEGMENT_ALREADY_EXISTS = -102
    CLIENT_NOT_FOUND = -103
    NO_AVAILABLE_HANDLE = -200
    INVALID_VERSION = -300
    INVALID_KEY = -400
    WRITE_FAIL = -500
    INVALID_PARAMS = -600
    ILLEGAL_CLIENT = -601
    INVALID_WRITE = -700
    INVALID_READ = -701
    INVALID_REPLICA = -702
    REPLICA_IS_NOT_READY = -703
    OBJECT_NOT_FOUND = -704
    OBJECT_ALREADY_EXISTS = -705
    OBJECT_HAS_LEASE = -706
    LEASE_EXPIRED = -707
    OBJECT_HAS_REPLICATION_TASK = -708
    OBJECT_NO_REPLICATION_TASK = -709
    REPLICA_NOT_FOUND = -710
    REPLICA_ALREADY_EXISTS = -711
    REPLICA_IS_GONE = -712
    TRANSFER_FAIL = -800
    RPC_FAIL = -900
    ETCD_OPERATION_ERROR = -1000
    ETCD_KEY_NOT_EXIST = -1001
    ETCD_TRANSACTION_FAIL = -1002
    ETCD_CTX_CANCELLED = -1003
    UNAVAILABLE_IN_CURRENT_STATUS = -1010
    UNAVAILABLE_IN_CURRENT_MODE = -1011
    FILE_NOT_FOUND = -1100
    FILE_OPEN_FAIL = -1101
    FILE_READ_FAIL = -1102
    FILE_WRITE_FAIL = -1103
    FILE_INVALID_BUFFER = -1104
    FILE_LOCK_FAIL = -1105
    FILE_INVALID_HANDLE = -1106
    BUCKET_NOT_FOUND = -1200
    BUCKET_ALREADY_EXISTS = -1201
    KEYS_EXCEED_BUCKET_LIMIT = -1202
    KEYS_ULTRA_LIMIT = -1203
    UNABLE_OFFLOAD = -1300
    UNABLE_OFFLOADING = -1301
    TASK_NOT_FOUND = -1400
    TASK_PENDING_LIMIT_EXCEEDED = -1401


#: The one table from cxlkv's wire codes to Mooncake's codes (docs/compat-mooncake.md).
#: (Built by name: cxlkv's ErrorCode is generated from the proto at import time.)
MOONCAKE_CODES: dict[CxlkvCode, ErrorCode] = {CxlkvCode[name]: code for name, code in {
    "OK": ErrorCode.OK,
    "NOT_FOUND": ErrorCode.OBJECT_NOT_FOUND,
    "ALREADY_EXISTS": ErrorCode.OBJECT_ALREADY_EXISTS,
    "NO_SPACE": ErrorCode.NO_AVAILABLE_HANDLE,
    "TOO_LARGE": ErrorCode.NO_AVAILABLE_HANDLE,     # larger than every segment
    "HAS_LEASE": ErrorCode.OBJECT_HAS_LEASE,
    "LEASE_EXPIRED": ErrorCode.LEASE_EXPIRED,
    "INVALID_KEY": ErrorCode.INVALID_KEY,
    "INVALID_ARGUMENT": ErrorCode.INVALID_PARAMS,
    "STALE_TOKEN": ErrorCode.INVALID_WRITE,
    "NOT_READY": ErrorCode.REPLICA_IS_NOT_READY,    # another put of the key is in flight
    "CHECKSUM_MISMATCH": ErrorCode.INVALID_READ,    # stale or torn read: a miss, never data
    "UNAVAILABLE": ErrorCode.RPC_FAIL,
    "INTERNAL": ErrorCode.INTERNAL_ERROR,
    "UNKNOWN_CLIENT": ErrorCode.CLIENT_NOT_FOUND,
    "UNKNOWN_BUFFER": ErrorCode.INVALID_PARAMS,
    "OUT_OF_RANGE": ErrorCode.INVALID_PARAMS,       # destination smaller than the value
    "PERMISSION_DENIED": ErrorCode.ILLEGAL_CLIENT,  # TLS: an identity not allowed this call
}.items()}


def mooncake_code(exc: BaseException) -> int:
    """The Mooncake code (a negative int) for an error raised by the cxlkv SDK.

    Args:
        exc: a :class:`~cxlkv.errors.CxlkvError` (mapped through
            :data:`MOONCAKE_CODES`); any other exception is a bad argument
            rejected before reaching the daemon and answers ``INVALID_PARAMS``.

    Returns:
        A negative :class:`ErrorCode` value (never 0).
    """
    if isinstance(exc, CxlkvError):
        code = MOONCAKE_CODES.get(exc.code, ErrorCode.INTERNAL_ERROR)
        return int(code) if code else int(ErrorCode.INTERNAL_ERROR)
    return int(ErrorCode.INVALID_PARAMS)
