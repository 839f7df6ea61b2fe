"""Connections from the SDK to its clientd: lean frames or gRPC, both blocking.

:class:`Connection` is the interface both framings implement, and
:class:`Connector` hands a :class:`~cxlkv.client.Client` its connections of one
framing (:func:`connector`): the Client calls these two and never asks which
framing it speaks.

:class:`LeanConnection` speaks the lean framing (:mod:`cxlkv.client.framing`) on
a plain blocking Unix socket: one request at a time (``call``), or several
pipelined (``call_many``: sends and receives interleaved with ``poll`` so a
large pipeline can never deadlock on full socket buffers). One connection
belongs to one thread.

:class:`GrpcConnection` calls the same RPCs through a gRPC channel on the
daemon's gRPC socket; it is thread-safe.

Both raise :class:`~cxlkv.errors.CxlkvError` subclasses: the daemon's error for a
failed call; :class:`~cxlkv.errors.DaemonUnreachable` (an ``Unavailable`` naming
the socket) when the daemon cannot be reached or the connection breaks before
the answer; plain :class:`~cxlkv.errors.Unavailable` when it does not answer
within the timeout.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import struct
import sys
import threading
import time
from typing import Any, Protocol, Sequence, runtime_checkable

from google.protobuf.message import DecodeError

from cxlkv.client.framing import HEADER, HEADER_BYTES, LENGTH_BYTES, MIN_LENGTH, Method
from cxlkv.errors import CxlkvError, DaemonUnreachable, Internal, InvalidArgument, Unavailable, error_for
from cxlkv.runtime.rundir import UntrustedDaemon, check_daemon_peer
from cxlkv.v1 import common_pb2

__all__ = ["Connection", "Connector", "LeanConnection", "GrpcConnection", "LeanConnector", "GrpcConnector",
           "connector"]

_pack = HEADER.pack
_unpack_from = HEADER.unpack_from
_ErrorDetail = common_pb2.ErrorDetail
_RECV_BYTES = 256 << 10
#: Most :meth:`GrpcConnection.send_nowait` calls in flight; more are dropped.
MAX_UNANSWERED_SENDS = 64
_JOIN_BYTES = 64 << 10
#: Shortest and longest pause of the gRPC channel between reconnection attempts
#: to the daemon's socket, in milliseconds.
RECONNECT_MIN_MS = 100
RECONNECT_MAX_MS = 1000
#: Longest wait in ``GrpcConnection.close`` for gRPC's connectivity poller to stop,
#: seconds (it checks every 0.2 s).
_POLLER_STOP_S = 0.5
#: Largest answer body whose receive buffer a connection keeps for reuse, bytes.
_KEEP_LARGE_BYTES = 16 << 20


def _error_from_detail(code: int, body: Any) -> CxlkvError:
    try:
        d = _ErrorDetail.FromString(body)
    except DecodeError:
        return error_for(code, "(malformed error detail from clientd)")
    return error_for(code, d.message, key=d.key or None,
                     requested_bytes=d.requested_bytes or None, free_bytes=d.free_bytes or None)


@runtime_checkable
class Connection(Protocol):
    """One link to the daemon, in either framing (both raise as the module says).

    Attributes:
        path: the daemon's socket this connection uses.
        timeout_s: longest wait for one answer, in seconds.
    """

    path: str
    timeout_s: float

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (or, lean, the connection broke)."""
        ...

    def call(self, method: Method, request: Any) -> Any:
        """One call; its response message.

        Raises:
            CxlkvError: the daemon's error for this call; DaemonUnreachable or
                Unavailable as the module says.
        """
        ...

    def call_many(self, calls: Sequence[tuple[Method, Any]]) -> list[Any]:
        """Several calls in flight at once; per call its response or its :class:`CxlkvError`.

        Raises:
            Unavailable: the daemon cannot be reached or does not answer in time.
        """
        ...

    def send(self, method: Method, request: Any) -> None:
        """A call whose answer nobody waits for where the framing allows (lean);
        else a plain :meth:`call` with its answer dropped.

        Raises:
            CxlkvError: as :meth:`call` (gRPC), or Unavailable on a lost connection.
        """
        ...

    def send_nowait(self, method: Method, request: Any) -> bool:
        """:meth:`send` that never blocks the caller: ``False`` when the daemon is not
        taking requests right now (stopped, or its socket full), the request dropped.
        For reports whose loss costs only information (hit reports).

        Raises:
            Unavailable: the connection is closed or lost.
        """
        ...

    def close(self) -> None:
        """Close (idempotent)."""
        ...


class LeanConnection:
    """One lean-framing connection (blocking; use from one thread at a time).

    Args:
        path: the daemon's lean socket.
        timeout_s: longest wait for an answer, in seconds.

    Raises:
        Unavailable: the socket does not exist or nobody listens on it.
        UntrustedDaemon: the process listening on it runs as another user than
            the caller, root or the socket's owner (``SO_PEERCRED``).
    """

    def __init__(self, path: str, timeout_s: float, *, _sock: socket.socket | None = None) -> None:
        self.path = path
        #: Who answers, for messages.
        self.peer = f"clientd at {path}"
        self.timeout_s = timeout_s
        self._next_id = 1
        self._rb = bytearray(_RECV_BYTES)
        self._rmv = memoryview(self._rb)
        self._rstart = 0
        self._rend = 0
        self._large = bytearray()
        #: The rest of a request :meth:`send_nowait` could not write whole: written
        #: before anything else goes on this connection.
        self._unsent = b""
        if _sock is not None:
            self._sock: socket.socket | None = _sock
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout_s)
            sock.connect(path)
            check_daemon_peer(sock, path)  # before anything is sent
            # Blocking mode with kernel timeouts: one syscall per send/recv
            # (Python's settimeout adds a poll() before each).
            sock.settimeout(None)
            tv = _timeval(timeout_s)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
            try:  # large inline requests in one send (capped by net.core.wmem_max)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
            except OSError:
                pass
        except OSError as exc:
            sock.close()
            if isinstance(exc, UntrustedDaemon):
                raise
            raise DaemonUnreachable(_unreachable(path, exc)) from None
        self._sock = sock

    @classmethod
    def service(cls, address: str, timeout_s: float, *, peer: str) -> "LeanConnection":
        """A plaintext connection to a lean-framing service (the master's, for direct
        commit) at TCP ``host:port`` or ``unix:PATH``, ``peer`` naming it in messages.

        Raises:
            Unavailable: nobody listens there, no connection within ``timeout_s``,
                or the Unix socket's listener runs as another user (not root).
        """
        if address.startswith("unix:"):
            try:
                conn = cls(address[5:], timeout_s)
            except (CxlkvError, UntrustedDaemon) as exc:
                raise Unavailable(f"cannot connect to {peer} at {address}: {exc}") from None
            conn.peer = f"{peer} at {address}"
            return conn
        host, _, port = address.rpartition(":")
        try:
            sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s)
        except (OSError, ValueError) as exc:
            raise Unavailable(f"cannot connect to {peer} at {address}: {exc}") from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(None)
            tv = _timeval(timeout_s)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
        except OSError as exc:
            sock.close()
            raise Unavailable(f"cannot connect to {peer} at {address}: {exc}") from None
        conn = cls(address, timeout_s, _sock=sock)
        conn.peer = f"{peer} at {address}"
        return conn

    @property
    def closed(self) -> bool:
        """Whether the connection was closed (after an error or :meth:`close`)."""
        return self._sock is None

    def close(self) -> None:
        """Close the socket (idempotent)."""
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None

    def peer_closed(self) -> bool:
        """Whether the daemon closed its end while this connection sat idle (it
        stopped or restarted).

        Non-blocking: answers already there (to :meth:`send` calls, which nobody
        waits for) are taken into the receive buffer, where the next call skips
        them, so that an end of stream behind them is seen too; usually one
        ``recv`` that finds nothing.
        """
        sock = self._sock
        if sock is None:
            return True
        rb = self._rb
        try:
            while True:
                self._compact()
                room = len(rb) - self._rend
                if not room:
                    return False  # a full buffer of unread answers: the daemon is there
                n = sock.recv_into(self._rmv[self._rend:], room, socket.MSG_DONTWAIT)
                if not n:
                    return True
                self._rend += n
        except BlockingIOError:
            return False  # open, nothing (more) to read
        except OSError:
            return True

    # -- one call -----------------------------------------------------------
    def call(self, method: Method, request: Any) -> Any:
        """Send one request and wait for its answer.

        Raises:
            CxlkvError: the daemon's error for this call.
            Unavailable: connection lost or no answer within ``timeout_s``
                (the connection is closed then).
        """
        sock = self._sock
        if sock is None:
            raise DaemonUnreachable(f"connection to {self.peer} is closed")
        rid = self._next_id
        self._next_id = rid + 1
        payload = request.SerializeToString()
        header = _pack(MIN_LENGTH + len(payload), method.number, 0, rid)
        try:
            self._send_unsent(sock)
            if len(payload) <= _JOIN_BYTES:
                sock.sendall(header + payload)
            else:
                sock.sendall(header)
                sock.sendall(payload)
            while True:
                code, got, body = self._read_frame()
                if got == rid:
                    break  # answers to abandoned requests (none in practice) are skipped
        except (socket.timeout, BlockingIOError):  # SO_RCVTIMEO / SO_SNDTIMEO expired
            self.close()
            raise Unavailable(f"{self.peer} did not answer {method.name} within {self.timeout_s:g} s") from None
        except OSError as exc:
            self.close()
            raise DaemonUnreachable(f"connection to {self.peer} lost during {method.name}: {exc}") from None
        if code:
            raise _error_from_detail(code, body)
        try:
            return method.response_type.FromString(body)
        except DecodeError as exc:
            raise Internal(f"{method.name}: malformed answer from clientd: {exc}") from None

    def send(self, method: Method, request: Any) -> None:
        """Send one request without waiting for its answer (which a later call skips):
        for calls whose answer does not matter, such as ending leases.

        Raises:
            Unavailable: the connection is closed or lost.
        """
        sock = self._sock
        if sock is None:
            raise DaemonUnreachable(f"connection to {self.peer} is closed")
        rid = self._next_id
        self._next_id = rid + 1
        payload = request.SerializeToString()
        try:
            self._skip_answers()
            self._send_unsent(sock)
            sock.sendall(_pack(MIN_LENGTH + len(payload), method.number, 0, rid) + payload)
        except OSError as exc:
            self.close()
            raise DaemonUnreachable(f"connection to {self.peer} lost during {method.name}: {exc}") from None

    def send_nowait(self, method: Method, request: Any) -> bool:
        """:meth:`send` that never blocks: ``False`` when the daemon's socket is full
        (the daemon is stopped, or not reading), the request dropped. A request the
        socket took in part is finished before anything else is written on this
        connection.

        Raises:
            Unavailable: the connection is closed or lost.
        """
        sock = self._sock
        if sock is None:
            raise DaemonUnreachable(f"connection to {self.peer} is closed")
        try:
            self._skip_answers()
            if self._unsent:
                self._unsent = self._unsent[sock.send(self._unsent, socket.MSG_DONTWAIT):]
                if self._unsent:
                    return False
            payload = request.SerializeToString()
            data = _pack(MIN_LENGTH + len(payload), method.number, 0, self._next_id) + payload
            n = sock.send(data, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        except OSError as exc:
            self.close()
            raise DaemonUnreachable(f"connection to {self.peer} lost during {method.name}: {exc}") from None
        self._next_id += 1
        if n < len(data):
            self._unsent = data[n:]
        return True

    def _send_unsent(self, sock: socket.socket) -> None:
        """Finish, blocking, the request :meth:`send_nowait` left partly written."""
        if self._unsent:
            sock.sendall(self._unsent)
            self._unsent = b""

    def _skip_answers(self) -> None:
        """Read, without blocking, and drop the answers already here to earlier
        :meth:`send` calls (nobody waits for them, and no call is in flight on a
        connection while it sends). Left unread they would fill the daemon's side
        until it stops reading this connection: a process that only reads from the
        index, sending hit reports, would then block in a send after some millions
        of reads."""
        sock, rb = self._sock, self._rb
        assert sock is not None
        while True:
            while self._rend - self._rstart >= HEADER_BYTES:  # drop whole frames
                total = LENGTH_BYTES + _unpack_from(rb, self._rstart)[0]
                if total > self._rend - self._rstart:
                    break
                self._rstart += total
            if self._rstart == self._rend:
                self._rstart = self._rend = 0
            self._compact()
            room = len(rb) - self._rend
            if not room:
                return  # a frame larger than the buffer: the next call reads it
            try:
                n = sock.recv_into(self._rmv[self._rend:], room, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            if not n:
                return  # the daemon closed: the next call finds out
            self._rend += n

    def _read_frame(self) -> tuple[int, int, Any]:
        """Read one whole frame: (code, request id, body)."""
        rb = self._rb
        while True:
            avail = self._rend - self._rstart
            if avail >= HEADER_BYTES:
                length, code, _flags, rid = _unpack_from(rb, self._rstart)
                if length < MIN_LENGTH:
                    raise ConnectionError(f"bad frame length {length} from clientd")
                total = LENGTH_BYTES + length
                if avail >= total:
                    s = self._rstart
                    body = rb[s + HEADER_BYTES:s + total]
                    self._rstart = s + total
                    if self._rstart == self._rend:
                        self._rstart = self._rend = 0
                    return code, rid, body
                if total > len(rb):
                    return code, rid, self._read_large(length - MIN_LENGTH, avail - HEADER_BYTES)
            self._compact()
            n = self._sock.recv_into(self._rmv[self._rend:])  # type: ignore[union-attr]
            if not n:
                raise ConnectionError("clientd closed the connection")
            self._rend += n

    def _read_large(self, body_len: int, have: int) -> memoryview:
        # One large buffer per connection, reused (a fresh one would page-fault
        # every time); the caller parses it before the next call.
        if body_len > _KEEP_LARGE_BYTES:
            body = memoryview(bytearray(body_len))  # rare: not kept
        else:
            if len(self._large) < body_len:
                self._large = bytearray(body_len)
            body = memoryview(self._large)[:body_len]
        s = self._rstart + HEADER_BYTES
        body[:have] = self._rb[s:s + have]
        self._rstart = self._rend = 0
        mv = memoryview(body)
        pos = have
        while pos < body_len:
            n = self._sock.recv_into(mv[pos:])  # type: ignore[union-attr]
            if not n:
                raise ConnectionError("clientd closed the connection")
            pos += n
        return body

    # -- pipelined calls ----------------------------------------------------
    def call_many(self, calls: Sequence[tuple[Method, Any]]) -> list[Any]:
        """Send several requests pipelined; answers may come in any order.

        Returns:
            Per call, its response message or the :class:`CxlkvError` it failed with.

        Raises:
            Unavailable: connection lost or no progress within ``timeout_s``.
        """
        if len(calls) == 1:
            m, req = calls[0]
            try:
                return [self.call(m, req)]
            except Unavailable:
                raise
            except CxlkvError as exc:
                return [exc]
        sock = self._sock
        if sock is None:
            raise DaemonUnreachable(f"connection to {self.peer} is closed")
        pending: dict[int, int] = {}
        parts: list[bytes] = []
        for i, (m, req) in enumerate(calls):
            rid = self._next_id
            self._next_id = rid + 1
            pending[rid] = i
            payload = req.SerializeToString()
            parts.append(_pack(MIN_LENGTH + len(payload), m.number, 0, rid))
            parts.append(payload)
        out_buf = memoryview(self._unsent + b"".join(parts))
        self._unsent = b""
        del parts
        sent = 0
        results: list[Any] = [None] * len(calls)
        poller = select.poll()
        timeout_ms = int(self.timeout_s * 1000)
        sock.setblocking(False)
        try:
            while pending:
                # Drain every frame already buffered before waiting.
                while pending and (state := self._frame_buffered()):
                    if state == 2:  # larger than the receive buffer: read it to its end
                        sock.setblocking(True)
                        code, rid, body = self._read_frame()
                        sock.setblocking(False)
                    else:
                        code, rid, body = self._read_frame()
                    i = pending.pop(rid, -1)
                    if i >= 0:
                        results[i] = self._decode(calls[i][0], code, body)
                if not pending:
                    break
                want = select.POLLIN | (select.POLLOUT if sent < len(out_buf) else 0)
                poller.register(sock, want)
                events = poller.poll(timeout_ms)
                poller.unregister(sock)
                if not events:
                    raise socket.timeout()
                ev = events[0][1]
                if ev & select.POLLOUT and sent < len(out_buf):
                    try:
                        sent += sock.send(out_buf[sent:sent + (1 << 20)])
                    except BlockingIOError:
                        pass
                if ev & (select.POLLIN | select.POLLHUP | select.POLLERR):
                    self._fill()
        except (socket.timeout, BlockingIOError):
            self.close()
            raise Unavailable(f"{self.peer} did not answer within {self.timeout_s:g} s") from None
        except OSError as exc:
            self.close()
            raise DaemonUnreachable(f"connection to {self.peer} lost: {exc}") from None
        finally:
            if self._sock is not None:
                self._sock.setblocking(True)
        return results

    def _frame_buffered(self) -> int:
        """0: no whole header buffered; 1: a whole frame buffered; 2: a frame too
        large for the receive buffer has begun."""
        avail = self._rend - self._rstart
        if avail < HEADER_BYTES:
            return 0
        total = LENGTH_BYTES + HEADER.unpack_from(self._rb, self._rstart)[0]
        if avail >= total:
            return 1
        return 2 if total > len(self._rb) else 0

    def _compact(self) -> None:
        """Move the unread bytes to the front of the receive buffer when less than
        a quarter of it is free behind them."""
        rb = self._rb
        if self._rstart and len(rb) - self._rend < (len(rb) >> 2):
            rest = self._rend - self._rstart
            rb[:rest] = rb[self._rstart:self._rend]
            self._rstart, self._rend = 0, rest

    def _fill(self) -> None:
        self._compact()
        try:
            n = self._sock.recv_into(self._rmv[self._rend:])  # type: ignore[union-attr]
        except BlockingIOError:
            return
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                return
            raise
        if not n:
            raise ConnectionError("clientd closed the connection")
        self._rend += n

    @staticmethod
    def _decode(method: Method, code: int, body: Any) -> Any:
        if code:
            return _error_from_detail(code, body)
        try:
            return method.response_type.FromString(body)
        except DecodeError as exc:
            return Internal(f"{method.name}: malformed answer from clientd: {exc}")


class GrpcConnection:
    """The daemon's gRPC API on its Unix socket (thread-safe).

    Args:
        path: the daemon's gRPC socket.
        timeout_s: deadline of each call, in seconds.

    Raises:
        Unavailable: the socket does not exist or nobody listens on it.
        UntrustedDaemon: the process listening on it runs as another user than
            the caller, root or the socket's owner (``SO_PEERCRED``).
    """

    def __init__(self, path: str, timeout_s: float) -> None:
        import grpc

        from cxlkv.v1 import client_pb2_grpc

        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.settimeout(timeout_s)
            probe.connect(path)
            check_daemon_peer(probe, path)  # before gRPC's own connection sends anything
        except OSError as exc:
            if isinstance(exc, UntrustedDaemon):
                raise
            raise DaemonUnreachable(_unreachable(path, exc)) from None
        finally:
            probe.close()
        self._grpc = grpc
        self._lost_codes = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
        self.path = path
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(f"unix:{path}", options=[
            ("grpc.max_receive_message_length", 256 << 20),
            ("grpc.max_send_message_length", 256 << 20),
            # A local daemon that restarts is back within seconds: try again
            # every 0.1-1 s, not gRPC's default 1 s growing to 120 s (a read
            # retried under Client.retry_s would fail until the next attempt).
            ("grpc.initial_reconnect_backoff_ms", RECONNECT_MIN_MS),
            ("grpc.min_reconnect_backoff_ms", RECONNECT_MIN_MS),
            ("grpc.max_reconnect_backoff_ms", RECONNECT_MAX_MS),
        ])
        self._stub = client_pb2_grpc.ClientServiceStub(self._channel)
        self.closed = False
        #: Calls :meth:`send_nowait` started whose answer has not come yet.
        self._unanswered = 0
        self._unanswered_lock = threading.Lock()
        #: Set when the channel became ready again after losing its connection (the
        #: daemon may have restarted and forgotten its buffers); the Client clears it
        #: once it has checked them.
        self.reconnected = False
        self._seen_ready = False
        self._channel.subscribe(self._on_state)

    def _on_state(self, state: Any) -> None:
        """gRPC connectivity callback (a gRPC thread)."""
        if state == self._grpc.ChannelConnectivity.READY:
            if self._seen_ready:
                self.reconnected = True
            self._seen_ready = True

    def close(self) -> None:
        """Close the channel (idempotent).

        gRPC's connectivity poller (a thread, waking every 0.2 s) fails with a
        printed traceback if the channel closes between its check for
        subscribers and its next wait (grpc/grpc#18995, also in gRPC's own
        close). So after unsubscribing, the channel is closed by a short-lived
        daemon thread once the poller has seen that nobody listens (at most
        :data:`_POLLER_STOP_S` later); this call returns at once.

        During interpreter shutdown (a ``Client`` never closed, collected by
        ``__del__`` while modules are torn down) no thread is started: a thread
        started then never runs, and ``Thread.start()`` waits for it forever on
        Python 3.11 (3.12 raises ``RuntimeError``); the process is exiting, so the
        channel is left to it.
        """
        if not self.closed:
            self.closed = True
            if sys.is_finalizing():
                return
            self._channel.unsubscribe(self._on_state)
            threading.Thread(target=_close_after_poller, args=(self._channel,), daemon=True,
                             name="cxlkv-grpc-close").start()

    def call(self, method: Method, request: Any) -> Any:
        """One call.

        Raises:
            CxlkvError: the daemon's error, or Unavailable.
        """
        try:
            return getattr(self._stub, method.name)(request, timeout=self.timeout_s)
        except self._grpc.RpcError as exc:
            raise self._error(exc) from None

    def send(self, method: Method, request: Any) -> None:
        """:meth:`call`, its answer dropped (gRPC has no call without an answer).

        Raises:
            CxlkvError: the daemon's error, or Unavailable.
        """
        self.call(method, request)

    def send_nowait(self, method: Method, request: Any) -> bool:
        """The call started and not waited for (its answer or error dropped); at most
        :data:`MAX_UNANSWERED_SENDS` in flight, else ``False`` and the request dropped:
        a stopped daemon never blocks the caller, nor piles up calls."""
        if self._unanswered >= MAX_UNANSWERED_SENDS:
            return False
        with self._unanswered_lock:
            self._unanswered += 1
        try:
            fut = getattr(self._stub, method.name).future(request, timeout=self.timeout_s)
        except self._grpc.RpcError as exc:
            self._answered(None)
            raise self._error(exc) from None
        fut.add_done_callback(self._answered)
        return True

    def _answered(self, _fut: Any) -> None:
        with self._unanswered_lock:
            self._unanswered -= 1

    def _error(self, exc: Any) -> CxlkvError:
        """The cxlkv error of a failed call. A bare gRPC UNAVAILABLE or CANCELLED
        (no cxlkv details: the channel could not reach the daemon, or the daemon
        stopped with the call in flight — the SDK never cancels its own calls) is
        :class:`DaemonUnreachable`."""
        from cxlkv.errors import from_rpc_error

        err = from_rpc_error(exc, target=f"clientd at {self.path}")
        if type(err) is Unavailable and exc.code() in self._lost_codes and not exc.trailing_metadata():
            return DaemonUnreachable(err.message)
        return err

    def call_many(self, calls: Sequence[tuple[Method, Any]]) -> list[Any]:
        """Several calls in flight at once; per call its response or its error.

        Raises:
            Unavailable: the daemon cannot be reached.
        """
        futures = [getattr(self._stub, m.name).future(req, timeout=self.timeout_s) for m, req in calls]
        out: list[Any] = []
        for f in futures:
            try:
                out.append(f.result())
            except self._grpc.RpcError as exc:
                err = self._error(exc)
                if isinstance(err, Unavailable):
                    raise err from None
                out.append(err)
        return out


class Connector(Protocol):
    """Where a :class:`~cxlkv.client.Client` gets its connections (one framing).

    The Client asks for a connection on every call (:meth:`get`); when the daemon
    behind it may be a new one (a fresh lean connection, a gRPC channel that
    connected again), the answer says so and the Client checks what the daemon
    knew of this process (its shared buffers, the regions direct mode mapped)
    before using it.
    """

    def get(self, check: bool) -> tuple[Connection, bool]:
        """This thread's connection, and whether the daemon may have changed since
        this process last checked it (``fresh``).

        Args:
            check: first see whether the daemon closed an idle lean connection (one
                non-blocking peek) or the gRPC channel connected again; done once per
                public call.

        Raises:
            DaemonUnreachable, UntrustedDaemon: a new connection cannot be made.
        """
        ...

    def unchecked(self, conn: Connection) -> None:
        """The check of a fresh ``conn`` failed: make the next :meth:`get` fresh again."""
        ...

    def lost(self) -> None:
        """A call lost the daemon: the next connection counts as fresh."""
        ...

    def close(self) -> None:
        """Close every connection handed out (idempotent)."""
        ...


class LeanConnector:
    """Lean connections, one per thread (so threads run calls in parallel).

    A new connection is always fresh (the daemon may be a new one); an idle one
    the daemon closed is replaced by a new one.

    Args:
        path: the daemon's lean socket.
        timeout_s: longest wait for an answer, in seconds.
    """

    def __init__(self, path: str, timeout_s: float, *, _sock: socket.socket | None = None) -> None:
        self.path = path
        #: Who answers, for messages.
        self.peer = f"clientd at {path}"
        self.timeout_s = timeout_s
        self._local = threading.local()
        self._lock = threading.Lock()
        self._conns: list[LeanConnection] = []

    def get(self, check: bool) -> tuple[LeanConnection, bool]:
        c = getattr(self._local, "conn", None)
        if check and c is not None and not c.closed and c.peer_closed():
            c.close()
        if c is not None and not c.closed:
            return c, False
        c = LeanConnection(self.path, self.timeout_s)
        self._local.conn = c
        with self._lock:
            self._conns = [x for x in self._conns if not x.closed]
            self._conns.append(c)
        return c, True

    def unchecked(self, conn: Connection) -> None:
        conn.close()  # the next call reconnects and asks again

    def lost(self) -> None:
        pass  # a broken lean connection is closed: its replacement is fresh

    def close(self) -> None:
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            c.close()


class GrpcConnector:
    """One gRPC channel shared by every thread (made on first use).

    The channel is fresh when gRPC has said it connected again
    (:attr:`GrpcConnection.reconnected`, asked when ``check``), or after a call
    lost the daemon (:meth:`lost`).

    Args:
        path: the daemon's gRPC socket.
        timeout_s: deadline of each call, in seconds.
    """

    def __init__(self, path: str, timeout_s: float, *, _sock: socket.socket | None = None) -> None:
        self.path = path
        #: Who answers, for messages.
        self.peer = f"clientd at {path}"
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._conn: GrpcConnection | None = None

    def get(self, check: bool) -> tuple[GrpcConnection, bool]:
        if self._conn is None:
            with self._lock:
                if self._conn is None:
                    self._conn = GrpcConnection(self.path, self.timeout_s)
        g = self._conn
        if check and g.reconnected:  # the channel found the daemon again
            g.reconnected = False
            return g, True
        return g, False

    def unchecked(self, conn: Connection) -> None:
        conn.reconnected = True  # type: ignore[attr-defined]  # ask again at the next call

    def lost(self) -> None:
        g = self._conn
        if g is not None:
            g.reconnected = True

    def close(self) -> None:
        with self._lock:
            g, self._conn = self._conn, None
        if g is not None:
            g.close()


def connector(protocol: str, socket_path: str, lean_socket_path: str, timeout_s: float) -> Connector:
    """The :class:`Connector` of ``protocol`` (``"lean"`` or ``"grpc"``).

    Raises:
        InvalidArgument: another protocol.
    """
    if protocol == "lean":
        return LeanConnector(lean_socket_path, timeout_s)
    if protocol == "grpc":
        return GrpcConnector(socket_path, timeout_s)
    raise InvalidArgument(f"protocol must be \"lean\" or \"grpc\", got {protocol!r}")


def _close_after_poller(channel: Any) -> None:
    """Close ``channel`` once gRPC's connectivity poller has stopped (see
    :meth:`GrpcConnection.close`)."""
    state = getattr(channel, "_connectivity_state", None)  # private: best effort
    deadline = time.monotonic() + _POLLER_STOP_S
    while getattr(state, "polling", False) and time.monotonic() < deadline:
        time.sleep(0.01)
    channel.close()


def _timeval(seconds: float) -> bytes:
    """A ``struct timeval`` for SO_RCVTIMEO / SO_SNDTIMEO."""
    sec = int(seconds)
    return struct.pack("@ll", sec, int((seconds - sec) * 1e6))


#: How the daemon's socket is named to the user in error messages: the SDK's
#: argument; the command line (cxlkv.cli.kv) sets ``"--socket"``.
SOCKET_SETTING = "socket_path"


def _unreachable(path: str, exc: OSError) -> str:
    """One line saying why ``path`` could not be connected to, naming the setting
    to fix (:data:`SOCKET_SETTING` or ``$CXLKV_SOCKET``) and what the path is.
    A lean socket (``X.lean``) is reported by the path the user gave (``X``)."""
    import stat as _stat

    fix = f"{SOCKET_SETTING} or $CXLKV_SOCKET"
    shown = path[:-len(".lean")] if path.endswith(".lean") else path

    def mode_of(p: str) -> int | None:
        try:
            return os.stat(p).st_mode
        except OSError:
            return None

    for p in dict.fromkeys((shown, path)):  # the path given first, then the one connected to
        mode = mode_of(p)
        if mode is not None and not _stat.S_ISSOCK(mode):
            kind = "a directory" if _stat.S_ISDIR(mode) else "a regular file" if _stat.S_ISREG(mode) else "no socket"
            return (f"cannot connect to clientd at {shown}: {p} is {kind}, not a socket "
                    f"({fix} must name the daemon's socket, e.g. /run/cxlkv/clientd.sock)")
    if isinstance(exc, FileNotFoundError):
        parent = os.path.dirname(shown) or "."
        if shown != path and mode_of(shown) is not None:
            why = f"it has no lean socket {path} (a daemon without lean frames? use protocol=\"grpc\")"
        elif not os.path.isdir(parent):
            why = f"directory {parent} does not exist ({fix} names the daemon's socket)"
        else:
            why = f"no such socket (is clientd running? {fix} names its socket)"
    elif isinstance(exc, ConnectionRefusedError):
        why = "connection refused (a socket left behind: clientd is not running)"
    elif isinstance(exc, PermissionError):
        why = "permission denied (socket_mode, or run as a member of the daemon's group)"
    else:
        why = exc.strerror or str(exc)
    return f"cannot connect to clientd at {shown}: {why}"
