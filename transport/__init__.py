"""cxlkv.transport: map a CXL region and move bytes in and out of it at memory speed.

The C core (``_transport``, built by cffi from ``cxlkv_transport.h`` /
``c/*.c``) maps a DAX device or a file ``MAP_SHARED`` and does
bounds-checked copies (single and batched, GIL released; large copies use
non-temporal stores), cache-line flush and
invalidate (CLWB / CLFLUSHOPT / CLFLUSH chosen at run time) and prefaulting.
:mod:`cxlkv.transport.bindings` wraps each C function thinly;
:class:`Region` is the API the daemon and tools use::

    from cxlkv.transport import Region

    with Region.open("/dev/shm/cxlkv-region", size=64 << 20, create=True) as region:
        region.copy_in(4096, b"value")
        region.flush(4096, 5)
        out = bytearray(5)
        region.copy_out(4096, out)

See docs/transport.md.
"""

from __future__ import annotations

from cxlkv.transport.bindings import (
    CACHE_LINE_BYTES,
    COPY_KERNEL,
    DAX_ALIGN_BYTES,
    FLUSH_INSTRUCTION,
    INVALIDATE_INSTRUCTION,
    PAGE_BYTES,
    cxlkv_copy_in,
    cxlkv_copy_in_ranges,
    cxlkv_copy_out,
    cxlkv_copy_out_ranges,
    cxlkv_fence,
    cxlkv_flush,
    cxlkv_invalidate,
    cxlkv_map,
    cxlkv_nc_read_chunk_bytes,
    cxlkv_nc_write_kernel,
    cxlkv_prefault,
    cxlkv_retire,
    cxlkv_set_nc_read_chunk_bytes,
    cxlkv_set_nc_write_kernel,
    cxlkv_set_stream_threshold_bytes,
    cxlkv_stream_threshold_bytes,
    cxlkv_unmap,
)
from cxlkv.transport.region import CHECKSUM_ALGORITHM, Region, checksum_buffer, install_sigbus_guard

__all__ = [
    "Region",
    "install_sigbus_guard",
    "checksum_buffer",
    "CHECKSUM_ALGORITHM",
    "CACHE_LINE_BYTES",
    "PAGE_BYTES",
    "DAX_ALIGN_BYTES",
    "FLUSH_INSTRUCTION",
    "INVALIDATE_INSTRUCTION",
    "COPY_KERNEL",
    "cxlkv_stream_threshold_bytes",
    "cxlkv_set_stream_threshold_bytes",
    "cxlkv_nc_write_kernel",
    "cxlkv_set_nc_write_kernel",
    "cxlkv_nc_read_chunk_bytes",
    "cxlkv_set_nc_read_chunk_bytes",
    "cxlkv_map",
    "cxlkv_unmap",
    "cxlkv_retire",
    "cxlkv_copy_in",
    "cxlkv_copy_out",
    "cxlkv_copy_in_ranges",
    "cxlkv_copy_out_ranges",
    "cxlkv_flush",
    "cxlkv_invalidate",
    "cxlkv_fence",
    "cxlkv_prefault",
]
