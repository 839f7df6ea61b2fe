from cxlkv.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DirectReserveRequest(_message.Message):
    __slots__ = ("pid", "need_bytes", "counts", "done_put_tokens", "committed_put_tokens", "committed_keys", "packed_extents")
    PID_FIELD_NUMBER: _ClassVar[int]
    NEED_BYTES_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    DONE_PUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_PUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_KEYS_FIELD_NUMBER: _ClassVar[int]
    PACKED_EXTENTS_FIELD_NUMBER: _ClassVar[int]
    pid: int
    need_bytes: _containers.RepeatedScalarFieldContainer[int]
    counts: _containers.RepeatedScalarFieldContainer[int]
    done_put_tokens: _containers.RepeatedScalarFieldContainer[int]
    committed_put_tokens: _containers.RepeatedScalarFieldContainer[int]
    committed_keys: _containers.RepeatedScalarFieldContainer[str]
    packed_extents: bool
    def __init__(self, pid: _Optional[int] = ..., need_bytes: _Optional[_Iterable[int]] = ..., counts: _Optional[_Iterable[int]] = ..., done_put_tokens: _Optional[_Iterable[int]] = ..., committed_put_tokens: _Optional[_Iterable[int]] = ..., committed_keys: _Optional[_Iterable[str]] = ..., packed_extents: bool = ...) -> None: ...

class DirectReserveResponse(_message.Message):
    __slots__ = ("offered", "master_address", "client_id", "epoch", "granted", "put_tokens", "extents", "why_not", "segment_ids", "offsets_bytes", "lengths_bytes")
    OFFERED_FIELD_NUMBER: _ClassVar[int]
    MASTER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    PUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EXTENTS_FIELD_NUMBER: _ClassVar[int]
    WHY_NOT_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_IDS_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_BYTES_FIELD_NUMBER: _ClassVar[int]
    LENGTHS_BYTES_FIELD_NUMBER: _ClassVar[int]
    offered: bool
    master_address: str
    client_id: str
    epoch: int
    granted: _containers.RepeatedScalarFieldContainer[int]
    put_tokens: _containers.RepeatedScalarFieldContainer[int]
    extents: _containers.RepeatedCompositeFieldContainer[DirectExtent]
    why_not: str
    segment_ids: _containers.RepeatedScalarFieldContainer[int]
    offsets_bytes: _containers.RepeatedScalarFieldContainer[int]
    lengths_bytes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, offered: bool = ..., master_address: _Optional[str] = ..., client_id: _Optional[str] = ..., epoch: _Optional[int] = ..., granted: _Optional[_Iterable[int]] = ..., put_tokens: _Optional[_Iterable[int]] = ..., extents: _Optional[_Iterable[_Union[DirectExtent, _Mapping]]] = ..., why_not: _Optional[str] = ..., segment_ids: _Optional[_Iterable[int]] = ..., offsets_bytes: _Optional[_Iterable[int]] = ..., lengths_bytes: _Optional[_Iterable[int]] = ...) -> None: ...

class ClientReportHitsRequest(_message.Message):
    __slots__ = ("keys", "get_items", "bytes_out", "prefix_queries", "prefix_keys", "prefix_hits", "chain_keys", "chain_lengths", "chain_matched", "reads_copied_again")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    GET_ITEMS_FIELD_NUMBER: _ClassVar[int]
    BYTES_OUT_FIELD_NUMBER: _ClassVar[int]
    PREFIX_QUERIES_FIELD_NUMBER: _ClassVar[int]
    PREFIX_KEYS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_HITS_FIELD_NUMBER: _ClassVar[int]
    CHAIN_KEYS_FIELD_NUMBER: _ClassVar[int]
    CHAIN_LENGTHS_FIELD_NUMBER: _ClassVar[int]
    CHAIN_MATCHED_FIELD_NUMBER: _ClassVar[int]
    READS_COPIED_AGAIN_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    get_items: int
    bytes_out: int
    prefix_queries: int
    prefix_keys: int
    prefix_hits: int
    chain_keys: _containers.RepeatedScalarFieldContainer[str]
    chain_lengths: _containers.RepeatedScalarFieldContainer[int]
    chain_matched: _containers.RepeatedScalarFieldContainer[int]
    reads_copied_again: int
    def __init__(self, keys: _Optional[_Iterable[str]] = ..., get_items: _Optional[int] = ..., bytes_out: _Optional[int] = ..., prefix_queries: _Optional[int] = ..., prefix_keys: _Optional[int] = ..., prefix_hits: _Optional[int] = ..., chain_keys: _Optional[_Iterable[str]] = ..., chain_lengths: _Optional[_Iterable[int]] = ..., chain_matched: _Optional[_Iterable[int]] = ..., reads_copied_again: _Optional[int] = ...) -> None: ...

class ClientReportHitsResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PutRequest(_message.Message):
    __slots__ = ("key", "value", "options")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: bytes
    options: _common_pb2.PutOptions
    def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ..., options: _Optional[_Union[_common_pb2.PutOptions, _Mapping]] = ...) -> None: ...

class PutResponse(_message.Message):
    __slots__ = ("version", "replicas_placed")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_PLACED_FIELD_NUMBER: _ClassVar[int]
    version: int
    replicas_placed: int
    def __init__(self, version: _Optional[int] = ..., replicas_placed: _Optional[int] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: str
    def __init__(self, key: _Optional[str] = ...) -> None: ...

class GetResponse(_message.Message):
    __slots__ = ("value", "version")
    VALUE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    value: bytes
    version: int
    def __init__(self, value: _Optional[bytes] = ..., version: _Optional[int] = ...) -> None: ...

class BatchPutRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[PutRequest]
    def __init__(self, items: _Optional[_Iterable[_Union[PutRequest, _Mapping]]] = ...) -> None: ...

class PutResult(_message.Message):
    __slots__ = ("status", "version", "replicas_placed")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_PLACED_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    version: int
    replicas_placed: int
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., version: _Optional[int] = ..., replicas_placed: _Optional[int] = ...) -> None: ...

class BatchPutResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[PutResult]
    def __init__(self, results: _Optional[_Iterable[_Union[PutResult, _Mapping]]] = ...) -> None: ...

class BatchGetRequest(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, keys: _Optional[_Iterable[str]] = ...) -> None: ...

class GetResult(_message.Message):
    __slots__ = ("status", "value", "version")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    value: bytes
    version: int
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., value: _Optional[bytes] = ..., version: _Optional[int] = ...) -> None: ...

class BatchGetResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[GetResult]
    def __init__(self, results: _Optional[_Iterable[_Union[GetResult, _Mapping]]] = ...) -> None: ...

class ExistRequest(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: str
    def __init__(self, key: _Optional[str] = ...) -> None: ...

class ExistResponse(_message.Message):
    __slots__ = ("exists",)
    EXISTS_FIELD_NUMBER: _ClassVar[int]
    exists: bool
    def __init__(self, exists: bool = ...) -> None: ...

class BatchExistRequest(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, keys: _Optional[_Iterable[str]] = ...) -> None: ...

class BatchExistResponse(_message.Message):
    __slots__ = ("exists", "results")
    EXISTS_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    exists: _containers.RepeatedScalarFieldContainer[bool]
    results: _containers.RepeatedCompositeFieldContainer[_common_pb2.Status]
    def __init__(self, exists: _Optional[_Iterable[bool]] = ..., results: _Optional[_Iterable[_Union[_common_pb2.Status, _Mapping]]] = ...) -> None: ...

class ClientRemoveRequest(_message.Message):
    __slots__ = ("key", "force")
    KEY_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    key: str
    force: bool
    def __init__(self, key: _Optional[str] = ..., force: bool = ...) -> None: ...

class ClientRemoveResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ClientBatchRemoveRequest(_message.Message):
    __slots__ = ("keys", "force")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    force: bool
    def __init__(self, keys: _Optional[_Iterable[str]] = ..., force: bool = ...) -> None: ...

class ClientBatchRemoveResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[_common_pb2.Status]
    def __init__(self, results: _Optional[_Iterable[_Union[_common_pb2.Status, _Mapping]]] = ...) -> None: ...

class ClientRemoveAllRequest(_message.Message):
    __slots__ = ("force", "regex")
    FORCE_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    force: bool
    regex: str
    def __init__(self, force: bool = ..., regex: _Optional[str] = ...) -> None: ...

class ClientRemoveAllResponse(_message.Message):
    __slots__ = ("removed", "skipped_leased")
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_LEASED_FIELD_NUMBER: _ClassVar[int]
    removed: int
    skipped_leased: int
    def __init__(self, removed: _Optional[int] = ..., skipped_leased: _Optional[int] = ...) -> None: ...

class RegisterBufferRequest(_message.Message):
    __slots__ = ("path", "size_bytes", "pid")
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    path: str
    size_bytes: int
    pid: int
    def __init__(self, path: _Optional[str] = ..., size_bytes: _Optional[int] = ..., pid: _Optional[int] = ...) -> None: ...

class RegisterBufferResponse(_message.Message):
    __slots__ = ("buffer_id",)
    BUFFER_ID_FIELD_NUMBER: _ClassVar[int]
    buffer_id: int
    def __init__(self, buffer_id: _Optional[int] = ...) -> None: ...

class UnregisterBufferRequest(_message.Message):
    __slots__ = ("buffer_id",)
    BUFFER_ID_FIELD_NUMBER: _ClassVar[int]
    buffer_id: int
    def __init__(self, buffer_id: _Optional[int] = ...) -> None: ...

class UnregisterBufferResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BufferRange(_message.Message):
    __slots__ = ("buffer_id", "offset_bytes", "length_bytes")
    BUFFER_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_BYTES_FIELD_NUMBER: _ClassVar[int]
    LENGTH_BYTES_FIELD_NUMBER: _ClassVar[int]
    buffer_id: int
    offset_bytes: int
    length_bytes: int
    def __init__(self, buffer_id: _Optional[int] = ..., offset_bytes: _Optional[int] = ..., length_bytes: _Optional[int] = ...) -> None: ...

class PutFromRequest(_message.Message):
    __slots__ = ("key", "source", "options")
    KEY_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    key: str
    source: BufferRange
    options: _common_pb2.PutOptions
    def __init__(self, key: _Optional[str] = ..., source: _Optional[_Union[BufferRange, _Mapping]] = ..., options: _Optional[_Union[_common_pb2.PutOptions, _Mapping]] = ...) -> None: ...

class PutFromResponse(_message.Message):
    __slots__ = ("version", "replicas_placed")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_PLACED_FIELD_NUMBER: _ClassVar[int]
    version: int
    replicas_placed: int
    def __init__(self, version: _Optional[int] = ..., replicas_placed: _Optional[int] = ...) -> None: ...

class BatchPutFromRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[PutFromRequest]
    def __init__(self, items: _Optional[_Iterable[_Union[PutFromRequest, _Mapping]]] = ...) -> None: ...

class BatchPutFromResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[PutResult]
    def __init__(self, results: _Optional[_Iterable[_Union[PutResult, _Mapping]]] = ...) -> None: ...

class GetIntoRequest(_message.Message):
    __slots__ = ("key", "target")
    KEY_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    key: str
    target: BufferRange
    def __init__(self, key: _Optional[str] = ..., target: _Optional[_Union[BufferRange, _Mapping]] = ...) -> None: ...

class GetIntoResponse(_message.Message):
    __slots__ = ("value_size_bytes", "version")
    VALUE_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    value_size_bytes: int
    version: int
    def __init__(self, value_size_bytes: _Optional[int] = ..., version: _Optional[int] = ...) -> None: ...

class GetIntoResult(_message.Message):
    __slots__ = ("status", "value_size_bytes", "version", "tier")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    VALUE_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    value_size_bytes: int
    version: int
    tier: _common_pb2.Tier
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., value_size_bytes: _Optional[int] = ..., version: _Optional[int] = ..., tier: _Optional[_Union[_common_pb2.Tier, str]] = ...) -> None: ...

class BatchGetIntoRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[GetIntoRequest]
    def __init__(self, items: _Optional[_Iterable[_Union[GetIntoRequest, _Mapping]]] = ...) -> None: ...

class BatchGetIntoResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[GetIntoResult]
    def __init__(self, results: _Optional[_Iterable[_Union[GetIntoResult, _Mapping]]] = ...) -> None: ...

class GetPrefixIntoRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[GetIntoRequest]
    def __init__(self, items: _Optional[_Iterable[_Union[GetIntoRequest, _Mapping]]] = ...) -> None: ...

class GetPrefixIntoResponse(_message.Message):
    __slots__ = ("matched", "results")
    MATCHED_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    matched: int
    results: _containers.RepeatedCompositeFieldContainer[GetIntoResult]
    def __init__(self, matched: _Optional[int] = ..., results: _Optional[_Iterable[_Union[GetIntoResult, _Mapping]]] = ...) -> None: ...

class BufferStatusRequest(_message.Message):
    __slots__ = ("buffer_ids",)
    BUFFER_IDS_FIELD_NUMBER: _ClassVar[int]
    buffer_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, buffer_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class BufferStatusResponse(_message.Message):
    __slots__ = ("registered",)
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    registered: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, registered: _Optional[_Iterable[bool]] = ...) -> None: ...

class PackedPutFromRequest(_message.Message):
    __slots__ = ("keys", "buffer_ids", "offsets_bytes", "lengths_bytes", "options")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    BUFFER_IDS_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_BYTES_FIELD_NUMBER: _ClassVar[int]
    LENGTHS_BYTES_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    buffer_ids: _containers.RepeatedScalarFieldContainer[int]
    offsets_bytes: _containers.RepeatedScalarFieldContainer[int]
    lengths_bytes: _containers.RepeatedScalarFieldContainer[int]
    options: _common_pb2.PutOptions
    def __init__(self, keys: _Optional[_Iterable[str]] = ..., buffer_ids: _Optional[_Iterable[int]] = ..., offsets_bytes: _Optional[_Iterable[int]] = ..., lengths_bytes: _Optional[_Iterable[int]] = ..., options: _Optional[_Union[_common_pb2.PutOptions, _Mapping]] = ...) -> None: ...

class PackedPutResponse(_message.Message):
    __slots__ = ("codes", "versions", "replicas_placed", "error_positions", "messages")
    CODES_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_PLACED_FIELD_NUMBER: _ClassVar[int]
    ERROR_POSITIONS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    codes: _containers.RepeatedScalarFieldContainer[int]
    versions: _containers.RepeatedScalarFieldContainer[int]
    replicas_placed: _containers.RepeatedScalarFieldContainer[int]
    error_positions: _containers.RepeatedScalarFieldContainer[int]
    messages: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, codes: _Optional[_Iterable[int]] = ..., versions: _Optional[_Iterable[int]] = ..., replicas_placed: _Optional[_Iterable[int]] = ..., error_positions: _Optional[_Iterable[int]] = ..., messages: _Optional[_Iterable[str]] = ...) -> None: ...

class PackedRangesRequest(_message.Message):
    __slots__ = ("keys", "buffer_ids", "offsets_bytes", "lengths_bytes")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    BUFFER_IDS_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_BYTES_FIELD_NUMBER: _ClassVar[int]
    LENGTHS_BYTES_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    buffer_ids: _containers.RepeatedScalarFieldContainer[int]
    offsets_bytes: _containers.RepeatedScalarFieldContainer[int]
    lengths_bytes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, keys: _Optional[_Iterable[str]] = ..., buffer_ids: _Optional[_Iterable[int]] = ..., offsets_bytes: _Optional[_Iterable[int]] = ..., lengths_bytes: _Optional[_Iterable[int]] = ...) -> None: ...

class PackedGetIntoResponse(_message.Message):
    __slots__ = ("matched", "codes", "value_sizes_bytes", "versions", "tiers", "error_positions", "messages")
    MATCHED_FIELD_NUMBER: _ClassVar[int]
    CODES_FIELD_NUMBER: _ClassVar[int]
    VALUE_SIZES_BYTES_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    ERROR_POSITIONS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    matched: int
    codes: _containers.RepeatedScalarFieldContainer[int]
    value_sizes_bytes: _containers.RepeatedScalarFieldContainer[int]
    versions: _containers.RepeatedScalarFieldContainer[int]
    tiers: _containers.RepeatedScalarFieldContainer[_common_pb2.Tier]
    error_positions: _containers.RepeatedScalarFieldContainer[int]
    messages: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, matched: _Optional[int] = ..., codes: _Optional[_Iterable[int]] = ..., value_sizes_bytes: _Optional[_Iterable[int]] = ..., versions: _Optional[_Iterable[int]] = ..., tiers: _Optional[_Iterable[_Union[_common_pb2.Tier, str]]] = ..., error_positions: _Optional[_Iterable[int]] = ..., messages: _Optional[_Iterable[str]] = ...) -> None: ...

class ClientStatRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ClientStatResponse(_message.Message):
    __slots__ = ("client_id", "epoch", "hostname", "name", "master_connected", "master_address", "segments", "key_count", "capacity_bytes", "used_bytes", "buffers_registered", "buffer_bytes", "counters", "version", "metrics_url", "uptime_s", "reserved_bytes", "quarantined_bytes")
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MASTER_CONNECTED_FIELD_NUMBER: _ClassVar[int]
    MASTER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    KEY_COUNT_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    BUFFERS_REGISTERED_FIELD_NUMBER: _ClassVar[int]
    BUFFER_BYTES_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    METRICS_URL_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    RESERVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    QUARANTINED_BYTES_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    epoch: int
    hostname: str
    name: str
    master_connected: bool
    master_address: str
    segments: _containers.RepeatedCompositeFieldContainer[_common_pb2.SegmentInfo]
    key_count: int
    capacity_bytes: int
    used_bytes: int
    buffers_registered: int
    buffer_bytes: int
    counters: _containers.ScalarMap[str, int]
    version: str
    metrics_url: str
    uptime_s: float
    reserved_bytes: int
    quarantined_bytes: int
    def __init__(self, client_id: _Optional[str] = ..., epoch: _Optional[int] = ..., hostname: _Optional[str] = ..., name: _Optional[str] = ..., master_connected: bool = ..., master_address: _Optional[str] = ..., segments: _Optional[_Iterable[_Union[_common_pb2.SegmentInfo, _Mapping]]] = ..., key_count: _Optional[int] = ..., capacity_bytes: _Optional[int] = ..., used_bytes: _Optional[int] = ..., buffers_registered: _Optional[int] = ..., buffer_bytes: _Optional[int] = ..., counters: _Optional[_Mapping[str, int]] = ..., version: _Optional[str] = ..., metrics_url: _Optional[str] = ..., uptime_s: _Optional[float] = ..., reserved_bytes: _Optional[int] = ..., quarantined_bytes: _Optional[int] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ("prefix", "page_size", "page_token")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    prefix: str
    page_size: int
    page_token: str
    def __init__(self, prefix: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListEntry(_message.Message):
    __slots__ = ("key", "value_size_bytes", "version", "replica_count")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REPLICA_COUNT_FIELD_NUMBER: _ClassVar[int]
    key: str
    value_size_bytes: int
    version: int
    replica_count: int
    def __init__(self, key: _Optional[str] = ..., value_size_bytes: _Optional[int] = ..., version: _Optional[int] = ..., replica_count: _Optional[int] = ...) -> None: ...

class ListResponse(_message.Message):
    __slots__ = ("entries", "next_page_token")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[ListEntry]
    next_page_token: str
    def __init__(self, entries: _Optional[_Iterable[_Union[ListEntry, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DirectInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DirectRegion(_message.Message):
    __slots__ = ("segment_id", "segment_name", "path", "region_uuid", "size_bytes")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    REGION_UUID_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    segment_id: int
    segment_name: str
    path: str
    region_uuid: str
    size_bytes: int
    def __init__(self, segment_id: _Optional[int] = ..., segment_name: _Optional[str] = ..., path: _Optional[str] = ..., region_uuid: _Optional[str] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class DirectInfoResponse(_message.Message):
    __slots__ = ("offered", "coherence", "regions", "max_inline_bytes", "index_region_uuid", "index_epoch", "flush_reads")
    OFFERED_FIELD_NUMBER: _ClassVar[int]
    COHERENCE_FIELD_NUMBER: _ClassVar[int]
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_INLINE_BYTES_FIELD_NUMBER: _ClassVar[int]
    INDEX_REGION_UUID_FIELD_NUMBER: _ClassVar[int]
    INDEX_EPOCH_FIELD_NUMBER: _ClassVar[int]
    FLUSH_READS_FIELD_NUMBER: _ClassVar[int]
    offered: bool
    coherence: str
    regions: _containers.RepeatedCompositeFieldContainer[DirectRegion]
    max_inline_bytes: int
    index_region_uuid: str
    index_epoch: int
    flush_reads: str
    def __init__(self, offered: bool = ..., coherence: _Optional[str] = ..., regions: _Optional[_Iterable[_Union[DirectRegion, _Mapping]]] = ..., max_inline_bytes: _Optional[int] = ..., index_region_uuid: _Optional[str] = ..., index_epoch: _Optional[int] = ..., flush_reads: _Optional[str] = ...) -> None: ...

class DirectExtent(_message.Message):
    __slots__ = ("extent", "tier", "direct")
    EXTENT_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    DIRECT_FIELD_NUMBER: _ClassVar[int]
    extent: _common_pb2.Extent
    tier: _common_pb2.Tier
    direct: bool
    def __init__(self, extent: _Optional[_Union[_common_pb2.Extent, _Mapping]] = ..., tier: _Optional[_Union[_common_pb2.Tier, str]] = ..., direct: bool = ...) -> None: ...

class DirectPutStartItem(_message.Message):
    __slots__ = ("key", "value_size_bytes", "options")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    key: str
    value_size_bytes: int
    options: _common_pb2.PutOptions
    def __init__(self, key: _Optional[str] = ..., value_size_bytes: _Optional[int] = ..., options: _Optional[_Union[_common_pb2.PutOptions, _Mapping]] = ...) -> None: ...

class DirectPutStartRequest(_message.Message):
    __slots__ = ("items", "pid")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[DirectPutStartItem]
    pid: int
    def __init__(self, items: _Optional[_Iterable[_Union[DirectPutStartItem, _Mapping]]] = ..., pid: _Optional[int] = ...) -> None: ...

class DirectPutStartResult(_message.Message):
    __slots__ = ("status", "fallback", "put_token", "version", "header_bytes", "extents")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_FIELD_NUMBER: _ClassVar[int]
    PUT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    HEADER_BYTES_FIELD_NUMBER: _ClassVar[int]
    EXTENTS_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    fallback: bool
    put_token: int
    version: int
    header_bytes: int
    extents: _containers.RepeatedCompositeFieldContainer[DirectExtent]
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., fallback: bool = ..., put_token: _Optional[int] = ..., version: _Optional[int] = ..., header_bytes: _Optional[int] = ..., extents: _Optional[_Iterable[_Union[DirectExtent, _Mapping]]] = ...) -> None: ...

class DirectPutStartResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[DirectPutStartResult]
    def __init__(self, results: _Optional[_Iterable[_Union[DirectPutStartResult, _Mapping]]] = ...) -> None: ...

class DirectPutEndItem(_message.Message):
    __slots__ = ("key", "put_token", "checksum", "revoke")
    KEY_FIELD_NUMBER: _ClassVar[int]
    PUT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    REVOKE_FIELD_NUMBER: _ClassVar[int]
    key: str
    put_token: int
    checksum: int
    revoke: bool
    def __init__(self, key: _Optional[str] = ..., put_token: _Optional[int] = ..., checksum: _Optional[int] = ..., revoke: bool = ...) -> None: ...

class DirectPutEndRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[DirectPutEndItem]
    def __init__(self, items: _Optional[_Iterable[_Union[DirectPutEndItem, _Mapping]]] = ...) -> None: ...

class DirectPutEndResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[_common_pb2.Status]
    def __init__(self, results: _Optional[_Iterable[_Union[_common_pb2.Status, _Mapping]]] = ...) -> None: ...

class DirectGetRequest(_message.Message):
    __slots__ = ("keys", "release_lease_ids")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    RELEASE_LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[str]
    release_lease_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, keys: _Optional[_Iterable[str]] = ..., release_lease_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class DirectGetResult(_message.Message):
    __slots__ = ("status", "value_size_bytes", "version", "checksum", "header_bytes", "lease_id", "lease_ttl_ms", "replicas")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    VALUE_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    HEADER_BYTES_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.Status
    value_size_bytes: int
    version: int
    checksum: int
    header_bytes: int
    lease_id: int
    lease_ttl_ms: int
    replicas: _containers.RepeatedCompositeFieldContainer[DirectExtent]
    def __init__(self, status: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., value_size_bytes: _Optional[int] = ..., version: _Optional[int] = ..., checksum: _Optional[int] = ..., header_bytes: _Optional[int] = ..., lease_id: _Optional[int] = ..., lease_ttl_ms: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[DirectExtent, _Mapping]]] = ...) -> None: ...

class DirectGetResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[DirectGetResult]
    def __init__(self, results: _Optional[_Iterable[_Union[DirectGetResult, _Mapping]]] = ...) -> None: ...

class DirectReleaseRequest(_message.Message):
    __slots__ = ("lease_ids", "checksum_failures", "reads_copied_again")
    LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FAILURES_FIELD_NUMBER: _ClassVar[int]
    READS_COPIED_AGAIN_FIELD_NUMBER: _ClassVar[int]
    lease_ids: _containers.RepeatedScalarFieldContainer[int]
    checksum_failures: int
    reads_copied_again: int
    def __init__(self, lease_ids: _Optional[_Iterable[int]] = ..., checksum_failures: _Optional[int] = ..., reads_copied_again: _Optional[int] = ...) -> None: ...

class DirectReleaseResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
