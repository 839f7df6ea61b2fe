"""``MooncakeDistributedStore`` served by cxlkv: Mooncake's Python store API on a cxlkv client.

Every call keeps Mooncake's signature and return convention — integers (0, a
byte count, or a negative :class:`~cxlkv.compat.mooncake.errors.ErrorCode`),
``b""`` for a missing key from ``get``, 1/0/-1 from ``is_exist``, one result per
position from the batch calls — and is carried out by one :class:`cxlkv.Client`
connected to the clientd of this host. docs/compat-mooncake.md lists the calls,
the arguments that are accepted but mean nothing on cxlkv, and the differences.

Memory passed by address (``put_from``, ``get_into``, their batch forms, the
``*_tensor_into`` / ``*_tensor_from`` calls):

* inside cxlkv shared memory — ``alloc_from_mem_pool`` memory, or a
  ``get_buffer`` handle — the call is zero-copy: the daemon copies between that
  memory and the CXL region, nothing else moves;
* anywhere else (numpy arrays, ``ctypes`` buffers, pinned tensors, registered or
  not) the bytes are staged through the SDK's shared pool: one extra memcpy on
  the caller's side (values up to 64 KiB travel inside the request instead).

Thread-safety: as Mooncake's, one store may be shared by threads; calls run in
parallel (each thread gets its own connection to the daemon). ``setup`` and
``close`` must not race with other calls on the same store.
"""

from __future__ import annotations

import ctypes
import logging
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any

from cxlkv.client import DEFAULT_POOL_BYTES, Client, Result
from cxlkv.compat.mooncake.config import ReplicateConfig, put_options
from cxlkv.compat.mooncake.errors import ErrorCode, mooncake_code
from cxlkv.compat.mooncake.memory import (BufferHandle, RangeRegistry, buffer_at, gather_part, make_handle,
                                          part_at, scatter_part)
from cxlkv.compat.mooncake.replicas import ReplicaDescriptor, replica_descriptors
from cxlkv.compat.mooncake.tenants import DEFAULT_TENANT, TenantClient, tenant_prefix
from cxlkv.compat.mooncake.tensor_calls import TensorCalls
from cxlkv.errors import AlreadyExists, CxlkvError, InvalidArgument, NotReady, OutOfRange
from cxlkv.wire.keys import key_error

__all__ = ["MooncakeDistributedStore", "DEFAULT_GLOBAL_SEGMENT_BYTES", "DEFAULT_LOCAL_BUFFER_BYTES",
           "DEFAULT_MASTER_SERVER_ADDR"]

MiB = 1 << 20
#: Mooncake's default ``global_segment_size`` (accepted, not used), in bytes.
DEFAULT_GLOBAL_SEGMENT_BYTES = 16 * MiB
#: Mooncake's default ``local_buffer_size`` (sizes the SDK's shared pool), in bytes.
DEFAULT_LOCAL_BUFFER_BYTES = 16 * MiB
#: Mooncake's default master address (accepted, not used: clientd owns the master link).
DEFAULT_MASTER_SERVER_ADDR = "127.0.0.1:50051"
#: ``get_buffer`` first reads into a pool range this large, in bytes; a larger
#: value is read again into a range of its exact size.
_PROBE_BYTES = 64 << 10
#: Values up to this size are joined in Python memory for ``put_parts`` (the SDK
#: sends them inline), in bytes; larger ones are assembled in shared memory.
_INLINE_PARTS_BYTES = 64 << 10
#: What a call turns into a Mooncake code: the SDK's errors (the daemon's answers,
#: arguments it refuses) and the builtins a malformed argument raises on the way.
_ARG_ERRORS = (CxlkvError, TypeError, ValueError, OverflowError, BufferError)
_INVALID = int(ErrorCode.INVALID_PARAMS)
_NOT_FOUND = int(ErrorCode.OBJECT_NOT_FOUND)
#: Mooncake's default ``client_http_port`` (accepted, not used: clientd serves its own metrics).
DEFAULT_CLIENT_HTTP_PORT = 9300
#: The keys of Mooncake's ``setup(config: dict)``, with their defaults.
_SETUP_DICT_DEFAULTS: dict[str, Any] = {
    "global_segment_size": DEFAULT_GLOBAL_SEGMENT_BYTES,
    "local_buffer_size": DEFAULT_LOCAL_BUFFER_BYTES,
    "protocol": "tcp",
    "rdma_devices": "",
    "master_server_addr": DEFAULT_MASTER_SERVER_ADDR,
    "ipc_socket_path": "",
    "enable_ssd_offload": False,
    "ssd_offload_path": "",
    "tenant_id": DEFAULT_TENANT,
    "enable_client_http_server": False,
    "client_http_port": DEFAULT_CLIENT_HTTP_PORT,
    "cxlkv_socket": None,
    "cxlkv_timeout_s": 30.0,
}
_SETUP_DICT_REQUIRED = ("local_hostname", "metadata_server")
#: Other names engines give ``setup(dict)`` keys (LMCache's MooncakeStoreConfig) -> Mooncake's.
_SETUP_DICT_ALIASES = {"device_name": "rdma_devices", "master_server_address": "master_server_addr"}
_SETUP_DICT_INTS = ("global_segment_size", "local_buffer_size", "client_http_port")
_SETUP_DICT_BOOLS = ("enable_ssd_offload", "enable_client_http_server")
logger = logging.getLogger("cxlkv.compat.mooncake")


def _as_int(name: str, value: Any) -> int:
    """A ``setup(dict)`` size: an int, or a decimal string (LMCache passes strings)."""
    if isinstance(value, bool):
        raise InvalidArgument(f"{name} must be an int, got {value!r}")
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            raise InvalidArgument(f"{name} must be an int, got {value!r}") from None
    return value


def _as_bool(name: str, value: Any) -> bool:
    """A ``setup(dict)`` switch: a bool, 0/1, or ``"true"``/``"false"``/``"1"``/``"0"``."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0", "yes", "no", ""):
        return value.strip().lower() in ("true", "1", "yes")
    raise InvalidArgument(f"{name} must be a bool, got {value!r}")


class MooncakeDistributedStore(TensorCalls):
    """Mooncake's ``MooncakeDistributedStore``, on cxlkv.

    Create it, call :meth:`setup` (Mooncake's arguments; the clientd socket comes
    from ``$CXLKV_SOCKET`` or ``cxlkv_socket=``), use it, :meth:`close` it. Calls
    made before ``setup`` or after ``close`` fail with ``INVALID_PARAMS`` (-600),
    ``b""``, ``None`` or -1, by the call's convention. The tensor calls come
    from :class:`~cxlkv.compat.mooncake.tensor_calls.TensorCalls`.
    """

    def __init__(self) -> None:
        self._client: TenantClient | None = None
        self._hostname = ""
        self._registry = RangeRegistry()
        self._pool_allocs: dict[int, memoryview] = {}
        self._lock = threading.Lock()

    # ================================================================ lifecycle
    def setup(
        self,
        local_hostname: str | dict[str, Any],
        metadata_server: str = "",
        global_segment_size: int = DEFAULT_GLOBAL_SEGMENT_BYTES,
        local_buffer_size: int = DEFAULT_LOCAL_BUFFER_BYTES,
        protocol: str = "tcp",
        rdma_devices: str = "",
        master_server_addr: str = DEFAULT_MASTER_SERVER_ADDR,
        engine: Any = None,
        enable_ssd_offload: bool = False,
        ssd_offload_path: str = "",
        tenant_id: str = DEFAULT_TENANT,
        enable_client_http_server: bool = False,
        client_http_port: int = DEFAULT_CLIENT_HTTP_PORT,
        *,
        cxlkv_socket: str | None = None,
        cxlkv_timeout_s: float = 30.0,
    ) -> int:
        """Connect to the clientd of this host (Mooncake's positional and keyword arguments).

        Also Mooncake's second form, ``setup(config: dict)``: the keys are the
        argument names below (``local_hostname`` and ``metadata_server``
        required; ``ipc_socket_path`` accepted, not used; sizes may be decimal
        strings, switches ``"true"``/``"false"``, as LMCache passes them;
        LMCache's ``device_name`` and ``master_server_address`` stand for
        ``rdma_devices`` and ``master_server_addr``; unknown keys are logged and
        ignored).

        Args:
            local_hostname: this node's name; returned by :meth:`get_hostname`
                (``socket.gethostname()`` when empty). Or the config dict.
            metadata_server: Mooncake's metadata server; accepted, not used.
            global_segment_size: memory Mooncake's client would contribute, in
                bytes; accepted, not used (capacity is the CXL region's, set on the master).
            local_buffer_size: size of the SDK's shared staging pool, in bytes
                (0: the SDK default, 64 MiB). Created lazily; larger values get
                their own shared segment while they are staged.
            protocol: Mooncake's transport (``"tcp"``, ``"rdma"``, …); accepted, not
                used (bytes move by memcpy through the CXL region).
            rdma_devices: accepted, not used.
            master_server_addr: Mooncake's master; accepted, not used (clientd owns
                the link to cxlkv's master).
            engine: a Mooncake ``TransferEngine``; must be ``None``.
            enable_ssd_offload: Mooncake offloads evicted objects to SSD. On cxlkv
                that is the cluster's SSD tier (docs/tiers.md), configured on the
                master: ``True`` is accepted when the cluster has a mounted SSD
                segment, and refused (``INVALID_PARAMS``, -600, with an error
                logged) when it has none — never silently run without offload.
            ssd_offload_path: Mooncake's per-client offload directory; accepted,
                not used (the SSD tier's file is the master's ``[[segments]]`` entry).
            tenant_id: the tenant whose key namespace this store uses; tenants are
                isolated (:mod:`cxlkv.compat.mooncake.tenants`). ``"default"``: keys
                as they are.
            enable_client_http_server: Mooncake's per-client metrics endpoint;
                accepted, not used (each clientd serves ``/metrics`` itself).
            client_http_port: accepted, not used.
            cxlkv_socket: the clientd's gRPC socket; default ``$CXLKV_SOCKET``, else
                the daemon's default path.
            cxlkv_timeout_s: longest wait for one answer from the daemon, in seconds.

        Returns:
            0, or ``RPC_FAIL`` (-900) when no clientd answers on the socket,
            ``INVALID_PARAMS`` (-600) for a bad argument or an SSD offload the
            cluster cannot give. A second ``setup`` closes the first connection.
        """
        if isinstance(local_hostname, dict):
            return self._setup_dict(local_hostname)
        try:
            if engine is not None:
                raise InvalidArgument("a Mooncake TransferEngine cannot be used with cxlkv; pass engine=None")
            sizes = {"global_segment_size": global_segment_size, "local_buffer_size": local_buffer_size,
                     "client_http_port": client_http_port}
            for name, size in sizes.items():
                if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                    raise InvalidArgument(f"{name} must be an int >= 0, got {size!r}")
            texts = {"local_hostname": local_hostname, "metadata_server": metadata_server, "protocol": protocol,
                     "rdma_devices": rdma_devices, "master_server_addr": master_server_addr,
                     "ssd_offload_path": ssd_offload_path, "tenant_id": tenant_id}
            for name, text in texts.items():
                if not isinstance(text, str):
                    raise InvalidArgument(f"{name} must be a str, got {type(text).__name__}")
            for name, flag in {"enable_ssd_offload": enable_ssd_offload,
                               "enable_client_http_server": enable_client_http_server}.items():
                if not isinstance(flag, (bool, int)):
                    raise InvalidArgument(f"{name} must be a bool, got {flag!r}")
            tenant_prefix(tenant_id)  # a bad tenant is refused before connecting
            client = Client(cxlkv_socket, timeout_s=cxlkv_timeout_s,
                            buffer_pool_bytes=local_buffer_size or DEFAULT_POOL_BYTES)
            try:
                tenant = TenantClient(client, tenant_id)
                if enable_ssd_offload:
                    self._check_ssd_tier(client)
            except BaseException:
                client.close()
                raise
        except _ARG_ERRORS as exc:
            logger.error("MooncakeDistributedStore.setup refused: %s", exc)
            return mooncake_code(exc)
        self._adopt(tenant, local_hostname or socket.gethostname())
        return 0

    def _adopt(self, client: TenantClient, hostname: str) -> None:
        """Make ``client`` this store's connection (closing the one before)."""
        with self._lock:
            old, self._client = self._client, client
            self._hostname = hostname
            self._pool_allocs.clear()
            self._registry.clear()
        if old is not None:
            old.close()

    @staticmethod
    def _check_ssd_tier(client: Any) -> None:
        """Raise unless the cluster has a mounted SSD segment (what ``enable_ssd_offload`` maps to)."""
        segments = client.stat().get("segments", [])
        if not any(seg.get("tier") == "SSD" and seg.get("mounted", True) for seg in segments):
            raise InvalidArgument(
                "enable_ssd_offload=True: this cxlkv cluster has no SSD tier. cxlkv offloads to SSD through "
                "the master's SSD segment ([[segments]] with tier = \"ssd\", docs/tiers.md), not through a "
                "per-client directory; configure one, or start the engine without SSD offload")

    def _setup_dict(self, config: dict[str, Any]) -> int:
        """``setup(config: dict)``: Mooncake's keyword form (see :meth:`setup`)."""
        try:
            config = {_SETUP_DICT_ALIASES.get(k, k): v for k, v in config.items()
                      if not (k in _SETUP_DICT_ALIASES and _SETUP_DICT_ALIASES[k] in config)}
            missing = [k for k in _SETUP_DICT_REQUIRED if k not in config]
            if missing:
                raise InvalidArgument(f"setup(config): missing required key(s) {', '.join(missing)}")
            unknown = sorted(set(config) - set(_SETUP_DICT_DEFAULTS) - set(_SETUP_DICT_REQUIRED))
            if unknown:
                logger.warning("MooncakeDistributedStore.setup(config): ignoring unknown key(s) %s",
                               ", ".join(unknown))
            opts = {**_SETUP_DICT_DEFAULTS, **{k: v for k, v in config.items() if k not in unknown}}
            for name in _SETUP_DICT_INTS:
                opts[name] = _as_int(name, opts[name])
            for name in _SETUP_DICT_BOOLS:
                opts[name] = _as_bool(name, opts[name])
        except InvalidArgument as exc:
            logger.error("MooncakeDistributedStore.setup refused: %s", exc)
            return mooncake_code(exc)
        return self.setup(
            opts["local_hostname"], opts["metadata_server"], opts["global_segment_size"],
            opts["local_buffer_size"], opts["protocol"], opts["rdma_devices"], opts["master_server_addr"],
            None, opts["enable_ssd_offload"], opts["ssd_offload_path"], opts["tenant_id"],
            opts["enable_client_http_server"], opts["client_http_port"],
            cxlkv_socket=opts["cxlkv_socket"], cxlkv_timeout_s=opts["cxlkv_timeout_s"])

    def setup_dummy(self, mem_pool_size: int, local_buffer_size: int, server_address: str) -> int:
        """Mooncake's standalone-storage mode: this process holds no store of its own.

        In Mooncake a *dummy* client forwards every call to a standalone
        ``mooncake_client`` process at ``server_address``, which owns the
        memory; the engine's host pool (``MooncakeHostMemAllocator``) is shared
        with it. On cxlkv that process is the clientd of this host, which is
        always standalone: this is :meth:`setup` on it, and
        :class:`~cxlkv.compat.mooncake.allocator.MooncakeHostMemAllocator`
        memory is shared with it (zero-copy).

        Args:
            mem_pool_size: bytes of host pool the engine will use; accepted, not used.
            local_buffer_size: as in :meth:`setup` (size of the staging pool), in bytes.
            server_address: the standalone client's address. A clientd socket
                path (``/…`` or ``unix:/…``) is used as the socket; a ``host:port``
                is accepted, not used (the clientd of this host, from
                ``$CXLKV_SOCKET`` or the default path).

        Returns:
            As :meth:`setup`.
        """
        if isinstance(mem_pool_size, bool) or not isinstance(mem_pool_size, int) or mem_pool_size < 0:
            return _INVALID
        if not isinstance(server_address, str):
            return _INVALID
        path = server_address[len("unix:"):] if server_address.startswith("unix:") else server_address
        return self.setup(socket.gethostname(), "", 0, local_buffer_size, "tcp", "", DEFAULT_MASTER_SERVER_ADDR,
                          cxlkv_socket=path if path.startswith("/") else None)

    def init_all(self, protocol: str, device_name: str, mount_segment_size: int = DEFAULT_GLOBAL_SEGMENT_BYTES) -> int:
        """Mooncake's one-call initialisation: :meth:`setup` with this host's name.

        Args:
            protocol: accepted, not used.
            device_name: accepted, not used.
            mount_segment_size: accepted, not used, in bytes.

        Returns:
            As :meth:`setup`.
        """
        return self.setup(socket.gethostname(), "", mount_segment_size, DEFAULT_LOCAL_BUFFER_BYTES,
                          protocol, device_name, DEFAULT_MASTER_SERVER_ADDR)

    def close(self) -> int:
        """Close the connection and release shared memory (idempotent).

        ``alloc_from_mem_pool`` addresses and ``get_buffer`` handles must not be
        used afterwards. Objects stay in the store: they outlive their writer.

        Returns:
            0.
        """
        with self._lock:
            client, self._client = self._client, None
            self._pool_allocs.clear()
            self._registry.clear()
        if client is not None:
            client.close()
        return 0

    def get_hostname(self) -> str:
        """The ``local_hostname`` given to :meth:`setup` (``""`` before it)."""
        return self._hostname

    # ============================================================== plumbing
    def _status(self, fn: Callable[[Any], object], *, exists_ok: bool = False) -> int:
        """Run ``fn(client)``: 0 on success, else its error's Mooncake code.

        With ``exists_ok`` (the plain writes) ``ALREADY_EXISTS`` answers 0, as in
        Mooncake: the committed value is kept and the write counts as done.
        """
        client = self._client
        if client is None:
            return _INVALID
        try:
            fn(client)
        except AlreadyExists as exc:
            return 0 if exists_ok else mooncake_code(exc)
        except _ARG_ERRORS as exc:
            return mooncake_code(exc)
        return 0

    def _value(self, fn: Callable[[Any], int]) -> int:
        """``fn(client)`` (a count or size >= 0), or the Mooncake code of its error."""
        client = self._client
        if client is None:
            return _INVALID
        try:
            return int(fn(client))
        except _ARG_ERRORS as exc:
            return mooncake_code(exc)

    def _put_codes(self, keys: list[str], results: list[Result], retry: Callable[[int], int]) -> list[int]:
        """Per-position codes of a batch write.

        ``ALREADY_EXISTS`` answers 0 (the committed value is kept). A position
        refused because an earlier position of the same batch wrote the same key
        (still in flight then) is written again on its own, so the batch behaves
        as its positions written in order.
        """
        seen: set[str] = set()
        out: list[int] = []
        for i, (k, r) in enumerate(zip(keys, results)):
            if r.ok or isinstance(r.error, AlreadyExists):
                out.append(0)
            elif isinstance(r.error, NotReady) and k in seen:
                out.append(retry(i))
            else:
                out.append(mooncake_code(r.error) if r.error is not None else int(ErrorCode.INTERNAL_ERROR))
            seen.add(k)
        return out

    @staticmethod
    def _same_length(*lists: Sequence[Any]) -> bool:
        try:
            return len({len(x) for x in lists}) == 1
        except TypeError:
            return False

    @staticmethod
    def _groups_fit(config: ReplicateConfig | None, n: int) -> bool:
        """A batch's ``config.group_ids`` is empty or names one group per key (as Mooncake checks)."""
        groups = getattr(config, "group_ids", None)
        return not groups or not hasattr(groups, "__len__") or len(groups) == n

    def _views(self, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int]
               ) -> tuple[list[int], list[Any], list[int]]:
        """Views of each ``(ptr, size)``; positions with a bad range get ``INVALID_PARAMS``."""
        codes = [0] * len(keys)
        views: list[Any] = [None] * len(keys)
        for i, (p, n) in enumerate(zip(ptrs, sizes)):
            try:
                views[i] = buffer_at(p, n)
            except InvalidArgument:
                codes[i] = _INVALID
        return codes, views, [i for i, c in enumerate(codes) if c == 0]

    def _prepare_batch(self, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int]
                       ) -> tuple[Any, list[str], list[int], list[Any], list[int]]:
        """Shared start of the zero-copy batch calls: ``(client, keys, codes, views, ok)``.

        ``client`` is ``None`` when no position can proceed (lists of different
        lengths, store not set up, or every range invalid); ``codes`` is then the
        answer. Otherwise ``ok`` lists the positions whose ``views`` are usable.
        """
        n = len(keys) if hasattr(keys, "__len__") else 0
        if not self._same_length(keys, ptrs, sizes) or self._client is None:
            return None, [], [_INVALID] * n, [], []
        keys = list(keys)
        codes, views, ok = self._views(keys, ptrs, sizes)
        return (self._client if ok else None), keys, codes, views, ok

    # ================================================================ writes
    def put(self, key: str, value: Any, config: ReplicateConfig | None = None) -> int:
        """Store ``value`` under ``key``.

        Args:
            key: 1-4096 UTF-8 bytes, no NUL.
            value: any C-contiguous bytes-like object (0 bytes is a value).
            config: replication and pin options.

        Returns:
            0 on success, also when ``key`` is already committed (its value is kept,
            as in Mooncake); else a negative code, e.g. ``NO_AVAILABLE_HANDLE`` (-200)
            when no segment can hold it, ``INVALID_KEY`` (-400).
        """
        return self._status(lambda c: c.put(key, value, **put_options(config)), exists_ok=True)

    def upsert(self, key: str, value: Any, config: ReplicateConfig | None = None) -> int:
        """Store ``value`` under ``key``, replacing a committed value atomically.

        Returns:
            0 or a negative code. Readers of the old version keep reading it until
            their lease ends.
        """
        return self._status(lambda c: c.put(key, value, upsert=True, **put_options(config)))

    def put_parts(self, key: str, *parts: Any, config: ReplicateConfig | None = None) -> int:
        """Store the concatenation of ``parts`` under ``key``.

        Parts up to 64 KiB in all are joined in Python memory; larger ones are
        assembled once in shared memory and stored from there (one copy).

        Returns:
            0 (also when ``key`` is already committed) or a negative code.
        """
        return self._status(lambda c: self._put_joined(c, key, parts, upsert=False, config=config),
                            exists_ok=True)

    def upsert_parts(self, key: str, *parts: Any, config: ReplicateConfig | None = None) -> int:
        """:meth:`put_parts` that replaces a committed value. Returns 0 or a negative code."""
        return self._status(lambda c: self._put_joined(c, key, parts, upsert=True, config=config))

    @staticmethod
    def _put_joined(c: Client, key: str, parts: Sequence[Any], *, upsert: bool,
                    config: ReplicateConfig | None) -> None:
        opts = put_options(config)
        views = [memoryview(p).cast("B") for p in parts]
        total = sum(v.nbytes for v in views)
        if total <= _INLINE_PARTS_BYTES:
            c.put(key, b"".join(views), upsert=upsert, **opts)
            return
        buf = c.buffer(total)
        off = 0
        for v in views:
            buf[off:off + v.nbytes] = v
            off += v.nbytes
        c.put_from(key, buf, upsert=upsert, **opts)

    def put_batch(self, keys: Sequence[str], values: Sequence[Any], config: ReplicateConfig | None = None) -> int:
        """Store ``values[i]`` under ``keys[i]``.

        Returns:
            0 when every position succeeded (already committed keys count as
            success), else the first position's negative code; ``INVALID_PARAMS``
            (-600) when the lists differ in length.
        """
        codes = self._write_batch(keys, values, upsert=False, config=config)
        if codes is None:
            return _INVALID
        return next((x for x in codes if x), 0)

    def upsert_batch(self, keys: Sequence[str], values: Sequence[Any], config: ReplicateConfig | None = None) -> int:
        """:meth:`put_batch` that replaces committed values. Returns 0 or the first negative code."""
        codes = self._write_batch(keys, values, upsert=True, config=config)
        if codes is None:
            return _INVALID
        return next((x for x in codes if x), 0)

    def _write_batch(self, keys: Sequence[str], values: Sequence[Any], *, upsert: bool,
                     config: ReplicateConfig | None) -> list[int] | None:
        """Per-position codes of a bytes-valued batch write; ``None`` for mismatched lists."""
        if not self._same_length(keys, values) or not self._groups_fit(config, len(keys)):
            return None
        client = self._client
        if client is None:
            return [_INVALID] * len(keys)
        keys = list(keys)
        values = list(values)
        try:
            opts = put_options(config)
            results = client.put_many(list(zip(keys, values)), upsert=upsert, **opts)
        except _ARG_ERRORS as exc:
            return [mooncake_code(exc)] * len(keys)

        def again(i: int) -> int:
            if upsert:
                return self._status(lambda c: c.put(keys[i], values[i], upsert=True, **opts))
            return self._status(lambda c: c.put(keys[i], values[i], **opts), exists_ok=True)

        return self._put_codes(keys, results, again)

    # ====================================================== zero-copy writes
    def put_from(self, key: str, buffer_ptr: int, size: int, config: ReplicateConfig | None = None) -> int:
        """Store ``size`` bytes at address ``buffer_ptr`` under ``key``.

        Zero-copy when the memory lies in cxlkv shared memory
        (:meth:`alloc_from_mem_pool`, a :meth:`get_buffer` handle); staged through
        the shared pool (one memcpy) otherwise. The memory need not be registered.

        Returns:
            0 (also when ``key`` is already committed) or a negative code;
            ``INVALID_PARAMS`` (-600) for a null address or a negative size.
        """
        return self._status(lambda c: c.put_from(key, buffer_at(buffer_ptr, size), **put_options(config)),
                            exists_ok=True)

    def upsert_from(self, key: str, buffer_ptr: int, size: int, config: ReplicateConfig | None = None) -> int:
        """:meth:`put_from` that replaces a committed value. Returns 0 or a negative code."""
        return self._status(lambda c: c.put_from(key, buffer_at(buffer_ptr, size), upsert=True,
                                                 **put_options(config)))

    def batch_put_from(self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int],
                       config: ReplicateConfig | None = None) -> list[int]:
        """Store ``sizes[i]`` bytes at ``buffer_ptrs[i]`` under ``keys[i]``.

        Returns:
            One code per key: 0 (also for already committed keys) or negative.
            Every position is ``INVALID_PARAMS`` (-600) when the lists differ in length.
        """
        return self._write_from_batch(keys, buffer_ptrs, sizes, upsert=False, config=config)

    def batch_upsert_from(self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int],
                          config: ReplicateConfig | None = None) -> list[int]:
        """:meth:`batch_put_from` that replaces committed values. One code per key."""
        return self._write_from_batch(keys, buffer_ptrs, sizes, upsert=True, config=config)

    def _write_from_batch(self, keys: Sequence[str], ptrs: Sequence[int], sizes: Sequence[int], *,
                          upsert: bool, config: ReplicateConfig | None) -> list[int]:
        client, keys, codes, views, ok = self._prepare_batch(keys, ptrs, sizes)
        if client is None:
            return codes
        if not self._groups_fit(config, len(keys)):
            return [_INVALID] * len(keys)
        try:
            opts = put_options(config)
            results = client.put_from_many([keys[i] for i in ok], [views[i] for i in ok], upsert=upsert, **opts)
        except _ARG_ERRORS as exc:
            for i in ok:
                codes[i] = mooncake_code(exc)
            return codes

        def again(j: int) -> int:
            i = ok[j]
            if upsert:
                return self._status(lambda c: c.put_from(keys[i], views[i], upsert=True, **opts))
            return self._status(lambda c: c.put_from(keys[i], views[i], **opts), exists_ok=True)

        for i, code in zip(ok, self._put_codes([keys[i] for i in ok], results, again)):
            codes[i] = code
        return codes

    def batch_put_from_multi_buffers(self, keys: Sequence[str], all_buffer_ptrs: Sequence[Sequence[int]],
                                     all_sizes: Sequence[Sequence[int]],
                                     config: ReplicateConfig | None = None) -> list[int]:
        """Store, under ``keys[i]``, the concatenation of the buffers ``all_buffer_ptrs[i]``.

        Each value is gathered once into shared memory and the batch is then stored
        from there zero-copy (one memcpy per value in all).

        Returns:
            One code per key: 0 (also for already committed keys) or negative;
            ``INVALID_PARAMS`` (-600) at a position whose pointer and size lists
            differ in length, and at every position when the three lists do.
        """
        n = len(keys) if hasattr(keys, "__len__") else 0
        if not self._same_length(keys, all_buffer_ptrs, all_sizes) or not self._groups_fit(config, n):
            return [_INVALID] * n
        client = self._client
        if client is None:
            return [_INVALID] * n
        keys = list(keys)
        codes = [0] * n
        values: list[Any] = [None] * n
        try:
            opts = put_options(config)
            for i, (ptrs, sizes) in enumerate(zip(all_buffer_ptrs, all_sizes)):
                if not self._same_length(ptrs, sizes):
                    codes[i] = _INVALID
                    continue
                try:
                    parts = [part_at(p, size) for p, size in zip(ptrs, sizes)]
                except InvalidArgument:
                    codes[i] = _INVALID
                    continue
                buf = client.buffer(sum(sizes))
                off = 0
                for v, size in zip(parts, sizes):
                    gather_part(buf[off:off + size], v)
                    off += size
                values[i] = buf
            ok = [i for i in range(n) if codes[i] == 0]
            results = client.put_from_many([keys[i] for i in ok], [values[i] for i in ok], **opts) if ok else []
        except _ARG_ERRORS as exc:
            return [c or mooncake_code(exc) for c in codes]

        def again(j: int) -> int:
            i = ok[j]
            return self._status(lambda c: c.put_from(keys[i], values[i], **opts), exists_ok=True)

        for i, code in zip(ok, self._put_codes([keys[i] for i in ok], results, again)):
            codes[i] = code
        return codes

    # ================================================================= reads
    def get(self, key: str) -> bytes:
        """The value of ``key``, or ``b""`` when it is missing or cannot be read.

        An empty value also reads as ``b""``; :meth:`is_exist` tells them apart.
        """
        client = self._client
        if client is None:
            return b""
        try:
            return client.get(key)
        except _ARG_ERRORS:
            return b""

    def get_batch(self, keys: Sequence[str]) -> list[bytes]:
        """The value of each key; ``b""`` at positions that are missing or fail."""
        client = self._client
        keys = list(keys)
        if client is None:
            return [b""] * len(keys)
        try:
            results = client.get_many(keys)
        except _ARG_ERRORS:
            return [b""] * len(keys)
        return [r.value if r.ok else b"" for r in results]

    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        """Copy the value of ``key`` to the ``size`` bytes at address ``buffer_ptr``.

        Zero-copy into cxlkv shared memory; staged (one memcpy) into other memory.

        Returns:
            The value's size in bytes (>= 0), or a negative code:
            ``OBJECT_NOT_FOUND`` (-704), ``INVALID_PARAMS`` (-600) when the value is
            larger than ``size`` or the address is null.
        """
        return self._value(lambda c: c.get_into(key, buffer_at(buffer_ptr, size)))

    def batch_get_into(self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int]) -> list[int]:
        """:meth:`get_into` for each position.

        Returns:
            One result per key: bytes read (>= 0) or a negative code. Every position
            is ``INVALID_PARAMS`` (-600) when the lists differ in length.
        """
        client, keys, codes, views, ok = self._prepare_batch(keys, buffer_ptrs, sizes)
        if client is None:
            return codes
        try:
            results = client.get_into_many([keys[i] for i in ok], [views[i] for i in ok])
        except _ARG_ERRORS as exc:
            for i in ok:
                codes[i] = mooncake_code(exc)
            return codes
        for i, r in zip(ok, results):
            codes[i] = int(r.value) if r.ok else mooncake_code(r.error) if r.error else _NOT_FOUND
        return codes

    def batch_get_into_multi_buffers(self, keys: Sequence[str], all_buffer_ptrs: Sequence[Sequence[int]],
                                     all_sizes: Sequence[Sequence[int]],
                                     prefer_alloc_in_same_node: bool = False) -> list[int]:
        """Read each ``keys[i]`` and scatter its bytes, in order, over the buffers ``all_buffer_ptrs[i]``.

        Each value is read by the daemon into shared memory and scattered from
        there (one memcpy per value). ``prefer_alloc_in_same_node`` is accepted, not used.

        Returns:
            One result per key: bytes read (>= 0) or a negative code
            (``INVALID_PARAMS`` (-600) when the value is larger than the buffers
            together, or the lists differ in length).
        """
        n = len(keys) if hasattr(keys, "__len__") else 0
        if not self._same_length(keys, all_buffer_ptrs, all_sizes):
            return [_INVALID] * n
        client = self._client
        if client is None:
            return [_INVALID] * n
        keys = list(keys)
        codes = [0] * n
        targets: list[list[Any]] = [[] for _ in range(n)]
        bufs: list[Any] = [None] * n
        try:
            for i, (ptrs, sizes) in enumerate(zip(all_buffer_ptrs, all_sizes)):
                if not self._same_length(ptrs, sizes):
                    codes[i] = _INVALID
                    continue
                try:
                    targets[i] = [(part_at(p, size), size) for p, size in zip(ptrs, sizes)]
                except InvalidArgument:
                    codes[i] = _INVALID
                    continue
                bufs[i] = client.buffer(sum(sizes))
            ok = [i for i in range(n) if codes[i] == 0]
            results = client.get_into_many([keys[i] for i in ok], [bufs[i] for i in ok]) if ok else []
        except _ARG_ERRORS as exc:
            return [c or mooncake_code(exc) for c in codes]
        for i, r in zip(ok, results):
            if not r.ok:
                codes[i] = mooncake_code(r.error) if r.error else _NOT_FOUND
                continue
            got, off = int(r.value), 0
            for v, size in targets[i]:
                take = min(size, got - off)
                if take <= 0:
                    break
                scatter_part(v, bufs[i][off:off + take])
                off += take
            codes[i] = got
        return codes

    def get_buffer(self, key: str) -> BufferHandle | None:
        """The value of ``key`` in cxlkv shared memory, or ``None`` when missing.

        The handle has ``ptr()``, ``size()``, ``len()`` and the buffer protocol.
        Values over 64 KiB are copied once, by the daemon, straight from the CXL
        region into the handle's memory, and the handle's address can be passed to
        :meth:`put_from` zero-copy. The memory is freed when the handle is.
        """
        client = self._client
        if client is None:
            return None
        try:
            capacity = _PROBE_BYTES
            for _ in range(3):  # the value may be replaced by a larger one meanwhile
                buf = client.buffer(capacity)
                try:
                    n = client.get_into(key, buf)
                except OutOfRange as exc:
                    if not exc.requested_bytes:
                        return None
                    capacity = exc.requested_bytes
                    continue
                if capacity == _PROBE_BYTES:
                    return make_handle(bytearray(buf[:n]))  # small: one copy, the probe range is released
                return make_handle(buf[:n])
        except _ARG_ERRORS:
            return None
        return None

    def batch_get_buffer(self, keys: Sequence[str]) -> list[BufferHandle | None]:
        """A :class:`BufferHandle` per key (``None`` where missing), read in one batch."""
        client = self._client
        keys = list(keys)
        if client is None:
            return [None] * len(keys)
        try:
            results = client.get_many(keys)
        except _ARG_ERRORS:
            return [None] * len(keys)
        return [make_handle(r.value) if r.ok else None for r in results]

    def get_size(self, key: str) -> int:
        """The size in bytes of the committed value of ``key``, or a negative code.

        Asks the master's key index (no lease is taken). Returns ``OBJECT_NOT_FOUND``
        (-704) for a missing key, ``INVALID_KEY`` (-400) for an invalid one.
        """
        why = key_error(key)
        if why is not None:
            return int(ErrorCode.INVALID_KEY)

        def size(c: Client) -> int:
            it = c.list(key, page_size=1)
            try:
                first = next(it, None)
            finally:
                it.close()  # type: ignore[attr-defined]
            return first.size_bytes if first is not None and first.key == key else _NOT_FOUND

        return self._value(size)

    # ============================================================ existence
    def is_exist(self, key: str) -> int:
        """1 if ``key`` is committed, 0 if not, -1 on error (an invalid key, no daemon)."""
        client = self._client
        if client is None:
            return -1
        try:
            return 1 if client.exists(key) else 0
        except _ARG_ERRORS:
            return -1

    def batch_is_exist(self, keys: Sequence[str]) -> list[int]:
        """:meth:`is_exist` for each key (1, 0 or -1 per position)."""
        client = self._client
        keys = list(keys)
        if client is None:
            return [-1] * len(keys)
        valid = [i for i, k in enumerate(keys) if key_error(k) is None]
        out = [-1] * len(keys)
        try:
            found = client.exists_many([keys[i] for i in valid])
        except _ARG_ERRORS:
            return out
        for i, f in zip(valid, found):
            out[i] = 1 if f else 0
        return out

    # =============================================================== removal
    def remove(self, key: str, force: bool = False) -> int:
        """Remove ``key``.

        Args:
            key: the key.
            force: remove even while a reader holds a lease (its bytes stay until the lease ends).

        Returns:
            0, ``OBJECT_NOT_FOUND`` (-704), ``OBJECT_HAS_LEASE`` (-706) while a read
            is copying it, or another negative code.
        """
        return self._status(lambda c: c.remove(key, force=bool(force)))

    def batch_remove(self, keys: Sequence[str], force: bool = False) -> list[int]:
        """:meth:`remove` for each key; one code per position."""
        client = self._client
        keys = list(keys)
        if client is None:
            return [_INVALID] * len(keys)
        try:
            results = client.remove_many(keys, force=bool(force))
        except _ARG_ERRORS as exc:
            return [mooncake_code(exc)] * len(keys)
        return [0 if r.ok else mooncake_code(r.error) if r.error else _NOT_FOUND for r in results]

    def remove_by_regex(self, regex_pattern: str) -> int:
        """Remove every object whose key matches ``regex_pattern`` (an RE2 pattern,
        searched in the key; an empty pattern matches every key).

        Returns:
            Objects removed (leased ones are skipped), or a negative code
            (``INVALID_PARAMS`` (-600) for a pattern that does not compile).
        """
        if not isinstance(regex_pattern, str):
            return _INVALID
        return self._value(lambda c: c.remove_all(regex=regex_pattern))

    def remove_all(self, force: bool = False) -> int:
        """Remove every object of this store's tenant.

        Args:
            force: also objects a reader holds a lease on (their bytes stay until the
                read ends), as Mooncake's ``force`` skips its lease checks.

        Returns:
            The count removed (leased objects skipped unless ``force``), or -1 on error.
        """
        n = self._value(lambda c: c.remove_all(force=bool(force)))
        return n if n >= 0 else -1

    # ============================================================ replicas
    def get_replica_desc(self, key: str) -> list[ReplicaDescriptor]:
        """The replicas of ``key`` (empty when it is missing or on error).

        One :class:`~cxlkv.compat.mooncake.replicas.ReplicaDescriptor` per
        committed replica, from the master's key index (no lease is taken). See
        :mod:`cxlkv.compat.mooncake.replicas` for what a descriptor holds on cxlkv.
        """
        client = self._client
        if client is None or key_error(key) is not None:
            return []
        try:
            return replica_descriptors(client, [key]).get(key, [])
        except _ARG_ERRORS:
            return []

    def batch_get_replica_desc(self, keys: Sequence[str]) -> dict[str, list[ReplicaDescriptor]]:
        """``{key: [ReplicaDescriptor, ...]}`` for the keys that exist (missing keys are absent)."""
        client = self._client
        if client is None:
            return {}
        try:
            keys = [k for k in keys if key_error(k) is None]
            return replica_descriptors(client, keys)
        except _ARG_ERRORS:
            return {}

    # ===================================================== registered memory
    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        """Register ``size`` bytes at ``buffer_ptr`` for the zero-copy calls.

        On cxlkv registration is optional: any address works with ``put_from`` /
        ``get_into``. It is recorded (so :meth:`unregister_buffer` answers as in
        Mooncake) and checked; which memory is zero-copy is decided by address
        (see the module docstring).

        Returns:
            0 (also for a repeated registration of the same range), or
            ``INVALID_PARAMS`` (-600) for a null address, a zero size or an overlap.
        """
        try:
            self._registry.add(buffer_ptr, size)
        except InvalidArgument:
            return _INVALID
        return 0

    def unregister_buffer(self, buffer_ptr: int) -> int:
        """Forget the range registered at ``buffer_ptr``. Returns 0 or ``INVALID_PARAMS`` (-600)."""
        try:
            self._registry.remove(buffer_ptr)
        except InvalidArgument:
            return _INVALID
        return 0

    def alloc_from_mem_pool(self, size: int) -> int:
        """``size`` bytes of cxlkv shared memory for zero-copy calls.

        The memory lies in a buffer the daemon has mapped: ``put_from`` /
        ``get_into`` on it move no bytes except the daemon's one copy to or from
        the CXL region. It lives until :meth:`free_to_mem_pool` or :meth:`close`.

        Returns:
            The address of the first byte, or 0 when it cannot be allocated.
        """
        client = self._client
        if client is None or isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            return 0
        try:
            mv = client.buffer(size)
        except _ARG_ERRORS:
            return 0
        addr = ctypes.addressof(ctypes.c_char.from_buffer(mv))
        with self._lock:
            self._pool_allocs[addr] = mv
        return addr

    def free_to_mem_pool(self, buffer_ptr: int) -> int:
        """Release memory from :meth:`alloc_from_mem_pool` (a cxlkv extension).

        Returns:
            0, or ``INVALID_PARAMS`` (-600) when ``buffer_ptr`` was not allocated there.
        """
        with self._lock:
            mv = self._pool_allocs.pop(buffer_ptr, None)
        return 0 if mv is not None else _INVALID

    # ================================================================= misc
    def __enter__(self) -> "MooncakeDistributedStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = repr(self._client) if self._client is not None else "not set up"
        return f"<MooncakeDistributedStore (cxlkv) {state}>"
