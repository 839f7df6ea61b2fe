"""The allocator: free-space manager inside one segment.

An offset-based, coalescing, two-level segregated-fit allocator (TLSF-style)
over the byte range ``[base_bytes, end_bytes)`` of one segment. It never touches
the bytes it manages: it only hands out offsets.

Design:

* Every extent is a multiple of ``alignment_bytes`` long and starts at a multiple
  of it (absolute offsets from the region's start, so the region header before
  ``base_bytes`` is never handed out). A request is split off the end of a free
  block exactly (no internal fragmentation beyond the alignment); the remainder
  keeps the block's offset, so it usually stays where it is in the indexes.
* Free space is a set of maximal free blocks: a freed extent is merged at once
  with a free neighbour on either side (coalescing), so no two free blocks touch.
* Free blocks are indexed by size class: for a block of ``u`` alignment units,
  the first level is ``floor(log2 u)`` and the second level splits each power of
  two into 32 linear sub-ranges (sizes under 32 units have a class each). Classes
  only *index* free blocks; a block of any size serves a request of any size, so
  space never calcifies into classes that no longer match the workload.
* Lookup is O(1): two levels of bitmaps (one bit per row = power of two, one
  32-bit map per row — all machine-sized ints, so each bit operation is cheap
  even for a segment of many TiB) say which classes hold a block; a request
  takes a block from the first non-empty class whose every block is large enough
  ("good fit": at most 1/32 larger than best fit). If there is none, the
  request's own class is searched (bounded) for a block that fits, so a request
  fails only when no block of its class or above can hold it.
* ``_free_by_offset`` (offset → length) and ``_free_by_end`` (end → offset) find
  neighbours in O(1). Everything is plain ``int`` in dicts: nothing for the
  garbage collector to track, few memory touches per call (a sorted index costs
  several times more at a million extents).
* Accounting is exact: ``used_bytes + free_bytes == capacity_bytes`` always,
  ``used_bytes`` is the sum of the live extents' lengths, and :meth:`check`
  verifies every invariant from scratch.

Not thread-safe: the master calls it from its event-loop thread only.
"""

from __future__ import annotations

from typing import Iterator

__all__ = ["ExtentAllocator", "align_up"]

#: Second-level subdivisions per power of two, as a power of two (2**5 = 32).
_SL_BITS = 5
_SL_MASK = (1 << _SL_BITS) - 1
#: How many blocks of the request's own class the slow path looks at.
_OWN_CLASS_PROBES = 64


def _size_class(units: int) -> int:
    """Class index of a free block of ``units`` alignment units (monotone in ``units``)."""
    fl = units.bit_length() - 1
    if fl < _SL_BITS:
        return units
    return ((fl - _SL_BITS + 1) << _SL_BITS) | ((units >> (fl - _SL_BITS)) & _SL_MASK)


def _request_class(units: int) -> int:
    """The first class whose every block holds ``units`` alignment units: the class of
    ``units`` itself if ``units`` is its lower bound, else the next one (what
    :meth:`ExtentAllocator.alloc` and :meth:`ExtentAllocator.can_alloc` look in first)."""
    fl = units.bit_length() - 1
    if fl < _SL_BITS:
        return units
    cls = ((fl - _SL_BITS + 1) << _SL_BITS) | ((units >> (fl - _SL_BITS)) & _SL_MASK)
    return cls + 1 if units & ((1 << (fl - _SL_BITS)) - 1) else cls


def align_up(n_bytes: int, alignment_bytes: int) -> int:
    """``n_bytes`` rounded up to a multiple of ``alignment_bytes`` (a power of two)."""
    return (n_bytes + alignment_bytes - 1) & ~(alignment_bytes - 1)


class ExtentAllocator:
    """Good-fit (TLSF-style), coalescing allocator over ``[base_bytes, end_bytes)``.

    Args:
        base_bytes: first allocatable offset (rounded up to the alignment).
        end_bytes: one past the last allocatable offset (rounded down to it).
        alignment_bytes: extent alignment and granularity; a power of two >= 8.

    Raises:
        ValueError: bad alignment, or ``end_bytes < base_bytes``.
    """

    __slots__ = (
        "base_bytes", "end_bytes", "alignment_bytes", "capacity_bytes", "used_bytes",
        "_shift", "_free_by_offset", "_free_by_end", "_classes", "_row_map", "_class_maps", "_used",
    )

    def __init__(self, base_bytes: int, end_bytes: int, alignment_bytes: int = 64) -> None:
        if alignment_bytes < 8 or alignment_bytes & (alignment_bytes - 1):
            raise ValueError(f"alignment_bytes must be a power of two >= 8, got {alignment_bytes}")
        if base_bytes < 0 or end_bytes < base_bytes:
            raise ValueError(f"bad range [{base_bytes}, {end_bytes})")
        self.alignment_bytes = alignment_bytes
        self._shift = alignment_bytes.bit_length() - 1
        self.base_bytes = align_up(base_bytes, alignment_bytes)
        self.end_bytes = max(self.base_bytes, end_bytes & ~(alignment_bytes - 1))
        #: Allocatable bytes (the whole aligned range).
        self.capacity_bytes = self.end_bytes - self.base_bytes
        #: Bytes in live extents.
        self.used_bytes = 0
        self._free_by_offset: dict[int, int] = {}
        self._free_by_end: dict[int, int] = {}
        n_classes = _size_class(max(1, self.capacity_bytes >> self._shift)) + 1
        #: class index → {offset: length} of the free blocks in that class.
        self._classes: list[dict[int, int]] = [{} for _ in range(n_classes)]
        #: Class ``c`` lives in row ``c >> 5`` at bit ``c & 31`` of ``_class_maps[row]``;
        #: a bit is set <=> that class holds a free block. Bit ``r`` of
        #: ``_row_map`` is set <=> ``_class_maps[r]`` is not 0.
        self._row_map = 0
        self._class_maps = [0] * ((n_classes >> _SL_BITS) + 2)
        self._used: dict[int, int] = {}
        if self.capacity_bytes:
            self._insert_free(self.base_bytes, self.capacity_bytes)

    # -- queries --------------------------------------------------------------
    @property
    def free_bytes(self) -> int:
        """Bytes not in any live extent."""
        return self.capacity_bytes - self.used_bytes

    @property
    def largest_free_bytes(self) -> int:
        """Length of the largest free block: the largest request that can succeed now.

        O(blocks in the top class), which is a handful in practice.
        """
        if not self._row_map:
            return 0
        row = self._row_map.bit_length() - 1
        cls = (row << _SL_BITS) | (self._class_maps[row].bit_length() - 1)
        return max(self._classes[cls].values())

    def can_alloc(self, length_bytes: int) -> bool:
        """Whether :meth:`alloc` of ``length_bytes`` would succeed now (it changes nothing).

        Not the same as ``largest_free_bytes >= length``: when no class above the
        request's own holds a block, :meth:`alloc` looks at only the first
        ``_OWN_CLASS_PROBES`` blocks of its own class, so a large enough block
        further down that class is not found. Whoever frees space until a request
        fits (eviction, demotion) asks this, not the largest block, or it stops
        early and the request fails with free space it never made reachable.
        """
        shift = self._shift
        units = ((length_bytes - 1) >> shift) + 1 if length_bytes > 0 else 1
        cls = _request_class(units)
        row = cls >> _SL_BITS
        if row < len(self._class_maps) and self._class_maps[row] & -(1 << (cls & _SL_MASK)):
            return True
        if self._row_map & -(2 << row):
            return True
        return self._search_own_class(units, units << shift)[0] >= 0

    @property
    def live_extents(self) -> int:
        """Number of live extents."""
        return len(self._used)

    @property
    def free_blocks(self) -> int:
        """Number of free blocks (a measure of fragmentation)."""
        return len(self._free_by_offset)

    def extent_bytes(self, length_bytes: int) -> int:
        """The extent length a request of ``length_bytes`` takes (aligned, at least one unit)."""
        a = self.alignment_bytes
        return (length_bytes + a - 1) & ~(a - 1) or a

    def length_of(self, offset_bytes: int) -> int:
        """Length of the live extent at ``offset_bytes``.

        Raises:
            KeyError: no live extent starts there.
        """
        return self._used[offset_bytes]

    def extents(self) -> Iterator[tuple[int, int]]:
        """Live extents as ``(offset_bytes, length_bytes)``, in no particular order."""
        return iter(self._used.items())

    def high_water_bytes(self) -> int:
        """Bytes from ``base_bytes`` to the end of the highest live extent (the footprint); O(1).

        Free blocks are coalesced, so the footprint is the capacity minus the
        trailing free block, if any.
        """
        tail = self._free_by_end.get(self.end_bytes)
        return (tail if tail is not None else self.end_bytes) - self.base_bytes

    # -- alloc / free -----------------------------------------------------------
    def alloc(self, length_bytes: int) -> int:
        """Reserve an extent for ``length_bytes`` (0 takes one alignment unit).

        Args:
            length_bytes: bytes wanted; the extent is :meth:`extent_bytes` long.

        Returns:
            The extent's offset in bytes, or -1 when no free block can hold it.
        """
        shift = self._shift
        units = ((length_bytes - 1) >> shift) + 1 if length_bytes > 0 else 1
        need = units << shift
        cls = _request_class(units)
        row = cls >> _SL_BITS
        maps = self._class_maps
        m = maps[row] & -(1 << (cls & _SL_MASK))  # classes >= cls in this row
        if not m:
            rows = self._row_map & -(2 << row)  # rows above
            if rows:
                row = (rows & -rows).bit_length() - 1
                m = maps[row]
        if m:
            cls = (row << _SL_BITS) | ((m & -m).bit_length() - 1)
            blocks = self._classes[cls]
            off, block = next(reversed(blocks.items()))  # the most recently freed block
        else:
            off, block, cls = self._search_own_class(units, need)
            if off < 0:
                return -1
            blocks = self._classes[cls]
            row = cls >> _SL_BITS
        rest = block - need
        free_by_end = self._free_by_end
        del free_by_end[off + block]
        if rest:
            # Take the extent from the block's end: the remainder keeps the
            # block's offset, so it usually stays in place in its class.
            self._free_by_offset[off] = rest
            free_by_end[off + rest] = off
            units = rest >> shift
            fl = units.bit_length() - 1
            rest_cls = units if fl < _SL_BITS else (
                ((fl - _SL_BITS + 1) << _SL_BITS) | ((units >> (fl - _SL_BITS)) & _SL_MASK))
            if rest_cls == cls:
                blocks[off] = rest
                self._used[off + rest] = need
                self.used_bytes += need
                return off + rest
            del blocks[off]
            self._classes[rest_cls][off] = rest
            rest_row = rest_cls >> _SL_BITS
            maps[rest_row] |= 1 << (rest_cls & _SL_MASK)
            self._row_map |= 1 << rest_row
            result = off + rest
        else:
            del blocks[off]
            del self._free_by_offset[off]
            result = off
        if not blocks:
            maps[row] &= ~(1 << (cls & _SL_MASK))
            if not maps[row]:
                self._row_map &= ~(1 << row)
        self._used[result] = need
        self.used_bytes += need
        return result

    def claim(self, offset_bytes: int, length_bytes: int) -> int:
        """Reserve the specific extent ``[offset_bytes, offset_bytes + extent)``.

        Used when the master rebuilds its index from a region scan: the extents
        already exist in the region and must be taken back exactly where they
        are. The extent is :meth:`extent_bytes` of ``length_bytes`` long, as
        :meth:`alloc` would have made it; the free block holding it is split
        around it (up to two free remainders).

        Cost: O(1) when the extent lies in the last free block of the range or
        starts a free block — always so when claims come in ascending offset
        order on an allocator that only claims; otherwise O(free blocks).

        Args:
            offset_bytes: the extent's offset in bytes (a multiple of the alignment).
            length_bytes: bytes the extent holds (0 takes one alignment unit).

        Returns:
            The extent's length in bytes.

        Raises:
            ValueError: ``offset_bytes`` is misaligned, the extent does not lie
                inside ``[base_bytes, end_bytes)``, or some of its bytes are not
                free (they overlap a live extent). Nothing is changed then.
        """
        need = self.extent_bytes(length_bytes)
        if offset_bytes % self.alignment_bytes or length_bytes < 0:
            raise ValueError(f"claim of ({offset_bytes}, {length_bytes}): offset is not a multiple of "
                             f"{self.alignment_bytes} or the length is negative")
        end = offset_bytes + need
        if offset_bytes < self.base_bytes or end > self.end_bytes:
            raise ValueError(f"claim of [{offset_bytes}, {end}) lies outside "
                             f"[{self.base_bytes}, {self.end_bytes})")
        block_off = self._containing_free_block(offset_bytes)
        if block_off < 0 or block_off + self._free_by_offset[block_off] < end:
            raise ValueError(f"claim of [{offset_bytes}, {end}) overlaps a live extent")
        block_end = block_off + self._free_by_offset.pop(block_off)
        del self._free_by_end[block_end]
        self._remove_free(block_off, block_end - block_off)
        if offset_bytes > block_off:
            self._insert_free(block_off, offset_bytes - block_off)
        if block_end > end:
            self._insert_free(end, block_end - end)
        self._used[offset_bytes] = need
        self.used_bytes += need
        return need

    def _containing_free_block(self, offset_bytes: int) -> int:
        """Offset of the free block holding byte ``offset_bytes``, or -1 if it is in use."""
        if offset_bytes in self._free_by_offset:
            return offset_bytes
        tail = self._free_by_end.get(self.end_bytes)
        if tail is not None and tail <= offset_bytes:
            return tail
        for off, n in self._free_by_offset.items():
            if off <= offset_bytes < off + n:
                return off
        return -1

    def _search_own_class(self, units: int, need: int) -> tuple[int, int, int]:
        """Slow path: a block of the request's own class that is large enough.

        Returns:
            ``(offset, length, class)``, or ``(-1, 0, 0)`` if none was found
            among the first ``_OWN_CLASS_PROBES`` blocks of the class.
        """
        cls = _size_class(units)
        if cls >= len(self._classes) or not self._classes[cls]:
            return -1, 0, 0
        for probes, (off, block) in enumerate(self._classes[cls].items()):
            if block >= need:
                return off, block, cls
            if probes >= _OWN_CLASS_PROBES:
                break
        return -1, 0, 0

    def free(self, offset_bytes: int) -> int:
        """Return the live extent at ``offset_bytes`` to the free pool, coalescing.

        Returns:
            The extent's length in bytes.

        Raises:
            KeyError: no live extent starts at ``offset_bytes`` (double free or a
                foreign offset); nothing is changed.
        """
        length = self._used.pop(offset_bytes)
        self.used_bytes -= length
        start = offset_bytes
        end = offset_bytes + length
        prev = self._free_by_end.pop(start, None)
        if prev is not None:
            self._remove_free(prev, self._free_by_offset.pop(prev))
            start = prev
        nlen = self._free_by_offset.pop(end, None)
        if nlen is not None:
            del self._free_by_end[end + nlen]
            self._remove_free(end, nlen)
            end += nlen
        self._insert_free(start, end - start)
        return length

    def _remove_free(self, off: int, length: int) -> None:
        """Drop a block from its class (the offset/end maps are the caller's job)."""
        cls = _size_class(length >> self._shift)
        blocks = self._classes[cls]
        del blocks[off]
        if not blocks:
            row = cls >> _SL_BITS
            maps = self._class_maps
            maps[row] &= ~(1 << (cls & _SL_MASK))
            if not maps[row]:
                self._row_map &= ~(1 << row)

    def _insert_free(self, off: int, length: int) -> None:
        self._free_by_offset[off] = length
        self._free_by_end[off + length] = off
        units = length >> self._shift
        fl = units.bit_length() - 1  # _size_class, inlined: this is the hot path
        cls = units if fl < _SL_BITS else ((fl - _SL_BITS + 1) << _SL_BITS) | ((units >> (fl - _SL_BITS)) & _SL_MASK)
        self._classes[cls][off] = length
        row = cls >> _SL_BITS
        self._class_maps[row] |= 1 << (cls & _SL_MASK)
        self._row_map |= 1 << row

    # -- verification ---------------------------------------------------------------
    def check(self) -> None:
        """Verify every invariant from scratch; O(n log n). For tests and debugging.

        Raises:
            AssertionError: naming the first violated invariant.
        """
        a = self.alignment_bytes
        blocks = sorted(
            [(o, n, "free") for o, n in self._free_by_offset.items()]
            + [(o, n, "used") for o, n in self._used.items()]
        )
        pos = self.base_bytes
        prev_kind = ""
        for off, n, kind in blocks:
            if off != pos:
                raise AssertionError(
                    f"gap or overlap at offset {pos}: next {kind} block starts at {off}"
                )
            if n <= 0 or off % a or n % a:
                raise AssertionError(f"misaligned or empty {kind} block ({off}, {n})")
            if kind == "free" and prev_kind == "free":
                raise AssertionError(f"free blocks not coalesced at offset {off}")
            prev_kind = kind
            pos = off + n
        if pos != self.end_bytes:
            raise AssertionError(f"blocks end at {pos}, range ends at {self.end_bytes}")
        used = sum(self._used.values())
        free = sum(self._free_by_offset.values())
        if used != self.used_bytes:
            raise AssertionError(f"used_bytes {self.used_bytes} != sum of live extents {used}")
        if used + free != self.capacity_bytes:
            raise AssertionError(f"used {used} + free {free} != capacity {self.capacity_bytes}")
        indexed = 0
        for cls, members in enumerate(self._classes):
            row = cls >> _SL_BITS
            if bool(members) != bool((self._class_maps[row] >> (cls & _SL_MASK)) & 1):
                raise AssertionError(f"bitmap bit {cls} disagrees with its class")
            if bool(self._class_maps[row]) != bool((self._row_map >> row) & 1):
                raise AssertionError(f"row bit {row} disagrees with its class map")
            for off, n in members.items():
                if self._free_by_offset.get(off) != n or _size_class(n >> self._shift) != cls:
                    raise AssertionError(f"free block ({off}, {n}) misfiled in class {cls}")
            indexed += len(members)
        if indexed != len(self._free_by_offset) or len(self._free_by_end) != indexed:
            raise AssertionError("free-block indexes disagree in size")
        for off, n in self._free_by_offset.items():
            if self._free_by_end.get(off + n) != off:
                raise AssertionError(f"free block ({off}, {n}) missing from the end index")
