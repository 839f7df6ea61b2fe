"""Region layout shared by the master and clientd.

A region (a DAX device or an emulating file) starts with a REGION_HEADER_BYTES
header holding its identity (written by ``cxlkv region format``); object extents
live in ``[REGION_HEADER_BYTES, size_bytes)`` and carry absolute offsets from the
region's start. The master's allocatable capacity of a segment is therefore
``size_bytes - REGION_HEADER_BYTES``.
"""

from __future__ import annotations

__all__ = ["REGION_HEADER_BYTES"]

#: Bytes at the start of every region reserved for its identity header.
REGION_HEADER_BYTES = 4096
