"""clientd's reads from the committed-object index in the region (docs/index.md).

A get, a batch get, a prefix match or an existence check that clientd serves
looks the key up in the index the master publishes into the shared region and
copies it with one C call (:class:`cxlkv.transport.index.IndexReader`): no
master round trip. What the index cannot answer — a key in another tier, a
value longer than ``index_max_value_bytes`` (a lease protects long copies), an
overflowed or unsure lookup, a copy that did not verify twice — goes through
the leased RPC path as before. Hits are reported to the master in batches
(:meth:`cxlkv.clientd.master_link.MasterLink.report_hits`) so eviction keeps
its information.

The reader is built from what the master said at registration (the region
holding the index, :attr:`MasterLink.index_region_uuid`) and rebuilt after
every re-registration; a master that publishes no index, or an index region
this daemon does not map, leaves every read on the RPC path.
"""

from __future__ import annotations

import logging
from typing import Any

from cxlkv.clientd.master_link import MasterLink
from cxlkv.clientd.regions import RegionSet
from cxlkv.errors import CxlkvError
from cxlkv.layout.index import read_index_header

__all__ = ["IndexReads"]

log = logging.getLogger(__name__)


class IndexReads:
    """The index reader of one daemon, following the master's registrations.

    Args:
        regions: the daemon's mapped regions.
        link: the master session (index region and epoch, generation).
        invalidate: non-coherent mode: invalidate before every read.
        verify_first: with ``invalidate``, a value's first copy goes through the
            cache and is checked (:class:`cxlkv.transport.index.IndexReader`).
        max_value_bytes: longer values go through the leased RPC path.
        enabled: ``False`` keeps every read on the RPC path (config ``index_reads``).
    """

    def __init__(self, regions: RegionSet, link: MasterLink, *, invalidate: bool, max_value_bytes: int,
                 enabled: bool = True, verify_first: bool = True) -> None:
        self.regions = regions
        self.link = link
        self.invalidate = invalidate
        self.verify_first = verify_first
        self.max_value_bytes = max_value_bytes
        self.enabled = enabled
        self._reader: Any = None
        self._used: list[Any] = []  # the MappedRegions the reader reads (rebuilt when one breaks)
        self._generation = -1
        #: Why reads do not use the index ("" while they do), for Stat and logs.
        self.why_not = "not registered yet"

    def reader(self) -> Any:
        """The current reader, or ``None`` (every read on the RPC path)."""
        if self._generation != self.link.generation or any(m.broken for m in self._used):
            self._rebuild()
        return self._reader

    def _rebuild(self) -> None:
        from cxlkv.transport.index import IndexReader

        self._generation = self.link.generation
        self._reader = None
        self._used = []
        if not self.enabled:
            self.why_not = "index_reads = false"
            return
        want = getattr(self.link, "index_region_uuid", "")
        if not want:
            self.why_not = "the master publishes no index"
            return
        by_uuid = {str(m.identity.region_uuid): m for m in self.regions if not m.local and not m.broken}
        home = by_uuid.get(want)
        if home is None or home.identity.index is None:
            self.why_not = f"the index region {want} is not mapped here"
            log.info("index reads off: %s", self.why_not)
            return
        geo = home.identity.index
        try:
            header = read_index_header(home.region, geo)
            regions = [by_uuid[str(u)].region if str(u) in by_uuid else None for u in header.region_uuids]
            self._reader = IndexReader(home.region, geo.index_offset_bytes, geo.table_offset_bytes, geo.buckets,
                                       regions, invalidate=self.invalidate, verify_first=self.verify_first,
                                       max_value_bytes=self.max_value_bytes)
        except CxlkvError as exc:
            self.why_not = f"index region {home.path}: {exc.message}"
            log.warning("index reads off: %s", self.why_not)
            return
        self._used = [by_uuid[str(u)] for u in header.region_uuids if str(u) in by_uuid]
        self.why_not = ""
        log.info("index reads on: index in region %s (segment %s), %d slots, %d region(s) named, %d mapped",
                 home.path, home.segment, geo.slots, len(regions), sum(r is not None for r in regions))
