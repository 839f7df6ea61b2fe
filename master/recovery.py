"""Rebuild the master's index from region scans (``cxlkv master --recover-from-region``).

The master keeps its metadata in memory only; when it is lost (the master was
killed or its host died) every committed object is still in the CXL regions,
and every extent is self-describing (:mod:`cxlkv.layout.objheader`). At start, for
each region given, the master maps the region (the only time it maps one; it
writes nothing), reads its identity (:mod:`cxlkv.layout.region`), scans it
(:mod:`cxlkv.transport.scan`: per key the newest version whose value checksum
holds and that nothing newer overwrote) and restores each live object as a
COMPLETE object with its extent claimed exactly where it lies
(:meth:`~cxlkv.master.state.MasterState.restore_objects`).

What a scan cannot know: leases, pins, in-flight puts (they have no header yet),
and which keys were removed — freed space is not cleared, so an object removed
(or evicted) whose extent was not reused since comes back. See docs/master.md.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import TYPE_CHECKING, Any, Sequence

from cxlkv.errors import ConfigError, CxlkvError
from cxlkv.master.objects import RestoredObject
from cxlkv.master.segments import Segment, Tier
from cxlkv.master.state import MasterState

__all__ = ["RegionRecovery", "check_recover_specs", "parse_recover_spec", "recover_regions"]

if TYPE_CHECKING:
    from cxlkv.master.owner import RegionOwnership

log = logging.getLogger("cxlkv.master")


@dataclasses.dataclass(frozen=True)
class RegionRecovery:
    """What the recovery of one region found and restored.

    Attributes:
        path: the region's path.
        segment: the segment its objects were restored into.
        region_uuid: the region's identity (uuid as a string).
        headers: valid object headers found (stale ones included).
        live: objects the scan vouches for (newest per key, intact, not overwritten).
        restored: objects committed under their key.
        replicas: extents added as replicas of a version restored from another region.
        restored_bytes: bytes of extents claimed (alignment included).
        skipped: objects left out for a real reason: a value checksum that fails
            with no intact copy of that version (or a newer one) restored from
            any region — a corrupt value, or a removed or evicted object's
            leftovers whose space was partly reused since — plus live objects the
            master refused (extent conflict, invalid key). When a key's newest
            version is corrupt, an older intact version of it that nothing
            overwrote is restored instead.
        stale: objects left out that lose nothing: an older version of a key
            whose newer version was restored from another region (a leftover in
            freed space), and copies whose value fails its checksum while an
            intact copy of the same or a newer version was restored — in a
            tiered cluster typically a freed CXL extent of a demoted object whose
            space an unfinished put or tier move (value written, header not yet)
            was rewriting when the master stopped.
        seconds: wall time of this region's recovery (map, scan, restore).
        corrupt_keys: ``(key, version)`` of the objects whose checksum failed
            (classified into ``skipped`` or ``stale`` by :func:`recover_regions`).
    """

    path: str
    segment: str
    region_uuid: str
    headers: int
    live: int
    restored: int
    replicas: int
    restored_bytes: int
    skipped: int
    seconds: float
    stale: int = 0
    corrupt_keys: tuple[tuple[str, int], ...] = ()


def parse_recover_spec(spec: str) -> tuple[str, str]:
    """Split ``"PATH"`` or ``"PATH=SEGMENT"`` into ``(path, segment)``.

    The last ``=`` separates the segment unless what follows it contains a
    ``/`` (then the whole string is a path).

    Returns:
        ``(path, segment)``; segment is ``""`` when not given (the region's
        identity names it).

    Raises:
        ConfigError: an empty path or segment.
    """
    path, sep, segment = spec.rpartition("=")
    if not sep or "/" in segment:
        path, sep, segment = spec, "", ""
    if not path or (sep and not segment):
        raise ConfigError(f"recover_from_region: expected \"PATH\" or \"PATH=SEGMENT\", got {spec!r}")
    return path, segment


def check_recover_specs(specs: Sequence[str]) -> None:
    """Check every ``recover_from_region`` spec before anything is mapped or written:
    a master that is to fail on one must leave every region as it found it (its
    index is emptied at start-up unless the master recovers from it, so a
    mistyped path must not start a master that wipes the region meant).

    Raises:
        ConfigError: a malformed spec, a path that does not exist or cannot be
            mapped, a region that is not formatted or whose identity names
            another segment than ``SEGMENT``, or a region given twice (by the
            same real path).
    """
    from cxlkv.layout.region import read_identity
    from cxlkv.transport import Region

    seen: dict[str, str] = {}
    for spec in specs:
        path, want = parse_recover_spec(spec)
        if not os.path.exists(path):
            raise ConfigError(f"recover_from_region: region {path} does not exist")
        real = os.path.realpath(path)
        if real in seen:
            raise ConfigError(f"recover_from_region: region {path} is given twice ({seen[real]!r} and "
                              f"{spec!r}); give each region once")
        seen[real] = spec
        try:
            with Region.open(path) as region:
                name = read_identity(region).segment_name
        except CxlkvError as exc:
            raise ConfigError(f"recover_from_region: {exc.message}") from None
        if want and name != want:
            raise ConfigError(f"recover_from_region: region {path} is formatted as segment {name!r}, not {want!r}")


def _segment_for(state: MasterState, name: str, size_bytes: int, region_uuid: str, path: str) -> Segment:
    """The mounted segment ``name``, checked against the region; mounted from the
    region's identity when the configuration does not declare it.

    Raises:
        ConfigError: a size or uuid mismatch (both named).
    """
    seg = state.segment_table.by_name(name)
    if seg is None or not seg.mounted:
        seg = state.segment_table.mount(name, Tier.CXL, size_bytes, region_uuid, path)
        state.counters["segments_mounted"] += 1
        log.info("recovery: mounted segment %s from the identity of region %s", name, path)
        return seg
    if seg.size_bytes != size_bytes:
        raise ConfigError(f"recover_from_region: region {path} is {size_bytes} B but segment "
                          f"{name!r} is {seg.size_bytes} B")
    if seg.region_uuid and seg.region_uuid != region_uuid:
        raise ConfigError(f"recover_from_region: region {path} has uuid {region_uuid} but segment "
                          f"{name!r} is configured with region_uuid {seg.region_uuid}")
    seg.region_uuid = region_uuid  # adopted: clientds registering later must report this one
    return seg


def recover_region(state: MasterState, spec: str, now: float) -> RegionRecovery:
    """Restore the committed objects of one region into ``state``.

    Args:
        state: the master's state (fresh: nothing allocated in this segment yet,
            or only objects of earlier regions elsewhere).
        spec: ``"PATH"`` or ``"PATH=SEGMENT"``.
        now: master clock, seconds.

    Returns:
        What was found and restored.

    Raises:
        ConfigError: the region cannot be mapped, is not formatted, its identity
            names another segment than ``SEGMENT``, or its size or uuid differs
            from the segment's; a segment recovered twice.
    """
    from cxlkv.layout.region import read_identity
    from cxlkv.transport import Region
    from cxlkv.transport.scan import live_objects, scan_region

    t0 = time.perf_counter()
    path, want = parse_recover_spec(spec)
    try:
        with Region.open(path) as region:
            identity = read_identity(region)
            name = want or identity.segment_name
            if want and identity.segment_name != want:
                raise ConfigError(f"recover_from_region: region {path} is formatted as segment "
                                  f"{identity.segment_name!r}, not {want!r}")
            uuid = str(identity.region_uuid)
            seg = _segment_for(state, name, region.size_bytes, uuid, path)
            if seg.allocator.live_extents:
                raise ConfigError(f"recover_from_region: segment {name!r} is recovered twice "
                                  f"(or already holds objects); give each region once")
            found = scan_region(region, verify_values=True)
    except CxlkvError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"recover_from_region: {exc.message}") from None
    live = live_objects(found)
    corrupt: list[tuple[str, int]] = []
    if any(o.checksum_ok is False for o in found):
        # What would be live were every value intact: those whose value fails are the corrupt ones.
        intact = {(o.offset_bytes, o.version): o.checksum_ok for o in found}
        candidates = live_objects([dataclasses.replace(o, checksum_ok=None) for o in found])
        corrupt = [(o.key, o.version) for o in candidates if intact[(o.offset_bytes, o.version)] is False]
    report = state.restore_objects(seg.segment_id, (
        RestoredObject(o.key, o.offset_bytes, o.value_len_bytes, o.header_bytes, o.version, o.value_checksum)
        for o in live
    ), now)
    refused = report.conflicts + report.invalid
    return RegionRecovery(
        path=path, segment=name, region_uuid=uuid, headers=len(found), live=len(live),
        restored=report.restored, replicas=report.replicas, restored_bytes=report.restored_bytes,
        skipped=len(corrupt) + refused, seconds=time.perf_counter() - t0,
        stale=report.superseded, corrupt_keys=tuple(corrupt),
    )


def _classify(state: MasterState, r: RegionRecovery) -> RegionRecovery:
    """Move the checksum failures of ``r`` that an intact restored copy covers
    (same or newer version of the key, from any region) from ``skipped`` to ``stale``."""
    covered = 0
    for key, version in r.corrupt_keys:
        obj = state.get_object(key)
        if obj is not None and obj.version >= version:
            covered += 1
    return dataclasses.replace(r, skipped=r.skipped - covered, stale=r.stale + covered)


def recover_regions(state: MasterState, specs: Sequence[str], now: float) -> list[RegionRecovery]:
    """Recover every region of ``specs`` in order; log one summary line.

    Logs one line per region with skipped objects (their count, never one line
    per object) and one summary line: objects, bytes, skipped, seconds.

    Raises:
        ConfigError: as :func:`recover_region`.
    """
    if not specs:
        return []
    t0 = time.perf_counter()
    done = [recover_region(state, spec, now) for spec in specs]
    done = [_classify(state, r) for r in done]  # after every region: copies restored anywhere count
    for r in done:
        if r.skipped:
            log.warning("recovery: region %s (segment %s): skipped %d object(s) whose value checksum "
                        "failed with no intact copy restored (a corrupt value, or the leftover of a removed or "
                        "evicted object whose space was being reused), or that the master refused "
                        "(extent conflict, invalid key)", r.path, r.segment, r.skipped)
        if r.stale:
            log.info("recovery: region %s (segment %s): left out %d stale cop(ies), nothing lost: an "
                     "older version superseded by a newer one, or a freed copy an unfinished put or "
                     "tier move was rewriting, its key restored from an intact copy",
                     r.path, r.segment, r.stale)
    seconds = time.perf_counter() - t0
    objects = sum(r.restored for r in done)
    log.info(
        "recovery: rebuilt the index from %d region(s): %d object(s), %d replica(s), %d bytes, "
        "%d skipped, %d stale, %.3f s", len(done), objects, sum(r.replicas for r in done),
        sum(r.restored_bytes for r in done), sum(r.skipped for r in done),
        sum(r.stale for r in done), seconds,
    )
    return done


def recover_from_index(state: MasterState, ownership: "RegionOwnership", numbers: dict[int, int],
                       now: float) -> dict[str, int]:
    """Rebuild the master's objects from the index region's slots.

    Only what the index names comes back: every live slot whose extent's object
    header (read from its region) describes the slot's key hash, version, value
    length, header size and value checksum becomes a COMPLETE object in its
    slot (:meth:`IndexWriter.adopt`). Slots that do not verify, name a region
    this master does not map, or say ELSEWHERE (an SSD- or DRAM-only object:
    give its tier file to ``recover_from_region`` to scan it) are emptied. A
    value whose bytes look like object headers never becomes an object, and
    after ``cxlkv region format --force`` (which empties the index) nothing
    of the old contents comes back.

    Args:
        state: the master's state, its ``index`` already the ownership's publisher.
        ownership: the regions this master owns (``index_region`` and ``writer`` set).
        numbers: segment id → region number of the index's region table.
        now: master clock, seconds.

    Returns:
        Counts: ``slots`` (live slots read), ``restored``, ``invalid`` (did not
        verify), ``elsewhere`` (ELSEWHERE slots emptied), ``unmapped``,
        ``refused`` (verified but the state refused: extent conflict, bad key),
        ``seconds``.
    """
    from cxlkv.layout.index import SLOT_ELSEWHERE, read_slots
    from cxlkv.layout.objheader import OBJECT_HEADER_BYTES, parse_header

    t0 = time.perf_counter()
    ir, writer = ownership.index_region, ownership.writer
    assert ir is not None and writer is not None
    by_number = {numbers[o.segment.segment_id]: o for o in ownership.owned if o.segment.segment_id in numbers}
    counts = dict.fromkeys(("slots", "restored", "invalid", "elsewhere", "unmapped", "refused"), 0)
    per_segment: dict[int, list[RestoredObject]] = {}
    adopted: list[tuple[str, int, int]] = []
    for slot_no, slot in list(read_slots(ir.region, ir.geometry)):
        counts["slots"] += 1
        if slot.flags & SLOT_ELSEWHERE:
            writer.tombstone(slot_no)
            counts["elsewhere"] += 1
            continue
        o = by_number.get(slot.region_no)
        if o is None:
            writer.tombstone(slot_no)
            counts["unmapped"] += 1
            continue
        key = _verified_key(o.region, slot, OBJECT_HEADER_BYTES, parse_header)
        if key is None:
            writer.tombstone(slot_no)
            counts["invalid"] += 1
            continue
        writer.adopt(slot_no, key, slot.key_hash, slot.version)
        adopted.append((key, slot.key_hash, slot.version))
        per_segment.setdefault(o.segment.segment_id, []).append(RestoredObject(
            key, slot.extent_offset_bytes, slot.value_len_bytes, slot.header_bytes, slot.version,
            slot.value_checksum))
    # The slots are adopted as they are: restoring must not write each of them again
    # (a million slot writes, ~15% of a takeover's time at 1M objects).
    saved, state.index = state.index, _Adopted(state.index)
    try:
        for sid, objs in per_segment.items():
            report = state.restore_objects(sid, objs, now)
            counts["restored"] += report.restored + report.replicas
    finally:
        state.index = saved
    for key, h, version in adopted:
        obj = state.get_object(key)
        if obj is None or obj.version != version:
            writer.retire(key, h, version)
            counts["refused"] += 1
    counts["seconds"] = time.perf_counter() - t0  # type: ignore[assignment]
    log.info("recovery: rebuilt from the index of region %s: %d object(s) of %d live slot(s); %d did not "
             "verify, %d ELSEWHERE (SSD/DRAM only) and %d in unmapped regions emptied, %d refused, %.3f s",
             ir.path, counts["restored"], counts["slots"], counts["invalid"], counts["elsewhere"],
             counts["unmapped"], counts["refused"], counts["seconds"])
    return counts


class _Adopted:
    """The state's index while objects are restored from their own slots: publishing
    them again is skipped (each slot already says exactly that); the rest passes through."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def publish(self, obj: Any) -> None:
        """Already in its slot."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _verified_key(region: Any, slot: Any, header_len: int, parse_header: Any) -> str | None:
    """The key of the object a slot names when its extent's header describes the slot exactly."""
    off = slot.extent_offset_bytes
    hb = slot.header_bytes
    if hb < header_len or off + hb + slot.value_len_bytes > region.size_bytes:
        return None
    try:
        region.invalidate(off, hb)
        head = region.read(off, hb)
    except CxlkvError:
        return None
    klen = int.from_bytes(head[12:16], "little")
    if not 1 <= klen <= hb - header_len:
        return None
    key_utf8 = head[header_len:header_len + klen]
    h = parse_header(head, key_utf8)
    if (h is None or h.key_hash != slot.key_hash or h.version != slot.version
            or h.value_len_bytes != slot.value_len_bytes or h.header_bytes != hb
            or h.value_checksum != slot.value_checksum):
        return None
    try:
        return bytes(key_utf8).decode("utf-8")
    except UnicodeDecodeError:
        return None
