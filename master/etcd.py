"""A small asyncio client of etcd's v3 gRPC API: what leader election needs.

cxlkv speaks etcd's own wire API through stubs generated (``make proto``) from
``proto/cxlkv/etcd/etcd_v3.proto``, a subset of etcd's ``rpc.proto`` and
``kv.proto`` with etcd's names and field numbers. Why not a Python etcd client
library: the maintained ones either pin old protobuf runtimes (python-etcd3
ships stubs generated for protobuf 3 and is unmaintained since 2020) or bring
their own grpc stack and event loop conventions; the five calls used here are a
page of code on the grpcio that cxlkv already depends on (docs/ha.md).

Calls used (etcd API reference, https://etcd.io/docs/v3.4/learning/api/):

* ``Lease.LeaseGrant`` / ``LeaseKeepAlive`` (a bidirectional stream) /
  ``LeaseRevoke``: the leader's lease; etcd deletes every key attached to it
  when it is not kept alive for its TTL;
* ``KV.Txn`` with a ``create_revision == 0`` compare: put-if-absent (the
  campaign), and compare-and-swap on a key's ``mod_revision``;
* ``KV.Range`` / ``KV.Put``: the cluster metadata and epoch keys;
* ``Watch.Watch``: standbys wait for the leader key's deletion.

Every call has a deadline (``timeout_s``); an unreachable etcd raises
:class:`cxlkv.errors.Unavailable` naming the endpoints.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator, NamedTuple, Sequence

import grpc

from cxlkv.errors import Unavailable
from cxlkv.etcd import etcd_v3_pb2 as pb
from cxlkv.etcd import etcd_v3_pb2_grpc as pbg

__all__ = ["EtcdClient", "KeyValue", "WatchEvent"]

log = logging.getLogger("cxlkv.master")


class KeyValue(NamedTuple):
    """One etcd key: ``value`` bytes; revisions as etcd counts them (0: absent)."""

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int


class WatchEvent(NamedTuple):
    """One change of a watched key: ``deleted`` or put, and the new value (b"" when deleted)."""

    deleted: bool
    key: bytes
    value: bytes
    revision: int


def _kv(m: Any) -> KeyValue:
    return KeyValue(m.key, m.value, m.create_revision, m.mod_revision, m.lease)


def _target(endpoints: Sequence[str]) -> str:
    """One gRPC target over every endpoint (``ipv4:`` lists when all are IPv4 literals:
    gRPC's pick_first then tries the next endpoint when one is down)."""
    hosts = [e.rpartition(":")[0] for e in endpoints]
    if len(endpoints) > 1 and all(h.replace(".", "").isdigit() for h in hosts):
        return "ipv4:" + ",".join(endpoints)
    return endpoints[0]


class EtcdClient:
    """An etcd v3 connection (one gRPC channel).

    Args:
        endpoints: client addresses of the etcd members: ``host:port`` or
            ``http://host:port`` (plaintext), ``https://host:port`` (mutual TLS
            with ``tls``: etcd started with ``--client-cert-auth`` and the
            cluster CA as ``--trusted-ca-file``).
        tls: this part's :class:`cxlkv.wire.tls.TlsFiles` (used for https endpoints).

    Raises:
        ConfigError: https endpoints without TLS files.
        timeout_s: deadline of each unary call, seconds.

    Thread-safety: event-loop confined.
    """

    def __init__(self, endpoints: Sequence[str], *, timeout_s: float = 2.0, tls: Any = None) -> None:
        if not endpoints:
            raise ValueError("no etcd endpoints")
        self.tls_required = any(e.startswith("https://") for e in endpoints)
        # etcd's own URL form (http(s)://host:port) is accepted: the scheme says plaintext or TLS
        self.endpoints = [e.split("://", 1)[-1].rstrip("/") for e in endpoints]
        self.timeout_s = timeout_s
        options = [
            ("grpc.enable_http_proxy", 0),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 250),
            ("grpc.min_reconnect_backoff_ms", 500),
        ]
        if self.tls_required:
            from cxlkv.errors import ConfigError
            from cxlkv.wire.tls import grpc_channel_credentials

            if tls is None or not tls.enabled:
                raise ConfigError("etcd_endpoints: https:// endpoints need this part's TLS files "
                                  "(tls_ca_file, tls_cert_file, tls_key_file)")
            self._channel = grpc.aio.secure_channel(_target(self.endpoints), grpc_channel_credentials(tls),
                                                    options=options)
        else:
            self._channel = grpc.aio.insecure_channel(_target(self.endpoints), options=options)
        self._kv = pbg.KVStub(self._channel)
        self._lease = pbg.LeaseStub(self._channel)
        self._watch = pbg.WatchStub(self._channel)
        self._maint = pbg.MaintenanceStub(self._channel)

    async def close(self) -> None:
        """Close the channel (streams end)."""
        await self._channel.close()

    def _err(self, exc: grpc.aio.AioRpcError, what: str) -> Unavailable:
        return Unavailable(f"etcd at {','.join(self.endpoints)}: {what} failed: "
                           f"{exc.code().name}: {exc.details() or ''}".rstrip(": "))

    async def _call(self, fn: Any, req: Any, what: str) -> Any:
        try:
            return await fn(req, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise self._err(exc, what) from None

    # -- KV ------------------------------------------------------------------
    async def get(self, key: bytes) -> KeyValue | None:
        """The key's current value, or None.

        Raises:
            Unavailable: etcd unreachable or the call failed.
        """
        resp = await self._call(self._kv.Range, pb.RangeRequest(key=key), "Range")
        return _kv(resp.kvs[0]) if resp.kvs else None

    async def get_prefix(self, prefix: bytes) -> list[KeyValue]:
        """Every key starting with ``prefix``, in key order.

        Raises:
            Unavailable: etcd unreachable or the call failed.
        """
        end = prefix[:-1] + bytes([prefix[-1] + 1])  # etcd's "range_end = prefix + 1" idiom
        resp = await self._call(self._kv.Range, pb.RangeRequest(key=prefix, range_end=end), "Range")
        return [_kv(m) for m in resp.kvs]

    async def put(self, key: bytes, value: bytes, *, lease: int = 0) -> int:
        """Put ``value``; returns the new revision.

        Raises:
            Unavailable: etcd unreachable or the call failed.
        """
        resp = await self._call(self._kv.Put, pb.PutRequest(key=key, value=value, lease=lease), "Put")
        return resp.header.revision

    async def delete(self, key: bytes) -> int:
        """Delete the key; returns how many keys were deleted (0 or 1)."""
        resp = await self._call(self._kv.DeleteRange, pb.DeleteRangeRequest(key=key), "DeleteRange")
        return resp.deleted

    async def create(self, key: bytes, value: bytes, *, lease: int = 0) -> tuple[bool, int, KeyValue | None]:
        """Put ``value`` only if the key does not exist (a Txn on ``create_revision == 0``).

        Returns:
            ``(created, revision, current)``: on failure ``current`` is the key that exists.

        Raises:
            Unavailable: etcd unreachable or the call failed.
        """
        req = pb.TxnRequest(
            compare=[pb.Compare(result=pb.Compare.EQUAL, target=pb.Compare.CREATE, key=key, create_revision=0)],
            success=[pb.RequestOp(request_put=pb.PutRequest(key=key, value=value, lease=lease))],
            failure=[pb.RequestOp(request_range=pb.RangeRequest(key=key))])
        resp = await self._call(self._kv.Txn, req, "Txn(create)")
        if resp.succeeded:
            return True, resp.header.revision, None
        kvs = resp.responses[0].response_range.kvs if resp.responses else []
        return False, resp.header.revision, (_kv(kvs[0]) if kvs else None)

    async def put_if(self, guard_key: bytes, guard_create_revision: int,
                     puts: Sequence[tuple[bytes, bytes, int]]) -> bool:
        """Put every ``(key, value, lease)`` of ``puts`` atomically, only while
        ``guard_key`` still exists with ``guard_create_revision`` (the leader key
        this master created: a deposed leader's writes are refused by etcd).

        Returns:
            Whether the guard held (and the puts were applied).

        Raises:
            Unavailable: etcd unreachable or the call failed.
        """
        req = pb.TxnRequest(
            compare=[pb.Compare(result=pb.Compare.EQUAL, target=pb.Compare.CREATE, key=guard_key,
                                create_revision=guard_create_revision)],
            success=[pb.RequestOp(request_put=pb.PutRequest(key=k, value=v, lease=lease)) for k, v, lease in puts])
        resp = await self._call(self._kv.Txn, req, "Txn(put_if)")
        return bool(resp.succeeded)

    async def delete_if(self, key: bytes, create_revision: int) -> bool:
        """Delete ``key`` only while it has ``create_revision`` (resign without
        deleting a successor's key)."""
        req = pb.TxnRequest(
            compare=[pb.Compare(result=pb.Compare.EQUAL, target=pb.Compare.CREATE, key=key,
                                create_revision=create_revision)],
            success=[pb.RequestOp(request_delete_range=pb.DeleteRangeRequest(key=key))])
        resp = await self._call(self._kv.Txn, req, "Txn(delete_if)")
        return bool(resp.succeeded)

    # -- Lease ---------------------------------------------------------------
    async def grant(self, ttl_s: int) -> tuple[int, int]:
        """Grant a lease; returns ``(lease_id, ttl_s)`` (etcd may raise the TTL to its minimum).

        Raises:
            Unavailable: etcd unreachable, the call failed, or etcd refused.
        """
        resp = await self._call(self._lease.LeaseGrant, pb.LeaseGrantRequest(TTL=ttl_s), "LeaseGrant")
        if resp.error:
            raise Unavailable(f"etcd refused a lease: {resp.error}")
        return resp.ID, resp.TTL

    async def revoke(self, lease_id: int) -> None:
        """Revoke a lease (its keys are deleted at once). Errors are logged, not raised."""
        try:
            await self._lease.LeaseRevoke(pb.LeaseRevokeRequest(ID=lease_id), timeout=self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            log.warning("etcd: could not revoke lease %x: %s", lease_id, exc.code().name)

    def keepalive_stream(self) -> "KeepAlive":
        """A keep-alive stream (one per lease holder)."""
        return KeepAlive(self)

    # -- Watch ---------------------------------------------------------------
    async def watch(self, key: bytes, start_revision: int = 0) -> AsyncIterator[WatchEvent]:
        """Yield every change of ``key`` from ``start_revision`` (0: from now).

        Raises:
            Unavailable: the stream broke (etcd stopped or unreachable) or etcd
                cancelled the watch (compacted revision).
        """
        queue: asyncio.Queue[Any] = asyncio.Queue()
        await queue.put(pb.WatchRequest(create_request=pb.WatchCreateRequest(key=key, start_revision=start_revision)))

        async def requests() -> AsyncIterator[Any]:
            while True:
                item = await queue.get()
                if item is None:
                    return
                yield item

        call = self._watch.Watch(requests())
        try:
            async for resp in call:
                if resp.canceled:
                    raise Unavailable(f"etcd cancelled the watch of {key!r}: {resp.cancel_reason or 'compacted'}")
                for ev in resp.events:
                    yield WatchEvent(ev.type == pb.Event.DELETE, ev.kv.key, ev.kv.value, ev.kv.mod_revision)
        except grpc.aio.AioRpcError as exc:
            raise self._err(exc, "Watch") from None
        finally:
            queue.put_nowait(None)
            call.cancel()
        raise Unavailable(f"etcd at {','.join(self.endpoints)}: the watch stream ended")

    async def status(self) -> tuple[str, int]:
        """``(etcd version, raft leader member id)`` of the member answering."""
        resp = await self._call(self._maint.Status, pb.StatusRequest(), "Status")
        return resp.version, resp.leader


class KeepAlive:
    """One ``LeaseKeepAlive`` stream: :meth:`renew` sends one request and awaits its answer."""

    def __init__(self, client: EtcdClient) -> None:
        self._client = client
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._call: Any = None

    async def _requests(self) -> AsyncIterator[Any]:
        while True:
            item = await self._queue.get()
            if item is None:
                return
            yield item

    async def renew(self, lease_id: int, timeout_s: float) -> int:
        """Renew ``lease_id``; returns the TTL etcd answered (<= 0: the lease is gone).

        Raises:
            Unavailable: no answer within ``timeout_s`` or the stream broke (it is
                reopened on the next call).
        """
        if self._call is None:
            self._call = self._client._lease.LeaseKeepAlive(self._requests())
        self._queue.put_nowait(pb.LeaseKeepAliveRequest(ID=lease_id))
        try:
            resp = await asyncio.wait_for(self._call.read(), timeout_s)
        except (asyncio.TimeoutError, grpc.aio.AioRpcError) as exc:
            self.close()
            what = "no answer" if isinstance(exc, asyncio.TimeoutError) else exc.code().name
            raise Unavailable(f"etcd at {','.join(self._client.endpoints)}: lease keep-alive: {what}") from None
        if resp is grpc.aio.EOF:
            self.close()
            raise Unavailable("etcd: the lease keep-alive stream ended")
        return resp.TTL

    def close(self) -> None:
        """End the stream."""
        if self._call is not None:
            self._queue.put_nowait(None)
            self._call.cancel()
            self._call = None
            self._queue = asyncio.Queue()
