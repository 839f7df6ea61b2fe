"""``cxlkv status``: the cluster at a glance.

Sources, in order:

1. the master's ``Stat`` — from ``--master HOST:PORT``, or from the address the
   local clientd (``--socket``, ``$CXLKV_SOCKET``, else its default socket)
   reports: segments and tiers with usage, keys, clients alive and expired,
   eviction and reclaim counters, how full the region's index is (and how many
   objects overflowed it), each daemon's ``metrics_url``;
2. the local clientd's ``Stat`` when a socket is used (its identity, master
   connection and counters);
3. each alive clientd's ``/metrics`` (``metrics_url``, 2 s timeout each): the
   prefix hit rate, summed over every clientd that answered. A clientd without
   metrics, or one that cannot be reached from here, is listed as such; the local
   clientd's own counters stand in for its scrape.

Counters are totals since each daemon started; ``--window S`` samples twice,
``S`` seconds apart, and also reports rates over that window (recent
evictions, puts, hit rate).

Exit status: 0 when the master answered; ``10 + ErrorCode`` (22 UNAVAILABLE)
with one line on stderr when the master cannot be reached — after printing what
the local clientd said, if it answered — or when neither can.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from typing import Any, Sequence

import click

from cxlkv.cli.admin import tls_options

from cxlkv.config import format_size

__all__ = ["status_cmd", "collect_status", "usage_bar", "index_summary", "index_line"]

#: Seconds to wait for a daemon's /metrics.
SCRAPE_TIMEOUT_S = 2.0
#: Seconds to wait for the master's Stat.
MASTER_TIMEOUT_S = 5.0
_BAR_WIDTH = 24


def usage_bar(used: int, capacity: int, width: int = _BAR_WIDTH) -> str:
    """``[#########...............]  37.5%`` (``[ n/a ]`` for an empty capacity)."""
    if capacity <= 0:
        return "[" + " n/a ".center(width) + "]"
    ratio = min(max(used / capacity, 0.0), 1.0)
    filled = int(round(ratio * width))
    return f"[{'#' * filled}{'.' * (width - filled)}] {ratio:6.1%}"


def index_summary(info: dict[str, int] | None) -> dict[str, Any] | None:
    """The ``index`` entry of ``cxlkv status --json`` from the master's ``Stat.index``
    (``None``: the master publishes no index).

    Returns:
        ``info``'s counts (``slots``, ``object_slots``, ``grant_slots``, ``key_limit``,
        ``overflow_objects``) plus ``used_slots``, ``usage_ratio`` (used / slots) and
        ``hint``: what an overflow costs and how to size the index ("" without one).
    """
    if info is None:
        return None
    used = info["object_slots"] + info["grant_slots"]
    over = info["overflow_objects"]
    hint = ""
    if over:
        hint = (f"{over:,} objects overflowed: their reads and every miss take the RPC path (size it: cxlkv "
                f"region format --expected-objects N, N >= {info['object_slots'] + over:,})")
    return {**info, "used_slots": used, "usage_ratio": used / info["slots"] if info["slots"] else 0.0,
            "hint": hint}


def index_line(ix: dict[str, Any]) -> str:
    """The ``index`` row of ``cxlkv status``: bar, slots, objects and grants, and the
    overflow with its consequence and fix (``ix``: :func:`index_summary`'s dict)::

        [##########..............]  41.2%  of 8,192 slots (3,300 objects, 75 grants)
    """
    line = (f"{usage_bar(ix['used_slots'], ix['slots'])}  of {ix['slots']:,} slots "
            f"({ix['object_slots']:,} objects, at most {ix['key_limit']:,}; {ix['grant_slots']:,} grants)")
    return line + (f"; {ix['hint']}" if ix["hint"] else "")


def _tier_name(tier: int) -> str:
    from cxlkv.v1 import common_pb2

    try:
        return common_pb2.Tier.Name(tier).lower()
    except ValueError:
        return str(tier)


def _master_stat(address: str, tls: Any = None) -> dict[str, Any]:
    """The master's Stat as a plain dict (over mutual TLS with ``tls``, a
    :class:`cxlkv.wire.tls.TlsFiles`; only an admin certificate gets the client table).

    Raises:
        CxlkvError: the master cannot be reached (Unavailable) or refused.
    """
    import grpc

    from cxlkv.errors import from_rpc_error
    from cxlkv.v1 import master_pb2, master_pb2_grpc

    from cxlkv.cli.admin import master_channel

    with master_channel(address, tls) as channel:
        try:
            st = master_pb2_grpc.MasterServiceStub(channel).Stat(master_pb2.StatRequest(), timeout=MASTER_TIMEOUT_S)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, target=f"master {address}") from None
    segments = [{
        "name": s.name, "segment_id": s.segment_id, "tier": _tier_name(s.tier), "mounted": s.mounted,
        "capacity_bytes": s.capacity_bytes, "used_bytes": s.used_bytes, "size_bytes": s.size_bytes,
        "object_count": s.object_count, "device_path": s.device_path, "region_uuid": s.region_uuid,
        "usage_ratio": s.used_bytes / s.capacity_bytes if s.capacity_bytes else 0.0,
    } for s in st.segments]
    clients = [{
        "client_id": c.client_id, "hostname": c.hostname, "name": c.name, "epoch": c.epoch,
        "alive": c.alive, "last_heartbeat_age_s": c.last_heartbeat_age_s, "metrics_url": c.metrics_url,
    } for c in st.clients]
    return {
        "address": address, "master_id": st.master_id, "version": st.version, "uptime_s": st.uptime_s,
        "metrics_url": st.metrics_url, "allocation_strategy": st.allocation_strategy,
        "eviction_policy": st.eviction_policy, "high_watermark": st.high_watermark,
        "low_watermark": st.low_watermark, "key_count": st.key_count,
        "processing_count": st.processing_count, "lease_count": st.lease_count,
        "fenced_count": st.fenced_count,
        "capacity_bytes": st.capacity_bytes, "used_bytes": st.used_bytes,
        "reserved_bytes": st.reserved_bytes, "reserved_count": st.reserved_count,
        "quarantined_bytes": st.quarantined_bytes, "quarantined_count": st.quarantined_count,
        "counters": dict(st.counters), "segments": segments, "clients": clients,
        "index": ({"slots": st.index.slots, "object_slots": st.index.object_slots,
                   "grant_slots": st.index.grant_slots, "key_limit": st.index.key_limit,
                   "overflow_objects": st.index.overflow_objects} if st.HasField("index") else None),
    }


def _why_unreachable(message: str) -> str:
    """A short reason from a gRPC failure's message, without the address (the
    warning names it once) or gRPC's resolver details."""
    low = message.lower()
    if "deadline" in low:
        return f"no answer within {MASTER_TIMEOUT_S:g} s"
    if "connection refused" in low:
        return "connection refused: nothing listens there"
    if "no route" in low or "unreachable" in low:
        return "no route to the host"
    if "name resolution" in low or "dns" in low:
        return "its host name does not resolve"
    if "handshake" in low or "ssl" in low or "certificate" in low:
        return "TLS handshake failed (check --tls-ca/--tls-cert/--tls-key)"
    if "socket closed" in low:
        return ("the master closed the connection at once: it serves TLS and this call did not "
                "(pass --tls-ca/--tls-cert/--tls-key, or tls_*_file in the configuration)")
    return message.split(":", 1)[-1].strip() if message.startswith("master ") else message


def _scrape_prefix(url: str, tls: Any = None) -> dict[str, Any]:
    """Prefix hit/miss and copied-byte counters from one clientd's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    context = None
    if url.startswith("https://") and tls is not None and tls.enabled:
        from cxlkv.wire.tls import client_context

        context = client_context(tls)  # TLS metrics want a client certificate of the cluster's CA
    with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S, context=context) as resp:
        text = resp.read().decode()
    out = {"hits": 0.0, "misses": 0.0, "bytes_in": 0.0, "bytes_out": 0.0}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "cxlkv_clientd_prefix_blocks_total":
                out["hits" if s.labels.get("result") == "hit" else "misses"] += s.value
            elif s.name == "cxlkv_clientd_copied_bytes_total":
                out["bytes_in" if s.labels.get("direction") == "in" else "bytes_out"] += s.value
    return out


def _local_prefix(local: dict[str, Any]) -> dict[str, Any]:
    c = local.get("counters", {})
    hits = float(c.get("prefix_hits", 0))
    return {"hits": hits, "misses": max(0.0, float(c.get("prefix_keys", 0)) - hits),
            "bytes_in": float(c.get("bytes_in", 0)), "bytes_out": float(c.get("bytes_out", 0))}


def _hit_sources(master: dict[str, Any] | None, local: dict[str, Any] | None,
                 tls: Any = None) -> dict[str, dict[str, Any]]:
    """client id → prefix counters, from scrapes (or the local clientd's Stat)."""
    out: dict[str, dict[str, Any]] = {}
    local_id = (local or {}).get("client_id", "")
    for c in (master or {}).get("clients", []):
        if not c["alive"]:
            continue
        if c["metrics_url"]:
            try:
                out[c["client_id"]] = {"source": "metrics", **_scrape_prefix(c["metrics_url"], tls)}
                continue
            except (OSError, ValueError, urllib.error.URLError) as exc:
                out[c["client_id"]] = {"source": "unreachable", "error": str(getattr(exc, "reason", exc))}
        if c["client_id"] == local_id and local is not None:
            out[local_id] = {"source": "clientd stat", **_local_prefix(local)}
        elif c["client_id"] not in out:
            out[c["client_id"]] = {"source": "no metrics"}
    if local is not None and local_id not in out:
        out[local_id or "local"] = {"source": "clientd stat", **_local_prefix(local)}
    return out


def _hit_rate(sources: dict[str, dict[str, Any]]) -> dict[str, Any]:
    counted = [s for s in sources.values() if "hits" in s]
    hits = sum(s["hits"] for s in counted)
    total = hits + sum(s["misses"] for s in counted)
    return {"prefix_blocks_hit": int(hits), "prefix_blocks": int(total),
            "ratio": hits / total if total else None,
            "clientds_reporting": len(counted), "clientds_alive": len(sources)}


def collect_status(master_address: str | None, socket_path: str | None, window_s: float = 0.0,
                   tls: Any = None, etcd: Sequence[str] = (), etcd_prefix: str = "/cxlkv/default") -> dict[str, Any]:
    """Everything ``cxlkv status`` shows, as one JSON-ready dict.

    Args:
        master_address: ``HOST:PORT`` of the master, or ``None`` to ask the clientd.
        socket_path: the local clientd's socket (``None``: ``$CXLKV_SOCKET`` or the
            default) — used when ``master_address`` is ``None``.
        window_s: when > 0, sample again after this many seconds and add rates.
        tls: :class:`cxlkv.wire.tls.TlsFiles` presented to the master (``None``: plaintext).
        etcd: etcd endpoints of a cluster with several masters: the leader, the
            standbys and the epoch are read there (``"ha"``), and the leader is
            the master asked when ``master_address`` is ``None``.
        etcd_prefix: the masters' ``etcd_prefix``.

    Raises:
        CxlkvError: neither the master nor the clientd can be reached.
    """
    from cxlkv.errors import CxlkvError

    local: dict[str, Any] | None = None
    errors: list[str] = []
    ha: dict[str, Any] | None = None
    if etcd:
        from cxlkv.cli.hastatus import read_masters

        try:
            ha = read_masters(etcd, etcd_prefix, tls=tls)
        except CxlkvError as exc:
            errors.append(f"etcd {','.join(etcd)}: {exc.message}")
        if master_address is None and ha is not None and ha.get("leader"):
            master_address = ha["leader"]["address"]
    if master_address is None:
        from cxlkv.client import Client

        with Client(socket_path) as client:
            local = client.stat()
        master_address = local.get("master_address") or None

    def master_or_none() -> dict[str, Any] | None:
        if master_address is None:
            return None
        try:
            return _master_stat(master_address, tls)
        except CxlkvError as exc:
            if local is None:
                raise
            errors.append(f"master {master_address} unreachable ({_why_unreachable(exc.message)}); "
                          "its keys, space and clients are unknown")
            return None

    master = master_or_none()
    sources = _hit_sources(master, local, tls)
    out: dict[str, Any] = {"master": master, "clientd": local, "hit_rate": _hit_rate(sources),
                           "hit_sources": sources, "errors": errors, "ha": ha}
    if master is not None:
        tiers: dict[str, dict[str, int]] = {}
        for s in master["segments"]:
            if s["mounted"]:
                t = tiers.setdefault(s["tier"], {"capacity_bytes": 0, "used_bytes": 0, "segments": 0})
                t["capacity_bytes"] += s["capacity_bytes"]
                t["used_bytes"] += s["used_bytes"]
                t["segments"] += 1
        out["tiers"] = tiers
        # What the store can hold: CXL + SSD. A DRAM tier only caches extra copies of
        # objects that live in CXL or on SSD, so it adds no capacity.
        homes = [v for t, v in tiers.items() if t != "dram"]
        out["space"] = {"capacity_bytes": sum(v["capacity_bytes"] for v in homes),
                        "used_bytes": sum(v["used_bytes"] for v in homes),
                        # of used_bytes: held ahead of need by clientds, and held for
                        # writers of ended registrations (docs/master.md); no object's
                        "reserved_bytes": master["reserved_bytes"],
                        "quarantined_bytes": master["quarantined_bytes"],
                        "excludes": "dram (extra copies only)"}
        c = master["counters"]
        out["evictions"] = {"evictions": c.get("evictions", 0), "evicted_bytes": c.get("evicted_bytes", 0),
                            "puts_reclaimed": c.get("puts_reclaimed", 0), "lease_expiries": c.get("lease_expiries", 0),
                            "no_space": c.get("no_space", 0),
                            # refused NOT_READY: the index had no slot to record a put's grant
                            "no_index_slot": c.get("grants_unrecorded", 0), "since": "master start"}
        # the region's index: slots in use, objects that overflowed it (null: no index)
        out["index"] = index_summary(master["index"])
        out["clients_alive"] = sum(1 for cl in master["clients"] if cl["alive"])
        out["clients_expired"] = sum(1 for cl in master["clients"] if not cl["alive"])
    if window_s > 0:
        time.sleep(window_s)
        master2 = master_or_none()
        later = _hit_rate(_hit_sources(master2, local, tls))
        rates: dict[str, Any] = {"window_s": window_s}
        if master is not None and master2 is not None:
            for name in ("evictions", "evicted_bytes", "puts_committed", "lease_grants", "get_misses",
                         "puts_reclaimed", "no_space"):
                rates[f"{name}_per_s"] = (master2["counters"].get(name, 0) - master["counters"].get(name, 0)) / window_s
        d_hit = later["prefix_blocks_hit"] - out["hit_rate"]["prefix_blocks_hit"]
        d_all = later["prefix_blocks"] - out["hit_rate"]["prefix_blocks"]
        rates["prefix_blocks_per_s"] = d_all / window_s
        rates["hit_rate"] = d_hit / d_all if d_all > 0 else None
        out["window"] = rates
    return out


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


_TIER_ORDER = {"dram": 0, "cxl": 1, "ssd": 2}


def held_note(space: dict[str, Any]) -> str:
    """What of the used space belongs to no object yet: reserved ahead of need, quarantined."""
    held = [f"{format_size(space[k])} {what}" for k, what in
            (("reserved_bytes", "reserved ahead of need"), ("quarantined_bytes", "quarantined"))
            if space.get(k)]
    return f"; of it {', '.join(held)}" if held else ""


def _space_rows(st: dict[str, Any]) -> list[tuple[str, str]]:
    """``space`` (what the store holds: CXL + SSD, never DRAM), then one row per tier."""
    sp, tiers = st["space"], st["tiers"]
    rows = [("space", f"{usage_bar(sp['used_bytes'], sp['capacity_bytes'])}  "
                      f"{format_size(sp['used_bytes'])} of {format_size(sp['capacity_bytes'])}"
                      + (f"  ({' + '.join(t for t in sorted(tiers, key=lambda t: _TIER_ORDER.get(t, 9)) if t != 'dram')})"
                         if len(tiers) > 1 else "")
                      + held_note(sp))]
    if len(tiers) > 1:
        for t in sorted(tiers, key=lambda t: _TIER_ORDER.get(t, 9)):
            v = tiers[t]
            note = f"{v['segments']} segment(s)"
            if t == "dram":
                note = f"{v['segments']} clientd(s), extra copies: not in space"
            rows.append((f"tier {t}", f"{usage_bar(v['used_bytes'], v['capacity_bytes'])}  "
                                   f"{format_size(v['used_bytes'])} of {format_size(v['capacity_bytes'])}  ({note})"))
    return rows


def _render(st: dict[str, Any]) -> str:
    from tabulate import tabulate

    lines: list[str] = []
    m = st["master"]
    local = st["clientd"]
    hr = st["hit_rate"]
    summary: list[tuple[str, str]] = []
    if st.get("ha") is not None:
        from cxlkv.cli.hastatus import render_masters

        summary += render_masters(st["ha"])
    if m is not None:
        summary += [
            ("master", f"{m['address']}  id {m['master_id']}  v{m['version']}  up {_age(m['uptime_s'])}"),
            ("policies", f"strategy {m['allocation_strategy']}, eviction {m['eviction_policy']}, "
                         f"watermarks {m['low_watermark']:.2f}/{m['high_watermark']:.2f}"),
            ("metrics", m["metrics_url"] or "(disabled: set metrics_address)"),
            ("keys", f"{m['key_count']}  ({m['processing_count']} puts in flight, {m['lease_count']} leases"
                     + (f", {m['fenced_count']} fenced" if m["fenced_count"] else "") + ")"),
            *_space_rows(st),
            ("index", index_line(st["index"]) if st.get("index") else "none (every read takes the leased RPC path)"),
            ("clients", f"{st['clients_alive']} alive, {st['clients_expired']} expired"),
        ]
        ev = st["evictions"]
        summary.append(("evictions", f"{ev['evictions']} ({format_size(ev['evicted_bytes'])}), "
                                     f"puts reclaimed {ev['puts_reclaimed']}, lease expiries {ev['lease_expiries']}, "
                                     f"no space {ev['no_space']}"
                                     + (f", no index slot {ev['no_index_slot']} (puts refused NOT_READY: "
                                        "more in flight than the index keeps slots for)"
                                        if ev.get("no_index_slot") else "")
                                     + " (since master start)"))
    if local is not None:
        summary.append(("clientd", f"{local.get('name', '')} on {local.get('hostname', '')}: client "
                                   f"{local.get('client_id', '') or '(unregistered)'}, master "
                                   f"{'connected' if local.get('master_connected') else 'NOT connected'}"))
    if hr["ratio"] is None:
        summary.append(("hit rate", f"n/a (no prefix queries yet; {hr['clientds_reporting']} of "
                                    f"{hr['clientds_alive']} clientd(s) reporting)"))
    else:
        summary.append(("hit rate", f"{hr['ratio']:.1%} ({hr['prefix_blocks_hit']} of {hr['prefix_blocks']} prefix "
                                    f"blocks; {hr['clientds_reporting']} of {hr['clientds_alive']} clientd(s) reporting)"))
    w = st.get("window")
    if w:
        recent = f"last {w['window_s']:g} s: "
        if "evictions_per_s" in w:
            recent += (f"{w['evictions_per_s']:.1f} evictions/s ({format_size(int(w['evicted_bytes_per_s']))}/s), "
                       f"{w['puts_committed_per_s']:.1f} puts/s, ")
        recent += "hit rate " + (f"{w['hit_rate']:.1%}" if w["hit_rate"] is not None else "n/a")
        summary.append(("recent", recent))
    for err in st["errors"]:
        summary.append(("warning", err))
    lines.append(tabulate(summary, tablefmt="plain"))
    if m is not None and m["segments"]:
        lines.append("")
        lines.append(tabulate(
            [(s["name"], s["tier"], usage_bar(s["used_bytes"], s["capacity_bytes"]) if s["mounted"] else "unmounted",
              format_size(s["used_bytes"]), format_size(s["capacity_bytes"]), s["object_count"])
             for s in m["segments"]],
            headers=["segment", "tier", "usage", "used", "capacity", "objects"]))
        if len(st["tiers"]) > 1:
            lines.append("")
            lines.append(tabulate(
                [(t, usage_bar(v["used_bytes"], v["capacity_bytes"]), format_size(v["used_bytes"]),
                  format_size(v["capacity_bytes"]), v["segments"]) for t, v in sorted(st["tiers"].items())],
                headers=["tier", "usage", "used", "capacity", "segments"]))
    if m is not None and m["clients"]:
        lines.append("")
        rows = []
        for c in m["clients"]:
            src = st["hit_sources"].get(c["client_id"], {})
            if "hits" in src:
                total = src["hits"] + src["misses"]
                hit = f"{src['hits'] / total:.1%}" if total else "n/a"
            else:
                hit = src.get("source", "-") if c["alive"] else "-"
            rows.append((c["name"], c["hostname"], c["client_id"], "alive" if c["alive"] else "expired",
                         f"{_age(c['last_heartbeat_age_s'])} ago", hit, c["metrics_url"] or "-"))
        lines.append(tabulate(rows, headers=["clientd", "host", "client id", "state", "heartbeat", "hit rate",
                                             "metrics"]))
    return "\n".join(lines)


@click.command("status")
@click.option("--master", "master_address", default=None, metavar="HOST:PORT",
              help="Ask this master directly (default: the master of the local clientd).")
@click.option("--socket", "socket_path", envvar="CXLKV_SOCKET", default=None, metavar="PATH",
              help="The local clientd's socket. Default: $CXLKV_SOCKET, else <runtime dir>/clientd.sock.")
@click.option("--window", "window_s", default=0.0, type=click.FloatRange(0, 3600), show_default=True,
              help="Sample twice, this many seconds apart, and show recent rates too.")
@click.option("--json", "as_json", is_flag=True, help="Print everything as one JSON object.")
@click.option("--etcd", "etcd", envvar="CXLKV_ETCD", default="", metavar="HOST:PORT[,...]",
              help="etcd of a cluster with several masters: show the leader, standbys and epoch (and ask the "
                   "leader). Default: $CXLKV_ETCD.")
@click.option("--etcd-prefix", envvar="CXLKV_ETCD_PREFIX", default="/cxlkv/default", show_default=True,
              help="The masters' etcd_prefix (default: $CXLKV_ETCD_PREFIX).")
@tls_options
def status_cmd(master_address: str | None, socket_path: str | None, window_s: float, as_json: bool,
               etcd: str, etcd_prefix: str, tls_ca: str, tls_cert: str, tls_key: str) -> None:
    """The cluster at a glance: master, segments and tiers with usage, keys,
    clients (alive/expired), hit rate, evictions, each daemon's metrics URL.

    With TLS on, the master shows clients and region identities to an admin
    certificate only (--tls-ca/--tls-cert/--tls-key)."""
    from cxlkv.cli.admin import tls_files
    from cxlkv.errors import CxlkvError
    from cxlkv.cli.kv import exit_code_for

    try:
        st = collect_status(master_address, socket_path, window_s, tls_files(tls_ca, tls_cert, tls_key),
                            etcd=[e.strip() for e in etcd.split(",") if e.strip()], etcd_prefix=etcd_prefix)
    except CxlkvError as err:
        hint = ""
        if master_address is None and err.code.name == "UNAVAILABLE" and "clientd" in err.message:
            hint = "; or ask the master directly: cxlkv status --master HOST:PORT"
        click.echo(f"error: {err.code.name}: {err.message}{hint}", err=True)
        sys.exit(exit_code_for(err))
    if as_json:
        click.echo(json.dumps(st, indent=2, sort_keys=True))
    else:
        click.echo(_render(st))
    if st["master"] is None:  # only the local clientd's view: not a healthy cluster
        from cxlkv.errors import ErrorCode

        click.echo("error: UNAVAILABLE: the master did not answer; shown: the local clientd's view only"
                   if st["errors"] else "error: UNAVAILABLE: the local clientd knows no master address", err=True)
        sys.exit(10 + int(ErrorCode.UNAVAILABLE))
