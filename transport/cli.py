"""``cxlkv region``: format and inspect regions (DAX devices or emulation files).

Errors are printed as one line (``Error: ...``) with exit status 1, never a
stack trace.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone

import click

from cxlkv.cli.sizes import Size
from cxlkv.config import format_size
from cxlkv.errors import CxlkvError
from cxlkv.layout.region import REGION_HEADER_BYTES, RegionIdentity, format_region, read_identity
from cxlkv.transport import Region

__all__ = ["region_group"]


@contextmanager
def _cli_errors() -> Iterator[None]:
    try:
        yield
    except CxlkvError as e:
        raise click.ClickException(str(e)) from None


def _print_identity(path: str, identity: RegionIdentity, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"path": path, **identity.to_dict()}, indent=2))
        return
    created = datetime.fromtimestamp(identity.created_s, tz=timezone.utc).isoformat(timespec="seconds")
    rows = [
        ("path", path),
        ("segment", identity.segment_name),
        ("uuid", str(identity.region_uuid)),
        ("size", f"{identity.size_bytes} bytes ({format_size(identity.size_bytes)})"),
        ("usable", f"{identity.size_bytes - REGION_HEADER_BYTES} bytes after the {REGION_HEADER_BYTES}-byte header"),
        ("created", created),
        ("format", str(identity.format_version)),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        click.echo(f"{key:<{width}}  {value}")


@click.group("region")
def region_group() -> None:
    """Format and inspect CXL regions (/dev/daxX.Y or an emulation file)."""


def _refuse_if_owned(region: Region, path: str) -> None:
    """Refuse to format a region whose owner lease a master renewed within its TTL.

    Re-formatting a region in use zeroes the index and the owner record under the
    running master (which then stops, "taken over") and its clientds: every object
    is dropped. ``--force`` is for a formatted region nobody runs on; a master that
    stopped cleanly released its lease, one that was killed holds it for at most
    ``owner_lease_ttl_s``."""
    import time

    from cxlkv.errors import RegionError
    from cxlkv.layout.index import read_owner

    try:
        geometry = read_identity(region).index
        cur = read_owner(region, geometry) if geometry is not None else None
    except CxlkvError:
        return  # not formatted, or a corrupt header: nothing can be running on it
    if cur is None or cur.heartbeat_s <= 0:
        return
    age = time.time() - cur.heartbeat_s
    if age < cur.ttl_s:
        raise RegionError(
            f"region {path} is in use: master {cur.owner_id.hex[:12]} (epoch {cur.epoch}) renewed its "
            f"owner lease {max(age, 0.0):.1f} s ago (it lapses {cur.ttl_s:g} s after the last renewal); stop "
            "that master and the clientds mapping the region first (re-formatting a region in use stops its "
            "master and drops every object)", path=path)


@region_group.command("format")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--segment", "segment_name", required=True, help="Segment name (1-64 UTF-8 bytes).")
@click.option(
    "--size",
    type=Size(min_bytes=REGION_HEADER_BYTES + 1),
    help="Region size, e.g. 64MiB (GB is decimal: 10^9). Must match an existing file; required with --create.",
)
@click.option("--create", is_flag=True, help="Create and size the emulation file if missing.")
@click.option("--force", is_flag=True, help="Re-format a region that already holds a header.")
@click.option("--expected-objects", type=click.IntRange(min=1), default=None,
              help="Objects to size the committed-object index for (default: one per 16 KiB of region; "
                   "the index costs 128 bytes of region per expected object, up to 256 as its table is "
                   "rounded up to a power of two of buckets: docs/index.md).")
@click.option("--no-index", is_flag=True, help="Lay out no index (reads go through the leased RPC path).")
@click.option("--json", "as_json", is_flag=True, help="Print the new identity as JSON.")
def format_cmd(
    path: str, segment_name: str, size: int | None, create: bool, force: bool, as_json: bool,
    expected_objects: int | None = None, no_index: bool = False,
) -> None:
    """Write a new identity header (uuid, size, segment name) at the start of PATH.

    An emulation file is allocated in full in its filesystem first (a sparse
    one larger than its filesystem is refused in one line)."""
    from cxlkv.transport.space import reserve_file

    if create and size is None:
        raise click.UsageError("--create needs --size (e.g. --size 64MiB)")
    made = create and not os.path.exists(path)
    try:
        with _cli_errors(), Region.open(path, size=size, create=create) as region:
            _refuse_if_owned(region, path)
            reserve_file(path)
            identity = format_region(region, segment_name, force=force, expected_objects=expected_objects,
                                     index=not no_index)
    except BaseException:
        if made:  # a refused format leaves no file it created (an unformatted region nobody asked for)
            with contextlib.suppress(OSError):
                os.unlink(path)
        raise
    if not as_json:
        click.echo(f"formatted {path}")
    _print_identity(path, identity, as_json)


@region_group.command("info")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the identity as JSON.")
def info_cmd(path: str, as_json: bool) -> None:
    """Print the identity header of PATH."""
    with _cli_errors(), Region.open(path) as region:
        identity = read_identity(region)
    _print_identity(path, identity, as_json)


@region_group.command("scan")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--all", "show_all", is_flag=True,
              help="List every valid header found, stale ones (removed or replaced objects) included.")
@click.option("--json", "as_json", is_flag=True, help="Print the objects as a JSON list.")
def scan_cmd(path: str, show_all: bool, as_json: bool) -> None:
    """List the objects in PATH from their headers alone (no master needed).

    Without --all, lists per key the newest version whose bytes no newer object
    overwrote: offset, key hash, version, value length and key.
    """
    from cxlkv.transport.scan import live_objects, scan_region

    with _cli_errors(), Region.open(path) as region:
        read_identity(region)  # a file that is not a region says so (not "0 object(s)")
        found = scan_region(region)
    objs = found if show_all else live_objects(found)
    if as_json:
        click.echo(json.dumps([o.to_dict() for o in objs], indent=2))
        return
    click.echo(f"{'offset':>14}  {'key_hash':>16}  {'version':>18}  {'length':>12}  key")
    for o in objs:
        click.echo(f"{o.offset_bytes:>14}  {o.key_hash:016x}  {o.version:>18}  {o.value_len_bytes:>12}  {o.key}")
    click.echo(f"{len(objs)} object(s)", err=True)


@region_group.command("verify")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def verify_cmd(path: str, as_json: bool) -> None:
    """Check every live object's value checksum in PATH; exit 1 if any is corrupt.

    An object is corrupt when its header is the newest for its key and not
    overwritten by a newer object, but its value bytes do not match the checksum
    the writer recorded.
    """
    from cxlkv.transport.scan import live_objects, scan_region

    with _cli_errors(), Region.open(path) as region:
        read_identity(region)  # a file that is not a region says so (not "0 object(s) checked")
        found = scan_region(region, verify_values=True)
    # Judge by headers alone, then report the chosen ones whose value is bad.
    unchecked = [dataclasses.replace(o, checksum_ok=None) for o in found]
    ok_by_offset = {o.offset_bytes: o.checksum_ok for o in found}
    live = live_objects(unchecked)
    corrupt = [o for o in live if not ok_by_offset[o.offset_bytes]]
    if as_json:
        click.echo(json.dumps({"path": path, "objects": len(live),
                               "corrupt": [o.to_dict() for o in corrupt]}, indent=2))
    else:
        for o in corrupt:
            click.echo(f"CORRUPT offset {o.offset_bytes} key {o.key!r} version {o.version} "
                       f"({o.value_len_bytes} bytes): value does not match its checksum")
        click.echo(f"{len(live)} object(s) checked, {len(corrupt)} corrupt")
    if corrupt:
        sys.exit(1)
