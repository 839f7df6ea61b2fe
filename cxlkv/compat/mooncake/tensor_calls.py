"""Mooncake's tensor calls (``put_tensor``, ``get_tensor``, their batch, TP and
zero-copy forms), built on the store's bytes and pointer calls.

Tensors are stored in Mooncake's ``[TensorMetadata][data]`` format
(:mod:`cxlkv.compat.mooncake.tensors`), so ``put_tensor_from`` /
``get_tensor_into`` buffers are laid out as Mooncake's. Only CPU tensors are
accepted. The calls that return tensors need torch; without it they raise
``ImportError``. TP shards are stored under ``<key>_tp_<rank>``, as Mooncake does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from cxlkv.compat.mooncake import tensors
from cxlkv.compat.mooncake.config import ReplicateConfig
from cxlkv.compat.mooncake.errors import ErrorCode
from cxlkv.compat.mooncake.memory import view_at
from cxlkv.errors import InvalidArgument

if TYPE_CHECKING:
    from cxlkv.client import Client

__all__ = ["TensorCalls"]

_INVALID = int(ErrorCode.INVALID_PARAMS)


class TensorCalls:
    """The tensor half of ``MooncakeDistributedStore`` (a mixin; see its class for the rest).

    Thread-safety: as the store's other calls.
    """

    if TYPE_CHECKING:  # provided by MooncakeDistributedStore
        def _status(self, fn: Callable[[Client], object], *, exists_ok: bool = False) -> int: ...
        @staticmethod
        def _put_joined(c: Client, key: str, parts: Sequence[Any], *, upsert: bool,
                        config: ReplicateConfig | None) -> None: ...
        @staticmethod
        def _same_length(*lists: Sequence[Any]) -> bool: ...
        def get(self, key: str) -> bytes: ...
        def get_batch(self, keys: Sequence[str]) -> list[bytes]: ...
        def get_into(self, key: str, buffer_ptr: int, size: int) -> int: ...
        def batch_get_into(self, keys: Sequence[str], buffer_ptrs: Sequence[int],
                           sizes: Sequence[int]) -> list[int]: ...
        def put_from(self, key: str, buffer_ptr: int, size: int,
                     config: ReplicateConfig | None = None) -> int: ...

    def put_tensor(self, key: str, tensor: Any) -> int:
        """Store a CPU tensor (Mooncake's ``[TensorMetadata][data]`` format). Returns 0 or negative."""
        return self.pub_tensor(key, tensor)

    def pub_tensor(self, key: str, tensor: Any, config: ReplicateConfig | None = None) -> int:
        """:meth:`put_tensor` with replication options. Returns 0 or a negative code."""
        return self._status(lambda c: self._put_tensor(c, key, tensor, upsert=False, config=config),
                            exists_ok=True)

    def upsert_tensor(self, key: str, tensor: Any) -> int:
        """Store a tensor, replacing a committed value. Returns 0 or a negative code."""
        return self._status(lambda c: self._put_tensor(c, key, tensor, upsert=True, config=None))

    def _put_tensor(self, c: Client, key: str, tensor: Any, *, upsert: bool,
                    config: ReplicateConfig | None) -> None:
        enc = tensors.encode(tensor)
        self._put_joined(c, key, (enc.header, enc.data), upsert=upsert, config=config)

    def batch_put_tensor(self, keys: Sequence[str], tensors_list: Sequence[Any]) -> list[int]:
        """:meth:`put_tensor` for each position; one code per key."""
        return self.batch_pub_tensor(keys, tensors_list)

    def batch_pub_tensor(self, keys: Sequence[str], tensors_list: Sequence[Any],
                         config: ReplicateConfig | None = None) -> list[int]:
        """:meth:`pub_tensor` for each position; one code per key (all ``INVALID_PARAMS``
        when the lists differ in length)."""
        n = len(keys) if hasattr(keys, "__len__") else 0
        if not self._same_length(keys, tensors_list):
            return [_INVALID] * n
        return [self.pub_tensor(k, t, config) for k, t in zip(keys, tensors_list)]

    def get_tensor(self, key: str) -> Any:
        """The tensor stored under ``key`` (a new CPU tensor), or ``None``."""
        tensors.torch_module()
        data = self.get(key)
        if not data:
            return None
        try:
            arr, name = tensors.decode(data)
        except InvalidArgument:
            return None
        return tensors.to_torch(arr, name)

    def batch_get_tensor(self, keys: Sequence[str]) -> list[Any]:
        """:meth:`get_tensor` for each key (``None`` where missing)."""
        tensors.torch_module()
        out: list[Any] = []
        for data in self.get_batch(keys):
            try:
                arr, name = tensors.decode(data)
            except InvalidArgument:
                out.append(None)
                continue
            out.append(tensors.to_torch(arr, name))
        return out

    def get_tensor_into(self, key: str, buffer_ptr: int, size: int) -> Any:
        """Read the tensor of ``key`` into ``[buffer_ptr, buffer_ptr + size)``.

        Returns:
            A tensor viewing that memory (after the 40-byte header), or ``None``.
        """
        tensors.torch_module()
        n = self.get_into(key, buffer_ptr, size)
        if n < 0:
            return None
        try:
            arr, name = tensors.decode(view_at(buffer_ptr, n))
        except InvalidArgument:
            return None
        return tensors.to_torch(arr, name)

    def batch_get_tensor_into(self, keys: Sequence[str], buffer_ptrs: Sequence[int],
                              sizes: Sequence[int]) -> list[Any]:
        """:meth:`get_tensor_into` for each position (``None`` where it fails)."""
        tensors.torch_module()
        out: list[Any] = []
        for ptr, n in zip(buffer_ptrs, self.batch_get_into(keys, buffer_ptrs, sizes)):
            try:
                arr, name = tensors.decode(view_at(ptr, n)) if n >= 0 else (None, "")
            except InvalidArgument:
                arr = None
            out.append(None if arr is None else tensors.to_torch(arr, name))
        return out

    def put_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        """Store ``size`` bytes at ``buffer_ptr`` that already hold ``[TensorMetadata][data]``.

        Returns:
            0 or a negative code (``INVALID_PARAMS`` (-600) when the bytes are not a tensor).
        """
        try:
            tensors.decode(view_at(buffer_ptr, size))
        except InvalidArgument:
            return _INVALID
        return self.put_from(key, buffer_ptr, size)

    def batch_put_tensor_from(self, keys: Sequence[str], buffer_ptrs: Sequence[int],
                              sizes: Sequence[int]) -> list[int]:
        """:meth:`put_tensor_from` for each position; one code per key."""
        n = len(keys) if hasattr(keys, "__len__") else 0
        if not self._same_length(keys, buffer_ptrs, sizes):
            return [_INVALID] * n
        return [self.put_tensor_from(k, p, s) for k, p, s in zip(keys, buffer_ptrs, sizes)]

    @staticmethod
    def _tp_key(key: str, rank: int) -> str:
        return f"{key}_tp_{rank}"

    def put_tensor_with_tp(self, key: str, tensor: Any, tp_rank: int = 0, tp_size: int = 1,
                           split_dim: int = 0) -> int:
        """Store ``tensor`` split into ``tp_size`` shards along ``split_dim``, under ``<key>_tp_<rank>``.

        Every shard is written (``tp_rank`` is accepted for Mooncake's signature);
        ``tp_size <= 1`` stores the whole tensor under ``key``.

        Returns:
            0, or the first shard's negative code (``INVALID_PARAMS`` when the tensor
            does not split into ``tp_size`` chunks).
        """
        return self.pub_tensor_with_tp(key, tensor, None, tp_rank, tp_size, split_dim)

    def pub_tensor_with_tp(self, key: str, tensor: Any, config: ReplicateConfig | None = None,
                           tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> int:
        """:meth:`put_tensor_with_tp` with replication options."""
        if tp_size <= 1:
            return self.pub_tensor(key, tensor, config)
        try:
            chunks = tensor.chunk(tp_size, split_dim)
        except (AttributeError, TypeError, ValueError, IndexError, RuntimeError):
            return _INVALID
        if len(chunks) != tp_size:
            return _INVALID
        for rank, chunk in enumerate(chunks):
            rc = self.pub_tensor(self._tp_key(key, rank), chunk.contiguous(), config)
            if rc:
                return rc
        return 0

    def batch_put_tensor_with_tp(self, base_keys: Sequence[str], tensors_list: Sequence[Any], tp_rank: int = 0,
                                 tp_size: int = 1, split_dim: int = 0) -> list[int]:
        """:meth:`put_tensor_with_tp` for each position; one code per base key."""
        return self.batch_pub_tensor_with_tp(base_keys, tensors_list, None, tp_rank, tp_size, split_dim)

    def batch_pub_tensor_with_tp(self, base_keys: Sequence[str], tensors_list: Sequence[Any],
                                 config: ReplicateConfig | None = None, tp_rank: int = 0, tp_size: int = 1,
                                 split_dim: int = 0) -> list[int]:
        """:meth:`pub_tensor_with_tp` for each position; one code per base key."""
        n = len(base_keys) if hasattr(base_keys, "__len__") else 0
        if not self._same_length(base_keys, tensors_list):
            return [_INVALID] * n
        return [self.pub_tensor_with_tp(k, t, config, tp_rank, tp_size, split_dim)
                for k, t in zip(base_keys, tensors_list)]

    def get_tensor_with_tp(self, key: str, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> Any:
        """The shard of rank ``tp_rank`` (``<key>_tp_<rank>``; ``key`` itself when
        ``tp_size <= 1``), or ``None``."""
        return self.get_tensor(key if tp_size <= 1 else self._tp_key(key, tp_rank))

    def batch_get_tensor_with_tp(self, base_keys: Sequence[str], tp_rank: int = 0, tp_size: int = 1) -> list[Any]:
        """:meth:`get_tensor_with_tp` for each base key (``None`` where missing)."""
        keys = list(base_keys) if tp_size <= 1 else [self._tp_key(k, tp_rank) for k in base_keys]
        return self.batch_get_tensor(keys)
