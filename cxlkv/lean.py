"""Lean framing for any cxlkv service: protobuf messages in length-prefixed frames.

The frame format is the one of docs/protocol.md (:mod:`cxlkv.client.framing`)::

    request  = u32 length | u16 method | u16 flags | u64 request_id | request bytes
    response = u32 length | u16 code   | u16 flags | u64 request_id | response bytes

``method`` is the 1-based position of the RPC in its service declaration
(:func:`service_methods`); ``code`` 0 means the payload is the response, else a
``cxlkv.v1.ErrorDetail``. Connections are pipelined.

The master serves ``MasterService`` this way on ``lean_listen_address`` next to
gRPC: on this kind of machine a Python gRPC call costs the master 0.5–1 ms of CPU,
which capped the whole cluster near 1,000 master calls/s; the same call in lean
frames costs a few tens of microseconds (docs/architecture.md). gRPC stays the
interface for tools and other languages; clientd uses the lean link for its
hot-path batch calls when the master advertises one.

This module has the generic pieces: :func:`service_methods`, :class:`LeanRoute`
(parse + handler), :class:`LeanServer` (TCP or Unix socket, serving routes with
the connection protocol of :mod:`cxlkv.clientd.lean`) and :class:`LeanChannel`
(an asyncio, pipelined client).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
from typing import Any, Awaitable, Callable

from google.protobuf import descriptor as _descriptor
from google.protobuf import message_factory

from cxlkv.client.framing import DEFAULT_MAX_FRAME_BYTES, HEADER, HEADER_BYTES, LENGTH_BYTES, MIN_LENGTH, Method
from cxlkv.errors import CxlkvError, Unavailable, error_for
from cxlkv.v1 import common_pb2

__all__ = ["service_methods", "LeanRoute", "LeanServer", "LeanChannel"]

log = logging.getLogger(__name__)


def service_methods(service: _descriptor.ServiceDescriptor) -> tuple[Method, ...]:
    """Every RPC of ``service`` in declaration order, numbered from 1 (the frame's method field)."""
    return tuple(
        Method(
            number=i + 1,
            name=m.name,
            request_type=message_factory.GetMessageClass(m.input_type),
            response_type=message_factory.GetMessageClass(m.output_type),
        )
        for i, m in enumerate(service.methods)
    )


class LeanRoute:
    """One served method: how to parse its request and the coroutine that answers it.

    ``handler(request)`` returns the response message or raises a
    :class:`~cxlkv.errors.CxlkvError` (sent as an ErrorDetail frame).
    """

    __slots__ = ("name", "parse", "handler")

    def __init__(self, name: str, parse: Callable[[bytes], Any], handler: Callable[[Any], Awaitable[Any]]):
        self.name = name
        self.parse = parse
        self.handler = handler


class LeanServer:
    """Serve ``routes`` (method number → :class:`LeanRoute`) in lean frames.

    Args:
        routes: the methods served.
        max_frame_bytes: largest accepted frame (``length`` field), in bytes.
        max_in_flight: calls one connection may have running before it is paused.

    Bind with :meth:`start_tcp` or :meth:`start_unix`. The connection protocol
    (partial frames, oversized frames, flow control, disconnects) is
    :class:`cxlkv.clientd.lean.LeanProtocol`'s: the daemon never dies on input.
    """

    def __init__(self, routes: dict[int, LeanRoute], *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 max_in_flight: int = 1024) -> None:
        self.routes = routes
        self.max_frame_bytes = max_frame_bytes
        self.max_in_flight = max_in_flight
        self.connections: set[Any] = set()
        self._server: asyncio.AbstractServer | None = None
        self.port = 0

    def _protocol(self) -> asyncio.Protocol:
        from cxlkv.clientd.lean import LeanProtocol  # the one connection protocol

        return LeanProtocol(self)  # type: ignore[arg-type]

    async def start_tcp(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (port 0 picks one). Returns the bound port.

        Raises:
            OSError: the address cannot be bound.
        """
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._protocol, host or None, port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]
        for s in self._server.sockets:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self.port

    async def start_unix(self, path: str, mode: int = 0o660) -> None:
        """Listen on the Unix socket ``path`` (which must not exist) with permission bits ``mode``.

        Raises:
            OSError: the socket could not be bound.
        """
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(path)
            os.chmod(path, mode)
            sock.listen(1024)
        except BaseException:
            sock.close()
            raise
        self._server = await loop.create_unix_server(self._protocol, sock=sock)

    async def stop(self, grace_s: float) -> None:
        """Stop accepting; let running calls finish for ``grace_s`` seconds; close connections."""
        if self._server is None:
            return
        self._server.close()
        conns = list(self.connections)
        if conns:
            try:
                await asyncio.wait_for(asyncio.gather(*(c.drain() for c in conns)), grace_s)
            except asyncio.TimeoutError:
                log.warning("lean: calls still running after %.1f s at shutdown", grace_s)
        for c in conns:
            if c._transport is not None:
                c._transport.close()
        await self._server.wait_closed()


class _ChannelProtocol(asyncio.Protocol):
    def __init__(self, channel: "LeanChannel") -> None:
        self.channel = channel
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.channel._lost(exc)

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos = 0
        n = len(buf)
        pending = self.channel._pending
        while n - pos >= HEADER_BYTES:
            length, code, _flags, rid = HEADER.unpack_from(buf, pos)
            end = pos + LENGTH_BYTES + length
            if length < MIN_LENGTH:
                self.transport.close()  # type: ignore[union-attr]
                return
            if end > n:
                break
            fut, response_type = pending.pop(rid, (None, None))
            if fut is not None and not fut.done():
                payload = bytes(buf[pos + HEADER_BYTES:end])
                if code == 0:
                    fut.set_result(response_type.FromString(payload))
                else:
                    d = common_pb2.ErrorDetail.FromString(payload)
                    fut.set_exception(error_for(
                        d.code, d.message, key=d.key or None,
                        requested_bytes=d.requested_bytes or None, free_bytes=d.free_bytes or None))
            pos = end
        if pos:
            del buf[:pos]


class LeanChannel:
    """A pipelined asyncio client of a lean server (one connection, reconnected on demand).

    Args:
        host: server host.
        port: server port.
        methods: the service's methods (:func:`service_methods`).

    Not thread-safe: use from one event loop.
    """

    def __init__(self, host: str, port: int, methods: tuple[Method, ...]) -> None:
        self.host, self.port = host, port
        self.target = f"{host}:{port}"
        self._by_name = {m.name: m for m in methods}
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[asyncio.Future[Any], Any]] = {}
        self._proto: _ChannelProtocol | None = None
        self._connecting: asyncio.Lock | None = None

    async def _connection(self) -> _ChannelProtocol:
        proto = self._proto
        if proto is not None and proto.transport is not None and not proto.transport.is_closing():
            return proto
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._proto is not None and self._proto.transport is not None and not self._proto.transport.is_closing():
                return self._proto
            loop = asyncio.get_running_loop()
            try:
                _, proto = await loop.create_connection(lambda: _ChannelProtocol(self), self.host, self.port)
            except OSError as exc:
                raise Unavailable(f"lean link to {self.target}: {exc.strerror or exc}") from None
            self._proto = proto
            return proto

    def _lost(self, exc: Exception | None) -> None:
        self._proto = None
        pending, self._pending = self._pending, {}
        for fut, _ in pending.values():
            if not fut.done():
                fut.set_exception(Unavailable(f"lean link to {self.target} lost: {exc or 'closed'}"))

    async def call(self, name: str, request: Any, *, timeout: float | None = None) -> Any:
        """Send ``request`` to method ``name`` and wait for the response message.

        Raises:
            CxlkvError: the server's error for this call (its ErrorDetail).
            Unavailable: no connection, connection lost, or no answer within ``timeout`` seconds.
        """
        method = self._by_name[name]
        proto = await self._connection()
        rid = next(self._ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[rid] = (fut, method.response_type)
        payload = request.SerializeToString()
        proto.transport.write(  # type: ignore[union-attr]
            HEADER.pack(MIN_LENGTH + len(payload), method.number, 0, rid) + payload)
        try:
            return await asyncio.wait_for(fut, timeout) if timeout else await fut
        except asyncio.TimeoutError:
            self._pending.pop(rid, None)
            raise Unavailable(f"{name} to {self.target}: no answer within {timeout:g} s") from None

    def close(self) -> None:
        """Close the connection; pending calls fail with :class:`Unavailable`."""
        if self._proto is not None and self._proto.transport is not None:
            self._proto.transport.close()
        self._proto = None


