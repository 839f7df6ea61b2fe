"""``cxlkv admin …`` and ``cxlkv certs …``: administrative calls and the cluster's certificates.

Administrative calls go to the master directly, presenting an admin certificate
(``OU=admin``, or a CN in the master's ``admin_identities``) with
``--tls-ca/--tls-cert/--tls-key`` (or ``CXLKV_TLS_CA``/``CXLKV_TLS_CERT``/
``CXLKV_TLS_KEY``); without them the call is plaintext, which only a master
without TLS (loopback) accepts. A clientd never makes these calls for its
callers once TLS is on: its certificate is not an admin's.

``cxlkv certs ca DIR`` makes a CA; ``cxlkv certs issue DIR NAME --role ...``
a certificate signed by it (:mod:`cxlkv.deploy.certs`; docs/operations.md, "Security").
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import click

__all__ = ["admin_group", "certs_group", "tls_options", "master_channel", "MASTER_TIMEOUT_S"]

#: Deadline of one administrative call, in seconds.
MASTER_TIMEOUT_S = 30.0


def tls_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--tls-ca/--tls-cert/--tls-key`` (the identity presented to the master)."""
    fn = click.option("--tls-key", "tls_key", envvar="CXLKV_TLS_KEY", default="", metavar="PEM",
                      help="Private key of --tls-cert. Default: $CXLKV_TLS_KEY.")(fn)
    fn = click.option("--tls-cert", "tls_cert", envvar="CXLKV_TLS_CERT", default="", metavar="PEM",
                      help="Certificate presented to the master (an admin's for admin calls). "
                           "Default: $CXLKV_TLS_CERT.")(fn)
    fn = click.option("--tls-ca", "tls_ca", envvar="CXLKV_TLS_CA", default="", metavar="PEM",
                      help="The cluster CA's certificate; with --tls-cert/--tls-key, talk to the master "
                           "over mutual TLS. Default: $CXLKV_TLS_CA.")(fn)
    return fn


def tls_files(tls_ca: str, tls_cert: str, tls_key: str) -> Any:
    """The :class:`cxlkv.wire.tls.TlsFiles` of the three options.

    Raises:
        ConfigError: one or two of them given.
    """
    from cxlkv.wire.tls import TlsFiles

    files = TlsFiles(tls_ca, tls_cert, tls_key)
    files.check()
    return files


def master_channel(address: str, tls: Any = None) -> Any:
    """A gRPC channel to the master: mutual TLS with ``tls`` enabled, else plaintext.

    Raises:
        ConfigError: a TLS file cannot be read, its key is not the certificate's,
            or the certificate is not valid now (checked here: gRPC would only fail
            the handshake, in log lines and "failed to connect").
    """
    import grpc

    options = [("grpc.enable_http_proxy", 0)]
    if tls is not None and tls.enabled:
        from cxlkv.wire.tls import check_certificate_files, grpc_channel_credentials

        check_certificate_files(tls)
        return grpc.secure_channel(address, grpc_channel_credentials(tls), options=options)
    return grpc.insecure_channel(address, options=options)


def _call(address: str, tls: Any, method: str, request: Any) -> Any:
    import grpc

    from cxlkv.errors import from_rpc_error
    from cxlkv.v1 import master_pb2_grpc

    with master_channel(address, tls) as ch:
        try:
            return getattr(master_pb2_grpc.MasterServiceStub(ch), method)(request, timeout=MASTER_TIMEOUT_S)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, target=f"master {address}") from None


def _run(fn: Callable[[], None]) -> None:
    from cxlkv.errors import CxlkvError
    from cxlkv.cli.kv import exit_code_for

    try:
        fn()
    except CxlkvError as err:
        click.echo(f"error: {err.code.name}: {err.message}", err=True)
        sys.exit(exit_code_for(err))


_master_option = click.option("--master", "master_address", required=True, metavar="HOST:PORT",
                              envvar="CXLKV_MASTER", help="The master's gRPC address. Default: $CXLKV_MASTER.")


@click.group("admin")
def admin_group() -> None:
    """Administrative calls to the master (they need an admin certificate once TLS is on)."""


@admin_group.command("remove-all")
@_master_option
@tls_options
@click.option("--regex", default="", help="Only keys matching this regular expression.")
@click.option("--force", is_flag=True, help="Remove leased objects too.")
def remove_all_cmd(master_address: str, tls_ca: str, tls_cert: str, tls_key: str, regex: str, force: bool) -> None:
    """Remove every committed object (or those matching --regex)."""
    from cxlkv.v1 import master_pb2

    def run() -> None:
        tls = tls_files(tls_ca, tls_cert, tls_key)
        r = _call(master_address, tls, "RemoveAll", master_pb2.RemoveAllRequest(force=force, pattern=regex))
        click.echo(f"removed {r.removed}" + (f", {r.skipped_leased} leased left" if r.skipped_leased else ""))

    _run(run)


@admin_group.command("ls")
@_master_option
@tls_options
@click.option("--prefix", default="", help="Only keys starting with this.")
@click.option("--limit", default=1000, show_default=True, type=click.IntRange(min=1), help="Most keys shown.")
def ls_cmd(master_address: str, tls_ca: str, tls_cert: str, tls_key: str, prefix: str, limit: int) -> None:
    """List committed keys (key, size in bytes, version), from the master."""
    from cxlkv.v1 import master_pb2

    def run() -> None:
        tls = tls_files(tls_ca, tls_cert, tls_key)
        token, shown = "", 0
        while shown < limit:
            r = _call(master_address, tls, "ListKeys", master_pb2.ListKeysRequest(
                prefix=prefix, page_size=min(1000, limit - shown), page_token=token))
            for e in r.entries:
                click.echo(f"{e.key}\t{e.value_size_bytes}\t{e.version}")
                shown += 1
            token = r.next_page_token
            if not token:
                break

    _run(run)


@admin_group.command("unmount")
@_master_option
@tls_options
@click.argument("segment")
def unmount_cmd(master_address: str, tls_ca: str, tls_cert: str, tls_key: str, segment: str) -> None:
    """Unmount SEGMENT: its objects are lost to the cluster."""
    from cxlkv.v1 import master_pb2

    def run() -> None:
        tls = tls_files(tls_ca, tls_cert, tls_key)
        r = _call(master_address, tls, "UnmountSegment", master_pb2.UnmountSegmentRequest(name=segment))
        click.echo(f"unmounted {segment}: {r.objects_lost} object(s), {r.replicas_lost} replica(s) lost")

    _run(run)


@admin_group.command("release-writer")
@_master_option
@tls_options
@click.argument("client_id")
def release_writer_cmd(master_address: str, tls_ca: str, tls_cert: str, tls_key: str, client_id: str) -> None:
    """Free the space quarantined from CLIENT_ID's ended registrations.

    Only when every writer of that clientd is known to be gone (its host died, or
    it was removed for good): space quarantined after an expiry is otherwise
    freed by the clientd itself once it comes back (docs/master.md,
    "Reservations and fencing"). `cxlkv status` lists expired clients."""
    from cxlkv.v1 import master_pb2

    def run() -> None:
        tls = tls_files(tls_ca, tls_cert, tls_key)
        r = _call(master_address, tls, "ReleaseQuarantine",
                  master_pb2.ReleaseQuarantineRequest(client_id=client_id, writers_gone=True))
        click.echo(f"released {r.freed_bytes} quarantined bytes of client {client_id}")

    _run(run)


@click.group("certs")
def certs_group() -> None:
    """Make the cluster's CA and certificates (ECDSA P-256, PEM; keys mode 0600)."""


@certs_group.command("ca")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--name", default="cxlkv-ca", show_default=True, help="The CA's common name.")
@click.option("--days", default=3650, show_default=True, type=click.IntRange(min=1), help="Validity in days.")
def ca_cmd(directory: str, name: str, days: int) -> None:
    """Make a CA in DIRECTORY: ca.pem (give it to every part) and ca-key.pem (keep it offline)."""
    from cxlkv.deploy.certs import make_ca

    ca = make_ca(directory, name=name, valid_days=days)
    click.echo(f"{ca.cert_file}\n{ca.key_file}")


@certs_group.command("issue")
@click.argument("directory", type=click.Path(file_okay=False))
@click.argument("name")
@click.option("--role", "roles", multiple=True, type=click.Choice(["master", "clientd", "admin"]),
              help="OU value(s): admin grants the administrative calls. Repeatable.")
@click.option("--host", "hosts", multiple=True, metavar="NAME|IP",
              help="Subject alternative name (repeatable): every address a server is dialled by.")
@click.option("--days", default=365, show_default=True, type=click.IntRange(min=1), help="Validity in days.")
@click.option("--ca-dir", default=None, type=click.Path(file_okay=False),
              help="Where ca.pem and ca-key.pem are (default: DIRECTORY).")
def issue_cmd(directory: str, name: str, roles: tuple[str, ...], hosts: tuple[str, ...], days: int,
              ca_dir: str | None) -> None:
    """Issue NAME.pem and NAME-key.pem in DIRECTORY, signed by the CA.

    NAME is the identity (CN): a clientd's is what the master binds its client id
    to, so give each daemon its own (e.g. host1-clientd)."""
    from pathlib import Path

    from cxlkv.deploy.certs import CaFiles, issue
    from cxlkv.errors import CxlkvError

    d = Path(ca_dir or directory)
    try:
        cert, key = issue(CaFiles(str(d / "ca.pem"), str(d / "ca-key.pem")), directory, name,
                          roles=roles, hosts=hosts, valid_days=days)
    except CxlkvError as err:
        raise click.ClickException(err.message) from None
    click.echo(f"{cert}\n{key}")
