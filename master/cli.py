"""``cxlkv master``: run the master service.

Configuration precedence: defaults → ``--config`` TOML → ``CXLKV_MASTER_*``
environment → flags. A configuration error (bad key or value, unknown strategy
or policy, a plugin that fails to load, port in use) prints one line on stderr
and exits with code 2, without a traceback.
"""

from __future__ import annotations

import logging
import os
import sys

import click

from cxlkv.config import MasterConfig, load_config
from cxlkv.errors import ConfigError
from cxlkv.runtime.logs import setup_logging

__all__ = ["master_cmd"]

#: Exit code for configuration and start-up errors.
EXIT_CONFIG = 2


@click.command("master")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="TOML configuration file (see docs/master.md).")
@click.option("--listen", default=None, metavar="HOST:PORT",
              help="gRPC listen address; port 0 picks a free port (overrides listen_address).")
@click.option("--address-file", default=None, type=click.Path(dir_okay=False),
              help="Write the bound HOST:PORT here once serving (overrides address_file).")
@click.option("--metrics-address", default=None, metavar="HOST:PORT",
              help="Serve Prometheus /metrics here; port 0 picks one (overrides metrics_address).")
@click.option("--log-level", default=None, type=click.Choice(["debug", "info", "warning", "error"]),
              help="Log level (overrides log_level).")
@click.option("--log-json/--no-log-json", default=None, help="Log JSON lines (overrides log_json).")
@click.option("--recover-from-region", "recover", multiple=True, metavar="PATH[=SEGMENT]",
              help="Rebuild the index from this region's object headers before serving (the "
                   "master's metadata was lost); repeat for every region (overrides recover_from_region).")
def master_cmd(config_path: str | None, listen: str | None, address_file: str | None,
               metrics_address: str | None, log_level: str | None, log_json: bool | None,
               recover: tuple[str, ...]) -> None:
    """Run the cxlkv master: metadata, allocation, leases, eviction, clients."""
    try:
        cfg = load_config(
            MasterConfig, config_path, env=os.environ, env_prefix="CXLKV_MASTER_",
            overrides={"listen_address": listen, "address_file": address_file,
                       "metrics_address": metrics_address, "log_level": log_level, "log_json": log_json,
                       "recover_from_region": list(recover) or None},
        )
        if cfg.tls.enabled:  # clientds and etcd would refuse an expired certificate at every handshake
            from cxlkv.wire.tls import check_certificate_files

            check_certificate_files(cfg.tls)
    except ConfigError as exc:
        click.echo(f"cxlkv master: {exc}", err=True)
        sys.exit(EXIT_CONFIG)
    setup_logging(cfg.log_level, json_lines=cfg.log_json, component="master")
    from cxlkv.runtime.loops import run
    from cxlkv.master.server import run_master  # grpc import only once the config is good
    from cxlkv.runtime.systemd import Notifier

    from cxlkv.runtime.systemd import config_reloader, install_reload

    notifier = Notifier.from_env(os.environ)
    install_reload(notifier, config_reloader(lambda: load_config(
        MasterConfig, config_path, env=os.environ, env_prefix="CXLKV_MASTER_",
        overrides={"listen_address": listen, "address_file": address_file, "metrics_address": metrics_address,
                   "log_level": log_level, "log_json": log_json, "recover_from_region": list(recover) or None},
    ), cfg, "master"))
    try:
        rc = run(run_master(cfg, notifier=notifier), cfg.event_loop)
    except ConfigError as exc:
        logging.getLogger("cxlkv.master").debug("start-up failed", exc_info=True)
        click.echo(f"cxlkv master: {exc}", err=True)
        sys.exit(EXIT_CONFIG)
    except KeyboardInterrupt:  # a second Ctrl-C during the drain
        rc = 0
    sys.exit(rc)
