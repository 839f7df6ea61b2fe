"""The gRPC front-end: ClientService (plus health and reflection) on a Unix socket.

A thin translator: every RPC awaits the :class:`~cxlkv.clientd.api.ClientApi`
method of the same name; a :class:`~cxlkv.errors.CxlkvError` becomes a gRPC
status whose details hold an ``ErrorDetail`` (the one mapping in
:mod:`cxlkv.errors`). The work of a call runs shielded from cancellation: a
caller that disconnects mid-put does not leave a half-done put behind — the put
completes (or is revoked) and only the answer is lost.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from cxlkv.wire.reflection import enable_reflection
from grpc_status import rpc_status

from cxlkv.client.framing import METHODS
from cxlkv.clientd.api import ClientApi
from cxlkv.errors import CxlkvError, Internal, rpc_status_for
from cxlkv.v1 import client_pb2, client_pb2_grpc
from cxlkv.wire.parse import add_service

__all__ = ["SERVICE_NAME", "make_servicer", "GrpcFrontEnd"]

log = logging.getLogger(__name__)

#: Full name of the service, as health and reflection report it.
SERVICE_NAME = client_pb2.DESCRIPTOR.services_by_name["ClientService"].full_name
#: Largest message the daemon's gRPC server sends, in bytes (what it accepts is
#: the configuration's ``max_request_bytes``).
MAX_MESSAGE_BYTES = 256 << 20


def shielded(coro: Awaitable[Any]) -> "asyncio.Future[Any]":
    """Run ``coro`` as a task that a cancelled caller does not cancel.

    The task's exception, if nobody awaits it any more, is consumed (logged at
    debug level) instead of being reported as never retrieved.
    """
    task = asyncio.ensure_future(coro)

    def _consume(t: "asyncio.Future[Any]") -> None:
        if not t.cancelled() and t.exception() is not None:
            log.debug("call finished after its caller left: %r", t.exception())

    task.add_done_callback(_consume)
    return asyncio.shield(task)


def _rpc(name: str, handler: Callable[[Any], Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def rpc(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await shielded(handler(request))
        except CxlkvError as err:
            await context.abort_with_status(rpc_status.to_status(rpc_status_for(err)))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug: answer INTERNAL, keep serving
            log.exception("%s failed", name)
            await context.abort_with_status(
                rpc_status.to_status(rpc_status_for(Internal(f"{name}: {type(exc).__name__}: {exc}"))))

    rpc.__name__ = name
    rpc.__doc__ = f"ClientService.{name} → ClientApi.{name}."
    return rpc


def make_servicer(api: ClientApi) -> client_pb2_grpc.ClientServiceServicer:
    """A ClientService servicer whose every RPC is the ``api`` method of the same name."""
    attrs = {m.name: _rpc(m.name, getattr(api, m.name)) for m in METHODS}
    cls = type("ClientServiceServicer", (client_pb2_grpc.ClientServiceServicer,), attrs)
    return cls()


class GrpcFrontEnd:
    """The gRPC server on ``socket_path``.

    Args:
        api: the ClientService methods.
        socket_path: Unix socket path (must not exist; the daemon clears stale ones).
        socket_mode: permission bits set on the socket (e.g. ``0o660``).
    """

    def __init__(self, api: ClientApi, socket_path: str, socket_mode: int) -> None:
        self.api = api
        self.socket_path = socket_path
        self.socket_mode = socket_mode
        self.health = health.aio.HealthServicer()
        self.server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", api.cfg.max_request_bytes),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
        ])
        # safe deserializers: a request that does not parse answers INVALID_ARGUMENT/INVALID_KEY (cxlkv.wire.parse)
        add_service(self.server, client_pb2.DESCRIPTOR.services_by_name["ClientService"], make_servicer(api))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        enable_reflection((SERVICE_NAME, health.SERVICE_NAME), self.server)  # v1 and v1alpha

    async def start(self) -> None:
        """Bind and serve (health NOT_SERVING until :meth:`set_serving`).

        Raises:
            RuntimeError: the socket could not be bound.
        """
        import os

        port = self.server.add_insecure_port(f"unix:{self.socket_path}")
        if not port:
            raise RuntimeError(f"cannot bind gRPC socket {self.socket_path}")
        await self.server.start()
        os.chmod(self.socket_path, self.socket_mode)
        await self.set_serving(False)

    async def set_serving(self, serving: bool) -> None:
        """Report SERVING (registered with the master) or NOT_SERVING through grpc.health."""
        status = (health_pb2.HealthCheckResponse.SERVING if serving
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.health.set("", status)
        await self.health.set(SERVICE_NAME, status)

    async def stop(self, grace_s: float) -> None:
        """Stop accepting calls; let running ones finish for ``grace_s`` seconds."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace_s)
