from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OK: _ClassVar[ErrorCode]
    NOT_FOUND: _ClassVar[ErrorCode]
    ALREADY_EXISTS: _ClassVar[ErrorCode]
    NO_SPACE: _ClassVar[ErrorCode]
    TOO_LARGE: _ClassVar[ErrorCode]
    HAS_LEASE: _ClassVar[ErrorCode]
    LEASE_EXPIRED: _ClassVar[ErrorCode]
    INVALID_KEY: _ClassVar[ErrorCode]
    INVALID_ARGUMENT: _ClassVar[ErrorCode]
    STALE_TOKEN: _ClassVar[ErrorCode]
    NOT_READY: _ClassVar[ErrorCode]
    CHECKSUM_MISMATCH: _ClassVar[ErrorCode]
    UNAVAILABLE: _ClassVar[ErrorCode]
    INTERNAL: _ClassVar[ErrorCode]
    UNKNOWN_CLIENT: _ClassVar[ErrorCode]
    UNKNOWN_BUFFER: _ClassVar[ErrorCode]
    OUT_OF_RANGE: _ClassVar[ErrorCode]
    PERMISSION_DENIED: _ClassVar[ErrorCode]

class Tier(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TIER_UNSPECIFIED: _ClassVar[Tier]
    CXL: _ClassVar[Tier]
    DRAM: _ClassVar[Tier]
    SSD: _ClassVar[Tier]

class ReplicaState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REPLICA_STATE_UNSPECIFIED: _ClassVar[ReplicaState]
    PROCESSING: _ClassVar[ReplicaState]
    COMPLETE: _ClassVar[ReplicaState]
    FAILED: _ClassVar[ReplicaState]
    REMOVED: _ClassVar[ReplicaState]
OK: ErrorCode
NOT_FOUND: ErrorCode
ALREADY_EXISTS: ErrorCode
NO_SPACE: ErrorCode
TOO_LARGE: ErrorCode
HAS_LEASE: ErrorCode
LEASE_EXPIRED: ErrorCode
INVALID_KEY: ErrorCode
INVALID_ARGUMENT: ErrorCode
STALE_TOKEN: ErrorCode
NOT_READY: ErrorCode
CHECKSUM_MISMATCH: ErrorCode
UNAVAILABLE: ErrorCode
INTERNAL: ErrorCode
UNKNOWN_CLIENT: ErrorCode
UNKNOWN_BUFFER: ErrorCode
OUT_OF_RANGE: ErrorCode
PERMISSION_DENIED: ErrorCode
TIER_UNSPECIFIED: Tier
CXL: Tier
DRAM: Tier
SSD: Tier
REPLICA_STATE_UNSPECIFIED: ReplicaState
PROCESSING: ReplicaState
COMPLETE: ReplicaState
FAILED: ReplicaState
REMOVED: ReplicaState

class Status(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: ErrorCode
    message: str
    def __init__(self, code: _Optional[_Union[ErrorCode, str]] = ..., message: _Optional[str] = ...) -> None: ...

class ErrorDetail(_message.Message):
    __slots__ = ("code", "message", "key", "requested_bytes", "free_bytes")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_BYTES_FIELD_NUMBER: _ClassVar[int]
    FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    code: ErrorCode
    message: str
    key: str
    requested_bytes: int
    free_bytes: int
    def __init__(self, code: _Optional[_Union[ErrorCode, str]] = ..., message: _Optional[str] = ..., key: _Optional[str] = ..., requested_bytes: _Optional[int] = ..., free_bytes: _Optional[int] = ...) -> None: ...

class Extent(_message.Message):
    __slots__ = ("segment_id", "offset_bytes", "length_bytes")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_BYTES_FIELD_NUMBER: _ClassVar[int]
    LENGTH_BYTES_FIELD_NUMBER: _ClassVar[int]
    segment_id: int
    offset_bytes: int
    length_bytes: int
    def __init__(self, segment_id: _Optional[int] = ..., offset_bytes: _Optional[int] = ..., length_bytes: _Optional[int] = ...) -> None: ...

class Replica(_message.Message):
    __slots__ = ("extent", "state", "tier")
    EXTENT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    extent: Extent
    state: ReplicaState
    tier: Tier
    def __init__(self, extent: _Optional[_Union[Extent, _Mapping]] = ..., state: _Optional[_Union[ReplicaState, str]] = ..., tier: _Optional[_Union[Tier, str]] = ...) -> None: ...

class PutOptions(_message.Message):
    __slots__ = ("replica_num", "upsert", "soft_pin", "hard_pin", "preferred_segment")
    REPLICA_NUM_FIELD_NUMBER: _ClassVar[int]
    UPSERT_FIELD_NUMBER: _ClassVar[int]
    SOFT_PIN_FIELD_NUMBER: _ClassVar[int]
    HARD_PIN_FIELD_NUMBER: _ClassVar[int]
    PREFERRED_SEGMENT_FIELD_NUMBER: _ClassVar[int]
    replica_num: int
    upsert: bool
    soft_pin: bool
    hard_pin: bool
    preferred_segment: str
    def __init__(self, replica_num: _Optional[int] = ..., upsert: bool = ..., soft_pin: bool = ..., hard_pin: bool = ..., preferred_segment: _Optional[str] = ...) -> None: ...

class SegmentInfo(_message.Message):
    __slots__ = ("segment_id", "name", "tier", "capacity_bytes", "used_bytes", "size_bytes", "region_uuid", "device_path", "mounted", "object_count", "owner_client_id")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    REGION_UUID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_PATH_FIELD_NUMBER: _ClassVar[int]
    MOUNTED_FIELD_NUMBER: _ClassVar[int]
    OBJECT_COUNT_FIELD_NUMBER: _ClassVar[int]
    OWNER_CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    segment_id: int
    name: str
    tier: Tier
    capacity_bytes: int
    used_bytes: int
    size_bytes: int
    region_uuid: str
    device_path: str
    mounted: bool
    object_count: int
    owner_client_id: str
    def __init__(self, segment_id: _Optional[int] = ..., name: _Optional[str] = ..., tier: _Optional[_Union[Tier, str]] = ..., capacity_bytes: _Optional[int] = ..., used_bytes: _Optional[int] = ..., size_bytes: _Optional[int] = ..., region_uuid: _Optional[str] = ..., device_path: _Optional[str] = ..., mounted: bool = ..., object_count: _Optional[int] = ..., owner_client_id: _Optional[str] = ...) -> None: ...
