"""Which path a value takes between the caller's memory and the store: the one
decision of the SDK, made here and nowhere else.

A value moves by one of these paths (:class:`Path`; docs/sdk.md "Paths of a
value"):

=================  ==========================================================  =====================
path               how                                                         code
=================  ==========================================================  =====================
``INDEX``          this process probes the region's index and copies (no RPC)  :mod:`._index`
``INLINE``         the bytes ride inside the request or the answer             :mod:`._daemon`
``POOL``           the memory lies in a registered shared buffer: the daemon   :mod:`._daemon`
                   copies between it and the region (zero-copy)
``STAGED``         copied through a range of the pool, then as ``POOL``        :mod:`._daemon`
``DIRECT``         this process copies between the memory and the region; the  :mod:`._direct`
                   daemon answers metadata (leases, reserved extents)
``CUDA_DIRECT``    DMA between a CUDA tensor and the region (direct mode)      :mod:`._direct`,
                                                                               :mod:`._cuda`
``CUDA_HOST``      a CUDA tensor through host memory (a host copy put, or a    :mod:`._cuda`
                   pinned buffer read, along ``DAEMON``)
``DAEMON``         the caller's memory through the daemon: ``POOL`` where it   :func:`daemon_path`
                   lies in a registered buffer, else ``INLINE`` (a small put)
                   or ``STAGED``
=================  ==========================================================  =====================

:func:`plan` answers, for one item, the paths to try in order: each later one
serves what the one before answered "not here" (an index or a direct read that
must go through the daemon, a direct put placed where this process cannot copy,
an inline value over the daemon's inline limit). It reads only its arguments:
no I/O, no state. :class:`~cxlkv.client.Client` calls the paths in that order
and nothing else decides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from cxlkv.client._cuda import is_cuda_tensor

__all__ = ["Op", "Memory", "Path", "Offers", "plan", "starts_at_index", "daemon_path", "memory_of"]


# The three vocabularies are classes of string constants, not enum.Enum: reading
# an Enum member costs ~0.3 us on Python 3.11 against ~0.04 us for a class
# attribute, and a read from the index (~7 us in all) asks several.


class Op:
    """What the caller asks."""

    PUT = "put"  # store the bytes of a source
    GET = "get"  # read a value into new bytes (its size unknown until asked)
    GET_INTO = "get_into"  # read a value into the caller's memory (of ``nbytes`` capacity)
    PREFIX = "prefix"  # the longest cached prefix of keys, into the caller's memory
    EXISTS = "exists"  # whether a key is committed (no bytes move)
    ALL = (PUT, GET, GET_INTO, PREFIX, EXISTS)


class Memory:
    """What the caller's bytes are (the source of a put, the destination of a read).

    Whether host memory lies in a shared buffer registered with the daemon is
    asked only at the daemon path (:func:`daemon_path`): locating memory may
    register the caller's shared memory with the daemon, which a read from the
    index or a direct copy never needs.
    """

    NONE = "none"  # no memory of the caller's (``get``: the SDK makes the bytes)
    BYTES = "bytes"  # a ``bytes`` value of ``put`` / ``put_many`` (it can ride in the message as is)
    HOST = "host"  # other host memory (bytes-like, numpy, CPU tensor)
    CUDA = "cuda"  # a CUDA tensor
    ALL = (NONE, BYTES, HOST, CUDA)


class Path:
    """How the bytes move (the module's table)."""

    INDEX = "index"
    INLINE = "inline"
    POOL = "pool"
    STAGED = "staged"
    DIRECT = "direct"
    CUDA_DIRECT = "cuda_direct"
    CUDA_HOST = "cuda_host"
    #: Through the daemon with the caller's memory: :func:`daemon_path` picks
    #: ``POOL``, ``INLINE`` or ``STAGED`` once the memory is located.
    DAEMON = "daemon"
    ALL = (INDEX, INLINE, POOL, STAGED, DIRECT, CUDA_DIRECT, CUDA_HOST, DAEMON)


@dataclass(frozen=True)
class Offers:
    """What this Client may use now, and its size limits.

    Attributes:
        index: reads from the region's index (direct mode on and the index mapped).
            A batch holding a CUDA destination passes ``False``: the index copies
            into host memory only, and a batch is read from it whole or not at all.
        direct: direct mode is on (the regions mapped here, not turned off since).
        inline_threshold_bytes: values up to this size travel inline.
        direct_threshold_bytes: smallest host value moved in direct mode (CUDA
            tensors use direct mode at any size).
        batch: the item is one of a batch put's (:func:`daemon_path`).
    """

    index: bool = False
    direct: bool = False
    inline_threshold_bytes: int = 64 << 10
    direct_threshold_bytes: int = (64 << 10) + 1
    batch: bool = False


def plan(op: str, memory: str, nbytes: int | None, offers: Offers) -> tuple[str, ...]:
    """The paths one item tries, in order (the module's docstring).

    Args:
        op: what is asked.
        memory: what the caller's bytes are (:func:`memory_of`; ``NONE`` for ``GET``).
        nbytes: the source's size (``PUT``), the destination's capacity
            (``GET_INTO``), the value's size once known (``GET`` after the inline
            answer said it is larger), else ``None``.
        offers: what the Client may use now.

    Returns:
        Never empty; ``DAEMON``, where it comes, is last. The rules:

        * ``PUT``: a ``bytes`` value up to the inline limit rides ``INLINE`` (then,
          over the daemon's own limit, ``STAGED``). A CUDA tensor goes
          ``CUDA_DIRECT`` in direct mode, ``CUDA_HOST`` after it or without it.
          Host memory of at least the direct threshold goes ``DIRECT`` in direct
          mode, then ``DAEMON``; smaller, or without direct mode, ``DAEMON``.
        * ``GET`` (``nbytes`` unknown): ``INDEX`` when offered, then ``INLINE``
          (the answer gives the size of a value too large to ride inline). With
          the size known: ``DIRECT`` at or over the direct threshold in direct
          mode, then ``STAGED``.
        * ``GET_INTO``: a CUDA tensor ``CUDA_DIRECT`` (direct mode) then
          ``CUDA_HOST``; host memory ``INDEX`` when offered, ``DIRECT`` (direct
          mode, capacity at least the direct threshold), then ``DAEMON``.
        * ``PREFIX``: ``INDEX`` when offered (not for a CUDA tensor), then ``DAEMON``.
        * ``EXISTS``: ``INDEX`` when offered, then ``INLINE`` (an answer, no bytes).
    """
    if op == Op.EXISTS:
        return _INDEX_INLINE if offers.index else _INLINE
    if op == Op.GET:
        if nbytes is None:
            return _INDEX_INLINE if offers.index else _INLINE
        if offers.direct and nbytes >= offers.direct_threshold_bytes:
            return _DIRECT_STAGED
        return _STAGED
    cuda = memory == Memory.CUDA
    if op == Op.PUT:
        if memory == Memory.BYTES and (nbytes or 0) <= offers.inline_threshold_bytes:
            return _INLINE_STAGED
    elif op == Op.PREFIX:
        return _INDEX_DAEMON if offers.index and not cuda else _DAEMON
    elif op != Op.GET_INTO:
        raise ValueError(f"unknown operation {op!r}")
    if cuda:
        return _CUDA_DIRECT_HOST if offers.direct else _CUDA_HOST
    direct = offers.direct and (nbytes or 0) >= offers.direct_threshold_bytes
    if op == Op.PUT or not offers.index:
        return _DIRECT_DAEMON if direct else _DAEMON
    return _INDEX_DIRECT_DAEMON if direct else _INDEX_DAEMON


def starts_at_index(op: str, memory: str, index: bool) -> bool:
    """Whether :func:`plan` begins with ``INDEX`` for an item, ``index`` being
    :attr:`Offers.index` (``GET``/``EXISTS`` with ``Memory.NONE``, the others with
    their memory): the first question of every read, asked before anything else
    is known, answered without building the rest of the plan (tested equal).
    """
    return index and op != Op.PUT and memory != Memory.CUDA


def daemon_path(op: str, shared: bool, nbytes: int, offers: Offers, *, handed_back: bool = False) -> tuple[str, ...]:
    """The :data:`Path.DAEMON` step of :func:`plan`, once the memory is located.

    Args:
        op: ``PUT``, ``GET_INTO`` or ``PREFIX``.
        shared: the memory lies in a shared buffer registered with the daemon.
        nbytes: the source's size or the destination's capacity.
        offers: what the Client may use now (``batch``).
        handed_back: the item comes from a direct put the daemon placed where
            this process cannot copy (``DIRECT`` or ``CUDA_DIRECT`` answered "not here").

    Returns:
        ``POOL`` for shared memory. Else a read is ``STAGED``; a put up to the
        inline limit ``INLINE`` (then ``STAGED`` over the daemon's own limit),
        except one of a batch that direct mode handed back (``STAGED``: it joins
        the batch's shared-memory request); a larger put ``STAGED``.
    """
    if shared:
        return _POOL
    if op == Op.PUT and nbytes <= offers.inline_threshold_bytes and not (handed_back and offers.batch):
        return _INLINE_STAGED
    return _STAGED


_INDEX_INLINE = (Path.INDEX, Path.INLINE)
_INLINE = (Path.INLINE,)
_DIRECT_STAGED = (Path.DIRECT, Path.STAGED)
_STAGED = (Path.STAGED,)
_INLINE_STAGED = (Path.INLINE, Path.STAGED)
_POOL = (Path.POOL,)
_DAEMON = (Path.DAEMON,)
_INDEX_DAEMON = (Path.INDEX, Path.DAEMON)
_DIRECT_DAEMON = (Path.DIRECT, Path.DAEMON)
_INDEX_DIRECT_DAEMON = (Path.INDEX, Path.DIRECT, Path.DAEMON)
_CUDA_DIRECT_HOST = (Path.CUDA_DIRECT, Path.CUDA_HOST)
_CUDA_HOST = (Path.CUDA_HOST,)


def memory_of(obj: Any, *, put_value: bool = False) -> str:
    """What ``obj`` is: ``CUDA`` (a CUDA tensor), ``BYTES`` (a ``bytes`` value of
    ``put``, when ``put_value``), else ``HOST``."""
    if put_value and isinstance(obj, bytes):
        return Memory.BYTES
    if type(obj) in _HOST_TYPES:  # the common ones, without asking what a tensor is
        return Memory.HOST
    return Memory.CUDA if is_cuda_tensor(obj) else Memory.HOST


_HOST_TYPES = frozenset((bytes, bytearray, memoryview, np.ndarray))
