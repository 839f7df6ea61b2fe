from cxlkv.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TaskKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_KIND_UNSPECIFIED: _ClassVar[TaskKind]
    DEMOTE: _ClassVar[TaskKind]
    PROMOTE: _ClassVar[TaskKind]
    CACHE: _ClassVar[TaskKind]
    COPY: _ClassVar[TaskKind]
TASK_KIND_UNSPECIFIED: TaskKind
DEMOTE: TaskKind
PROMOTE: TaskKind
CACHE: TaskKind
COPY: TaskKind

class ReportReadsRequest(_message.Message):
    __slots__ = ("client_id", "keys", "prefix_keys", "prefix_lengths", "prefix_matched", "damaged_keys", "damaged_versions")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_KEYS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_LENGTHS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_MATCHED_FIELD_NUMBER: _ClassVar[int]
    DAMAGED_KEYS_FIELD_NUMBER: _ClassVar[int]
    DAMAGED_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    prefix_keys: _containers.RepeatedScalarFieldContainer[str]
    prefix_lengths: _containers.RepeatedScalarFieldContainer[int]
    prefix_matched: _containers.RepeatedScalarFieldContainer[int]
    damaged_keys: _containers.RepeatedScalarFieldContainer[str]
    damaged_versions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, client_id: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ..., prefix_keys: _Optional[_Iterable[str]] = ..., prefix_lengths: _Optional[_Iterable[int]] = ..., prefix_matched: _Optional[_Iterable[int]] = ..., damaged_keys: _Optional[_Iterable[str]] = ..., damaged_versions: _Optional[_Iterable[int]] = ...) -> None: ...

class ReportReadsResponse(_message.Message):
    __slots__ = ("applied", "dropped")
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    applied: int
    dropped: int
    def __init__(self, applied: _Optional[int] = ..., dropped: _Optional[int] = ...) -> None: ...

class ReserveRequest(_message.Message):
    __slots__ = ("client_id", "epoch", "need_bytes", "counts", "unreserve_put_tokens")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    NEED_BYTES_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    UNRESERVE_PUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    epoch: int
    need_bytes: _containers.RepeatedScalarFieldContainer[int]
    counts: _containers.RepeatedScalarFieldContainer[int]
    unreserve_put_tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, client_id: _Optional[str] = ..., epoch: _Optional[int] = ..., need_bytes: _Optional[_Iterable[int]] = ..., counts: _Optional[_Iterable[int]] = ..., unreserve_put_tokens: _Optional[_Iterable[int]] = ...) -> None: ...

class ReserveResponse(_message.Message):
    __slots__ = ("granted", "put_tokens", "segment_ids", "offsets_bytes", "lengths_bytes", "unreserved")
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    PUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_IDS_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_BYTES_FIELD_NUMBER: _ClassVar[int]
    LENGTHS_BYTES_FIELD_NUMBER: _ClassVar[int]
    UNRESERVED_FIELD_NUMBER: _ClassVar[int]
    granted: _containers.RepeatedScalarFieldContainer[int]
    put_tokens: _containers.RepeatedScalarFieldContainer[int]
    segment_ids: _containers.RepeatedScalarFieldContainer[int]
    offsets_bytes: _containers.RepeatedScalarFieldContainer[int]
    lengths_bytes: _containers.RepeatedScalarFieldContainer[int]
    unreserved: ItemResults
    def __init__(self, granted: _Optional[_Iterable[int]] = ..., put_tokens: _Optional[_Iterable[int]] = ..., segment_ids: _Optional[_Iterable[int]] = ..., offsets_bytes: _Optional[_Iterable[int]] = ..., lengths_bytes: _Optional[_Iterable[int]] = ..., unreserved: _Optional[_Union[ItemResults, _Mapping]] = ...) -> None: ...

class CommitRequest(_message.Message):
    __slots__ = ("client_id", "epoch", "keys", "put_tokens", "value_size_bytes", "header_bytes", "checksums", "flags")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    PUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    VALUE_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    HEADER_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    epoch: int
    keys: _containers.RepeatedScalarFieldContainer[str]
    put_tokens: _containers.RepeatedScalarFieldContainer[int]
    value_size_bytes: _containers.RepeatedScalarFieldContainer[int]
    header_bytes: _containers.RepeatedScalarFieldContainer[int]
    checksums: _containers.RepeatedScalarFieldContainer[int]
    flags: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, client_id: _Optional[str] = ..., epoch: _Optional[int] = ..., keys: _Optional[_Iterable[str]] = ..., put_tokens: _Optional[_Iterable[int]] = ..., value_size_bytes: _Optional[_Iterable[int]] = ..., header_bytes: _Optional[_Iterable[int]] = ..., checksums: _Optional[_Iterable[int]] = ..., flags: _Optional[_Iterable[int]] = ...) -> None: ...

class ReleaseQuarantineRequest(_message.Message):
    __slots__ = ("client_id", "epoch", "upto_epoch", "keep_put_tokens", "writers_gone")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    UPTO_EPOCH_FIELD_NUMBER: _ClassVar[int]
    KEEP_PUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    WRITERS_GONE_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    epoch: int
    upto_epoch: int
    keep_put_tokens: _containers.RepeatedScalarFieldContainer[int]
    writers_gone: bool
    def __init__(self, client_id: _Optional[str] = ..., epoch: _Optional[int] = ..., upto_epoch: _Optional[int] = ..., keep_put_tokens: _Optional[_Iterable[int]] = ..., writers_gone: bool = ...) -> None: ...

class ReleaseQuarantineResponse(_message.Message):
    __slots__ = ("freed_bytes",)
    FREED_BYTES_FIELD_NUMBER: _ClassVar[int]
    freed_bytes: int
    def __init__(self, freed_bytes: _Optional[int] = ...) -> None: ...

class RegionIdentity(_message.Message):
    __slots__ = ("segment_name", "region_uuid", "size_bytes", "device_path")
    SEGMENT_NAME_FIELD_NUMBER: _ClassVar[int]
    REGION_UUID_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    DEVICE_PATH_FIELD_NUMBER: _ClassVar[int]
    segment_name: str
    region_uuid: str
    size_bytes: int
    device_path: str
    def __init__(self, segment_name: _Optional[str] = ..., region_uuid: _Optional[str] = ..., size_bytes: _Optional[int] = ..., device_path: _Optional[str] = ...) -> None: ...

class RegisterClientRequest(_message.Message):
    __slots__ = ("hostname", "name", "pid", "regions", "previous_client_id", "metrics_url")
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    METRICS_URL_FIELD_NUMBER: _ClassVar[int]
    hostname: str
    name: str
    pid: int
    regions: _containers.RepeatedCompositeFieldContainer[RegionIdentity]
    previous_client_id: str
    metrics_url: str
    def __init__(self, hostname: _Optional[str] = ..., name: _Optional[str] = ..., pid: _Optional[int] = ..., regions: _Optional[_Iterable[_Union[RegionIdentity, _Mapping]]] = ..., previous_client_id: _Optional[str] = ..., metrics_url: _Optional[str] = ...) -> None: ...

class RegisterClientResponse(_message.Message):
    __slots__ = ("client_id", "epoch", "heartbeat_interval_s", "client_ttl_s", "segments", "lease_ttl_s", "master_id", "lean_port", "index_region_uuid", "index_epoch", "lean_socket_path")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    CLIENT_TTL_S_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_S_FIELD_NUMBER: _ClassVar[int]
    MASTER_ID_FIELD_NUMBER: _ClassVar[int]
    LEAN_PORT_FIELD_NUMBER: _ClassVar[int]
    INDEX_REGION_UUID_FIELD_NUMBER: _ClassVar[int]
    INDEX_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEAN_SOCKET_PATH_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    epoch: int
    heartbeat_interval_s: float
    client_ttl_s: float
    segments: _containers.RepeatedCompositeFieldContainer[_common_pb2.SegmentInfo]
    lease_ttl_s: float
    master_id: str
    lean_port: int
    index_region_uuid: str
    index_epoch: int
    lean_socket_path: str
    def __init__(self, client_id: _Optional[str] = ..., epoch: _Optional[int] = ..., heartbeat_interval_s: _Optional[float] = ..., client_ttl_s: _Optional[float] = ..., segments: _Optional[_Iterable[_Union[_common_pb2.SegmentInfo, _Mapping]]] = ..., lease_ttl_s: _Optional[float] = ..., master_id: _Optional[str] = ..., lean_port: _Optional[int] = ..., index_region_uuid: _Optional[str] = ..., index_epoch: _Optional[int] = ..., lean_socket_path: _Optional[str] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("client_id", "epoch")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    epoch: int
    def __init__(self, client_id: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("master_id", "segments_version")
    MASTER_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_VERSION_FIELD_NUMBER: _ClassVar[int]
    master_id: str
    segments_version: int
    def __init__(self, master_id: _Optional[str] = ..., segments_version: _Optional[int] = ...) -> None: ...

class DeregisterClientRequest(_message.Message):
    __slots__ = ("client_id", "epoch")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    epoch: int
    def __init__(self, client_id: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class DeregisterClientResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class MountSegmentRequest(_message.Message):
    __slots__ = ("client_id", "epoch", "name", "tier", "size_bytes", "region_uuid", "device_path")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    REGION_UUID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_PATH_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    epoch: int
    name: str
    tier: _common_pb2.Tier
    size_bytes: int
    region_uuid: str
    device_path: str
    def __init__(self, client_id: _Optional[str] = ..., epoch: _Optional[int] = ..., name: _Optional[str] = ..., tier: _Optional[_Union[_common_pb2.Tier, str]] = ..., size_bytes: _Optional[int] = ..., region_uuid: _Optional[str] = ..., device_path: _Optional[str] = ...) -> None: ...

class MountSegmentResponse(_message.Message):
    __slots__ = ("segment",)
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    segment: _common_pb2.SegmentInfo
    def __init__(self, segment: _Optional[_Union[_common_pb2.SegmentInfo, _Mapping]] = ...) -> None: ...

class UnmountSegmentRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class UnmountSegmentResponse(_message.Message):
    __slots__ = ("replicas_lost", "objects_lost")
    REPLICAS_LOST_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_LOST_FIELD_NUMBER: _ClassVar[int]
    replicas_lost: int
    objects_lost: int
    def __init__(self, replicas_lost: _Optional[int] = ..., objects_lost: _Optional[int] = ...) -> None: ...

class ListSegmentsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListSegmentsResponse(_message.Message):
    __slots__ = ("segments",)
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    segments: _containers.RepeatedCompositeFieldContainer[_common_pb2.SegmentInfo]
    def __init__(self, segments: _Optional[_Iterable[_Union[_common_pb2.SegmentInfo, _Mapping]]] = ...) -> None: ...

class PutStartRequest(_message.Message):
    __slots__ = ("client_id", "epoch", "keys", "value_size_bytes", "header_bytes", "options")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    VALUE_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    HEADER_BYTES_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    epoch: int
    keys: _containers.RepeatedScalarFieldContainer[str]
    value_size_bytes: _containers.RepeatedScalarFieldContainer[int]
    header_bytes: _containers.RepeatedScalarFieldContainer[int]
    options: _containers.RepeatedCompositeFieldContainer[_common_pb2.PutOptions]
    def __init__(self, client_id: _Optional[str] = ..., epoch: _Optional[int] = ..., keys: _Optional[_Iterable[str]] = ..., value_size_bytes: _Optional[_Iterable[int]] = ..., header_bytes: _Optional[_Iterable[int]] = ..., options: _Optional[_Iterable[_Union[_common_pb2.PutOptions, _Mapping]]] = ...) -> None: ...

class PutStartResponse(_message.Message):
    __slots__ = ("codes", "put_tokens", "versions", "replicas_wanted", "extent_counts", "segment_ids", "offsets_bytes", "lengths_bytes", "error_positions", "messages")
    CODES_FIELD_NUMBER: _ClassVar[int]
    PUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_WANTED_FIELD_NUMBER: _ClassVar[int]
    EXTENT_COUNTS_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_IDS_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_BYTES_FIELD_NUMBER: _ClassVar[int]
    LENGTHS_BYTES_FIELD_NUMBER: _ClassVar[int]
    ERROR_POSITIONS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    codes: _containers.RepeatedScalarFieldContainer[int]
    put_tokens: _containers.RepeatedScalarFieldContainer[int]
    versions: _containers.RepeatedScalarFieldContainer[int]
    replicas_wanted: _containers.RepeatedScalarFieldContainer[int]
    extent_counts: _containers.RepeatedScalarFieldContainer[int]
    segment_ids: _containers.RepeatedScalarFieldContainer[int]
    offsets_bytes: _containers.RepeatedScalarFieldContainer[int]
    lengths_bytes: _containers.RepeatedScalarFieldContainer[int]
    error_positions: _containers.RepeatedScalarFieldContainer[int]
    messages: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, codes: _Optional[_Iterable[int]] = ..., put_tokens: _Optional[_Iterable[int]] = ..., versions: _Optional[_Iterable[int]] = ..., replicas_wanted: _Optional[_Iterable[int]] = ..., extent_counts: _Optional[_Iterable[int]] = ..., segment_ids: _Optional[_Iterable[int]] = ..., offsets_bytes: _Optional[_Iterable[int]] = ..., lengths_bytes: _Optional[_Iterable[int]] = ..., error_positions: _Optional[_Iterable[int]] = ..., messages: _Optional[_Iterable[str]] = ...) -> None: ...

class PutEndRequest(_message.Message):
    __slots__ = ("client_id", "epoch", "keys", "put_tokens", "checksums")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    PUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    epoch: int
    keys: _containers.RepeatedScalarFieldContainer[str]
    put_tokens: _containers.RepeatedScalarFieldContainer[int]
    checksums: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, client_id: _Optional[str] = ..., epoch: _Optional[int] = ..., keys: _Optional[_Iterable[str]] = ..., put_tokens: _Optional[_Iterable[int]] = ..., checksums: _Optional[_Iterable[int]] = ...) -> None: ...

class ItemResults(_message.Message):
    __slots__ = ("codes", "error_positions", "messages")
    CODES_FIELD_NUMBER: _ClassVar[int]
    ERROR_POSITIONS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    codes: _containers.RepeatedScalarFieldContainer[int]
    error_positions: _containers.RepeatedScalarFieldContainer[int]
    messages: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, codes: _Optional[_Iterable[int]] = ..., error_positions: _Optional[_Iterable[int]] = ..., messages: _Optional[_Iterable[str]] = ...) -> None: ...

class GetReplicaListRequest(_message.Message):
    __slots__ = ("client_id", "keys", "no_lease", "release_lease_ids")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    NO_LEASE_FIELD_NUMBER: _ClassVar[int]
    RELEASE_LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    no_lease: bool
    release_lease_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, client_id: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ..., no_lease: bool = ..., release_lease_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class Locations(_message.Message):
    __slots__ = ("codes", "value_size_bytes", "versions", "lease_ids", "lease_ttl_ms", "checksums", "header_bytes", "replica_counts", "segment_ids", "offsets_bytes", "lengths_bytes", "tiers", "error_positions", "messages")
    CODES_FIELD_NUMBER: _ClassVar[int]
    VALUE_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    HEADER_BYTES_FIELD_NUMBER: _ClassVar[int]
    REPLICA_COUNTS_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_IDS_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_BYTES_FIELD_NUMBER: _ClassVar[int]
    LENGTHS_BYTES_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    ERROR_POSITIONS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    codes: _containers.RepeatedScalarFieldContainer[int]
    value_size_bytes: _containers.RepeatedScalarFieldContainer[int]
    versions: _containers.RepeatedScalarFieldContainer[int]
    lease_ids: _containers.RepeatedScalarFieldContainer[int]
    lease_ttl_ms: _containers.RepeatedScalarFieldContainer[int]
    checksums: _containers.RepeatedScalarFieldContainer[int]
    header_bytes: _containers.RepeatedScalarFieldContainer[int]
    replica_counts: _containers.RepeatedScalarFieldContainer[int]
    segment_ids: _containers.RepeatedScalarFieldContainer[int]
    offsets_bytes: _containers.RepeatedScalarFieldContainer[int]
    lengths_bytes: _containers.RepeatedScalarFieldContainer[int]
    tiers: _containers.RepeatedScalarFieldContainer[_common_pb2.Tier]
    error_positions: _containers.RepeatedScalarFieldContainer[int]
    messages: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, codes: _Optional[_Iterable[int]] = ..., value_size_bytes: _Optional[_Iterable[int]] = ..., versions: _Optional[_Iterable[int]] = ..., lease_ids: _Optional[_Iterable[int]] = ..., lease_ttl_ms: _Optional[_Iterable[int]] = ..., checksums: _Optional[_Iterable[int]] = ..., header_bytes: _Optional[_Iterable[int]] = ..., replica_counts: _Optional[_Iterable[int]] = ..., segment_ids: _Optional[_Iterable[int]] = ..., offsets_bytes: _Optional[_Iterable[int]] = ..., lengths_bytes: _Optional[_Iterable[int]] = ..., tiers: _Optional[_Iterable[_Union[_common_pb2.Tier, str]]] = ..., error_positions: _Optional[_Iterable[int]] = ..., messages: _Optional[_Iterable[str]] = ...) -> None: ...

class ReleaseLeasesRequest(_message.Message):
    __slots__ = ("client_id", "lease_ids")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    lease_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, client_id: _Optional[str] = ..., lease_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ReleaseLeasesResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: int
    def __init__(self, released: _Optional[int] = ...) -> None: ...

class ExistKeyRequest(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, keys: _Optional[_Iterable[str]] = ...) -> None: ...

class ExistKeyResponse(_message.Message):
    __slots__ = ("exists", "results")
    EXISTS_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    exists: _containers.RepeatedScalarFieldContainer[bool]
    results: _containers.RepeatedCompositeFieldContainer[_common_pb2.Status]
    def __init__(self, exists: _Optional[_Iterable[bool]] = ..., results: _Optional[_Iterable[_Union[_common_pb2.Status, _Mapping]]] = ...) -> None: ...

class PrefixQuery(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, keys: _Optional[_Iterable[str]] = ...) -> None: ...

class MatchPrefixRequest(_message.Message):
    __slots__ = ("client_id", "queries", "no_lease", "release_lease_ids")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    NO_LEASE_FIELD_NUMBER: _ClassVar[int]
    RELEASE_LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    queries: _containers.RepeatedCompositeFieldContainer[PrefixQuery]
    no_lease: bool
    release_lease_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, client_id: _Optional[str] = ..., queries: _Optional[_Iterable[_Union[PrefixQuery, _Mapping]]] = ..., no_lease: bool = ..., release_lease_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class MatchPrefixResponse(_message.Message):
    __slots__ = ("matched", "locations")
    MATCHED_FIELD_NUMBER: _ClassVar[int]
    LOCATIONS_FIELD_NUMBER: _ClassVar[int]
    matched: _containers.RepeatedScalarFieldContainer[int]
    locations: Locations
    def __init__(self, matched: _Optional[_Iterable[int]] = ..., locations: _Optional[_Union[Locations, _Mapping]] = ...) -> None: ...

class RemoveRequest(_message.Message):
    __slots__ = ("keys", "force")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    force: bool
    def __init__(self, keys: _Optional[_Iterable[str]] = ..., force: bool = ...) -> None: ...

class RemoveResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[_common_pb2.Status]
    def __init__(self, results: _Optional[_Iterable[_Union[_common_pb2.Status, _Mapping]]] = ...) -> None: ...

class RemoveAllRequest(_message.Message):
    __slots__ = ("force", "pattern")
    FORCE_FIELD_NUMBER: _ClassVar[int]
    PATTERN_FIELD_NUMBER: _ClassVar[int]
    force: bool
    pattern: str
    def __init__(self, force: bool = ..., pattern: _Optional[str] = ...) -> None: ...

class RemoveAllResponse(_message.Message):
    __slots__ = ("removed", "skipped_leased")
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_LEASED_FIELD_NUMBER: _ClassVar[int]
    removed: int
    skipped_leased: int
    def __init__(self, removed: _Optional[int] = ..., skipped_leased: _Optional[int] = ...) -> None: ...

class ListKeysRequest(_message.Message):
    __slots__ = ("prefix", "page_size", "page_token")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    prefix: str
    page_size: int
    page_token: str
    def __init__(self, prefix: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class KeyEntry(_message.Message):
    __slots__ = ("key", "value_size_bytes", "version", "replica_count", "tiers", "hard_pinned", "soft_pinned", "lease_count")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REPLICA_COUNT_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    HARD_PINNED_FIELD_NUMBER: _ClassVar[int]
    SOFT_PINNED_FIELD_NUMBER: _ClassVar[int]
    LEASE_COUNT_FIELD_NUMBER: _ClassVar[int]
    key: str
    value_size_bytes: int
    version: int
    replica_count: int
    tiers: _containers.RepeatedScalarFieldContainer[_common_pb2.Tier]
    hard_pinned: bool
    soft_pinned: bool
    lease_count: int
    def __init__(self, key: _Optional[str] = ..., value_size_bytes: _Optional[int] = ..., version: _Optional[int] = ..., replica_count: _Optional[int] = ..., tiers: _Optional[_Iterable[_Union[_common_pb2.Tier, str]]] = ..., hard_pinned: bool = ..., soft_pinned: bool = ..., lease_count: _Optional[int] = ...) -> None: ...

class ListKeysResponse(_message.Message):
    __slots__ = ("entries", "next_page_token")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[KeyEntry]
    next_page_token: str
    def __init__(self, entries: _Optional[_Iterable[_Union[KeyEntry, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class StatRequest(_message.Message):
    __slots__ = ("check_invariants",)
    CHECK_INVARIANTS_FIELD_NUMBER: _ClassVar[int]
    check_invariants: bool
    def __init__(self, check_invariants: bool = ...) -> None: ...

class ClientInfo(_message.Message):
    __slots__ = ("client_id", "hostname", "name", "epoch", "alive", "last_heartbeat_age_s", "metrics_url")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_AGE_S_FIELD_NUMBER: _ClassVar[int]
    METRICS_URL_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    hostname: str
    name: str
    epoch: int
    alive: bool
    last_heartbeat_age_s: float
    metrics_url: str
    def __init__(self, client_id: _Optional[str] = ..., hostname: _Optional[str] = ..., name: _Optional[str] = ..., epoch: _Optional[int] = ..., alive: bool = ..., last_heartbeat_age_s: _Optional[float] = ..., metrics_url: _Optional[str] = ...) -> None: ...

class StatResponse(_message.Message):
    __slots__ = ("master_id", "version", "segments", "key_count", "processing_count", "lease_count", "clients", "capacity_bytes", "used_bytes", "counters", "high_watermark", "low_watermark", "allocation_strategy", "eviction_policy", "uptime_s", "metrics_url", "invariant_violation", "fenced_count", "reserved_count", "quarantined_count", "quarantined_bytes", "reserved_bytes", "index")
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    MASTER_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    KEY_COUNT_FIELD_NUMBER: _ClassVar[int]
    PROCESSING_COUNT_FIELD_NUMBER: _ClassVar[int]
    LEASE_COUNT_FIELD_NUMBER: _ClassVar[int]
    CLIENTS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    LOW_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_STRATEGY_FIELD_NUMBER: _ClassVar[int]
    EVICTION_POLICY_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    METRICS_URL_FIELD_NUMBER: _ClassVar[int]
    INVARIANT_VIOLATION_FIELD_NUMBER: _ClassVar[int]
    FENCED_COUNT_FIELD_NUMBER: _ClassVar[int]
    RESERVED_COUNT_FIELD_NUMBER: _ClassVar[int]
    QUARANTINED_COUNT_FIELD_NUMBER: _ClassVar[int]
    QUARANTINED_BYTES_FIELD_NUMBER: _ClassVar[int]
    RESERVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    master_id: str
    version: str
    segments: _containers.RepeatedCompositeFieldContainer[_common_pb2.SegmentInfo]
    key_count: int
    processing_count: int
    lease_count: int
    clients: _containers.RepeatedCompositeFieldContainer[ClientInfo]
    capacity_bytes: int
    used_bytes: int
    counters: _containers.ScalarMap[str, int]
    high_watermark: float
    low_watermark: float
    allocation_strategy: str
    eviction_policy: str
    uptime_s: float
    metrics_url: str
    invariant_violation: str
    fenced_count: int
    reserved_count: int
    quarantined_count: int
    quarantined_bytes: int
    reserved_bytes: int
    index: IndexInfo
    def __init__(self, master_id: _Optional[str] = ..., version: _Optional[str] = ..., segments: _Optional[_Iterable[_Union[_common_pb2.SegmentInfo, _Mapping]]] = ..., key_count: _Optional[int] = ..., processing_count: _Optional[int] = ..., lease_count: _Optional[int] = ..., clients: _Optional[_Iterable[_Union[ClientInfo, _Mapping]]] = ..., capacity_bytes: _Optional[int] = ..., used_bytes: _Optional[int] = ..., counters: _Optional[_Mapping[str, int]] = ..., high_watermark: _Optional[float] = ..., low_watermark: _Optional[float] = ..., allocation_strategy: _Optional[str] = ..., eviction_policy: _Optional[str] = ..., uptime_s: _Optional[float] = ..., metrics_url: _Optional[str] = ..., invariant_violation: _Optional[str] = ..., fenced_count: _Optional[int] = ..., reserved_count: _Optional[int] = ..., quarantined_count: _Optional[int] = ..., quarantined_bytes: _Optional[int] = ..., reserved_bytes: _Optional[int] = ..., index: _Optional[_Union[IndexInfo, _Mapping]] = ...) -> None: ...

class IndexInfo(_message.Message):
    __slots__ = ("slots", "object_slots", "grant_slots", "key_limit", "overflow_objects")
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    OBJECT_SLOTS_FIELD_NUMBER: _ClassVar[int]
    GRANT_SLOTS_FIELD_NUMBER: _ClassVar[int]
    KEY_LIMIT_FIELD_NUMBER: _ClassVar[int]
    OVERFLOW_OBJECTS_FIELD_NUMBER: _ClassVar[int]
    slots: int
    object_slots: int
    grant_slots: int
    key_limit: int
    overflow_objects: int
    def __init__(self, slots: _Optional[int] = ..., object_slots: _Optional[int] = ..., grant_slots: _Optional[int] = ..., key_limit: _Optional[int] = ..., overflow_objects: _Optional[int] = ...) -> None: ...

class MoveTask(_message.Message):
    __slots__ = ("task_id", "kind", "key", "version", "value_size_bytes", "header_bytes", "checksum", "source", "destination", "deadline_ms")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    VALUE_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    HEADER_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    task_id: int
    kind: TaskKind
    key: str
    version: int
    value_size_bytes: int
    header_bytes: int
    checksum: int
    source: _common_pb2.Extent
    destination: _common_pb2.Extent
    deadline_ms: int
    def __init__(self, task_id: _Optional[int] = ..., kind: _Optional[_Union[TaskKind, str]] = ..., key: _Optional[str] = ..., version: _Optional[int] = ..., value_size_bytes: _Optional[int] = ..., header_bytes: _Optional[int] = ..., checksum: _Optional[int] = ..., source: _Optional[_Union[_common_pb2.Extent, _Mapping]] = ..., destination: _Optional[_Union[_common_pb2.Extent, _Mapping]] = ..., deadline_ms: _Optional[int] = ...) -> None: ...

class TaskResult(_message.Message):
    __slots__ = ("task_id", "status")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    task_id: int
    status: _common_pb2.Status
    def __init__(self, task_id: _Optional[int] = ..., status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ...) -> None: ...

class ExchangeTasksRequest(_message.Message):
    __slots__ = ("client_id", "epoch", "results", "max_tasks", "wait_ms")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    MAX_TASKS_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    epoch: int
    results: _containers.RepeatedCompositeFieldContainer[TaskResult]
    max_tasks: int
    wait_ms: int
    def __init__(self, client_id: _Optional[str] = ..., epoch: _Optional[int] = ..., results: _Optional[_Iterable[_Union[TaskResult, _Mapping]]] = ..., max_tasks: _Optional[int] = ..., wait_ms: _Optional[int] = ...) -> None: ...

class ExchangeTasksResponse(_message.Message):
    __slots__ = ("tasks", "results")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[MoveTask]
    results: _containers.RepeatedCompositeFieldContainer[_common_pb2.Status]
    def __init__(self, tasks: _Optional[_Iterable[_Union[MoveTask, _Mapping]]] = ..., results: _Optional[_Iterable[_Union[_common_pb2.Status, _Mapping]]] = ...) -> None: ...
