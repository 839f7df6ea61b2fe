"""``cxlkv clientd``: run the client daemon of this host."""

from __future__ import annotations

import os
import sys

import click

__all__ = ["clientd_cmd"]


@click.command("clientd")
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help="TOML file (ClientdConfig keys; see docs/clientd.md).")
@click.option("--name", default=None, help="This daemon's name, unique on its host.")
@click.option("--master", "master_address", default=None, help="Master gRPC host:port.")
@click.option("--socket", "socket_path", default=None, help="gRPC Unix socket path.")
@click.option("--lean-socket", "lean_socket_path", default=None, help="Lean-framing Unix socket path.")
@click.option("--region", "regions", multiple=True, metavar="SEGMENT=PATH",
              help="Region to map (repeatable); replaces the config's [[regions]].")
@click.option("--prefault/--no-prefault", default=None, help="Fault in every region page at start.")
@click.option("--metrics-address", default=None, metavar="HOST:PORT",
              help="Serve Prometheus /metrics here; port 0 picks one (overrides metrics_address).")
@click.option("--log-level", default=None, type=click.Choice(["debug", "info", "warning", "error"]))
@click.option("--log-json/--no-log-json", default=None, help="Log JSON lines (overrides log_json).")
def clientd_cmd(config_path, name, master_address, socket_path, lean_socket_path, regions, prefault,
                metrics_address, log_level, log_json):
    """Run the client daemon: map the CXL region(s), register with the master and
    serve the local KV API on Unix sockets (gRPC and lean framing).

    Settings: defaults → --config TOML → CXLKV_CLIENTD_* environment → flags.
    Exit code 2: bad configuration, wrong/unformatted/resized region, socket in
    use, or the master refused the registration.
    """
    from cxlkv.config import ClientdConfig, load_config
    from cxlkv.errors import ConfigError
    from cxlkv.runtime.logs import setup_logging

    overrides = {
        "name": name, "master_address": master_address, "socket_path": socket_path,
        "lean_socket_path": lean_socket_path, "prefault": prefault, "log_level": log_level,
        "metrics_address": metrics_address, "log_json": log_json,
    }
    if regions:
        parsed = []
        for r in regions:
            seg, sep, path = r.partition("=")
            if not sep or not seg or not path:
                click.echo(f"error: --region {r!r}: expected SEGMENT=PATH", err=True)
                sys.exit(2)
            parsed.append({"segment": seg, "path": path})
        overrides["regions"] = parsed
    try:
        cfg = load_config(ClientdConfig, config_path, env=os.environ, env_prefix="CXLKV_CLIENTD_",
                          overrides=overrides)
        if cfg.tls.enabled:  # an expired certificate would only meet "Socket closed" from the master, forever
            from cxlkv.wire.tls import check_certificate_files

            check_certificate_files(cfg.tls)
    except ConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    setup_logging(cfg.log_level, json_lines=cfg.log_json, component=cfg.name)
    from cxlkv.clientd.daemon import Daemon
    from cxlkv.runtime.systemd import Notifier

    from cxlkv.runtime.systemd import config_reloader, install_reload

    notifier = Notifier.from_env(os.environ)
    install_reload(notifier, config_reloader(lambda: load_config(
        ClientdConfig, config_path, env=os.environ, env_prefix="CXLKV_CLIENTD_", overrides=overrides),
        cfg, cfg.name))

    async def _main() -> int:
        return await Daemon(cfg, notifier=notifier).run()

    from cxlkv.runtime.loops import run

    try:
        rc = run(_main(), cfg.event_loop)
    except ConfigError as exc:  # uvloop asked for but missing
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    sys.exit(rc)
