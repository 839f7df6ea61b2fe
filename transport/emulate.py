"""A stale-cache emulator for tests: non-coherent CXL sharing on one machine.

**Test-only.** Real multi-host CXL 2.0 memory is not coherent across hosts: a
host's stores can sit in its cache (invisible to the others) until written back
(CLWB / CLFLUSHOPT), and a host keeps reading its own cached copy of a line after
another host changed the memory behind it, until it invalidates the line. A
``/dev/shm`` file mapped by several processes on one machine is coherent, so it
hides every missing flush or invalidate. :class:`NoncoherentRegion` puts the
hazard back: each ``Region`` object models one host's cache, at 64-byte line
granularity, over a private shadow copy of the region:

* a line is *invalid*, *clean* or *dirty* in this cache;
* a read (``copy_out*``, ``read``, ``view``, ``checksum``) first loads the
  *invalid* lines of its range from the shared mapping into the shadow, then
  reads the shadow: a clean line is never re-read from memory, so another
  process's later writes stay invisible (a stale read) until :meth:`invalidate`;
* a write (``copy_in*``) loads the invalid lines of its range (write-allocate),
  writes the shadow and marks the lines dirty: nothing reaches the shared
  mapping, so other processes do not see it (a lost or torn write);
* :meth:`flush` (CLWB) copies the dirty lines of its range to the shared mapping
  and marks them clean; :meth:`invalidate` (CLFLUSHOPT) writes dirty lines back,
  then drops every line of its range, so the next read comes from memory;
* the non-coherent copies (``copy_in*(..., flush=True)``,
  ``copy_out*(..., invalidate=True)``, ``read(..., invalidate=True)``) do what
  the C kernels promise: a write publishes its bytes before returning (whole
  lines streamed past the cache end *invalid* here, the partial lines at either
  end written back and *clean*); a read drops the lines of its range before
  reading them.

:class:`KernelTrace` checks the real C kernels against the same model: the
transport records what a non-coherent copy did (stores cached or streamed,
write-backs, drops, loads, fences; :func:`cxlkv.transport.bindings.nc_trace`)
and the replay applies the x86 ordering rules to a cache that holds a stale
copy of every line, flagging any load of a line whose drop was not fenced
before it and any written line not in memory when the call returned.

Caches never evict on their own (the worst case a discipline must survive).
Writes through a :meth:`view` are not tracked (views are for reading; clientd
only reads through them). Every method holds one lock, so the emulator is
thread-safe but serial; it is slow (numpy, line by line) and meant for tests
only.

Enable it with ``Region.open(..., emulate_noncoherent=True)`` or, for whole
processes (clientds started by a test), the environment variable
``CXLKV_TRANSPORT_EMULATE_NONCOHERENT=1`` read by :meth:`Region.open`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import xxhash

from cxlkv.errors import InvalidArgument, OutOfRange
from cxlkv.transport import portable
from cxlkv.transport.bindings import CACHE_LINE_BYTES, BufferLike, U64Array, ffi
from cxlkv.transport.region import Region

__all__ = ["NoncoherentRegion", "KernelTrace", "EMULATE_ENV"]

#: Environment variable that makes :meth:`Region.open` return a :class:`NoncoherentRegion`.
EMULATE_ENV = "CXLKV_TRANSPORT_EMULATE_NONCOHERENT"

_LINE = CACHE_LINE_BYTES
_INVALID, _CLEAN, _DIRTY = 0, 1, 2


def _bytes_of(buf: BufferLike, writable: bool) -> np.ndarray:
    try:
        mv = memoryview(buf)
    except TypeError:
        raise InvalidArgument(f"expected a bytes-like object, got {type(buf).__name__}") from None
    if not mv.c_contiguous:
        raise InvalidArgument("the buffer is not C-contiguous")
    if writable and mv.readonly:
        raise InvalidArgument("the destination buffer is read-only")
    return np.frombuffer(mv.cast("B"), dtype=np.uint8) if mv.nbytes else np.empty(0, np.uint8)


class NoncoherentRegion(Region):
    """A :class:`Region` whose reads and writes go through an emulated private
    cache (see the module docstring). Same API and errors as :class:`Region`.

    Attributes:
        stale_line_reads: lines read from this cache whose bytes differed from the
            shared mapping at the time (stale reads served), a count.
    """

    __slots__ = ("_shared", "_shadow", "_lines", "_lock", "stale_line_reads")

    def __init__(self, handle: Any, path: str) -> None:
        super().__init__(handle, path)
        size = self._size
        if size % _LINE:
            raise InvalidArgument(f"region {path}: emulation needs a size multiple of {_LINE} bytes, got {size}")
        self._shared = np.frombuffer(ffi.buffer(self._base, size), dtype=np.uint8).reshape(-1, _LINE)
        self._shadow = np.zeros((size // _LINE, _LINE), dtype=np.uint8)
        self._lines = np.zeros(size // _LINE, dtype=np.uint8)
        self._lock = threading.Lock()
        self.stale_line_reads = 0

    def __repr__(self) -> str:
        return super().__repr__()[:-1] + " emulated-noncoherent>"

    # -- the cache model ----------------------------------------------------------
    def _range(self, op: str, offset: int, length: int) -> tuple[int, int]:
        self._check(op, offset, length)
        return offset // _LINE, -(-(offset + length) // _LINE)

    def _load(self, lo: int, hi: int) -> None:
        idx = lo + np.flatnonzero(self._lines[lo:hi] == _INVALID)
        if idx.size:
            self._shadow[idx] = self._shared[idx]
            self._lines[idx] = _CLEAN

    def _count_stale(self, lo: int, hi: int) -> None:
        clean = lo + np.flatnonzero(self._lines[lo:hi] == _CLEAN)
        if clean.size:
            self.stale_line_reads += int(np.any(self._shadow[clean] != self._shared[clean], axis=1).sum())

    def _write_back(self, lo: int, hi: int) -> None:
        idx = lo + np.flatnonzero(self._lines[lo:hi] == _DIRTY)
        if idx.size:
            self._shared[idx] = self._shadow[idx]
            self._lines[idx] = _CLEAN

    def _flat(self) -> np.ndarray:
        return self._shadow.reshape(-1)

    def _in(self, op: str, offset: int, src: BufferLike) -> int:
        data = _bytes_of(src, writable=False)
        n = data.size
        if offset < 0:
            raise OutOfRange(f"{op}: offset {offset} is negative")
        lo, hi = self._range(op, offset, n)
        if n:
            self._load(lo, hi)
            self._flat()[offset:offset + n] = data
            self._lines[lo:hi] = _DIRTY
        return n

    def _out(self, op: str, offset: int, dst: BufferLike) -> int:
        data = _bytes_of(dst, writable=True)
        n = data.size
        if offset < 0:
            raise OutOfRange(f"{op}: offset {offset} is negative")
        lo, hi = self._range(op, offset, n)
        if n:
            self._count_stale(lo, hi)
            self._load(lo, hi)
            data[:] = self._flat()[offset:offset + n]
        return n

    def _publish(self, offset: int, n: int) -> None:
        """What a non-coherent write leaves behind: its bytes in the shared
        mapping; lines streamed whole end invalid in this cache, the partial
        lines at either end (written through the cache, then written back) clean."""
        if not n:
            return
        lo, hi = offset // _LINE, -(-(offset + n) // _LINE)
        self._write_back(lo, hi)
        first, last = -(-offset // _LINE), (offset + n) // _LINE  # whole lines [first, last)
        if first < last:
            self._lines[first:last] = _INVALID

    def _drop(self, offset: int, n: int) -> None:
        """CLFLUSHOPT over a range: dirty lines written back, every line dropped."""
        if not n:
            return
        lo, hi = offset // _LINE, -(-(offset + n) // _LINE)
        self._write_back(lo, hi)
        self._lines[lo:hi] = _INVALID

    # -- Region API -------------------------------------------------------------
    def copy_in(self, offset: int, src: BufferLike, *, flush: bool = False) -> int:
        with self._lock:
            n = self._in("copy_in", offset, src)
            if flush:
                self._publish(offset, n)
            return n

    def copy_out(self, offset: int, dst: BufferLike, *, invalidate: bool = False) -> int:
        with self._lock:
            if invalidate:
                self._check("copy_out", offset, _bytes_of(dst, writable=True).size)
                self._drop(offset, _bytes_of(dst, writable=True).size)
            return self._out("copy_out", offset, dst)

    def copy_in_hashed(self, offset: int, src: BufferLike, *, flush: bool = False) -> int:
        with self._lock:
            n = self._in("copy_in_hashed", offset, src)
            if flush:
                self._publish(offset, n)
            return xxhash.xxh3_64_intdigest(_bytes_of(src, writable=False))

    def copy_out_hashed(self, offset: int, dst: BufferLike, *, invalidate: bool = False) -> int:
        with self._lock:
            if invalidate:
                self._check("copy_out_hashed", offset, _bytes_of(dst, writable=True).size)
                self._drop(offset, _bytes_of(dst, writable=True).size)
            self._out("copy_out_hashed", offset, dst)
            return xxhash.xxh3_64_intdigest(_bytes_of(dst, writable=True))

    def read(self, offset: int, length: int, *, invalidate: bool = False) -> bytes:
        if length < 0:
            raise OutOfRange(f"read: length {length} is negative")
        out = bytearray(length)
        self.copy_out(offset, out, invalidate=invalidate)
        return bytes(out)

    def _ranges(self, op: str, buf: BufferLike, buf_offsets: U64Array, region_offsets: U64Array,
                lengths: U64Array, writable: bool) -> list[tuple[np.ndarray, int]]:
        b = _bytes_of(buf, writable=writable)
        bo, ro, ln = ([int(x) for x in a] for a in (buf_offsets, region_offsets, lengths))
        if not len(bo) == len(ro) == len(ln):
            raise InvalidArgument(f"{op}: index arrays differ in length ({len(bo)}, {len(ro)}, {len(ln)})")
        out = []
        for i, (o, r, n) in enumerate(zip(bo, ro, ln)):
            if o < 0 or n < 0 or o + n > b.size:
                raise OutOfRange(f"{op}[{i}]: buffer range [{o}, {o} + {n}) outside a {b.size}-byte buffer")
            self._check(f"{op}[{i}]", r, n)
            out.append((b[o:o + n], r))
        return out

    def copy_in_ranges(self, buf: BufferLike, buf_offsets: U64Array, region_offsets: U64Array,
                       lengths: U64Array, *, flush: bool = False) -> None:
        with self._lock:
            for piece, r in self._ranges("copy_in_ranges", buf, buf_offsets, region_offsets, lengths, False):
                n = self._in("copy_in_ranges", r, piece)
                if flush:
                    self._publish(r, n)

    def copy_out_ranges(self, buf: BufferLike, buf_offsets: U64Array, region_offsets: U64Array,
                        lengths: U64Array, *, invalidate: bool = False) -> None:
        with self._lock:
            for piece, r in self._ranges("copy_out_ranges", buf, buf_offsets, region_offsets, lengths, True):
                if invalidate:
                    self._drop(r, piece.size)
                self._out("copy_out_ranges", r, piece)

    # The batch calls go through this cache's copy/read/flush/invalidate above.
    def copy_in_ranges_hashed(self, *args: Any, flush: bool = False) -> list[int]:
        return portable.copy_in_ranges_hashed(self, *args, flush=flush)

    def copy_out_ranges_hashed(self, *args: Any, invalidate: bool = False) -> list[int]:
        return portable.copy_out_ranges_hashed(self, *args, invalidate=invalidate)

    def write_headers(self, *args: Any, flush: bool = False) -> None:
        for i, (off, hb) in enumerate(zip(args[0], args[1])):  # every span before any write
            self._check(f"write_headers[{i}]", int(off), int(hb))
        portable.write_headers(self, *args, flush=flush)

    def verify_headers(self, *args: Any, invalidate: bool = False) -> bytes:
        for i, (off, hb) in enumerate(zip(args[0], args[1])):
            if int(hb) >= 64:
                self._check(f"verify_headers[{i}]", int(off), int(hb))
        return portable.verify_headers(self, *args, invalidate=invalidate)

    def index_store(self, *args: Any, **kwargs: Any) -> None:
        """:meth:`Region.index_store` through this cache (:func:`portable.index_store`)."""
        portable.index_store(self, *args, **kwargs)

    def flush(self, offset: int = 0, length: int | None = None) -> None:
        offset, length = self._span(offset, length)
        with self._lock:
            lo, hi = self._range("flush", offset, length)
            self._write_back(lo, hi)
        super().flush(offset, length)

    def invalidate(self, offset: int = 0, length: int | None = None) -> None:
        offset, length = self._span(offset, length)
        with self._lock:
            lo, hi = self._range("invalidate", offset, length)
            self._write_back(lo, hi)
            self._lines[lo:hi] = _INVALID
        super().invalidate(offset, length)

    def view(self, offset: int, length: int) -> memoryview:
        """A read-only-by-contract view of this cache's copy (lines loaded first)."""
        with self._lock:
            lo, hi = self._range("view", offset, length)
            self._count_stale(lo, hi)
            self._load(lo, hi)
            return memoryview(self._flat()[offset:offset + length])

    def checksum(self, offset: int, length: int) -> int:
        with self._lock:
            lo, hi = self._range("checksum", offset, length)
            self._load(lo, hi)
            return xxhash.xxh3_64_intdigest(self._flat()[offset:offset + length])


class KernelTrace:
    """A real non-coherent kernel's recorded events
    (:func:`cxlkv.transport.bindings.nc_trace`) replayed on this module's cache
    model with the x86 ordering rules, from the worst case: every line of the
    region is cached on this host with bytes older than memory's.

    Rules (Intel SDM Vol. 3A 9.2.2 "Memory Ordering in P6 and More Recent
    Processor Families"; Vol. 2 CLFLUSHOPT, CLWB; Vol. 1 10.4.6.2):

    * ``drop`` (CLFLUSHOPT) counts for later loads only once an ``mfence``
      follows it: loads may pass SFENCE, and CLFLUSHOPT is not ordered with
      later loads of its own;
    * a ``load`` of a line still holding its stale copy (no drop, or a drop not
      yet fenced) is a stale read;
    * a ``vload`` (the first copy of a read that verifies first: bytes hashed
      and compared with a checksum read fresh before they are used) may read
      stale lines: they are counted in ``verified_stale``, not violations, and
      stay stale (a later ``load`` must still drop them);
    * a ``store`` through the cache leaves the line dirty here; ``wb`` (CLWB) of
      a dirty line and ``stream`` (non-temporal) stores reach memory at the next
      fence; a store after the ``wb`` needs another one;
    * a ``stream`` must cover whole lines;
    * every line written must be in memory when the call returns.

    Attributes:
        violations: what broke a rule, one line each (empty: none).
        loaded, written: line numbers (region offset // line) read / written.
        streamed: line numbers written with streaming stores.
        drops: line number -> how many times it was dropped.
        verified, verified_stale: line numbers read by ``vload`` / those of them
            that may have been stale.
        fences: ``{"sfence": n, "mfence": n}``.
    """

    _STALE, _INVALID, _FRESH, _DIRTY, _WB_PENDING, _NT_PENDING, _PUBLISHED = range(7)

    def __init__(self, events: Sequence[tuple[str, int, int]], base: int, line: int = _LINE) -> None:
        """Args: events of one or more calls, in order; ``base``: the region's
        mapping address (events carry addresses); ``line``: bytes per cache line."""
        self.violations: list[str] = []
        self.loaded: set[int] = set()
        self.written: set[int] = set()
        self.streamed: set[int] = set()
        self.drops: dict[int, int] = {}
        self.verified: set[int] = set()
        self.verified_stale: set[int] = set()
        self.fences = {"sfence": 0, "mfence": 0}
        state: dict[int, int] = {}
        pending: set[int] = set()
        for kind, a, b in events:
            if kind in ("sfence", "mfence"):
                self.fences[kind] += 1
                for ln, st in state.items():
                    if st in (self._WB_PENDING, self._NT_PENDING):
                        state[ln] = self._PUBLISHED
                if kind == "mfence":
                    for ln in pending:
                        state[ln] = self._INVALID  # a dirty line was written back by the drop
                    pending.clear()
                continue
            lo, hi = (a - base) // line, -(-(b - base) // line)
            if kind == "drop":
                for ln in range(lo, hi):
                    pending.add(ln)
                    self.drops[ln] = self.drops.get(ln, 0) + 1
            elif kind == "load":
                for ln in range(lo, hi):
                    st = state.get(ln, self._STALE)
                    if st == self._STALE:
                        self.violations.append(f"stale read: line at offset {ln * line} loaded "
                                               f"before a fenced drop")
                        state[ln] = self._FRESH  # reported once
                    elif st == self._INVALID:
                        state[ln] = self._FRESH
                    self.loaded.add(ln)
            elif kind == "vload":
                for ln in range(lo, hi):
                    self.verified.add(ln)
                    if state.get(ln, self._STALE) == self._STALE:
                        self.verified_stale.add(ln)
            elif kind == "store":
                for ln in range(lo, hi):
                    state[ln] = self._DIRTY
                    self.written.add(ln)
            elif kind == "wb":
                for ln in range(lo, hi):
                    if state.get(ln) == self._DIRTY:
                        state[ln] = self._WB_PENDING
            elif kind == "stream":
                if (a - base) % line or (b - base) % line:
                    self.violations.append(f"streaming store over a partial line: [{a - base}, {b - base})")
                for ln in range(lo, hi):
                    state[ln] = self._NT_PENDING
                    self.written.add(ln)
                    self.streamed.add(ln)
            else:
                raise InvalidArgument(f"unknown trace event {kind!r}")
        for ln in sorted(self.written):
            if state.get(ln) not in (self._PUBLISHED, self._INVALID):
                self.violations.append(f"line at offset {ln * line} written but not in memory at return")
