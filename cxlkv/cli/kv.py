"""Key-value commands of the ``cxlkv`` CLI: put, get, exists, rm, ls, stat.

They talk to the local clientd through the SDK (lean framing), on the socket
given by ``--socket`` or ``$CXLKV_SOCKET`` (else the daemon's default path).

Exit status: 0 on success; ``exists`` exits 1 when the key is absent; 2 for a
usage error; a cxlkv error exits ``10 + its ErrorCode`` (e.g. 11 NOT_FOUND,
12 ALREADY_EXISTS, 13 NO_SPACE, 17 INVALID_KEY, 22 UNAVAILABLE) after printing
one line ``error: CODE: message`` on stderr — never a traceback.
"""

from __future__ import annotations

import functools
import json
import mmap
import os
import sys
from typing import Any, Callable

import click

from cxlkv.wire.keys import MAX_REPLICA_NUM
from cxlkv.wire.protodict import message_dict

__all__ = ["put_cmd", "get_cmd", "exists_cmd", "rm_cmd", "ls_cmd", "stat_cmd", "EXIT_ERROR_BASE", "exit_code_for"]

#: A cxlkv error exits with ``EXIT_ERROR_BASE + ErrorCode``.
EXIT_ERROR_BASE = 10


def exit_code_for(err: Any) -> int:
    """The exit status of a failed command: ``10 + ErrorCode`` (NOT_FOUND → 11, …)."""
    return EXIT_ERROR_BASE + int(err.code)


_socket_option = click.option(
    "--socket", "socket_path", envvar="CXLKV_SOCKET", default=None, metavar="PATH",
    help="clientd's gRPC socket (its lean socket is PATH.lean). Default: $CXLKV_SOCKET, "
         "else <runtime dir>/clientd.sock.")


def _check_utf8(kwargs: dict[str, Any]) -> None:
    """Keys (and a prefix) from argv that are not UTF-8 fail as INVALID_KEY, not a traceback."""
    from cxlkv.errors import InvalidKey

    for name, what in (("key", "key"), ("keys", "key"), ("prefix", "prefix")):
        value = kwargs.get(name)
        for text in (value,) if isinstance(value, str) else (value or ()):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise InvalidKey(f"{what} is not valid UTF-8 (bad byte at character {exc.start})") from None


def _kv_command(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Open a Client for the command; turn cxlkv errors into one line and an exit code."""

    @functools.wraps(fn)
    def wrapper(socket_path: str | None, **kwargs: Any) -> None:
        from cxlkv.client import Client
        from cxlkv.errors import CxlkvError

        try:
            _check_utf8(kwargs)
            with Client(socket_path) as client:
                fn(client, **kwargs)
        except CxlkvError as err:
            click.echo(f"error: {err.code.name}: {err.message}", err=True)
            sys.exit(exit_code_for(err))
        except BrokenPipeError:  # `cxlkv get k | head`
            sys.exit(0)
        except OSError as exc:  # stdout on a full disk, an unreadable input file, …
            where = f"{exc.filename}: " if exc.filename else ""
            click.echo(f"error: I/O error: {where}{exc.strerror or exc}", err=True)
            sys.exit(1)

    return _socket_option(wrapper)


def _put_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    for opt in reversed([
        click.option("--upsert", is_flag=True, help="Replace a committed key (new version)."),
        click.option("--replicas", "replica_num", type=click.IntRange(1, MAX_REPLICA_NUM), default=1, show_default=True,
                     help="Replicas on distinct segments (best effort)."),
        click.option("--soft-pin", is_flag=True, help="Evict last (the pin expires)."),
        click.option("--hard-pin", is_flag=True, help="Never evict."),
        click.option("--json", "as_json", is_flag=True, help="Print a JSON object."),
    ]):
        fn = opt(fn)
    return fn


@click.command("put")
@click.argument("key")
@click.argument("source", metavar="FILE|-")
@_put_options
@_kv_command
def put_cmd(client: Any, key: str, source: str, upsert: bool, replica_num: int, soft_pin: bool,
            hard_pin: bool, as_json: bool) -> None:
    """Store the bytes of FILE (or of standard input with -) under KEY."""
    opts = dict(upsert=upsert, replica_num=replica_num, soft_pin=soft_pin, hard_pin=hard_pin)
    if source == "-":
        data: Any = sys.stdin.buffer.read()
        size = len(data)
        version = client.put(key, data, **opts)
    else:
        try:
            f = open(source, "rb")
        except OSError as exc:
            raise click.BadParameter(f"{source}: {exc.strerror}", param_hint="FILE") from None
        with f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                version = client.put(key, b"", **opts)
            else:
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                try:
                    version = client.put_from(key, mm, **opts)
                finally:
                    try:
                        mm.close()
                    except BufferError:  # a failed put's traceback still views the map; it goes with it
                        pass
    placed = _replicas_placed(client, key, version) if replica_num > 1 else 1
    if as_json:
        rec: dict[str, Any] = {"key": key, "version": version, "size_bytes": size}
        if replica_num > 1:
            rec.update(replicas_wanted=replica_num, replicas_placed=placed)
        click.echo(json.dumps(rec))
    else:
        click.echo(f"{key}: version {version}, {size} bytes")
        if placed is not None and placed < replica_num:
            click.echo(f"{key}: {placed} of {replica_num} replicas placed (best effort: only {placed} "
                       f"segment(s) had room or exist)", err=True)


def _replicas_placed(client: Any, key: str, version: int) -> int | None:
    """Replicas the committed ``version`` of ``key`` has (``None`` if it cannot be told:
    replaced or removed meanwhile)."""
    for e in client.list(key, page_size=1):
        return e.replica_count if e.key == key and e.version == version else None
    return None


@click.command("get")
@click.argument("key")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write the value to this file (default: standard output).")
@_kv_command
def get_cmd(client: Any, key: str, output: str | None) -> None:
    """Write the value of KEY to standard output or to a file."""
    value = client.get(key)
    if output is None or output == "-":
        sys.stdout.buffer.write(value)
        sys.stdout.buffer.flush()
    else:
        try:
            with open(output, "wb") as f:
                f.write(value)
        except OSError as exc:
            raise click.BadParameter(f"{output}: {exc.strerror or exc}", param_hint="'-o' / '--output'") from None


@click.command("exists")
@click.argument("key")
@_kv_command
def exists_cmd(client: Any, key: str) -> None:
    """Print true or false; exit 0 if KEY is committed, 1 if not."""
    found = client.exists(key)
    click.echo("true" if found else "false")
    if not found:
        sys.exit(1)


@click.command("rm")
@click.argument("keys", nargs=-1, required=True, metavar="KEY...")
@click.option("--force", is_flag=True, help="Remove even while readers hold a lease.")
@_kv_command
def rm_cmd(client: Any, keys: tuple[str, ...], force: bool) -> None:
    """Remove KEY(s). With several keys, each failure is printed and the first one sets the exit status."""
    if len(keys) == 1:
        client.remove(keys[0], force=force)
        return
    first = None
    for key, res in zip(keys, client.remove_many(list(keys), force=force)):
        if not res.ok:
            click.echo(f"error: {res.error.code.name}: {res.error.message}", err=True)
            first = first or res.error
    if first is not None:
        sys.exit(exit_code_for(first))


@click.command("ls")
@click.option("--prefix", default="", help="Only keys starting with this.")
@click.option("--limit", type=click.IntRange(min=0), default=0, help="Show at most this many keys (0: all).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per line.")
@_kv_command
def ls_cmd(client: Any, prefix: str, limit: int, as_json: bool) -> None:
    """List committed keys in key order: size, version, replicas."""
    from tabulate import tabulate

    rows = []
    for i, e in enumerate(client.list(prefix)):
        if limit and i >= limit:
            break
        if as_json:
            click.echo(json.dumps({"key": e.key, "size_bytes": e.size_bytes, "version": e.version,
                                   "replica_count": e.replica_count}, ensure_ascii=False))
        else:
            rows.append((e.key, e.size_bytes, e.version, e.replica_count))
    if not as_json:
        click.echo(tabulate(rows, headers=["key", "size_bytes", "version", "replicas"]))


def _with_ints(st: dict[str, Any]) -> dict[str, Any]:
    """``Client.stat()``'s dict with its 64-bit integers as ints, not strings."""
    from google.protobuf.json_format import ParseDict

    from cxlkv.v1 import client_pb2

    try:
        return message_dict(ParseDict(st, client_pb2.ClientStatResponse(), ignore_unknown_fields=True))
    except Exception:  # an SDK that already answers ints (or another shape): as given
        return st


@click.command("stat")
@click.option("--json", "as_json", is_flag=True, help="Print the full state as JSON.")
@_kv_command
def stat_cmd(client: Any, as_json: bool) -> None:
    """Show the local clientd: identity, master connection, space, segments, buffers.

    Keys and space come from the master: "unknown" (null in --json) while it is not reachable."""
    from tabulate import tabulate

    from cxlkv.config import format_size

    from cxlkv.cli.status import held_note

    st = _with_ints(client.stat())
    known = bool(st.get("master_connected"))
    if not known:  # keys and space come from the master: unknown, not 0
        for field in ("key_count", "capacity_bytes", "used_bytes"):
            st[field] = None
    if as_json:
        click.echo(json.dumps(st, indent=2, sort_keys=True))
        return
    cap = int(st.get("capacity_bytes") or 0)
    used = int(st.get("used_bytes") or 0)
    segs = st.get("segments", [])
    space_note = ""
    if any(s.get("tier") == "DRAM" for s in segs):  # DRAM tiers hold extra copies only: not space
        homes = [s for s in segs if s.get("mounted") and s.get("tier") != "DRAM"]
        cap = sum(int(s.get("capacity_bytes", 0)) for s in homes)
        used = sum(int(s.get("used_bytes", 0)) for s in homes)
        space_note = " (CXL + SSD; DRAM tiers hold extra copies only)"
    summary = [
        ("name", st.get("name", "")),
        ("hostname", st.get("hostname", "")),
        ("client id", f"{st.get('client_id', '')} (epoch {st.get('epoch', 0)})"),
        ("master", f"{st.get('master_address', '')} ({'connected' if st.get('master_connected') else 'NOT connected'})"),
        ("keys", st.get("key_count", 0) if known else "unknown (the master is not reachable)"),
        ("space", (f"{format_size(used)} used of {format_size(cap)}" + (f" ({used / cap:.1%})" if cap else "")
                   + space_note + held_note(st)) if known else "unknown (the master is not reachable)"),
        ("shared buffers", f"{st.get('buffers_registered', 0)} ({format_size(int(st.get('buffer_bytes', 0)))})"),
        ("version", st.get("version", "")),
        ("uptime", f"{float(st.get('uptime_s', 0)):.0f} s"),
    ]
    click.echo(tabulate(summary, tablefmt="plain"))
    if segs:
        click.echo()
        click.echo(tabulate(
            [(s.get("name"), s.get("segment_id", 0), s.get("tier"),
              format_size(int(s.get("used_bytes", 0))) if known else "?",
              format_size(int(s.get("capacity_bytes", 0))), s.get("object_count", 0) if known else "?",
              s.get("mounted"))
             for s in segs],
            headers=["segment", "id", "tier", "used", "capacity", "objects", "mounted"]))
