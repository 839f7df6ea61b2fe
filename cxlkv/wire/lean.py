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
(parse + handler), :class:`LeanProtocol` (one served connection),
:class:`LeanFrameServer` (TCP or Unix socket) and :class:`LeanChannel` (an asyncio,
pipelined client). clientd serves ClientService with the same pieces.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
import os
import socket
import ssl as _ssl
from time import perf_counter
from typing import Any, Callable

from google.protobuf.message import DecodeError

from cxlkv.client.framing import (
    DEFAULT_MAX_FRAME_BYTES, HEADER, HEADER_BYTES, LENGTH_BYTES, MIN_LENGTH, Method, service_methods,
)
from cxlkv.errors import CxlkvError, ErrorCode, Internal, InvalidArgument, LimitExceeded, Unavailable, error_for
from cxlkv.v1 import common_pb2

__all__ = ["service_methods", "LeanRoute", "LeanProtocol", "LeanFrameServer", "LeanChannel", "LeanConnectError",
           "PEER_CRED", "PEER_IDENTITY", "peer_cred"]

log = logging.getLogger(__name__)

#: ``(pid, uid, gid)`` of the process at the other end of the Unix socket whose
#: request the current task serves (``SO_PEERCRED``, taken when the connection was
#: accepted); ``None`` outside a lean Unix-socket call (TCP, gRPC).
PEER_CRED: contextvars.ContextVar[tuple[int, int, int] | None] = contextvars.ContextVar("PEER_CRED", default=None)
#: The :class:`cxlkv.wire.tls.Identity` of the TLS peer whose request is being served
#: (its certificate, checked at the handshake); ``None`` on a plaintext connection.
PEER_IDENTITY: contextvars.ContextVar[Any] = contextvars.ContextVar("PEER_IDENTITY", default=None)


def peer_cred(sock: socket.socket | None) -> tuple[int, int, int] | None:
    """``(pid, uid, gid)`` of a connected Unix socket's peer, or ``None`` (not Unix, or unknown)."""
    if sock is None or getattr(sock, "family", None) != socket.AF_UNIX or not hasattr(socket, "SO_PEERCRED"):
        return None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    except OSError:
        return None
    import struct

    pid, uid, gid = struct.unpack("3i", raw)
    return (pid, uid, gid) if pid > 0 else None


class LeanRoute:
    """One served method: how to parse its request and the code that answers it.

    ``handler(request)`` returns the response message or raises a
    :class:`~cxlkv.errors.CxlkvError` (sent as an ErrorDetail frame). It is a
    coroutine function, run as a task of its own, unless ``inline`` is true: then
    it is a plain function, called as soon as its frame is parsed (no task, no
    extra turn of the event loop: the master's handlers, which never wait, save
    about a fifth of their per-call CPU this way), and the answers of all the
    frames that arrived together leave in one write.
    """

    __slots__ = ("name", "parse", "handler", "request_type", "inline")

    def __init__(self, name: str, parse: Callable[[bytes], Any], handler: Callable[[Any], Any],
                 request_type: Any = None, *, inline: bool = False):
        self.name = name
        self.parse = parse
        self.handler = handler
        #: The request message class (names the field of a non-UTF-8 string in errors).
        self.request_type = request_type
        #: ``handler`` is synchronous: answer while parsing (see above).
        self.inline = inline


_pack = HEADER.pack
_unpack_from = HEADER.unpack_from
_INVALID_ARGUMENT = int(ErrorCode.INVALID_ARGUMENT)
#: Answers up to this size are joined with their header into one write.
_JOIN_BYTES = 64 << 10
#: Send buffer asked for on every connection, in bytes (the kernel caps it at
#: net.core.wmem_max).
SOCKET_BUFFER_BYTES = 4 << 20
#: Longest a connection's frames run on the event loop in one turn, seconds: the
#: frames left wait (reading paused) until the loop has served everyone else once.
#: Bounds what one connection's pipeline can hold up: the master's other callers
#: wait at most about this long per busy connection (docs/protocol.md, "Flow control").
TURN_BUDGET_S = 0.005
#: Calls one connection may have running (as tasks) before it is paused.
DEFAULT_MAX_IN_FLIGHT = 64


class LeanProtocol(asyncio.Protocol):
    """One lean connection (asyncio Protocol: no StreamReader overhead).

    Robustness (a daemon never dies on bad input):

    * an unknown method number or an unparsable message gets an INVALID_ARGUMENT
      answer and the connection goes on (the framing is intact);
    * a ``length`` below 12 (INVALID_ARGUMENT) or above ``max_frame_bytes``
      (TOO_LARGE, :class:`~cxlkv.errors.LimitExceeded`) cannot be skipped safely:
      it gets that answer, then the connection is closed;
    * a client that disconnects mid-frame just goes away; calls it had started run
      to completion (a put is never left half-done) and their answers are dropped;
    * a client that sends faster than it reads is paused: once its answers fill
      the transport's buffer (asyncio flow control) no further frame of it is
      dispatched — the frames it already sent wait, unparsed, until it reads —
      and so is one with ``max_in_flight`` calls running; a connection's answers
      waiting to be read are therefore bounded (about ``max_in_flight`` answers
      and the buffer), however many requests it pipelines without reading;
    * frames run at most :data:`TURN_BUDGET_S` per turn of the event loop, then
      the connection waits its turn again: one connection's long pipeline of
      calls never holds up the others' for longer than that.
    """

    def __init__(self, server: "LeanFrameServer") -> None:
        self._server = server
        self._routes = server.routes
        self._max_frame = server.max_frame_bytes
        self._transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._closed = False
        self._paused_writing = False
        self._paused_reading = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._peer: tuple[int, int, int] | None = None
        #: The TLS peer's identity (``None``: plaintext).
        self._identity: Any = None
        #: While frames are dispatched: the answers to write together afterwards.
        self._batch: list[bytes] | None = None
        self._batch_bytes = 0
        #: Whole frames wait in ``_buf`` undispatched (paused, or the turn's time was used up).
        self._held = False
        self._resume_scheduled = False
        #: The last dispatch stopped before the end of its data (see ``_held``).
        self._stopped_early = False

    # -- asyncio callbacks --------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._loop = asyncio.get_running_loop()
        sock = transport.get_extra_info("socket")
        self._peer = peer_cred(sock)
        if self._server.ssl is not None:  # asyncio calls this once the handshake (client cert checked) is done
            from cxlkv.wire.tls import identity_from_peercert

            self._identity = identity_from_peercert(transport.get_extra_info("peercert"))
        if sock is not None:
            try:  # large answers (inline values) in one send: fewer wake-ups of both sides
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
            except OSError:
                pass  # capped by net.core.wmem_max; the default works, only slower
        self._server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._held = False  # frames it sent but never let us answer are dropped, unrun
        self._buf = bytearray()
        self._server.connections.discard(self)

    def pause_writing(self) -> None:
        self._paused_writing = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._paused_writing = False
        if self._held:
            self._schedule_resume()
        self._update_reading()

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        buf = self._buf
        if not buf and len(data) >= HEADER_BYTES and not self._blocked():
            # Fast path: whole frames in `data`, no copy into the buffer.
            pos = self._frames(data)
            if pos < len(data) and not self._closed:
                buf += data[pos:]
                self._after_dispatch()
            return
        buf += data
        self._dispatch_buffered()

    def _blocked(self) -> bool:
        """No frame may be dispatched now: answers wait for the peer to read, or
        ``max_in_flight`` calls are running."""
        return self._paused_writing or len(self._tasks) >= self._server.max_in_flight

    def _dispatch_buffered(self) -> None:
        buf = self._buf
        if self._blocked():
            if buf:
                self._hold()
            return
        pos = self._frames(buf)
        if pos:
            del buf[:pos]
        if buf and not self._closed:
            self._after_dispatch()

    def _after_dispatch(self) -> None:
        """What a dispatch left in ``_buf``: whole frames it stopped before (held
        for a later turn), or the start of a frame still arriving (its length checked)."""
        if self._stopped_early:
            self._hold()
        else:
            self._check_partial()

    def _hold(self) -> None:
        """Keep the buffered frames for later: reading paused until they are dispatched."""
        self._held = True
        self._update_reading()
        if not self._blocked():
            self._schedule_resume()  # only the turn's time ran out: go on at the next turn

    def _schedule_resume(self) -> None:
        if not self._resume_scheduled and not self._closed:
            self._resume_scheduled = True
            self._loop.call_soon(self._resume)

    def _resume(self) -> None:
        """Dispatch held frames (a later turn of the loop, or the pause that held them ended)."""
        self._resume_scheduled = False
        if self._closed or not self._held or self._blocked():
            return  # resume_writing or a call's end comes back here
        self._held = False
        self._dispatch_buffered()
        self._update_reading()

    # -- framing ------------------------------------------------------------
    def _frames(self, data: bytes | bytearray) -> int:
        """Dispatch the complete frames of ``data`` (all of them, unless the
        connection gets paused or the turn's time runs out: ``_stopped_early``);
        returns bytes consumed."""
        self._batch = []  # answers of inline routes, written together below
        self._batch_bytes = 0
        self._stopped_early = False
        token = PEER_IDENTITY.set(self._identity) if self._identity is not None else None
        try:
            return self._dispatch(data, self._routes)
        finally:
            if token is not None:
                PEER_IDENTITY.reset(token)
            self._flush()
            self._batch = None

    def _flush(self) -> None:
        """Write the answers gathered in ``_batch`` (one send)."""
        batch = self._batch
        if batch:
            t = self._transport
            if t is not None and not t.is_closing():
                t.write(b"".join(batch) if len(batch) > 1 else batch[0])  # may pause_writing()
            batch.clear()
            self._batch_bytes = 0

    def _dispatch(self, data: bytes | bytearray, routes: dict[int, LeanRoute]) -> int:
        pos = 0
        end_all = len(data)
        max_in_flight = self._server.max_in_flight
        tasks = self._tasks
        deadline = perf_counter() + TURN_BUDGET_S
        while end_all - pos >= HEADER_BYTES:
            if pos and (self._paused_writing or len(tasks) >= max_in_flight or perf_counter() > deadline):
                self._stopped_early = True  # the rest waits (see the class docstring)
                break
            length, method, _flags, rid = _unpack_from(data, pos)
            if length < MIN_LENGTH or length > self._max_frame:
                self._fatal(rid, length)
                return end_all
            end = pos + LENGTH_BYTES + length
            if end > end_all:
                break
            payload = bytes(data[pos + HEADER_BYTES:end]) if isinstance(data, bytearray) \
                else data[pos + HEADER_BYTES:end]
            pos = end
            route = routes.get(method)
            if route is None:
                self._answer_error(rid, InvalidArgument(
                    f"unknown method number {method} (this daemon knows 1..{len(routes)})"))
                continue
            try:
                request = route.parse(payload)
            except (DecodeError, ValueError, TypeError) as exc:
                from cxlkv.wire.parse import malformed_request_error

                self._answer_error(rid, malformed_request_error(route.name, route.request_type, payload, exc)
                                   if route.request_type is not None
                                   else InvalidArgument(f"{route.name}: malformed request message: {exc}"))
                continue
            if route.inline:
                self._call_inline(route, request, rid)
                continue
            task = self._loop.create_task(self._call(route, request, rid))
            tasks.add(task)
            task.add_done_callback(self._task_done)
            if len(tasks) >= max_in_flight:
                self._update_reading()
        return pos

    def _check_partial(self) -> None:
        """Refuse an oversized frame as soon as its length field has arrived."""
        buf = self._buf
        if len(buf) >= LENGTH_BYTES:
            length = int.from_bytes(buf[:LENGTH_BYTES], "little")
            if length < MIN_LENGTH or length > self._max_frame:
                rid = int.from_bytes(buf[8:16], "little") if len(buf) >= HEADER_BYTES else 0
                self._fatal(rid, length)

    def _fatal(self, rid: int, length: int) -> None:
        """A frame length that cannot be honoured: answer, then close the connection."""
        err: CxlkvError
        if length < MIN_LENGTH:
            err = InvalidArgument(f"frame length {length} is below the minimum of {MIN_LENGTH} bytes")
        else:
            err = LimitExceeded(
                f"request frame of {length} bytes is over the limit of {self._max_frame} bytes "
                "(max_request_bytes); split the call", limit_name="max_request_bytes", limit=self._max_frame,
                requested=length, requested_bytes=length)
        log.warning("lean connection closed: %s", err.message)
        self._answer_error(rid, err)
        self._flush()
        self._closed = True
        self._buf = bytearray()
        if self._transport is not None:
            self._transport.close()  # flushes the answer first

    # -- calls --------------------------------------------------------------
    async def _call(self, route: LeanRoute, request: Any, rid: int) -> None:
        PEER_CRED.set(self._peer)  # this task's own context: seen by the handler only
        try:
            payload = (await route.handler(request)).SerializeToString()
        except Exception as exc:
            self._failed(route, rid, exc)
            return
        self._write(0, rid, payload)

    def _call_inline(self, route: LeanRoute, request: Any, rid: int) -> None:
        try:
            payload = route.handler(request).SerializeToString()
        except Exception as exc:
            self._failed(route, rid, exc)
            return
        self._write(0, rid, payload)

    def _failed(self, route: LeanRoute, rid: int, exc: Exception) -> None:
        """Answer a handler's error; a bug (not a CxlkvError) answers INTERNAL and is
        logged with its traceback. The connection goes on."""
        if isinstance(exc, CxlkvError):
            self._answer_error(rid, exc)
            return
        log.error("%s failed", route.name, exc_info=exc)
        self._answer_error(rid, Internal(f"{route.name}: {type(exc).__name__}: {exc}"))

    def _answer_error(self, rid: int, err: CxlkvError) -> None:
        self._write(int(err.code), rid, err.to_detail().SerializeToString())

    def _write(self, code: int, rid: int, payload: bytes) -> None:
        header = _pack(MIN_LENGTH + len(payload), code, 0, rid)
        batch = self._batch
        if batch is not None and len(payload) <= _JOIN_BYTES:
            batch.append(header + payload)  # sent when this read's frames are done
            self._batch_bytes += len(payload)
            if self._batch_bytes >= _JOIN_BYTES:
                self._flush()  # its write tells whether the peer keeps up (pause_writing)
            return
        self._flush()  # keep the answers in order
        t = self._transport
        if t is None or t.is_closing():
            return
        if len(payload) <= _JOIN_BYTES:
            t.write(header + payload)
        else:  # two sends rather than a joined copy of a large answer
            t.write(header)
            t.write(payload)

    def _task_done(self, task: "asyncio.Task[None]") -> None:
        self._tasks.discard(task)
        if self._held:
            self._schedule_resume()
        if self._paused_reading:
            self._update_reading()

    def _update_reading(self) -> None:
        t = self._transport
        if t is None or t.is_closing():
            return
        pause = self._held or self._blocked()
        if pause and not self._paused_reading:
            t.pause_reading()
            self._paused_reading = True
        elif not pause and self._paused_reading:
            t.resume_reading()
            self._paused_reading = False

    async def drain(self) -> None:
        """Wait for this connection's running calls."""
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


class LeanFrameServer:
    """Serve ``routes`` (method number → :class:`LeanRoute`) in lean frames.

    Args:
        routes: the methods served.
        max_frame_bytes: largest accepted frame (``length`` field), in bytes.
        max_in_flight: calls one connection may have running before it is paused.
        ssl: a server :class:`ssl.SSLContext` (:func:`cxlkv.wire.tls.server_context`)
            for TCP: every connection is TLS, the peer's certificate checked at
            the handshake, its identity in :data:`PEER_IDENTITY` while its calls
            run; ``None``: plaintext.

    Bind with :meth:`start_tcp` or :meth:`start_unix`. Each connection is a
    :class:`LeanProtocol` (partial frames, oversized frames, flow control,
    disconnects): the daemon never dies on input.
    """

    def __init__(self, routes: dict[int, LeanRoute], *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 max_in_flight: int = DEFAULT_MAX_IN_FLIGHT, ssl: _ssl.SSLContext | None = None) -> None:
        self.routes = routes
        self.ssl = ssl
        self.max_frame_bytes = max_frame_bytes
        self.max_in_flight = max_in_flight
        self.connections: set[Any] = set()
        self._server: asyncio.AbstractServer | None = None
        self.port = 0

    def _protocol(self) -> asyncio.Protocol:
        return LeanProtocol(self)

    async def start_tcp(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (port 0 picks one). Returns the bound port.

        Raises:
            OSError: the address cannot be bound.
        """
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._protocol, host or None, port, reuse_address=True,
                                                ssl=self.ssl)
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


class LeanConnectError(Unavailable):
    """The lean link could not be opened: nothing was sent, so the call may safely go another way."""


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
        ssl: a client :class:`ssl.SSLContext` (:func:`cxlkv.wire.tls.client_context`):
            the connection is TLS, the server verified against ``host``; ``None``:
            plaintext.
        unix_path: connect to this Unix socket instead of ``host:port`` (plaintext;
            ``host`` and ``port`` still name the service).

    Not thread-safe: use from one event loop.
    """

    def __init__(self, host: str, port: int, methods: tuple[Method, ...], *,
                 ssl: _ssl.SSLContext | None = None, unix_path: str = "") -> None:
        self.host, self.port = host, port
        self.ssl = ssl
        self.unix_path = unix_path
        self.target = unix_path or f"{host}:{port}"
        self._by_name = {m.name: m for m in methods}
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[asyncio.Future[Any], Any]] = {}
        self._proto: _ChannelProtocol | None = None
        self._connecting: asyncio.Lock | None = None

    async def _connection(self, timeout: float | None = None) -> _ChannelProtocol:
        proto = self._proto
        if proto is not None and proto.transport is not None and not proto.transport.is_closing():
            return proto
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._proto is not None and self._proto.transport is not None and not self._proto.transport.is_closing():
                return self._proto
            loop = asyncio.get_running_loop()
            connect = (loop.create_unix_connection(lambda: _ChannelProtocol(self), self.unix_path)
                       if self.unix_path else
                       loop.create_connection(lambda: _ChannelProtocol(self), self.host, self.port, ssl=self.ssl))
            try:
                # bounded: a host that drops packets would hold the call for the kernel's
                # SYN retries (minutes); a timeout is a failed connect (nothing was sent)
                _, proto = await asyncio.wait_for(connect, timeout) if timeout else await connect
            except asyncio.TimeoutError:
                raise LeanConnectError(f"lean link to {self.target}: no connection within {timeout:g} s") from None
            except OSError as exc:
                raise LeanConnectError(f"lean link to {self.target}: {exc.strerror or exc}") from None
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
            LeanConnectError: the connection could not be opened (nothing was sent).
            Unavailable: connection lost, or no answer within ``timeout`` seconds
                (the call may or may not have run).
        """
        method = self._by_name[name]
        proto = await self._connection(timeout)
        rid = next(self._ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[rid] = (fut, method.response_type)
        payload = request.SerializeToString()
        transport = proto.transport
        try:
            if transport is None or transport.is_closing():
                raise RuntimeError("closed")
            transport.write(HEADER.pack(MIN_LENGTH + len(payload), method.number, 0, rid) + payload)
        except RuntimeError:  # the peer went away and its connection_lost is not delivered yet (uvloop)
            self._pending.pop(rid, None)
            if self._proto is proto:
                self._proto = None
            raise Unavailable(f"lean link to {self.target} lost (closed before {name} was sent)") from None
        if not timeout:
            return await fut
        # A timer on the future itself: cheaper than asyncio.wait_for (no wrapper
        # future and callbacks), on the path of every master call.
        timer = asyncio.get_running_loop().call_later(timeout, self._expire, rid, fut, name, timeout)
        try:
            return await fut
        finally:
            timer.cancel()

    def _expire(self, rid: int, fut: "asyncio.Future[Any]", name: str, timeout: float) -> None:
        self._pending.pop(rid, None)
        if not fut.done():
            fut.set_exception(Unavailable(f"{name} to {self.target}: no answer within {timeout:g} s"))

    def close(self) -> None:
        """Close the connection; pending calls fail with :class:`Unavailable`."""
        if self._proto is not None and self._proto.transport is not None:
            self._proto.transport.close()
        self._proto = None


