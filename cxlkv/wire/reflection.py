"""gRPC server reflection under both names tools ask for: ``v1`` and ``v1alpha``.

grpcio-reflection serves only ``grpc.reflection.v1alpha.ServerReflection``; newer
tools (grpcurl ≥ 1.8.8, Postman, grpc_cli, grpc-js clients) ask
``grpc.reflection.v1.ServerReflection`` first. The two services' messages are the
same on the wire — grpc-proto's ``grpc/reflection/v1/reflection.proto`` is the
v1alpha file with its package renamed (same messages, fields and numbers) — so
the library's own servicer answers v1 too, registered under the v1 method path
with the v1alpha message classes as (de)serializers. Nothing is hand-written but
that registration.
"""

from __future__ import annotations

from typing import Iterable

import grpc
from grpc_reflection.v1alpha import reflection
from grpc_reflection.v1alpha import reflection_pb2 as _pb

__all__ = ["V1_SERVICE_NAME", "V1ALPHA_SERVICE_NAME", "enable_reflection"]

#: Full names of the two reflection services served.
V1_SERVICE_NAME = "grpc.reflection.v1.ServerReflection"
V1ALPHA_SERVICE_NAME = reflection.SERVICE_NAME


def enable_reflection(service_names: Iterable[str], server: grpc.aio.Server) -> None:
    """Serve reflection v1 and v1alpha on an asyncio gRPC server.

    Args:
        service_names: full names of the server's other services (both
            reflection services are added to the list it reports).
        server: a ``grpc.aio.Server`` not started yet.
    """
    names = (*service_names, V1_SERVICE_NAME, V1ALPHA_SERVICE_NAME)
    servicer = reflection.aio.ReflectionServicer(names)
    # v1alpha: the library's own registration
    from grpc_reflection.v1alpha import reflection_pb2_grpc

    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    v1 = grpc.method_handlers_generic_handler(V1_SERVICE_NAME, {
        "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
            servicer.ServerReflectionInfo,
            request_deserializer=_pb.ServerReflectionRequest.FromString,
            response_serializer=_pb.ServerReflectionResponse.SerializeToString,
        ),
    })
    server.add_generic_rpc_handlers((v1,))
