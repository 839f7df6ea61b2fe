"""Make the cluster's certificates: one CA, then one certificate per part.

Built on the ``cryptography`` package (no hand-written ASN.1). Keys are ECDSA
P-256; files are PEM, private keys written with mode 0600. The shape is the one
:mod:`cxlkv.wire.tls` reads: the identity in the subject's CN, roles in OU values,
host names and addresses in the subject alternative name (a master's certificate
must name every address clientds and tools dial).

``cxlkv certs ca DIR`` and ``cxlkv certs issue DIR NAME --role ...`` wrap these
functions (docs/operations.md, "Security").
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from cxlkv.errors import ConfigError
from cxlkv.wire.tls import ADMIN_ROLE

__all__ = ["CaFiles", "make_ca", "issue", "local_cluster_certs", "DEFAULT_VALID_DAYS"]

#: Validity of certificates made without an explicit ``valid_days``.
DEFAULT_VALID_DAYS = 365


@dataclass(frozen=True)
class CaFiles:
    """Where a CA's certificate and key live."""

    cert_file: str
    key_file: str


def _write(path: Path, data: bytes, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, mode)
    tmp.replace(path)


def _key_pem(key) -> bytes:  # type: ignore[no-untyped-def]
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_ca(directory: str | os.PathLike[str], *, name: str = "cxlkv-ca",
            valid_days: int = 10 * DEFAULT_VALID_DAYS) -> CaFiles:
    """Make a CA: ``ca.pem`` and ``ca-key.pem`` in ``directory``.

    Args:
        directory: where the files go (created if missing).
        name: the CA's common name.
        valid_days: validity from now, in days.

    Returns:
        The paths written.

    Raises:
        OSError: the files cannot be written.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name),
                         x509.NameAttribute(NameOID.ORGANIZATION_NAME, "cxlkv")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=valid_days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    from cryptography.hazmat.primitives import serialization

    d = Path(directory)
    _write(d / "ca.pem", cert.public_bytes(serialization.Encoding.PEM), 0o644)
    _write(d / "ca-key.pem", _key_pem(key), 0o600)
    return CaFiles(str(d / "ca.pem"), str(d / "ca-key.pem"))


def _san(hosts: Iterable[str]) -> list[Any]:
    """``x509.GeneralName`` entries: IP addresses as such, anything else a DNS name."""
    from cryptography import x509

    out: list[x509.GeneralName] = []
    for h in hosts:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(h.strip("[]"))))
        except ValueError:
            out.append(x509.DNSName(h))
    return out


def issue(ca: CaFiles, directory: str | os.PathLike[str], name: str, *, roles: Sequence[str] = (),
          hosts: Sequence[str] = (), valid_days: int = DEFAULT_VALID_DAYS) -> tuple[str, str]:
    """Issue a certificate for ``name`` signed by ``ca``: ``NAME.pem`` and ``NAME-key.pem``.

    Args:
        ca: the CA's files (from :func:`make_ca`).
        directory: where the files go.
        name: the identity (the subject's CN); a clientd's is what the master binds
            its client id to, so make it unique per daemon (e.g. ``host1-clientd``).
        roles: OU values: ``admin`` grants administrative calls; ``master`` and
            ``clientd`` describe the part.
        hosts: DNS names and IP addresses for the subject alternative name: every
            address a server's certificate is dialled by. ``name`` is always added
            as a DNS name.
        valid_days: validity from now, in days.

    Returns:
        ``(cert_file, key_file)``.

    Raises:
        ConfigError: the CA files cannot be read or do not hold a certificate and key.
        OSError: the files cannot be written.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if not name or "/" in name:
        raise ConfigError(f"certificate name: must be non-empty without '/', got {name!r}")
    try:
        ca_cert = x509.load_pem_x509_certificate(Path(ca.cert_file).read_bytes())
        ca_key = serialization.load_pem_private_key(Path(ca.key_file).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise ConfigError(f"CA files {ca.cert_file}, {ca.key_file}: {getattr(exc, 'strerror', None) or exc}") from None
    key = ec.generate_private_key(ec.SECP256R1())
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, name), x509.NameAttribute(NameOID.ORGANIZATION_NAME, "cxlkv")]
    attrs += [x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, r) for r in roles]
    now = datetime.datetime.now(datetime.timezone.utc)
    sans = _san(dict.fromkeys([name, *hosts]))
    cert = (x509.CertificateBuilder().subject_name(x509.Name(attrs)).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=valid_days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),  # type: ignore[arg-type]
                           critical=False)
            .sign(ca_key, hashes.SHA256()))  # type: ignore[arg-type]
    d = Path(directory)
    cert_file, key_file = d / f"{name}.pem", d / f"{name}-key.pem"
    _write(cert_file, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    _write(key_file, _key_pem(key), 0o600)
    return str(cert_file), str(key_file)


def local_cluster_certs(directory: str | os.PathLike[str], clientd_names: Sequence[str]) -> dict[str, tuple[str, str]]:
    """A CA and the certificates of a one-machine cluster (``cxlkv cluster up --tls``, tests).

    Makes ``master`` (role ``master``), one per clientd name (role ``clientd``),
    each with SAN localhost, 127.0.0.1, ::1 (they serve /metrics there), and
    ``admin`` (role ``admin``).

    Returns:
        name → ``(cert_file, key_file)``, plus ``"ca"`` → ``(ca.pem, ca-key.pem)``.

    Raises:
        OSError: the files cannot be written.
    """
    ca = make_ca(directory)
    out = {"ca": (ca.cert_file, ca.key_file)}
    out["master"] = issue(ca, directory, "master", roles=["master"], hosts=["localhost", "127.0.0.1", "::1"])
    for n in clientd_names:
        out[n] = issue(ca, directory, n, roles=["clientd"], hosts=["localhost", "127.0.0.1", "::1"])
    out["admin"] = issue(ca, directory, "admin", roles=[ADMIN_ROLE])
    return out

