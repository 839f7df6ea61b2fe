"""The lean front-end: ClientService in length-prefixed frames on a Unix socket.

Same messages as the gRPC front-end, without HTTP/2 (docs/protocol.md): a
request is ``u32 length | u16 method | u16 flags | u64 request_id | message``,
a response ``u32 length | u16 code | u16 flags | u64 request_id | message``
(an ``ErrorDetail`` when ``code`` is not 0). Connections are pipelined: every
request runs as its own task and answers when done, in any order.

The connection handling (partial and oversized frames, flow control,
disconnects) is :class:`cxlkv.wire.lean.LeanProtocol`, shared with the master's lean
link; this module only maps ClientService method numbers onto :class:`ClientApi`.
"""

from __future__ import annotations

from cxlkv.client.framing import METHODS
from cxlkv.clientd.api import ClientApi
from cxlkv.wire.lean import LeanProtocol, LeanRoute
from cxlkv.wire.lean import DEFAULT_MAX_IN_FLIGHT
from cxlkv.wire.lean import LeanFrameServer as _LeanServer

__all__ = ["LeanServer", "LeanProtocol"]


class LeanServer(_LeanServer):
    """The lean-framing ClientService on ``socket_path``.

    Args:
        api: the ClientService methods.
        socket_path: Unix socket path (must not exist; the daemon clears stale ones).
        socket_mode: permission bits set on the socket.
        max_frame_bytes: largest accepted frame (``length`` field), in bytes
            (default: the configuration's ``max_request_bytes``).
        max_in_flight: calls one connection may have running before it is paused.
    """

    def __init__(
        self,
        api: ClientApi,
        socket_path: str,
        socket_mode: int,
        *,
        max_frame_bytes: int | None = None,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    ) -> None:
        routes = {m.number: LeanRoute(m.name, m.request_type.FromString, getattr(api, m.name), m.request_type) for m in METHODS}
        if max_frame_bytes is None:
            max_frame_bytes = api.cfg.max_request_bytes
        super().__init__(routes, max_frame_bytes=max_frame_bytes, max_in_flight=max_in_flight)
        self.api = api
        self.socket_path = socket_path
        self.socket_mode = socket_mode

    async def start(self) -> None:
        """Bind ``socket_path`` and serve.

        Raises:
            OSError: the socket could not be bound.
        """
        await self.start_unix(self.socket_path, self.socket_mode)
