"""The lean front-end: ClientService in length-prefixed frames on a Unix socket.

Same messages as the gRPC front-end, without HTTP/2 (docs/protocol.md): a
request is ``u32 length | u16 method | u16 flags | u64 request_id | message``,
a response ``u32 length | u16 code | u16 flags | u64 request_id | message``
(an ``ErrorDetail`` when ``code`` is not 0). Connections are pipelined: every
request runs as its own task and answers when done, in any order.

Robustness (the daemon never dies on bad input):

* an unknown method number or an unparsable message gets an INVALID_ARGUMENT
  answer and the connection goes on (the framing is intact);
* a ``length`` below 12 or above ``max_frame_bytes`` cannot be skipped safely:
  it gets an INVALID_ARGUMENT answer, then the connection is closed;
* a client that disconnects mid-frame just goes away; calls it had started run
  to completion (a put is never left half-done) and their answers are dropped;
* a client that sends faster than it reads is paused (asyncio flow control),
  and so is one with more than ``max_in_flight`` calls running.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from typing import Any, Awaitable, Callable

from google.protobuf.message import DecodeError

from cxlkv.client.framing import (
    DEFAULT_MAX_FRAME_BYTES,
    HEADER,
    HEADER_BYTES,
    LENGTH_BYTES,
    METHODS,
    MIN_LENGTH,
)
from cxlkv.clientd.api import ClientApi
from cxlkv.errors import CxlkvError, ErrorCode, Internal, InvalidArgument
from cxlkv.v1 import common_pb2

__all__ = ["LeanServer", "LeanProtocol"]

log = logging.getLogger(__name__)

_pack = HEADER.pack
_unpack_from = HEADER.unpack_from
_INVALID_ARGUMENT = int(ErrorCode.INVALID_ARGUMENT)
#: Answers up to this size are joined with their header into one write.
_JOIN_BYTES = 64 << 10
#: Send buffer asked for on every connection, in bytes (the kernel caps it at
#: net.core.wmem_max).
SOCKET_BUFFER_BYTES = 4 << 20


class _Route:
    __slots__ = ("name", "parse", "handler")

    def __init__(self, name: str, parse: Callable[[bytes], Any], handler: Callable[[Any], Awaitable[Any]]):
        self.name = name
        self.parse = parse
        self.handler = handler


class LeanProtocol(asyncio.Protocol):
    """One lean connection (asyncio Protocol: no StreamReader overhead)."""

    def __init__(self, server: "LeanServer") -> None:
        self._server = server
        self._routes = server.routes
        self._max_frame = server.max_frame_bytes
        self._transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._closed = False
        self._paused_writing = False
        self._paused_reading = False
        self._tasks: set[asyncio.Task[None]] = set()

    # -- asyncio callbacks --------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._loop = asyncio.get_running_loop()
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:  # large answers (inline values) in one send: fewer wake-ups of both sides
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
            except OSError:
                pass  # capped by net.core.wmem_max; the default works, only slower
        self._server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._buf = bytearray()
        self._server.connections.discard(self)

    def pause_writing(self) -> None:
        self._paused_writing = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._paused_writing = False
        self._update_reading()

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        buf = self._buf
        if not buf and len(data) >= HEADER_BYTES:
            # Fast path: whole frames in `data`, no copy into the buffer.
            pos = self._frames(data)
            if pos < len(data) and not self._closed:
                buf += data[pos:]
                self._check_partial()
            return
        buf += data
        pos = self._frames(buf)
        if pos:
            del buf[:pos]
        if buf and not self._closed:
            self._check_partial()

    # -- framing ------------------------------------------------------------
    def _frames(self, data: bytes | bytearray) -> int:
        """Dispatch every complete frame of ``data``; returns bytes consumed."""
        pos = 0
        end_all = len(data)
        routes = self._routes
        while end_all - pos >= HEADER_BYTES:
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
                self._answer_error(rid, InvalidArgument(f"{route.name}: malformed request message: {exc}"))
                continue
            task = self._loop.create_task(self._call(route, request, rid))
            self._tasks.add(task)
            task.add_done_callback(self._task_done)
            if len(self._tasks) >= self._server.max_in_flight:
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
        if length < MIN_LENGTH:
            msg = f"frame length {length} is below the minimum of {MIN_LENGTH} bytes"
        else:
            msg = f"frame of {length} bytes is over the limit of {self._max_frame} bytes"
        log.warning("lean connection closed: %s", msg)
        self._answer_error(rid, InvalidArgument(msg))
        self._closed = True
        self._buf = bytearray()
        if self._transport is not None:
            self._transport.close()  # flushes the answer first

    # -- calls --------------------------------------------------------------
    async def _call(self, route: _Route, request: Any, rid: int) -> None:
        try:
            response = await route.handler(request)
        except CxlkvError as err:
            self._answer_error(rid, err)
            return
        except Exception as exc:  # a bug: answer INTERNAL, keep serving
            log.exception("%s failed", route.name)
            self._answer_error(rid, Internal(f"{route.name}: {type(exc).__name__}: {exc}"))
            return
        self._write(0, rid, response.SerializeToString())

    def _answer_error(self, rid: int, err: CxlkvError) -> None:
        self._write(int(err.code), rid, err.to_detail().SerializeToString())

    def _write(self, code: int, rid: int, payload: bytes) -> None:
        t = self._transport
        if t is None or t.is_closing():
            return
        header = _pack(MIN_LENGTH + len(payload), code, 0, rid)
        if len(payload) <= _JOIN_BYTES:
            t.write(header + payload)
        else:  # two sends rather than a joined copy of a large answer
            t.write(header)
            t.write(payload)

    def _task_done(self, task: "asyncio.Task[None]") -> None:
        self._tasks.discard(task)
        if self._paused_reading:
            self._update_reading()

    def _update_reading(self) -> None:
        t = self._transport
        if t is None or t.is_closing():
            return
        pause = self._paused_writing or len(self._tasks) >= self._server.max_in_flight
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


class LeanServer:
    """The lean-framing server on ``socket_path``.

    Args:
        api: the ClientService methods.
        socket_path: Unix socket path (must not exist; the daemon clears stale ones).
        socket_mode: permission bits set on the socket.
        max_frame_bytes: largest accepted frame (``length`` field), in bytes.
        max_in_flight: calls one connection may have running before it is paused.
    """

    def __init__(
        self,
        api: ClientApi,
        socket_path: str,
        socket_mode: int,
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_in_flight: int = 1024,
    ) -> None:
        self.api = api
        self.socket_path = socket_path
        self.socket_mode = socket_mode
        self.max_frame_bytes = max_frame_bytes
        self.max_in_flight = max_in_flight
        self.routes: dict[int, _Route] = {
            m.number: _Route(m.name, m.request_type.FromString, getattr(api, m.name)) for m in METHODS
        }
        self.connections: set[LeanProtocol] = set()
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        """Bind and serve.

        Raises:
            OSError: the socket could not be bound.
        """
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(self.socket_path)
            os.chmod(self.socket_path, self.socket_mode)
            sock.listen(1024)
        except BaseException:
            sock.close()
            raise
        self._server = await loop.create_unix_server(lambda: LeanProtocol(self), sock=sock)

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
