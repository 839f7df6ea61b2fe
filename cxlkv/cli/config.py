"""``cxlkv config check|example``: validate a configuration file, print documented examples.

``check FILE`` loads FILE the way the daemon would (defaults → FILE →
``CXLKV_MASTER_*`` / ``CXLKV_CLIENTD_*`` environment unless ``--no-env``),
runs every validation the daemon runs before it binds anything (for a master
also loading its allocation strategy and eviction policy plugins), and prints
the effective configuration as TOML. Whether FILE is a master or a clientd
configuration is told from its keys unless ``--kind`` says so. A problem is one
line on stderr naming the key, and exit status 2.

``example --kind master|clientd`` prints a complete file: every key, its
meaning, unit and default, generated from the config dataclasses
(:func:`cxlkv.config.describe`). ``deploy/examples/*.toml`` are its output
(a test keeps them in sync).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import typing
from pathlib import Path
from typing import Any

import click

from cxlkv.config import ClientdConfig, MasterConfig, RegionConfig, SegmentConfig, load_config, read_toml
from cxlkv.errors import ConfigError, CxlkvError

__all__ = ["config_group", "KINDS", "detect_kind", "check_config", "example_toml", "EXIT_CONFIG"]

#: Exit status of an invalid configuration.
EXIT_CONFIG = 2

#: kind → (config class, environment prefix).
KINDS: dict[str, tuple[type, str]] = {
    "master": (MasterConfig, "CXLKV_MASTER_"),
    "clientd": (ClientdConfig, "CXLKV_CLIENTD_"),
}

#: Values the shipped examples use where the default is not what a service wants.
EXAMPLE_VALUES: dict[str, dict[str, Any]] = {
    "master": {
        "listen_address": "0.0.0.0:50051",
        "lean_listen_address": "0.0.0.0:50052",  # a fixed port firewalls can open (docs/operations.md)
        "metrics_address": "0.0.0.0:9464",
        "tls_ca_file": "/etc/cxlkv/tls/ca.pem",
        "tls_cert_file": "/etc/cxlkv/tls/master.pem",
        "tls_key_file": "/etc/cxlkv/tls/master-key.pem",
        "segments": [{"name": "cxl0", "size_bytes": "256GiB", "path": "/dev/dax0.0", "tier": "cxl",
                      "region_uuid": ""}],
    },
    "clientd": {
        "name": "clientd",
        "master_address": "kv-master.example.internal:50051",
        "socket_path": "/run/cxlkv/clientd.sock",
        "metrics_address": "0.0.0.0:9465",
        "tls_ca_file": "/etc/cxlkv/tls/ca.pem",
        "tls_cert_file": "/etc/cxlkv/tls/clientd.pem",
        "tls_key_file": "/etc/cxlkv/tls/clientd-key.pem",
        "regions": [{"segment": "cxl0", "path": "/dev/dax0.0"}],
    },
}

_HEADERS = {
    "master": "cxlkv master configuration: `cxlkv master --config FILE` (deploy/systemd/cxlkv-master.service)",
    "clientd": "cxlkv clientd configuration: `cxlkv clientd --config FILE` (deploy/systemd/cxlkv-clientd.service)",
}
_ITEM_CLASSES: dict[str, type] = {"segments": SegmentConfig, "regions": RegionConfig}


def _fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def detect_kind(data: dict[str, Any], *, where: str = "config") -> str:
    """``"master"`` or ``"clientd"``, told from the keys a config uses.

    Raises:
        ConfigError: the keys belong to both kinds, or to neither only (say ``--kind``).
    """
    master_only = _fields(MasterConfig) - _fields(ClientdConfig)
    clientd_only = _fields(ClientdConfig) - _fields(MasterConfig)
    keys = set(data)
    m, c = sorted(keys & master_only), sorted(keys & clientd_only)
    if m and c:
        raise ConfigError(f"{where}: mixes master keys ({', '.join(m)}) and clientd keys ({', '.join(c)}); "
                          "pass --kind master|clientd")
    if m:
        return "master"
    if c:
        return "clientd"
    raise ConfigError(f"{where}: cannot tell whether this is a master or a clientd configuration "
                      "from its keys; pass --kind master|clientd")


def check_config(path: str, kind: str | None = None, env: dict[str, str] | None = None) -> tuple[str, Any]:
    """Load and validate ``path`` as the daemon would.

    Args:
        path: the TOML file.
        kind: ``"master"``, ``"clientd"`` or ``None`` (detected from the keys).
        env: environment to apply (``CXLKV_<KIND>_*``), or ``None`` for none.

    Returns:
        ``(kind, config)``.

    Raises:
        ConfigError: unreadable file, TOML syntax, unknown key, bad value, a
            failed cross-field check, or (master) an unknown or broken
            strategy/policy plugin — one line naming the key.
    """
    p = Path(path)
    if kind is None:
        kind = detect_kind(read_toml(p), where=str(p))
    cls, prefix = KINDS[kind]
    cfg: Any = load_config(cls, p, env=env, env_prefix=prefix)
    if kind == "master":
        from cxlkv.master.eviction import load_policy
        from cxlkv.master.strategies import load_strategy

        try:
            load_strategy(cfg.allocation_strategy, cfg)
        except ConfigError as exc:
            raise ConfigError(f"allocation_strategy: {exc}") from None
        try:
            load_policy(cfg.eviction_policy, cfg)
        except ConfigError as exc:
            raise ConfigError(f"eviction_policy: {exc}") from None
    return kind, cfg


def _toml_value(value: Any) -> str:
    import tomli_w

    return tomli_w.dumps({"v": value}).split("=", 1)[1].strip()


def _default_text(f: dataclasses.Field, value: Any) -> str:
    if f.name == "socket_mode":
        return oct(value)
    if f.metadata.get("unit") == "bytes" and isinstance(value, int) and value:
        for unit, n in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
            if value % n == 0:
                return f'"{value // n}{unit}"'
    return _toml_value(value)


def _comment(f: dataclasses.Field, default: str) -> list[str]:
    unit = f.metadata.get("unit", "")
    unit_text = {"bytes": "bytes (4096, \"64KiB\", \"2GiB\")", "s": "seconds (5, \"30s\", \"250ms\", \"2m\")"}.get(unit, "")
    lines = [f"# {f.metadata.get('doc', '')}"]
    lines.append(f"#   default: {default}" + (f"; unit: {unit_text}" if unit_text else ""))
    return lines


def _value_text(f: dataclasses.Field, value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return _default_text(f, value)
    return _toml_value(value)


def example_toml(kind: str) -> str:
    """A complete, documented configuration file for ``kind`` (every key, with its meaning)."""
    cls, prefix = KINDS[kind]
    values = EXAMPLE_VALUES[kind]
    out = [
        f"# {_HEADERS[kind]}",
        f"# Generated by `cxlkv config example --kind {kind}` from cxlkv.config.{cls.__name__}.",
        f"# Precedence: defaults < this file < {prefix}<KEY> environment variables < command-line flags.",
        "# Check a file with `cxlkv config check FILE` before (re)starting the service.",
        "",
    ]
    tables: list[dataclasses.Field] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if typing.get_origin(hint) is list and dataclasses.is_dataclass(typing.get_args(hint)[0]):
            tables.append(f)
            continue
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]
        out += _comment(f, _default_text(f, default))
        out.append(f"{f.name} = {_value_text(f, values.get(f.name, default))}")
        out.append("")
    for f in tables:
        item_cls = _ITEM_CLASSES[f.name]
        out.append(f"# [[{f.name}]]: {f.metadata.get('doc', '')} (one table per entry)")
        for item in values.get(f.name, []):
            out.append(f"[[{f.name}]]")
            for sf in dataclasses.fields(item_cls):
                out += _comment(sf, _default_text(sf, sf.default))
                out.append(f"{sf.name} = {_toml_value(item.get(sf.name, sf.default))}")
            out.append("")
    return "\n".join(out).rstrip() + "\n"


@click.group("config")
def config_group() -> None:
    """Validate configuration files; print documented examples."""


def _size_notes(path: str) -> list[str]:
    """One note per size in ``path`` written with a decimal unit (kB, MB, GB, TB)."""
    from cxlkv.config import parse_size, size_note

    try:
        data = read_toml(path)
    except ConfigError:
        return []
    notes: list[str] = []

    def walk(value: Any, where: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{where}.{k}" if where else k)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, f"{where}[{i}]")
        elif isinstance(value, str) and where.endswith("_bytes"):
            try:
                note = size_note(value, parse_size(value))
            except CxlkvError:
                return
            if note:
                notes.append(f"{where}: {note}")

    walk(data, "")
    return notes


@config_group.command("check")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--kind", type=click.Choice(sorted(KINDS)), default=None,
              help="master or clientd (default: told from the file's keys).")
@click.option("--env/--no-env", "use_env", default=True, show_default=True,
              help="Apply CXLKV_MASTER_* / CXLKV_CLIENTD_* environment overrides, as the daemon does.")
def check_cmd(file: str, kind: str | None, use_env: bool) -> None:
    """Validate FILE and print the effective configuration as TOML.

    Exit status 0 when valid; 2 with one line naming the key when not.
    """
    import tomli_w

    try:
        kind, cfg = check_config(file, kind, dict(os.environ) if use_env else None)
    except ConfigError as exc:
        where = "" if str(exc).startswith("environment variable") else f"{file}: "
        click.echo(f"cxlkv config check: {where}{exc}", err=True)
        sys.exit(EXIT_CONFIG)
    click.echo(f"# {file}: valid {kind} configuration; effective values"
               + (" (environment applied)" if use_env else "") + ":")
    for note in _size_notes(file):
        click.echo(f"# note: {note}")
    click.echo(tomli_w.dumps(dataclasses.asdict(cfg)), nl=False)


@config_group.command("example")
@click.option("--kind", type=click.Choice(sorted(KINDS)), required=True)
def example_cmd(kind: str) -> None:
    """Print a complete configuration file with every key documented."""
    click.echo(example_toml(kind), nl=False)

