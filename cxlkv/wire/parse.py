"""Request parsing that never fails a server: a message that does not parse
becomes the documented error (docs/errors.md), on gRPC and on lean frames alike.

gRPC's Python server turns an exception in a request deserializer into
``StatusCode.UNKNOWN`` with raw Python text and no ``ErrorDetail``. Services
are therefore added with :func:`add_service`, whose deserializers never raise:
a message that fails to parse becomes a :class:`Malformed` sentinel, and the
handler answers its error (``INVALID_ARGUMENT``, or ``INVALID_KEY`` when a key
field is not valid UTF-8) with an ``ErrorDetail`` in the status details. The
lean servers use :func:`malformed_request_error` for the same answer.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import grpc
from google.protobuf import descriptor as _descriptor
from google.protobuf import message_factory
from grpc_status import rpc_status

from cxlkv.errors import CxlkvError, InvalidArgument, InvalidKey, rpc_status_for

__all__ = ["Malformed", "malformed_request_error", "bad_utf8_field", "safe_parser", "add_service"]

#: Field names that hold object keys: a non-UTF-8 value in one is INVALID_KEY.
_KEY_FIELDS = frozenset({"key", "keys", "damaged_keys"})


class Malformed:
    """What a safe parser returns for a request that does not parse.

    Attributes:
        error: the error to answer (:class:`InvalidKey` or :class:`InvalidArgument`).
    """

    __slots__ = ("error",)

    def __init__(self, error: CxlkvError) -> None:
        self.error = error


def _varint(data: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def bad_utf8_field(data: bytes, desc: _descriptor.Descriptor, _prefix: str = "") -> tuple[str, bool] | None:
    """Find a string field of ``desc`` whose bytes in ``data`` are not valid UTF-8.

    Returns:
        ``(dotted field path, whether it is a key field)`` of the first such field,
        or ``None`` (none found, or ``data`` is not well-formed enough to tell).
    """
    try:
        i, n = 0, len(data)
        is_map = desc.GetOptions().map_entry
        while i < n:
            tag, i = _varint(data, i)
            number, wire_type = tag >> 3, tag & 7
            if wire_type == 0:
                _, i = _varint(data, i)
            elif wire_type == 1:
                i += 8
            elif wire_type == 5:
                i += 4
            elif wire_type == 2:
                length, i = _varint(data, i)
                chunk = data[i:i + length]
                i += length
                f = desc.fields_by_number.get(number)
                if f is None:
                    continue
                if f.type == f.TYPE_STRING:
                    try:
                        chunk.decode("utf-8")
                    except UnicodeDecodeError:
                        return _prefix + f.name, (f.name in _KEY_FIELDS and not is_map)
                elif f.type == f.TYPE_MESSAGE:
                    found = bad_utf8_field(chunk, f.message_type, _prefix + f.name + ".")
                    if found is not None:
                        return found
            else:
                return None
    except (IndexError, ValueError):
        return None
    return None


def malformed_request_error(method: str, request_type: Any, data: bytes, exc: BaseException) -> CxlkvError:
    """The error to answer for request ``data`` of ``method`` that failed to parse.

    Returns:
        :class:`InvalidKey` if a key field is not valid UTF-8; :class:`InvalidArgument`
        naming the field if another string field is not; else :class:`InvalidArgument`
        "malformed request message" with the parser's reason. Always one line.
    """
    found = bad_utf8_field(bytes(data), request_type.DESCRIPTOR)
    if found is not None:
        path, is_key = found
        if is_key:
            return InvalidKey(f"{method}: key is not valid UTF-8 (field {path})")
        return InvalidArgument(f"{method}: field {path} is not valid UTF-8")
    reason = " ".join(str(exc).split()) or type(exc).__name__
    return InvalidArgument(f"{method}: malformed request message: {reason}")


def safe_parser(method: str, request_type: Any) -> Callable[[bytes], Any]:
    """A deserializer for ``request_type`` that returns :class:`Malformed` instead of raising."""
    from_string = request_type.FromString

    def parse(data: bytes) -> Any:
        try:
            return from_string(data)
        except Exception as exc:  # DecodeError, and whatever else a bad message raises
            return Malformed(malformed_request_error(method, request_type, data, exc))

    return parse


def _guarded(fn: Callable[..., Any]) -> Callable[[Any, grpc.aio.ServicerContext], Any]:
    async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Malformed):
            await context.abort_with_status(rpc_status.to_status(rpc_status_for(request.error)))
        result = fn(request, context)
        if inspect.isawaitable(result):
            result = await result
        return result

    return handler


def add_service(server: grpc.aio.Server, service: _descriptor.ServiceDescriptor, servicer: Any) -> None:
    """Serve every (unary) method of ``service`` with ``servicer``'s method of the
    same name, through safe deserializers (a request that does not parse answers
    its documented error with an ``ErrorDetail``, never ``UNKNOWN``)."""
    handlers = {}
    for m in service.methods:
        request_type = message_factory.GetMessageClass(m.input_type)
        response_type = message_factory.GetMessageClass(m.output_type)
        handlers[m.name] = grpc.unary_unary_rpc_method_handler(
            _guarded(getattr(servicer, m.name)),
            request_deserializer=safe_parser(m.name, request_type),
            response_serializer=response_type.SerializeToString,
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
