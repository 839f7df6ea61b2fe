"""Mooncake's tensor object format: a 40-byte header, then the tensor's bytes.

Mooncake stores a tensor as ``[TensorMetadata][data]`` where ``TensorMetadata``
is ``{int32 dtype; int32 ndim; int64 shape[4]}`` in native (little-endian) byte
order, unused dimensions set to -1, and ``dtype`` one of Mooncake's
``TensorDtype`` values (:data:`DTYPES`). ``put_tensor_from`` / ``get_tensor_into``
expose this layout to callers, so cxlkv keeps it byte for byte.

This module is the codec. It needs no torch: :func:`encode` accepts CPU torch
tensors and numpy arrays, :func:`decode` yields a numpy array plus the torch
dtype name, and :func:`to_torch` (the only torch-dependent step) turns that into
a tensor.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from cxlkv.errors import InvalidArgument

__all__ = ["HEADER", "HEADER_BYTES", "MAX_DIMS", "DTYPES", "Encoded", "encode", "decode", "to_torch", "torch_module"]

#: ``TensorMetadata``: dtype, ndim, shape[4].
HEADER = struct.Struct("<ii4q")
#: Header size in bytes (40).
HEADER_BYTES = HEADER.size
#: Most dimensions a stored tensor may have (Mooncake's limit).
MAX_DIMS = 4

#: Mooncake ``TensorDtype`` value → (torch dtype name, numpy storage dtype).
#: float16 is stored as numpy float16; bfloat16 and the float8 types, which numpy
#: lacks, travel as raw 16- and 8-bit words and are re-typed by :func:`to_torch`.
DTYPES: dict[int, tuple[str, str]] = {
    0: ("float32", "float32"),
    1: ("float64", "float64"),
    2: ("int8", "int8"),
    3: ("uint8", "uint8"),
    4: ("int16", "int16"),
    5: ("uint16", "uint16"),
    6: ("int32", "int32"),
    7: ("uint32", "uint32"),
    8: ("int64", "int64"),
    9: ("uint64", "uint64"),
    10: ("bool", "bool"),
    11: ("float16", "float16"),
    12: ("bfloat16", "uint16"),
    13: ("float8_e4m3fn", "uint8"),
    14: ("float8_e5m2", "uint8"),
}
_CODE_BY_NAME = {name: code for code, (name, _) in DTYPES.items()}


@dataclass(frozen=True)
class Encoded:
    """A tensor ready to store: its header and its bytes (a view when contiguous).

    Attributes:
        header: the 40-byte ``TensorMetadata``.
        data: the tensor's bytes as a 1-D uint8 array.
    """

    header: bytes
    data: np.ndarray

    @property
    def nbytes(self) -> int:
        """Stored size in bytes (header included)."""
        return HEADER_BYTES + self.data.nbytes


def _is_torch(obj: Any) -> bool:
    return type(obj).__module__.split(".", 1)[0] == "torch"


def encode(tensor: Any) -> Encoded:
    """Header and bytes of a CPU torch tensor or a numpy array.

    Raises:
        InvalidArgument: not a tensor or array, on a GPU, more than 4 dimensions,
            or a dtype Mooncake's format has no code for.
    """
    if _is_torch(tensor) and hasattr(tensor, "dtype") and hasattr(tensor, "shape"):
        if tensor.device.type != "cpu":
            raise InvalidArgument(f"only CPU tensors can be stored; this one is on {tensor.device}")
        name = str(tensor.dtype).removeprefix("torch.")
        shape = tuple(int(d) for d in tensor.shape)
        import torch  # type: ignore[import-not-found]

        flat = tensor.detach().contiguous().reshape(-1)
        data = flat.view(torch.uint8).numpy() if flat.numel() else np.empty(0, np.uint8)
    elif isinstance(tensor, np.ndarray):
        name = tensor.dtype.name
        shape = tuple(int(d) for d in tensor.shape)
        data = np.ascontiguousarray(tensor).reshape(-1).view(np.uint8)
    else:
        raise InvalidArgument(f"expected a torch tensor or a numpy array, got {type(tensor).__name__}")
    code = _CODE_BY_NAME.get(name)
    if code is None:
        raise InvalidArgument(f"dtype {name} has no Mooncake tensor code (supported: {', '.join(_CODE_BY_NAME)})")
    if len(shape) > MAX_DIMS:
        raise InvalidArgument(f"tensors have at most {MAX_DIMS} dimensions, this one has {len(shape)}")
    dims = list(shape) + [-1] * (MAX_DIMS - len(shape))
    return Encoded(HEADER.pack(code, len(shape), *dims), data)


def decode(memory: Any) -> tuple[np.ndarray, str]:
    """The array stored in ``memory`` (a view of it, no copy) and its torch dtype name.

    Args:
        memory: a bytes-like object holding ``[TensorMetadata][data]``.

    Returns:
        ``(array, dtype_name)``: the array has the stored shape and numpy storage dtype.

    Raises:
        InvalidArgument: too short, an unknown dtype code, a bad ``ndim`` or shape,
            or a data length that does not match the shape.
    """
    mv = memoryview(memory).cast("B")
    if mv.nbytes < HEADER_BYTES:
        raise InvalidArgument(f"{mv.nbytes} bytes cannot hold a tensor header ({HEADER_BYTES} bytes)")
    code, ndim, *dims = HEADER.unpack_from(mv, 0)
    if code not in DTYPES:
        raise InvalidArgument(f"unknown tensor dtype code {code}")
    if not 0 <= ndim <= MAX_DIMS:
        raise InvalidArgument(f"tensor header has ndim {ndim}")
    shape = tuple(dims[:ndim])
    if any(d < 0 for d in shape):
        raise InvalidArgument(f"tensor header has shape {shape}")
    name, storage = DTYPES[code]
    dt = np.dtype(storage)
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if mv.nbytes - HEADER_BYTES != count * dt.itemsize:
        raise InvalidArgument(
            f"tensor of shape {shape} and dtype {name} needs {count * dt.itemsize} bytes, "
            f"{mv.nbytes - HEADER_BYTES} are stored")
    arr = np.frombuffer(mv, dtype=dt, count=count, offset=HEADER_BYTES).reshape(shape)
    return arr, name


def torch_module() -> Any:
    """``torch``, or an ImportError that says the tensor calls need it."""
    try:
        import torch  # type: ignore[import-not-found]
    except ImportError as exc:
        raise ImportError("the tensor calls of MooncakeDistributedStore need torch (pip install torch)") from exc
    return torch


def to_torch(arr: np.ndarray, dtype_name: str) -> Any:
    """A torch tensor sharing ``arr``'s memory, re-typed to ``dtype_name``.

    A read-only array (e.g. over ``bytes``) is copied first so the tensor is writable.
    """
    torch = torch_module()
    if not arr.flags.writeable:
        arr = arr.copy()
    t = torch.from_numpy(arr)
    if str(t.dtype).removeprefix("torch.") != dtype_name:
        t = t.view(getattr(torch, dtype_name))
    return t
