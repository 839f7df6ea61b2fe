"""Mutual TLS for the links that cross hosts, and the identities certificates carry.

Everything that reaches the master over the network — gRPC (``listen_address``)
and the lean link (``lean_listen_address``) — runs over TLS with a client
certificate when the three files of :class:`TlsFiles` are configured: the
cluster's CA certificate (every peer must present a certificate it signed), this
part's own certificate and its private key.

A certificate names its holder: the identity is the subject's common name (CN),
or its first DNS subject-alternative name when it has no CN. Roles are the
subject's organizational-unit (OU) values; ``admin`` is the one the master
checks (:mod:`cxlkv.master.auth`), ``clientd`` and ``master`` are descriptive.
``cxlkv certs`` (:mod:`cxlkv.deploy.certs`) makes certificates of this shape.

Python's :mod:`ssl` serves the lean link (asyncio ``create_server(ssl=...)`` /
``create_connection(ssl=...)``); gRPC takes the same PEM files through
``grpc.ssl_server_credentials(require_client_auth=True)`` and
``grpc.ssl_channel_credentials``.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from cxlkv.errors import ConfigError

__all__ = ["TlsFiles", "Identity", "ADMIN_ROLE", "server_context", "client_context",
           "grpc_server_credentials", "grpc_channel_credentials", "identity_from_peercert",
           "identity_from_auth_context", "is_loopback_host", "check_certificate_files"]

#: The OU value of an administrator's certificate.
ADMIN_ROLE = "admin"


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of one part of the cluster.

    Attributes:
        ca_file: the cluster CA's certificate; peers must present a certificate it signed.
        cert_file: this part's certificate (its identity), chain appended if any.
        key_file: the private key of ``cert_file`` (unencrypted PEM, mode 0600).
    """

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""

    @property
    def enabled(self) -> bool:
        """Whether TLS is configured (all three files named)."""
        return bool(self.ca_file and self.cert_file and self.key_file)

    def check(self) -> None:
        """Either none or all three files are named (they are read at start).

        Raises:
            ConfigError: one or two of the three are set.
        """
        named = {"tls_ca_file": self.ca_file, "tls_cert_file": self.cert_file, "tls_key_file": self.key_file}
        missing = [k for k, v in named.items() if not v]
        if missing and len(missing) < 3:
            raise ConfigError(f"TLS needs tls_ca_file, tls_cert_file and tls_key_file; {', '.join(missing)} not set")

    def read(self) -> tuple[bytes, bytes, bytes]:
        """``(ca, cert, key)`` PEM bytes.

        Raises:
            ConfigError: a file cannot be read.
        """
        out = []
        for key, path in (("tls_ca_file", self.ca_file), ("tls_cert_file", self.cert_file),
                          ("tls_key_file", self.key_file)):
            try:
                out.append(Path(path).read_bytes())
            except OSError as exc:
                raise ConfigError(f"{key}: cannot read {path}: {exc.strerror or exc}") from None
        return out[0], out[1], out[2]


@dataclass(frozen=True)
class Identity:
    """Who is at the other end of an authenticated connection.

    Attributes:
        name: the certificate's CN (else its first DNS SAN).
        roles: the subject's OU values (``admin``, ``clientd``, ``master``...).
    """

    name: str
    roles: frozenset[str] = frozenset()

    @property
    def is_admin(self) -> bool:
        """Whether the certificate carries the admin role."""
        return ADMIN_ROLE in self.roles

    def __str__(self) -> str:
        return f"{self.name} ({', '.join(sorted(self.roles))})" if self.roles else self.name


def _load(ctx: ssl.SSLContext, files: TlsFiles) -> ssl.SSLContext:
    try:
        ctx.load_cert_chain(files.cert_file, files.key_file)
        ctx.load_verify_locations(cafile=files.ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"TLS files (cert {files.cert_file}, key {files.key_file}, ca {files.ca_file}): "
                          f"{getattr(exc, 'strerror', None) or exc}") from None
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def server_context(files: TlsFiles) -> ssl.SSLContext:
    """A server-side context that requires a client certificate signed by the CA.

    Raises:
        ConfigError: a file cannot be read or does not hold what it should.
    """
    ctx = _load(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), files)
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def client_context(files: TlsFiles) -> ssl.SSLContext:
    """A client-side context: verifies the server against the CA (and its host
    name), presents this part's certificate.

    Raises:
        ConfigError: a file cannot be read or does not hold what it should.
    """
    ctx = _load(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), files)
    ctx.check_hostname = True
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def check_certificate_files(files: TlsFiles) -> None:
    """Check the certificate a part presents before it dials or serves (the command
    line before a call; master and clientd at start): the files parse, the key is
    the certificate's, and the certificate is valid now.

    gRPC reads the PEM bytes without checking them; a wrong key or an expired
    certificate then fails only at the handshake, as C-level log lines and
    "failed to connect" (the master closes the connection of a peer whose
    certificate it refuses, without a reason the client could print).

    Raises:
        ConfigError: a file cannot be read or does not hold what it should; the
            certificate is not valid yet or has expired (the message says when).
    """
    import datetime

    from cryptography import x509

    client_context(files)  # reads all three; the key must match the certificate
    cert = x509.load_pem_x509_certificate(Path(files.cert_file).read_bytes())
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    if now > end:
        raise ConfigError(f"tls_cert_file {files.cert_file}: the certificate expired on "
                          f"{end:%Y-%m-%d %H:%M:%S} UTC; issue a new one (cxlkv certs issue)")
    if now < start:
        raise ConfigError(f"tls_cert_file {files.cert_file}: the certificate is not valid before "
                          f"{start:%Y-%m-%d %H:%M:%S} UTC (check this host's clock)")


def grpc_server_credentials(files: TlsFiles) -> Any:
    """gRPC server credentials that require a client certificate signed by the CA.

    Raises:
        ConfigError: a file cannot be read.
    """
    import grpc

    ca, cert, key = files.read()
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=True)


def grpc_channel_credentials(files: TlsFiles) -> Any:
    """gRPC channel credentials presenting this part's certificate.

    Raises:
        ConfigError: a file cannot be read.
    """
    import grpc

    ca, cert, key = files.read()
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


def identity_from_peercert(cert: Mapping[str, Any] | None) -> Identity | None:
    """The identity in ``ssl.SSLSocket.getpeercert()``'s answer (``None``: no certificate)."""
    if not cert:
        return None
    cn = ""
    roles: list[str] = []
    for rdn in cert.get("subject", ()):
        for attr, value in rdn:
            if attr == "commonName" and not cn:
                cn = value
            elif attr == "organizationalUnitName":
                roles.append(value)
    if not cn:
        cn = next((v for kind, v in cert.get("subjectAltName", ()) if kind == "DNS"), "")
    return Identity(cn, frozenset(roles)) if cn else None


_PEM_IDENTITIES: dict[bytes, Identity | None] = {}


def _identity_from_pem(pem: bytes) -> Identity | None:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    cert = x509.load_pem_x509_certificate(pem)
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    roles = frozenset(str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME))
    name = str(cns[0].value) if cns else ""
    if not name:
        try:
            san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            name = next(iter(san.get_values_for_type(x509.DNSName)), "")
        except x509.ExtensionNotFound:
            pass
    return Identity(name, roles) if name else None


def identity_from_auth_context(auth: Mapping[str, Iterable[bytes]]) -> Identity | None:
    """The identity in a gRPC ``context.auth_context()`` (``None``: not TLS, or no
    client certificate). Parsed once per distinct certificate."""
    pems = list(auth.get("x509_pem_cert", ()))
    if not pems:
        return None
    pem = pems[0]
    if pem not in _PEM_IDENTITIES:
        if len(_PEM_IDENTITIES) > 4096:
            _PEM_IDENTITIES.clear()
        _PEM_IDENTITIES[pem] = _identity_from_pem(pem)
    return _PEM_IDENTITIES[pem]


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` (of a listen address) is a loopback address or ``localhost``."""
    import ipaddress

    h = host.strip("[]")
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False
