"""The lean framing: ClientService messages in length-prefixed binary frames.

clientd serves its API twice on the same host: as gRPC on ``socket_path`` (any
language, with health and reflection) and in this lean framing on
``lean_socket_path``, for callers that need more calls per second than gRPC's
HTTP/2 machinery allows in Python. Both carry the *same* protobuf messages of
``cxlkv.v1.ClientService``; docs/protocol.md is the normative description.

Frames (all integers little-endian)::

    request  = u32 length | u16 method | u16 flags | u64 request_id | request bytes
    response = u32 length | u16 code   | u16 flags | u64 request_id | response bytes

``length`` counts every byte after the length field itself (12 + payload).
``method`` is the 1-based position of the RPC in ``ClientService`` as declared in
client.proto (:data:`METHODS`, derived from the service descriptor). ``code`` is
the ``cxlkv.v1.ErrorCode``: 0 means the payload is the RPC's response message,
anything else means it is a ``cxlkv.v1.ErrorDetail``. ``flags`` are reserved:
senders write 0, receivers ignore them. A connection is pipelined: a client may
send many requests before reading, and responses may come back in any order,
matched by ``request_id``.

This module holds only the wire format (no I/O); the SDK
(:mod:`cxlkv.client`) and the daemon (:mod:`cxlkv.clientd.lean`) share it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from google.protobuf import message_factory
from google.protobuf.message import Message

from cxlkv.v1 import client_pb2

__all__ = [
    "HEADER",
    "HEADER_BYTES",
    "LENGTH_BYTES",
    "MIN_LENGTH",
    "DEFAULT_MAX_FRAME_BYTES",
    "Method",
    "service_methods",
    "METHODS",
    "METHODS_BY_NAME",
    "METHODS_BY_NUMBER",
    "encode_request",
    "encode_response",
]

#: ``u32 length | u16 method-or-code | u16 flags | u64 request_id``.
HEADER = struct.Struct("<IHHQ")
#: Bytes of the fixed header (16).
HEADER_BYTES = HEADER.size
#: Bytes of the length field; ``length`` counts what follows it.
LENGTH_BYTES = 4
#: Smallest legal ``length`` value: the rest of the header with an empty payload.
MIN_LENGTH = HEADER_BYTES - LENGTH_BYTES
#: Largest frame the daemon accepts by default (``length`` field value), in bytes.
DEFAULT_MAX_FRAME_BYTES = 256 << 20


@dataclass(frozen=True)
class Method:
    """One RPC of ClientService as the lean framing numbers it.

    Attributes:
        number: 1-based position in the service declaration (the frame's method field).
        name: the RPC name, e.g. ``"GetInto"``.
        request_type: generated message class of the request.
        response_type: generated message class of the response.
    """

    number: int
    name: str
    request_type: type[Message]
    response_type: type[Message]


def service_methods(service: Any) -> tuple[Method, ...]:
    """Every RPC of ``service`` (a protobuf ServiceDescriptor) in declaration order,
    numbered from 1 (the frame's method field)."""
    return tuple(
        Method(
            number=i + 1,
            name=m.name,
            request_type=message_factory.GetMessageClass(m.input_type),
            response_type=message_factory.GetMessageClass(m.output_type),
        )
        for i, m in enumerate(service.methods)
    )


#: Every RPC in declaration order; ``METHODS[n - 1].number == n``.
METHODS: tuple[Method, ...] = service_methods(client_pb2.DESCRIPTOR.services_by_name["ClientService"])
#: RPC name → :class:`Method`.
METHODS_BY_NAME: dict[str, Method] = {m.name: m for m in METHODS}
#: Method number → :class:`Method`.
METHODS_BY_NUMBER: dict[int, Method] = {m.number: m for m in METHODS}


def encode_request(method: int, request_id: int, payload: bytes) -> bytes:
    """One request frame.

    Args:
        method: the method number (:attr:`Method.number`).
        request_id: caller-chosen id echoed in the response (0 … 2**64-1).
        payload: the serialized request message.

    Raises:
        struct.error: a field does not fit its width.
    """
    return HEADER.pack(MIN_LENGTH + len(payload), method, 0, request_id) + payload


def encode_response(code: int, request_id: int, payload: bytes) -> bytes:
    """One response frame (``code`` 0: ``payload`` is the response, else an ErrorDetail).

    Raises:
        struct.error: a field does not fit its width.
    """
    return HEADER.pack(MIN_LENGTH + len(payload), code, 0, request_id) + payload
