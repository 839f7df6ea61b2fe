"""The regions a clientd maps, checked against their identity and the master's segments.

At start every configured region is mapped through :class:`cxlkv.transport.Region`
and its identity header read (:func:`cxlkv.layout.region.read_identity`). A region that
is missing, unformatted, resized since formatting, or formatted for another
segment stops the daemon with one clear line (:class:`StartupError`, exit 2).
After RegisterClient the master's segment list binds segment ids to mapped
regions; a region whose uuid or size differs from the master's segment is the
wrong device and is equally fatal.
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, NoReturn

from cxlkv.config import RegionConfig
from cxlkv.errors import CxlkvError, RegionError
from cxlkv.v1 import common_pb2, master_pb2

if TYPE_CHECKING:
    from cxlkv.layout.region import RegionIdentity
    from cxlkv.transport import Region

__all__ = ["StartupError", "MappedRegion", "BrokenRegion", "RegionSet"]

log = logging.getLogger(__name__)


class StartupError(Exception):
    """The daemon cannot start; the message is the one line shown to the operator."""


@dataclass(eq=False)
class MappedRegion:
    """One mapped region.

    Attributes:
        segment: the segment name it is configured as.
        path: the local device or file.
        region: the transport mapping.
        identity: its identity header.
        segment_id: the master's id for it (0 until bound).
        local: this daemon's own DRAM tier (mounted with MountSegment, not
            reported at registration).
        broken: why the region is unusable ("" while it is fine): its file shrank
            under the mapping (:meth:`RegionSet.check_files`); ``region`` is then
            a :class:`BrokenRegion` whose every call raises ``RegionError``.
        watch_fd: a read-only descriptor of the mapped file, fstat()ed to see it
            shrink (-1: a device, the SSD tier file, or the DRAM tier).
    """

    segment: str
    path: str
    region: "Region"
    identity: "RegionIdentity"
    segment_id: int = 0
    info: common_pb2.SegmentInfo | None = field(default=None, repr=False)
    local: bool = False
    broken: str = ""
    watch_fd: int = -1

    @property
    def size_bytes(self) -> int:
        """Mapped size in bytes."""
        return self.region.size_bytes


class BrokenRegion:
    """Stands in for a region whose file shrank under its mapping: every call raises.

    The mapping itself was retired (zero memory), so a copy that was running
    when the file shrank finished harmlessly; every later read, write or probe
    of the segment is answered with :class:`~cxlkv.errors.RegionError` naming
    the file and both sizes.
    """

    def __init__(self, why: str, path: str, size_bytes: int) -> None:
        self.why = why
        self.path = path
        self.size_bytes = size_bytes
        self.closed = True
        self.is_dax = False
        self.guard_hits = 0

    def _raise(self, *_args: object, **_kw: object) -> NoReturn:
        raise RegionError(self.why, path=self.path)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._raise

    def close(self) -> None:
        """Nothing left to unmap."""

    def retire(self) -> None:
        """Nothing left to retire."""


class RegionSet:
    """The regions of one daemon, by segment name and (once bound) by segment id.

    Thread-safety: read-only after :meth:`bind`, which runs on the event loop; the
    mappings may be used from copy threads.
    """

    def __init__(self, regions: list[MappedRegion]) -> None:
        self._by_name = {r.segment: r for r in regions}
        self._by_id: dict[int, MappedRegion] = {}

    @classmethod
    def open(cls, configs: Iterable[RegionConfig], *, prefault: bool = False) -> "RegionSet":
        """Map and identify every configured region.

        Args:
            configs: the ``[[regions]]`` of the clientd config.
            prefault: fault in every page for writing now (no first-touch faults later).

        Raises:
            StartupError: a region is missing, unmappable, larger than the free
                space its file still needs, unformatted, resized, formatted for
                another segment, or configured twice.
        """
        from cxlkv.layout.region import read_identity
        from cxlkv.transport import Region
        from cxlkv.transport.space import reserve_file

        mapped: list[MappedRegion] = []
        try:
            for rc in configs:
                if any(m.segment == rc.segment for m in mapped):
                    raise StartupError(f"regions: segment {rc.segment!r} is configured twice")
                try:
                    if rc.tier == "ssd":  # positioned I/O on a file, never mapped (docs/tiers.md)
                        from cxlkv.clientd.tiers import FileRegion

                        region = FileRegion.open(rc.path)
                    else:
                        region = Region.open(rc.path)
                except CxlkvError as exc:
                    raise StartupError(f"region {rc.path} (segment {rc.segment}): {exc.message}") from None
                try:
                    # Every block of a region or tier file allocated in its filesystem now:
                    # one larger than its filesystem stops the daemon here, not with
                    # SIGBUS or ENOSPC later (a DAX device is left alone).
                    reserve_file(rc.path, "SSD tier" if rc.tier == "ssd" else "region")
                except CxlkvError as exc:
                    region.close()
                    raise StartupError(f"segment {rc.segment}: {exc.message}") from None
                try:
                    identity = read_identity(region)
                except CxlkvError as exc:
                    region.close()
                    raise StartupError(f"region {rc.path} (segment {rc.segment}): {exc.message}") from None
                if identity.segment_name != rc.segment:
                    region.close()
                    raise StartupError(
                        f"region {rc.path} is formatted as segment {identity.segment_name!r}, "
                        f"but the config maps it as segment {rc.segment!r} (wrong file?)"
                    )
                mapped.append(MappedRegion(rc.segment, rc.path, region, identity,
                                           watch_fd=_watch_fd(rc.path)))
                if prefault:
                    try:
                        region.prefault()
                    except CxlkvError as exc:
                        raise StartupError(f"region {rc.path}: prefault failed: {exc.message}") from None
                log.info(
                    "mapped region %s as segment %s (%d bytes, uuid %s%s)",
                    rc.path, rc.segment, region.size_bytes, identity.region_uuid,
                    ", prefaulted" if prefault else "",
                )
        except BaseException:
            for m in mapped:
                m.region.close()
            raise
        return cls(mapped)

    def identities(self) -> list[master_pb2.RegionIdentity]:
        """The RegionIdentity messages RegisterClient carries."""
        return [
            master_pb2.RegionIdentity(
                segment_name=m.segment,
                region_uuid=str(m.identity.region_uuid),
                size_bytes=m.size_bytes,
                device_path=m.path,
            )
            for m in self._by_name.values() if not m.local
        ]

    def file_ids(self) -> set[tuple[int, int]]:
        """``(st_dev, st_ino)`` of every region and tier file this daemon maps or
        writes (the shared-buffer registry refuses them as buffers)."""
        ids: set[tuple[int, int]] = set()
        for m in self._by_name.values():
            try:
                st = os.stat(m.path)
            except OSError:
                continue  # unlinked (the DRAM tier): nobody can name it
            ids.add((st.st_dev, st.st_ino))
        return ids

    def add_local(self, m: MappedRegion) -> None:
        """Add this daemon's DRAM tier (bound once the master has mounted it)."""
        self._by_name[m.segment] = m

    def local(self) -> MappedRegion | None:
        """This daemon's DRAM tier, if any."""
        return next((m for m in self._by_name.values() if m.local), None)

    def bind(self, segments: Iterable[common_pb2.SegmentInfo]) -> list[str]:
        """Bind the master's segment ids to the mapped regions.

        Args:
            segments: every segment the master reports.

        Returns:
            Problems that make a region unusable (uuid or size differing from the
            master's segment of the same name); empty when all is well. Segments
            the master has and this host does not map are simply not readable here.
        """
        problems: list[str] = []
        by_id: dict[int, MappedRegion] = {}
        for seg in segments:
            m = self._by_name.get(seg.name)
            if m is None:
                continue
            if seg.region_uuid and seg.region_uuid != str(m.identity.region_uuid):
                problems.append(
                    f"region {m.path} has uuid {m.identity.region_uuid} but the master's segment "
                    f"{seg.name} has uuid {seg.region_uuid} (wrong device or re-formatted)"
                )
                continue
            if seg.size_bytes and seg.size_bytes != m.size_bytes:
                problems.append(
                    f"region {m.path} is {m.size_bytes} bytes but the master's segment "
                    f"{seg.name} is {seg.size_bytes} bytes"
                )
                continue
            m.segment_id = seg.segment_id
            m.info = seg
            by_id[seg.segment_id] = m
        self._by_id = by_id
        return problems

    def by_segment_id(self, segment_id: int) -> MappedRegion | None:
        """The mapped region of a master segment id, or ``None`` if not mapped here."""
        return self._by_id.get(segment_id)

    def __iter__(self):
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)

    def check_files(self) -> list[str]:
        """Retire every mapped region whose file shrank under its mapping.

        A file shorter than its mapping (``fstat`` of :attr:`MappedRegion.watch_fd`)
        or a mapping in which the SIGBUS guard absorbed a fault
        (:attr:`cxlkv.transport.Region.guard_hits`) is unusable: the mapping is
        replaced by zero memory (``Region.retire``, safe while copies run) and the
        region by a :class:`BrokenRegion`, so that every later call on its segment
        is answered with a ``RegionError``. Cheap (one ``fstat`` per region); called
        periodically and after a copy that met a fault.

        Returns:
            One line per region found broken by this call (for the log).
        """
        found: list[str] = []
        for m in list(self._by_name.values()):
            if m.broken or m.local:
                continue
            size = m.size_bytes
            now_bytes = size
            if m.watch_fd >= 0:
                try:
                    now_bytes = os.fstat(m.watch_fd).st_size
                except OSError:
                    pass
            hits = getattr(m.region, "guard_hits", 0)  # the SSD tier (pread/pwrite) has no mapping
            if now_bytes >= size and not hits:
                continue
            why = (f"region {m.path} (segment {m.segment}) shrank to {now_bytes} bytes under this daemon, which "
                   f"maps {size} bytes: the segment is unusable here (restore or re-create the region and "
                   f"restart clientd)")
            old = m.region
            m.broken = why
            m.region = BrokenRegion(why, m.path, size)  # type: ignore[assignment]
            try:
                old.retire()
            except CxlkvError as exc:  # keep the zero memory the guard put in place
                log.error("retiring region %s failed: %s", m.path, exc.message)
            found.append(why)
        return found

    def close(self) -> None:
        """Unmap every region (shutdown; no copy may still be running)."""
        for m in self._by_name.values():
            m.region.close()
            if m.watch_fd >= 0:
                os.close(m.watch_fd)
                m.watch_fd = -1


def _watch_fd(path: str) -> int:
    """A read-only descriptor of the regular file ``path`` (-1 for a device or on error)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return -1
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return -1
    return fd
