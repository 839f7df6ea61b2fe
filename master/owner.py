"""The regions a master owns: mapping, owner leases, and the index it publishes.

At start the master maps every CXL segment of its configuration that names a
``path`` (:class:`cxlkv.config.SegmentConfig`), checks the region's identity
against the segment, and takes the region's **owner lease** (recorded in the
region's index header page, :mod:`cxlkv.layout.index`): a region whose lease another
master renewed less than ``owner_lease_ttl_s`` ago is waited for, then refused
with one line — two masters never publish into one region. The epoch grows at
every takeover; the lease is renewed every quarter of its TTL, and a master that
finds another epoch in the record has been deposed and stops (it must write
nothing more).

The first mapped CXL region that has an index holds the cluster's index (the
**index region**); its region table names every mapped CXL region (region
numbers in slots). Other regions' own index areas stay inactive (publish word
0), so readers find one active index. Without ``--recover-from-region`` the
index is emptied at start (the cache starts empty, as the master's memory
does); with it, the master's objects are rebuilt from the index
(:func:`cxlkv.master.recovery.recover_from_index`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
import uuid
from typing import Any, Callable

from cxlkv.config import MasterConfig
from cxlkv.errors import ConfigError, CxlkvError
from cxlkv.layout.index import (
    MAX_REGIONS, IndexGeometry, IndexWriter, OwnerLease, read_grants, read_index_header, read_owner,
    set_publish_word, write_owner, write_region_table,
)
from cxlkv.master.publish import RegionIndex
from cxlkv.master.segments import Segment
from cxlkv.master.state import MasterState
from cxlkv.layout.region import RegionIdentity, read_identity

__all__ = ["OwnedRegion", "RegionOwnership", "Deposed"]

log = logging.getLogger("cxlkv.master")



class Deposed(Exception):
    """Another master took over a region this master owned (its epoch is in the record)."""


@dataclasses.dataclass
class OwnedRegion:
    """One region this master maps and owns.

    Attributes:
        path: where it is mapped.
        segment: its segment.
        region: the mapping (:class:`cxlkv.transport.Region`).
        identity: its identity header.
        geometry: its index area.
        epoch: this master's owner epoch.
    """

    path: str
    segment: Segment
    region: Any
    identity: RegionIdentity
    geometry: IndexGeometry
    epoch: int


class RegionOwnership:
    """The regions one master owns, the owner leases and the index it publishes.

    Args:
        state: the master's state (segments mounted from the configuration).
        config: the master's configuration.
        owner_id: this master's instance id.
        wall: wall clock (seconds since the epoch) for lease times.
        sleep: waits while another master's lease is live.

    Raises:
        ConfigError: a region that cannot be mapped or whose identity is not the
            segment's, or that another master owns (one line each, naming the
            region and what to do).
    """

    def __init__(self, state: MasterState, config: MasterConfig, owner_id: uuid.UUID, *,
                 wall: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
                 min_epoch: int = 0) -> None:
        self.state = state
        self.config = config
        self.owner_id = owner_id
        #: The epoch taken is at least this (leader election: one above etcd's record).
        self.min_epoch = min_epoch
        #: A standby's :class:`~cxlkv.master.warm.WarmState` whose state this master took
        #: over: recovery applies its last diff instead of rebuilding (None: rebuild).
        self.warm: Any = None
        self._wall = wall
        self._sleep = sleep
        # Every slot write is written back (CLWB: tens of ns where memory is coherent), so
        # the index is right under non-coherent sharing whatever the clientds' mode.
        self.flush = True
        self.owned: list[OwnedRegion] = []
        #: The region holding the cluster's index, and its writer (None: no index).
        self.index_region: OwnedRegion | None = None
        self.writer: IndexWriter | None = None
        self.publisher: RegionIndex | None = None
        try:
            for sc in config.segments:
                if sc.tier != "cxl" or not sc.path:
                    continue
                seg = state.segment_table.by_name(sc.name)
                if seg is None or not seg.mounted:
                    continue
                owned = self._open(sc.path, seg)
                if owned is not None:
                    self.owned.append(owned)
        except BaseException:
            self.close()
            raise
        indexed = [o for o in self.owned]
        if indexed:
            self.index_region = indexed[0]
            if len(indexed) > MAX_REGIONS:
                log.warning("index: only the first %d CXL regions are indexed", MAX_REGIONS)

    # -- set-up ----------------------------------------------------------------
    def _open(self, path: str, seg: Segment) -> OwnedRegion | None:
        from cxlkv.transport import Region, install_sigbus_guard

        install_sigbus_guard()  # a region file that shrinks: zero memory and an error line, never a SIGBUS death
        try:
            region = Region.open(path)
        except CxlkvError as exc:
            raise ConfigError(f"segment {seg.name!r}: cannot map its region {path} to publish the index: "
                              f"{exc.message} (give the master access, or remove `path` from the segment to "
                              f"run without the index)") from None
        try:
            identity = read_identity(region)
            if identity.segment_name != seg.name:
                raise ConfigError(f"segment {seg.name!r}: region {path} is formatted as segment "
                                  f"{identity.segment_name!r}")
            if region.size_bytes != seg.size_bytes:
                raise ConfigError(f"segment {seg.name!r}: region {path} is {region.size_bytes} B, the "
                                  f"segment is configured with {seg.size_bytes} B")
            if seg.region_uuid and seg.region_uuid != str(identity.region_uuid):
                raise ConfigError(f"segment {seg.name!r}: region {path} has uuid {identity.region_uuid}, "
                                  f"the segment is configured with {seg.region_uuid}")
            geometry = identity.index
            if geometry is None:
                log.warning("segment %s: region %s has no index (format version %d): its objects are read "
                            "through the leased RPC path; `cxlkv region format --force` lays one out",
                            seg.name, path, identity.format_version)
                region.close()
                return None
            read_index_header(region, geometry)
            seg.region_uuid = str(identity.region_uuid)
            if seg.data_end_bytes != identity.data_end_bytes:  # a warm standby's state has it already
                self.state.segment_table.set_data_end(seg, identity.data_end_bytes)
            epoch = self._take(region, geometry, path)
        except CxlkvError as exc:
            region.close()
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(f"segment {seg.name!r}: region {path}: {exc.message}") from None
        except BaseException:
            region.close()
            raise
        log.info("segment %s: owns region %s (uuid %s) at epoch %d; index of %d slots (%d bytes)",
                 seg.name, path, identity.region_uuid, epoch, geometry.slots, geometry.index_bytes)
        return OwnedRegion(path, seg, region, identity, geometry, epoch)

    def _take(self, region: Any, geometry: IndexGeometry, path: str) -> int:
        """Take the owner lease (waiting while another master's is live); returns the new epoch."""
        ttl = self.config.owner_lease_ttl_s
        waited = False
        deadline = time.monotonic() + ttl + 1.0
        while True:
            cur = read_owner(region, geometry)
            now = self._wall()
            if cur is None or cur.owner_id == self.owner_id or now - cur.heartbeat_s >= cur.ttl_s:
                break
            if time.monotonic() >= deadline:
                raise ConfigError(
                    f"region {path} is owned by another master (id {cur.owner_id.hex[:12]}, epoch {cur.epoch}, "
                    f"heartbeat {now - cur.heartbeat_s:.1f} s ago): stop it first; a region has one master")
            if not waited:
                log.warning("region %s: owner lease held by master %s (epoch %d, heartbeat %.1f s ago); "
                            "waiting up to %.0f s for it to lapse", path, cur.owner_id.hex[:12], cur.epoch,
                            now - cur.heartbeat_s, ttl + 1.0)
                waited = True
            self._sleep(min(0.2, ttl / 4))
        epoch = max((cur.epoch if cur is not None else 0) + 1, self.min_epoch)
        write_owner(region, geometry, OwnerLease(epoch, self.owner_id, self._wall(), ttl))
        return epoch

    def start_index(self, recover: bool, now: float) -> dict[str, int]:
        """Recover from (or empty) the index, write its region table, attach the
        publisher to the state and set the publish word; other regions' own
        index areas are deactivated.

        Returns:
            What recovery found (empty without ``recover``).
        """
        ir = self.index_region
        if ir is None:
            return {}
        for o in self.owned:
            if o is not ir:
                set_publish_word(o.region, o.geometry, 0)
        named = self.owned[:MAX_REGIONS]
        write_region_table(ir.region, ir.geometry, [o.identity.region_uuid for o in named])
        numbers = {o.segment.segment_id: i for i, o in enumerate(named)}
        self.writer = IndexWriter(ir.region, ir.geometry, flush=self.flush)
        self.publisher = RegionIndex(self.writer, numbers, self.state.segment_table.by_id,
                                     {o.segment.segment_id: o.region for o in self.owned})
        self.state.index = self.publisher
        # Space the previous master had handed to writers (grant slots): held for them
        # until their clientd says they stopped — with or without recovery.
        grants = read_grants(ir.region, ir.geometry)
        found: dict[str, int] = {}
        if recover:
            from cxlkv.master.recovery import recover_from_index

            for g in grants:
                self.writer.adopt_grant(g)
            warm = self.warm.finish(self, numbers, now) if self.warm is not None else None
            found = warm if warm is not None else recover_from_index(self.state, self, numbers, now)
        else:
            self.writer.clear()
        by_number = {i: o.segment.segment_id for i, o in enumerate(named)}
        held = 0
        for g in grants:
            sid = by_number.get(g.region_no)
            if sid is not None and self.state.quarantine_granted(sid, g.extent_offset_bytes, g.length_bytes,
                                                                 g.put_token, g.client_hash, now):
                held += 1
                if not recover:
                    self.writer.regrant(g)
            elif recover:
                self.writer.ungrant(g.put_token)  # its put was committed (an object owns it) or its region is gone
        if grants:
            log.info("index: %d extent(s) the previous master had handed to writers are held until their "
                     "clientds say they stopped writing (%d already committed or gone)", held, len(grants) - held)
        found["grants_held"] = held
        self.writer.sync()
        set_publish_word(ir.region, ir.geometry, ir.epoch)
        return found

    # -- run time --------------------------------------------------------------
    def index_epoch(self) -> int:
        """The epoch in the index region's owner record now (0: no record or no index).

        Raises:
            RegionError: the region cannot be read.
        """
        ir = self.index_region
        if ir is None:
            return 0
        cur = read_owner(ir.region, ir.geometry)
        return cur.epoch if cur is not None else 0

    def heartbeat(self) -> None:
        """Renew every owner lease.

        Raises:
            Deposed: another master's epoch is in a region's record (this master
                must stop at once; it writes nothing more).
        """
        for o in self.owned:
            hits = getattr(o.region, "guard_hits", 0)
            if hits and not getattr(o, "shrunk", False):
                o.shrunk = True  # type: ignore[attr-defined]
                log.error("region %s (segment %s) shrank under the master (its file was truncated): index "
                          "writes past its end are lost; clientds retire the region; re-create and re-format it",
                          o.path, o.segment.name)
            cur = read_owner(o.region, o.geometry)
            if cur is None or cur.owner_id != self.owner_id or cur.epoch != o.epoch:
                what = "no owner record" if cur is None else (
                    f"master {cur.owner_id.hex[:12]} at epoch {cur.epoch}")
                raise Deposed(f"region {o.path} (segment {o.segment.name}) was taken over: {what}; this "
                              f"master (epoch {o.epoch}) stops")
            write_owner(o.region, o.geometry, OwnerLease(o.epoch, self.owner_id, self._wall(),
                                                         self.config.owner_lease_ttl_s))

    def release(self) -> None:
        """Clean stop: let the owner leases lapse at once (the next master takes over
        without waiting); the index stays published, so reads go on meanwhile."""
        for o in self.owned:
            try:
                cur = read_owner(o.region, o.geometry)
                if cur is not None and cur.owner_id == self.owner_id and cur.epoch == o.epoch:
                    write_owner(o.region, o.geometry, OwnerLease(o.epoch, self.owner_id, 0.0, cur.ttl_s))
            except CxlkvError as exc:
                log.warning("region %s: could not release the owner lease: %s", o.path, exc.message)

    def close(self) -> None:
        """Unmap every region (after :meth:`release`)."""
        for o in self.owned:
            try:
                o.region.close()
            except Exception:  # noqa: BLE001 - closing must not hide the error that got us here
                pass
        self.owned = []

    def check_recover_specs(self, specs: list[str]) -> None:
        """``PATH=SEGMENT`` specs of owned regions must name the region's own segment.

        Raises:
            ConfigError: one names another segment (both named).
        """
        from cxlkv.master.recovery import parse_recover_spec

        by_path = {os.path.realpath(o.path): o for o in self.owned}
        for spec in specs:
            path, want = parse_recover_spec(spec)
            o = by_path.get(os.path.realpath(path))
            if o is not None and want and want != o.identity.segment_name:
                raise ConfigError(f"recover_from_region: region {path} is formatted as segment "
                                  f"{o.identity.segment_name!r}, not {want!r}")

    def paths(self) -> set[str]:
        """Real paths of the owned regions."""
        return {os.path.realpath(o.path) for o in self.owned}
