"""Protobuf messages as plain dicts for JSON output and SDK answers.

``google.protobuf.json_format.MessageToDict`` writes 64-bit integers as strings
(the proto3 JSON mapping) and leaves out fields at their default value;
:func:`message_dict` keeps every field, integers as ints and enums by name.
"""

from __future__ import annotations

from typing import Any

__all__ = ["message_dict"]


def _is_repeated(fd: Any) -> bool:
    rep = getattr(fd, "is_repeated", None)  # protobuf ≥ 6; older ones have only ``label``
    if rep is not None:
        return bool(rep)
    from google.protobuf.descriptor import FieldDescriptor

    return bool(fd.label == FieldDescriptor.LABEL_REPEATED)


def message_dict(msg: Any) -> dict[str, Any]:
    """A protobuf message as a dict with proto field names, every field present,
    integers as ints (``MessageToDict`` writes 64-bit ones as strings), enums by name."""
    from google.protobuf.descriptor import FieldDescriptor as F

    def value(fd: Any, v: Any) -> Any:
        if fd.type == F.TYPE_MESSAGE:
            return message_dict(v)
        if fd.type == F.TYPE_ENUM:
            ev = fd.enum_type.values_by_number.get(v)
            return ev.name if ev is not None else v
        return v

    out: dict[str, Any] = {}
    for fd in msg.DESCRIPTOR.fields:
        v = getattr(msg, fd.name)
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            vf = fd.message_type.fields_by_name["value"]
            out[fd.name] = {k: value(vf, x) for k, x in v.items()}
        elif _is_repeated(fd):
            out[fd.name] = [value(fd, x) for x in v]
        else:
            out[fd.name] = value(fd, v)
    return out
