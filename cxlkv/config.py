"""Configuration: frozen dataclasses, loaded once, validated with clear messages.

Precedence (lowest first): field defaults → TOML file → ``CXLKV_<COMPONENT>_<FIELD>``
environment variables → explicit overrides (CLI flags). Human sizes (``"64GiB"``,
``"512KiB"``, ``4096``) and durations (``"30s"``, ``"250ms"``, ``"2m"``, ``1.5``) are
parsed once, here, into bytes and seconds; components receive a config object and
never read the environment themselves.

A field's unit lives in its name (``*_bytes``, ``*_s``) and in its metadata
(``unit="bytes"`` / ``unit="s"``), which tells the loader how to parse it.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence, TypeVar

from cxlkv.errors import ConfigError
from cxlkv.layout.region import REGION_HEADER_BYTES
from cxlkv.wire.tls import TlsFiles, is_loopback_host

__all__ = [
    "read_toml",
    "parse_size",
    "parse_duration",
    "format_size",
    "size_note",
    "SegmentConfig",
    "MasterConfig",
    "RegionConfig",
    "ClientdConfig",
    "load_config",
    "default_runtime_dir",
    "FLUSH_READS",
]

#: The values of clientd's ``flush_reads`` (how flush mode reads; docs/transport.md).
FLUSH_READS = ("verify_first", "invalidate_first")

# Size units, by the IEC 80000-13 rules: KiB/MiB/GiB/TiB are powers of 1024, kB/MB/GB/TB
# powers of 1000 (SI), as in systemd and `dd`. A bare k/m/g/t is refused as ambiguous
# (Java's -Xmx64m and `ls -h` mean 2^20; SI means 10^6). Hand-written rather than
# humanfriendly.parse_size: it would be one more dependency of every install, and its
# binary=True reads "GB" as 2^30 — silently the other meaning.
_SIZE_UNITS = {
    "": 1, "b": 1,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
    "ki": 1024, "kib": 1024, "mi": 1024**2, "mib": 1024**2, "gi": 1024**3, "gib": 1024**3,
    "ti": 1024**4, "tib": 1024**4,
}
_DECIMAL_UNITS = {"kb": "KiB", "mb": "MiB", "gb": "GiB", "tb": "TiB"}
_AMBIGUOUS_UNITS = {"k": ("KiB", "kB", "2^10", "10^3"), "m": ("MiB", "MB", "2^20", "10^6"),
                    "g": ("GiB", "GB", "2^30", "10^9"), "t": ("TiB", "TB", "2^40", "10^12")}
_DURATION_UNITS = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "m": 60.0, "min": 60.0, "h": 3600.0}
_NUM_UNIT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: int | float | str, *, name: str = "size") -> int:
    """Parse a size into bytes: ``4096``, ``"64MiB"``, ``"1.5GiB"`` (binary: 2^30),
    ``"10GB"`` (decimal: 10 × 10^9 — see :func:`size_note`). Units are case-blind;
    a bare ``k``/``m``/``g``/``t`` is refused as ambiguous.

    Raises:
        ConfigError: not a size, negative, or an unknown or ambiguous unit (the
            message names ``name``).
    """
    if isinstance(value, bool):
        raise ConfigError(f"{name}: expected a size, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{name}: size must be a finite number, got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ConfigError(f"{name}: size must be >= 0, got {value!r}")
        return int(value)
    m = _NUM_UNIT.match(str(value))
    unit = m.group(2).lower() if m else None
    if m and unit in _AMBIGUOUS_UNITS:
        binary, decimal, b, d = _AMBIGUOUS_UNITS[unit]
        raise ConfigError(f"{name}: {value!r}: unit {m.group(2)!r} is ambiguous; write "
                          f"\"{m.group(1)}{binary}\" ({m.group(1)} × {b} bytes) or \"{m.group(1)}{decimal}\" ({m.group(1)} × {d})")
    if not m or unit not in _SIZE_UNITS:
        raise ConfigError(
            f"{name}: cannot parse size {value!r} (examples: 4096, \"64KiB\", \"16MiB\", \"2GiB\")"
        )
    n = float(m.group(1)) * _SIZE_UNITS[unit]
    if not math.isfinite(n):
        raise ConfigError(f"{name}: size must be a finite number, got {value!r}")
    return int(n)


def size_note(value: int | float | str, n_bytes: int) -> str | None:
    """What a size written with a decimal unit means, for the command that took it:
    ``'"1GB" is decimal: 1000000000 bytes (953.7 MiB); "1GiB" would be 1073741824'``.
    ``None`` for binary units and plain numbers (nothing to say)."""
    m = _NUM_UNIT.match(str(value)) if isinstance(value, str) else None
    if m is None or m.group(2).lower() not in _DECIMAL_UNITS:
        return None
    binary = _DECIMAL_UNITS[m.group(2).lower()]
    as_binary = int(float(m.group(1)) * _SIZE_UNITS[binary.lower()])
    return (f"{value.strip()!r} is decimal (SI): {n_bytes} bytes ({format_size(n_bytes)}); "
            f"\"{m.group(1)}{binary}\" would be {as_binary} bytes")


def parse_duration(value: int | float | str, *, name: str = "duration") -> float:
    """Parse a duration into seconds: ``5``, ``"30s"``, ``"250ms"``, ``"2m"``, ``"1h"``.

    Raises:
        ConfigError: not a duration, negative, or an unknown unit.
    """
    if isinstance(value, bool):
        raise ConfigError(f"{name}: expected a duration, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{name}: duration must be a finite number of seconds, got {value!r}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ConfigError(f"{name}: duration must be >= 0, got {value!r}")
        return float(value)
    m = _NUM_UNIT.match(str(value))
    unit = m.group(2).lower() if m else None
    if not m or unit not in _DURATION_UNITS:
        raise ConfigError(
            f"{name}: cannot parse duration {value!r} (examples: 5, \"30s\", \"250ms\", \"2m\")"
        )
    seconds = float(m.group(1)) * _DURATION_UNITS[unit]
    if not math.isfinite(seconds):
        raise ConfigError(f"{name}: duration must be a finite number of seconds, got {value!r}")
    return seconds


def format_size(n_bytes: int) -> str:
    """Human form of a byte count using binary units (``"64.0 MiB"``)."""
    n = float(n_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n_bytes} B"


def default_runtime_dir() -> Path:
    """Where clientd's sockets live by default: ``$XDG_RUNTIME_DIR/cxlkv`` when
    that variable is set, else ``/run/cxlkv`` when writable (root, systemd
    ``RuntimeDirectory=``), else ``/tmp/cxlkv-<uid>``.

    Only the path: the daemon and the SDK check it before use
    (:func:`cxlkv.runtime.rundir.check_private_dir`: owned by the user or root, not
    writable by group or others).
    """
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg) / "cxlkv"
    run = Path("/run/cxlkv")
    if run.is_dir() and os.access(run, os.W_OK):
        return run
    if os.geteuid() == 0 and Path("/run").is_dir() and os.access("/run", os.W_OK):
        return run
    return Path(f"/tmp/cxlkv-{os.geteuid()}")


def _f(default: Any, doc: str, unit: str = "", **kw: Any) -> Any:
    """A documented dataclass field; ``unit`` is "bytes", "s", "items" or ""."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"doc": doc, "unit": unit}, **kw)
    return field(default=default, metadata={"doc": doc, "unit": unit}, **kw)


# --------------------------------------------------------------------------- master


@dataclass(frozen=True)
class SegmentConfig:
    """A CXL region the master allocates from (``[[segments]]`` in master TOML)."""

    name: str = _f("", "segment name, unique in the cluster (e.g. \"cxl0\")")
    size_bytes: int = _f(0, "whole region size including its header", unit="bytes")
    path: str = _f("", "where hosts map it (/dev/daxX.Y or /dev/shm/...); informational on the master")
    tier: str = _f("cxl", "tier of the segment: cxl, or ssd (a file on a shared path every clientd opens, "
                   "read and written with pread/pwrite); dram tiers are mounted by clientds")
    region_uuid: str = _f("", "expected region identity; \"\" adopts the first one a clientd reports")


@dataclass(frozen=True)
class MasterConfig:
    """Configuration of ``cxlkv master`` (TOML top level; env ``CXLKV_MASTER_*``)."""

    listen_address: str = _f("127.0.0.1:50051", "gRPC host:port; port 0 picks a free port")
    address_file: str = _f("", "write the bound host:port here once serving (\"\" = don't)")
    lean_listen_address: str = _f(
        "", "MasterService in lean frames for clientds' hot path: host:port (\"\" = listen_address's host, "
        "a free port at every start: set a fixed one, e.g. \"0.0.0.0:50052\", where a firewall must let "
        "clientds in; \"off\" = gRPC only)")
    lean_socket_path: str = _f(
        "", "MasterService in lean frames on this Unix socket too, for clientds and direct-mode writers on the "
        "master's host when it listens on loopback (a round trip costs about half of TCP loopback's); "
        "plaintext, so not served with TLS; file permissions (0660) decide who may connect (\"\" = none)")
    metrics_address: str = _f("", "Prometheus /metrics host:port (\"\" = disabled; port 0 picks)")
    tls_ca_file: str = _f("", "PEM certificate of the cluster CA: with tls_cert_file and tls_key_file, gRPC, the "
                          "lean port and /metrics require mutual TLS, every caller a certificate this CA signed "
                          "(\"\" = no TLS: loopback addresses only, unless allow_insecure)")
    tls_cert_file: str = _f("", "PEM certificate of this master (its SAN names every address clientds dial)")
    tls_key_file: str = _f("", "PEM private key of tls_cert_file (mode 0600)")
    admin_identities: list[str] = _f(
        [], "certificate names (CN) allowed the administrative calls (RemoveAll, pattern removal, "
        "Mount/UnmountSegment, ListKeys, full Stat), besides certificates with OU=admin")
    allow_insecure: bool = _f(False, "serve without TLS on non-loopback addresses (trusted networks only: "
                                     "anyone who reaches the port can change the cluster)")
    segments: list[SegmentConfig] = _f([], "CXL regions (and SSD tier files) to mount at start")
    allocation_strategy: str = _f("cxl_first", "entry point name in cxlkv.allocation_strategies")
    eviction_policy: str = _f("lru", "entry point name in cxlkv.eviction_policies")
    alignment_bytes: int = _f(64, "extent alignment (power of two, >= 8)", unit="bytes")
    lease_ttl_s: float = _f(5.0, "read lease length", unit="s")
    soft_pin_ttl_s: float = _f(600.0, "soft pins expire after this long", unit="s")
    client_ttl_s: float = _f(10.0, "a clientd silent this long is expired", unit="s")
    heartbeat_interval_s: float = _f(1.0, "how often clientds heartbeat", unit="s")
    put_timeout_s: float = _f(60.0, "a PROCESSING put older than this is revoked", unit="s")
    high_watermark: float = _f(0.95, "used/capacity ratio at which eviction starts")
    low_watermark: float = _f(0.90, "used/capacity ratio eviction frees down to")
    evict_budget_s: float = _f(0.005, "most time one eviction pass may take", unit="s")
    sweep_interval_s: float = _f(0.5, "period of the lease/put/client expiry sweep", unit="s")
    max_batch_items: int = _f(2048, "most items in one batch call; more is refused with TOO_LARGE "
                              "(docs/protocol.md, Limits)", unit="items")
    max_request_bytes: int = _f(16 << 20, "largest request accepted (gRPC message, lean frame); larger is "
                                "refused with TOO_LARGE", unit="bytes")
    slice_s: float = _f(0.01, "long operations (RemoveAll, UnmountSegment) run in slices of "
                        "at most this much event-loop time, so heartbeats are answered between them", unit="s")
    log_level: str = _f("info", "debug, info, warning or error")
    log_json: bool = _f(False, "log JSON lines instead of text")
    event_loop: str = _f("uvloop", "uvloop (libuv, in C: less CPU per call) or asyncio (the standard library's)")
    promotion_threshold: int = _f(
        2, "an SSD-only object read this often (count-min estimate, decayed) is copied back into CXL; 0 = never")
    dram_promotion_threshold: int = _f(
        4, "an object read this often by one host is cached in that host's DRAM tier; 0 = never")
    access_sketch_width: int = _f(
        1 << 16, "counters per row of the access-frequency count-min sketch (memory: width x depth x 4 B)")
    access_sketch_depth: int = _f(4, "rows (hash functions) of the access-frequency count-min sketch")
    access_sketch_reset_adds: int = _f(
        0, "halve every counter after this many recorded reads (decay); 0 = 10 x access_sketch_width")
    copy_ahead_watermark: float = _f(
        0.8, "with an SSD tier: objects committed while their CXL segment is this full are copied to SSD "
        "at once, so that demoting them later frees CXL without a copy (1 = only when full)")
    task_timeout_s: float = _f(5.0, "a tier-move task not reported within this long is given again", unit="s")
    task_retries: int = _f(3, "a tier-move task given this many times without success is failed and counted")
    full_tier_backoff_s: float = _f(
        1.0, "a tier a clientd could not write into (its filesystem full, NO_SPACE) takes no new objects "
        "for this long, doubling with each refusal in a row", unit="s")
    full_tier_backoff_max_s: float = _f(60.0, "longest pause of a full tier (full_tier_backoff_s doubled)", unit="s")
    recover_from_region: list[str] = _f(
        [], "rebuild the metadata at start from these regions (metadata lost): from the region's "
        "committed-object index when it has one, else from its object headers; "
        "\"PATH\" (segment named by the region's identity) or \"PATH=SEGMENT\"")
    writer_reclaim_s: float = _f(
        0.0, "space taken back from a writer whose registration ended (expired, partitioned, stopped) is "
        "reused once the writer says it stopped, or after this long; 0 = never on time alone (an operator's "
        "`cxlkv admin release-writer` frees it)", unit="s")
    reserve_max_extents: int = _f(
        4096, "most extents one clientd may hold reserved ahead of need (writes in one round trip); "
        "0 = none (every put costs PutStart + PutEnd)")
    reserve_max_ratio: float = _f(
        0.0625, "most bytes one clientd may hold reserved ahead of need, as a fraction of the capacity of the "
        "CXL segments a reservation may take (reserved space is never evicted: idle writers must not hold a "
        "cache's capacity); beyond it puts take the daemon's path")
    owner_lease_ttl_s: float = _f(
        5.0, "the owner lease this master records in each region it maps lapses this long after its last "
        "heartbeat (heartbeats every quarter of it); another master takes a region over only once lapsed",
        unit="s")

    etcd_endpoints: list[str] = _f(
        [], "etcd v3 client endpoints for leader election among several masters (docs/ha.md): host:port or "
        "http://host:port (plaintext), https://host:port (mutual TLS with this master's TLS files); [] = a "
        "single master, no election")
    etcd_prefix: str = _f("/cxlkv/default", "etcd key prefix of this cluster's election and metadata keys")
    leader_lease_ttl_s: float = _f(
        1.0, "with etcd: the leader's etcd lease (whole seconds, at least etcd's minimum); a standby takes "
        "over about this long after the leader stops renewing it; the region owner lease then uses the "
        "same TTL", unit="s")
    standby_refresh_s: float = _f(
        1.0, "with etcd: a standby keeps a copy of the master state warm, applying what changed in the region's "
        "index this often (a takeover then applies the last change only); 0 = rebuild from the index at "
        "takeover", unit="s")
    advertise_address: str = _f(
        "", "with etcd: the gRPC host:port clientds dial to reach this master (\"\" = listen_address)")

    @property
    def tls(self) -> TlsFiles:
        """The TLS files (``enabled`` false when none is configured)."""
        return TlsFiles(self.tls_ca_file, self.tls_cert_file, self.tls_key_file)

    def validate(self) -> None:
        """Check cross-field rules. Raises :class:`ConfigError` naming the key."""
        if self.etcd_endpoints:
            if not self.leader_lease_ttl_s >= 1 or self.leader_lease_ttl_s != int(self.leader_lease_ttl_s):
                raise ConfigError(f"leader_lease_ttl_s: must be a whole number of seconds >= 1 (etcd leases "
                                  f"are), got {self.leader_lease_ttl_s}")
            if not self.etcd_prefix.startswith("/"):
                raise ConfigError(f"etcd_prefix: must start with '/', got {self.etcd_prefix!r}")
            for ep in self.etcd_endpoints:
                _check_address("etcd_endpoints", ep.split("://", 1)[-1].rstrip("/"), empty_ok=False)
                if ep.startswith("https://") and not self.tls.enabled:
                    raise ConfigError(f"etcd_endpoints: {ep} needs tls_ca_file, tls_cert_file and tls_key_file "
                                      "(the master presents its certificate to etcd)")
        if not self.owner_lease_ttl_s > 0:
            raise ConfigError(f"owner_lease_ttl_s: must be > 0, got {self.owner_lease_ttl_s}")
        for spec in self.recover_from_region:
            if not isinstance(spec, str) or not spec or spec.startswith("="):
                raise ConfigError(f"recover_from_region: expected \"PATH\" or \"PATH=SEGMENT\", got {spec!r}")
        if not 0.0 < self.low_watermark <= self.high_watermark <= 1.0:
            raise ConfigError(
                f"low_watermark ({self.low_watermark}) and high_watermark ({self.high_watermark}) "
                "must satisfy 0 < low <= high <= 1"
            )
        a = self.alignment_bytes
        if a < 8 or a & (a - 1):
            raise ConfigError(f"alignment_bytes: must be a power of two >= 8, got {a}")
        names = [s.name for s in self.segments]
        for s in self.segments:
            if not s.name:
                raise ConfigError("segments: every segment needs a name")
            if s.size_bytes <= REGION_HEADER_BYTES:
                raise ConfigError(f"segments[{s.name}].size_bytes: must be more than the {REGION_HEADER_BYTES}-byte "
                                  f"region header, got {s.size_bytes}")
            if s.tier not in ("cxl", "ssd"):
                raise ConfigError(f"segments[{s.name}].tier: must be \"cxl\" or \"ssd\" (dram tiers are "
                                  f"mounted by clientds), got {s.tier!r}")
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ConfigError(f"segments: duplicate names {sorted(dup)}")
        for name in ("lease_ttl_s", "client_ttl_s", "heartbeat_interval_s", "put_timeout_s", "sweep_interval_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name}: must be > 0")
        for name in ("promotion_threshold", "dram_promotion_threshold"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}: must be >= 0 (0 = never), got {getattr(self, name)}")
        if not 16 <= self.access_sketch_width <= 1 << 26:
            raise ConfigError(f"access_sketch_width: must be in [16, 2^26], got {self.access_sketch_width}")
        if not 1 <= self.access_sketch_depth <= 16:
            raise ConfigError(f"access_sketch_depth: must be in [1, 16], got {self.access_sketch_depth}")
        if self.access_sketch_reset_adds < 0:
            raise ConfigError(f"access_sketch_reset_adds: must be >= 0, got {self.access_sketch_reset_adds}")
        if not 0.0 <= self.reserve_max_ratio <= 1.0:
            raise ConfigError(f"reserve_max_ratio: must be in [0, 1], got {self.reserve_max_ratio}")
        if self.reserve_max_extents < 0:
            raise ConfigError(f"reserve_max_extents: must be >= 0 (0 = no reservations), got {self.reserve_max_extents}")
        if not 0.0 <= self.copy_ahead_watermark <= 1.0:
            raise ConfigError(f"copy_ahead_watermark: must be in [0, 1], got {self.copy_ahead_watermark}")
        if self.task_timeout_s <= 0:
            raise ConfigError("task_timeout_s: must be > 0")
        if self.task_retries < 1:
            raise ConfigError(f"task_retries: must be >= 1, got {self.task_retries}")
        if not 0 < self.full_tier_backoff_s <= self.full_tier_backoff_max_s:
            raise ConfigError("full_tier_backoff_s: must be > 0 and <= full_tier_backoff_max_s")
        if self.heartbeat_interval_s >= self.client_ttl_s:
            raise ConfigError("heartbeat_interval_s must be shorter than client_ttl_s")
        _check_limits(self.max_batch_items, self.max_request_bytes, master=True)
        if not 0 < self.slice_s <= 1:
            raise ConfigError(f"slice_s: must be in (0, 1] seconds, got {self.slice_s}")
        _check_address("listen_address", self.listen_address)
        _check_address("metrics_address", self.metrics_address, empty_ok=True)
        self.tls.check()
        if not self.tls.enabled and not self.allow_insecure:
            lean = self.lean_listen_address if self.lean_listen_address not in ("", "off") else ""
            for key, address in (("listen_address", self.listen_address), ("lean_listen_address", lean),
                                 ("metrics_address", self.metrics_address)):
                _check_loopback(key, address)
        _check_level(self.log_level)
        _check_event_loop(self.event_loop)


# -------------------------------------------------------------------------- clientd


@dataclass(frozen=True)
class RegionConfig:
    """A region a clientd maps (``[[regions]]`` in clientd TOML)."""

    segment: str = _f("", "name of the master's segment this region is")
    path: str = _f("", "/dev/daxX.Y or a file (e.g. /dev/shm/cxlkv-cxl0)")
    tier: str = _f("cxl", "cxl (mapped), or ssd (a file read and written with pread/pwrite, never mapped)")


@dataclass(frozen=True)
class ClientdConfig:
    """Configuration of ``cxlkv clientd`` (TOML top level; env ``CXLKV_CLIENTD_*``)."""

    name: str = _f("clientd", "this daemon's name, unique on its host")
    master_address: str = _f("127.0.0.1:50051", "master gRPC host:port; with several masters (docs/ha.md) a "
                             "comma-separated list: the daemon follows whichever one leads")
    tls_ca_file: str = _f("", "PEM certificate of the cluster CA: with tls_cert_file and tls_key_file, the links "
                          "to the master (gRPC and lean) and /metrics use mutual TLS (\"\" = no TLS: a loopback "
                          "master_address only, unless allow_insecure)")
    tls_cert_file: str = _f("", "PEM certificate of this daemon: its CN is the identity the master binds its "
                                "client id to (unique per daemon)")
    tls_key_file: str = _f("", "PEM private key of tls_cert_file (mode 0600)")
    allow_insecure: bool = _f(False, "talk to a non-loopback master and serve metrics on a non-loopback "
                                     "address without TLS (trusted networks only)")
    socket_path: str = _f("", "gRPC Unix socket (\"\" = <runtime dir>/<name>.sock)")
    lean_socket_path: str = _f("", "lean-framing Unix socket (\"\" = <socket_path>.lean)")
    socket_mode: int = _f(0o660, "permission bits of the sockets")
    ready_file: str = _f("", "touch this file once both sockets serve (\"\" = don't); used by cxlkv cluster")
    metrics_address: str = _f("", "Prometheus /metrics host:port (\"\" = disabled; port 0 picks)")
    regions: list[RegionConfig] = _f([], "regions to map (segment name → local path)")
    max_inline_bytes: int = _f(1 << 20, "largest value carried inside a message", unit="bytes")
    reserve_ahead: bool = _f(True, "take extents from the master ahead of need, so a put (or a batch of puts) "
                             "costs one master round trip (clientd/reserve.py)")
    direct_commit: bool = _f(True, "hand reserved extents to direct-mode SDK writers, which commit their puts "
                             "to the master themselves (one round trip, none through this daemon); offered only "
                             "while the master link is plaintext lean framing to a single master (docs/sdk.md \"Direct commit\")")
    index_reads: bool = _f(True, "serve gets, prefix matches and existence checks from the committed-object "
                           "index the master publishes in the region (no master round trip; docs/index.md)")
    index_max_value_bytes: int = _f(
        4 << 20, "longer values are read through the leased RPC path instead of the index (a lease protects "
        "a long copy; an index read that is overwritten under it is redone)", unit="bytes")
    prefault: bool = _f(False, "touch every page of each region at start (no first-touch faults later)")
    dram_tier_bytes: int = _f(
        0, "this host's DRAM tier: private memory mounted as a host-local segment for hot objects; 0 = off",
        unit="bytes")
    task_batch: int = _f(64, "most tier-move tasks fetched from the master at once (0 = run none)")
    region_check_interval_s: float = _f(
        0.5, "how often the mapped region files are checked for having shrunk (then retired: errors, "
        "not SIGBUS)", unit="s")
    coherence: str = _f("coherent", "coherent, or flush (non-coherent CXL: flush before PutEnd, invalidate before read)")
    flush_reads: str = _f(
        "verify_first", "flush mode's reads (SDK processes follow): verify_first (metadata lines dropped; the "
        "value's first copy through the cache, checked against the committed checksum, copied again with "
        "every line dropped when it does not match) or invalidate_first (every line dropped before the "
        "first copy too); docs/transport.md")
    direct_mode: bool = _f(True, "offer direct mode: SDK processes that can map the regions copy bytes "
                                 "themselves, asking only for metadata (docs/sdk.md)")
    master_timeout_s: float = _f(10.0, "deadline of each call to the master", unit="s")
    max_batch_items: int = _f(16_384, "most items in one batch call of the local API; more is refused with "
                              "TOO_LARGE (the SDK splits its batches; docs/protocol.md, Limits)", unit="items")
    max_request_bytes: int = _f(32 << 20, "largest request accepted on the local API (gRPC message, lean "
                                "frame); larger is refused with TOO_LARGE", unit="bytes")
    log_level: str = _f("info", "debug, info, warning or error")
    log_json: bool = _f(False, "log JSON lines instead of text")
    event_loop: str = _f("uvloop", "uvloop (libuv, in C: less CPU per call) or asyncio (the standard library's)")

    def validate(self) -> None:
        """Check cross-field rules. Raises :class:`ConfigError` naming the key."""
        if not self.name or "/" in self.name:
            raise ConfigError(f"name: must be non-empty without '/', got {self.name!r}")
        if self.coherence not in ("coherent", "flush"):
            raise ConfigError(f"coherence: must be \"coherent\" or \"flush\", got {self.coherence!r}")
        if self.flush_reads not in FLUSH_READS:
            raise ConfigError(f"flush_reads: must be \"verify_first\" or \"invalidate_first\", got {self.flush_reads!r}")
        for r in self.regions:
            if not r.segment or not r.path:
                raise ConfigError("regions: every region needs `segment` and `path`")
            if r.tier not in ("cxl", "ssd"):
                raise ConfigError(f"regions[{r.segment}].tier: must be \"cxl\" or \"ssd\", got {r.tier!r}")
        if self.dram_tier_bytes and self.dram_tier_bytes < 1 << 20:
            raise ConfigError(f"dram_tier_bytes: must be 0 (off) or at least 1 MiB, got {self.dram_tier_bytes}")
        if self.region_check_interval_s <= 0:
            raise ConfigError("region_check_interval_s: must be > 0")
        if self.task_batch < 0:
            raise ConfigError(f"task_batch: must be >= 0, got {self.task_batch}")
        if not 0 <= self.socket_mode <= 0o777:
            # chmod(-1) would give the sockets mode 7777 (anyone on the host reads and
            # writes every key); larger values overflowed into a traceback at start
            raise ConfigError(f"socket_mode: must be permission bits from 0o000 to 0o777 (e.g. 0o660), "
                              f"got {self.socket_mode!r}")
        if self.master_timeout_s <= 0:
            raise ConfigError("master_timeout_s: must be > 0")
        _check_limits(self.max_batch_items, self.max_request_bytes, master=False)
        if self.max_request_bytes < self.max_inline_bytes + (1 << 20):
            raise ConfigError(f"max_request_bytes ({self.max_request_bytes}) must exceed max_inline_bytes "
                              f"({self.max_inline_bytes}) by at least 1 MiB")
        _check_address("metrics_address", self.metrics_address, empty_ok=True)
        for address in self.master_address.split(","):
            _check_address("master_address", address.strip())
        self.tls.check()
        if not self.tls.enabled and not self.allow_insecure:
            for address in self.master_address.split(","):
                _check_loopback("master_address", address.strip())
            _check_loopback("metrics_address", self.metrics_address)
        _check_level(self.log_level)
        _check_event_loop(self.event_loop)

    @property
    def master_addresses(self) -> list[str]:
        """``master_address`` split at commas: every master the daemon may follow (docs/ha.md)."""
        return [a.strip() for a in self.master_address.split(",") if a.strip()]

    @property
    def tls(self) -> TlsFiles:
        """The TLS files (``enabled`` false when none is configured)."""
        return TlsFiles(self.tls_ca_file, self.tls_cert_file, self.tls_key_file)

    def resolved_socket_path(self) -> str:
        """The gRPC socket path, defaults filled in."""
        return self.socket_path or str(default_runtime_dir() / f"{self.name}.sock")

    def resolved_lean_socket_path(self) -> str:
        """The lean-framing socket path, defaults filled in."""
        return self.lean_socket_path or self.resolved_socket_path() + ".lean"


def _check_limits(max_batch_items: int, max_request_bytes: int, *, master: bool) -> None:
    """Bounds of the per-call limits (cxlkv.wire.limits). Raises :class:`ConfigError`."""
    from cxlkv.wire.limits import MIN_MASTER_MAX_REQUEST_BYTES, MIN_MAX_BATCH_ITEMS, MIN_MAX_REQUEST_BYTES

    if max_batch_items < MIN_MAX_BATCH_ITEMS:
        raise ConfigError(f"max_batch_items: must be >= {MIN_MAX_BATCH_ITEMS} (the batch size of the SDK "
                          f"and of clientd's master calls), got {max_batch_items}")
    low = MIN_MASTER_MAX_REQUEST_BYTES if master else MIN_MAX_REQUEST_BYTES
    if not low <= max_request_bytes <= 1 << 30:
        raise ConfigError(f"max_request_bytes: must be in [{format_size(low)}, 1 GiB], got {max_request_bytes}")


def _check_address(key: str, address: str, *, empty_ok: bool = False) -> None:
    """``HOST:PORT`` with a port in 0..65535 (``""`` too when ``empty_ok``)."""
    if empty_ok and not address:
        return
    _, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"{key}: expected HOST:PORT (port 0 picks a free one), got {address!r}")


def _check_loopback(key: str, address: str) -> None:
    """Without TLS only a loopback ``address`` is allowed (``""``: not served)."""
    if not address:
        return
    host = address.rpartition(":")[0]
    if not is_loopback_host(host):
        raise ConfigError(f"{key} {address!r} is not a loopback address and TLS is not configured: set "
                          "tls_ca_file, tls_cert_file and tls_key_file (cxlkv certs), or allow_insecure = true "
                          "on a trusted network")


def _check_event_loop(name: str) -> None:
    if name not in ("uvloop", "asyncio"):
        raise ConfigError(f"event_loop: must be uvloop or asyncio, got {name!r}")


def _check_level(level: str) -> None:
    if level.lower() not in ("debug", "info", "warning", "error"):
        raise ConfigError(f"log_level: must be debug, info, warning or error, got {level!r}")


# --------------------------------------------------------------------------- loader

T = TypeVar("T")


def _coerce(cls: type, f: dataclasses.Field, value: Any, where: str) -> Any:
    unit = f.metadata.get("unit", "")
    hint = typing.get_type_hints(cls)[f.name]
    if unit == "bytes":
        return parse_size(value, name=where)
    if unit == "s":
        return parse_duration(value, name=where)
    origin = typing.get_origin(hint)
    if origin is list:
        (item_type,) = typing.get_args(hint)
        if not isinstance(value, list):
            shape = f"[[{f.name}]] tables" if dataclasses.is_dataclass(item_type) else f"{f.name} = [\"...\", ...]"
            raise ConfigError(f"{where}: expected a list (TOML {shape}), got {value!r}")
        if dataclasses.is_dataclass(item_type):
            return [_build(item_type, v, f"{where}[{i}]") for i, v in enumerate(value)]
        return list(value)
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return value.lower() in ("1", "true", "yes", "on")
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if hint is int:
        # bool is an int in Python and a float may be inf, nan or fractional: none is an integer
        if isinstance(value, bool) or (isinstance(value, float) and not (math.isfinite(value)
                                                                          and value.is_integer())):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        try:
            return int(value, 0) if isinstance(value, str) else int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected an integer, got {value!r}") from None
    if hint is float:
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected a number, got {value!r}") from None
        if not math.isfinite(number):
            raise ConfigError(f"{where}: expected a finite number, got {value!r}")
        return number
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    return value


def _build(cls: type[T], data: Mapping[str, Any], where: str) -> T:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a table, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{where + ': ' if where else ''}{unknown_keys(unknown, fields)}")
    kwargs = {k: _coerce(cls, fields[k], v, f"{where}.{k}" if where else k) for k, v in data.items()}
    return cls(**kwargs)


def unknown_keys(unknown: Sequence[str], known: Iterable[str]) -> str:
    """``unknown key 'lease_ttl' (did you mean 'lease_ttl_s'?)``, for one or more
    keys; close matches by :func:`difflib.get_close_matches` (ratio ≥ 0.6), else
    the known keys are listed."""
    import difflib

    known = sorted(known)
    parts, unmatched = [], False
    for k in unknown:
        close = difflib.get_close_matches(k, known, n=2)
        if close:
            parts.append(f"{k!r} (did you mean {' or '.join(repr(c) for c in close)}?)")
        else:
            parts.append(repr(k))
            unmatched = True
    text = f"unknown key{'s' if len(unknown) > 1 else ''} {', '.join(parts)}"
    return text + (f"; known keys: {', '.join(known)}" if unmatched else "")


def read_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The TOML table of the file at ``path``.

    Raises:
        ConfigError: the file is missing, unreadable (permissions, a directory, an
            I/O error), not UTF-8 or not TOML -- one line naming the file.
    """
    p = Path(path)
    try:
        return tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {p} does not exist") from None
    except PermissionError:
        raise ConfigError(f"config file {p}: permission denied") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {p}: {exc}") from None
    except OSError as exc:  # a directory, an I/O error
        raise ConfigError(f"config file {p}: {exc.strerror or exc}") from None


def load_config(
    cls: type[T],
    path: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    env_prefix: str = "",
    overrides: Mapping[str, Any] | None = None,
) -> T:
    """Load a config dataclass: defaults → TOML ``path`` → env → ``overrides``.

    Args:
        cls: ``MasterConfig`` or ``ClientdConfig``.
        path: TOML file, or ``None``.
        env: environment mapping (``os.environ`` is passed by the CLI, never read here).
        env_prefix: e.g. ``"CXLKV_MASTER_"``; ``CXLKV_MASTER_LEASE_TTL_S=2s`` sets
            ``lease_ttl_s``. Only scalar fields can be set from the environment.
        overrides: field → value from CLI flags; ``None`` values are ignored.

    Raises:
        ConfigError: unreadable file, TOML syntax error, unknown key, bad value,
            or a failed cross-field check — the message names the key.
    """
    data: dict[str, Any] = read_toml(path) if path is not None else {}
    from_env: dict[str, str] = {}  # field → the environment variable that set it
    if env and env_prefix:
        fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        for k, v in env.items():
            if k.startswith(env_prefix):
                fname = k[len(env_prefix):].lower()
                if fname not in fields:
                    import difflib

                    close = difflib.get_close_matches(fname, list(fields), n=1)
                    hint = f" (did you mean {env_prefix}{close[0].upper()}?)" if close else ""
                    raise ConfigError(f"environment variable {k}: no config key {fname!r}{hint}")
                # a bad value is the variable's fault, not the file's: name the variable
                data[fname] = _coerce(cls, fields[fname], v, f"environment variable {k} ({fname})")
                from_env[fname] = k
    for k, v in (overrides or {}).items():
        if v is not None:
            data[k] = v
            from_env.pop(k, None)
    cfg = _build(cls, data, "")
    validate = getattr(cfg, "validate", None)
    if validate is not None:
        try:
            validate()
        except ConfigError as exc:
            named = [k for f, k in from_env.items() if re.search(rf"\b{re.escape(f)}\b", exc.message)]
            if named:
                raise ConfigError(f"{exc.message} (set by environment variable {', '.join(named)})") from None
            raise
    return cfg


def describe(cls: type) -> list[tuple[str, str, str, str]]:
    """(key, default, unit, doc) of every field of a config dataclass, for docs and `config check`."""
    rows = []
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        rows.append((f.name, repr(default), f.metadata.get("unit", ""), f.metadata.get("doc", "")))
    return rows
