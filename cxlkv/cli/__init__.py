"""The ``cxlkv`` command line (click); its commands live beside it in :mod:`cxlkv.cli`.

Subcommands are imported lazily, so ``cxlkv --help`` stays fast and a component's
import cost is paid only by the command that needs it. Each entry of
``SUBCOMMANDS`` names ``module:attribute`` of a click command or group.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading
from typing import Any

try:
    import click
except ModuleNotFoundError as exc:  # an SDK-only install (pip install cxlkv)
    raise SystemExit(f"cxlkv: the command line and the daemons need the server extra "
                     f"(pip install 'cxlkv[server]'); missing module {exc.name!r}") from None

from cxlkv import __version__

#: command name → "module:attribute" of its click command/group.
SUBCOMMANDS: dict[str, str] = {
    "master": "cxlkv.master.cli:master_cmd",
    "clientd": "cxlkv.clientd.cli:clientd_cmd",
    "bench": "cxlkv.bench.cli:bench_group",
    "region": "cxlkv.transport.cli:region_group",
    "cluster": "cxlkv.cli.cluster:cluster_group",
    "replay": "cxlkv.trace.replay:replay_cmd",
    "put": "cxlkv.cli.kv:put_cmd",
    "get": "cxlkv.cli.kv:get_cmd",
    "exists": "cxlkv.cli.kv:exists_cmd",
    "rm": "cxlkv.cli.kv:rm_cmd",
    "ls": "cxlkv.cli.kv:ls_cmd",
    "stat": "cxlkv.cli.kv:stat_cmd",
    "config": "cxlkv.cli.config:config_group",
    "status": "cxlkv.cli.status:status_cmd",
    "admin": "cxlkv.cli.admin:admin_group",
    "certs": "cxlkv.cli.admin:certs_group",
}


#: Commands that are gRPC clients only: they run with gRPC's C-core logging at
#: ERROR (unless GRPC_VERBOSITY is set), so a refused TLS handshake is the
#: command's one error line, not C-level "Handshake failed" log lines before it.
#: The daemons (and commands that start them) keep gRPC's default.
QUIET_GRPC_COMMANDS = frozenset({"put", "get", "exists", "rm", "ls", "stat", "status", "admin"})


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def __init__(self, *args, lazy: dict[str, str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self.lazy))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy:
            if name in QUIET_GRPC_COMMANDS and "grpc" not in sys.modules:
                os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # read once, when grpc is imported
            module, attr = self.lazy[name].split(":")
            # Threads a module starts as it is imported (numpy's OpenBLAS pool)
            # inherit the importing thread's signal mask: with SIGINT blocked
            # there, a Ctrl-C always reaches the main thread. Else, while the main
            # thread ignores SIGINT for a moment (`replay` starting its workers),
            # a Ctrl-C delivered to such a thread would be dropped — the replay
            # ran on.
            main_thread = threading.current_thread() is threading.main_thread()
            old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if main_thread else None
            try:
                return getattr(importlib.import_module(module), attr)
            finally:
                if old is not None:
                    signal.pthread_sigmask(signal.SIG_SETMASK, old)  # a pending Ctrl-C is raised here
        return super().get_command(ctx, name)


def version_text() -> str:
    """``cxlkv 0.1.0 (commit 542c262a1b2c, CPython 3.11.7, Linux x86_64)``."""
    import platform

    from cxlkv._version import commit

    return (f"cxlkv {__version__} (commit {commit()}, {platform.python_implementation()} "
            f"{platform.python_version()}, {platform.system()} {platform.machine()})")


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(version_text())
        ctx.exit()


@click.group(cls=LazyGroup, lazy=SUBCOMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Show the version, the git commit it was built from, and exit.")
def main() -> None:
    """cxlkv: a distributed KV-cache store on shared CXL memory.

    Run `cxlkv COMMAND --help` for each command. Shell completion (bash, zsh,
    fish): eval "$(_CXLKV_COMPLETE=bash_source cxlkv)" in ~/.bashrc (zsh_source,
    fish_source for the others).
    """
    # SIGTERM (kill, timeout, a cancelled CI job) ends a command the way Ctrl-C
    # does: its cleanup runs — an embedded cluster and its region file are removed.
    # The daemons install their own handlers once their event loop runs.
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminated)
    from cxlkv.client import _conn

    # the SDK's errors name the command line's option while a command runs (and the
    # SDK's own name again afterwards: a program may run commands in-process)
    old, _conn.SOCKET_SETTING = _conn.SOCKET_SETTING, "--socket"
    click.get_current_context().call_on_close(lambda: setattr(_conn, "SOCKET_SETTING", old))


def _terminated(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)
