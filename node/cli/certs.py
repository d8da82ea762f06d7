"""Certificates for a local cluster (`raftlog cluster up --tls`): one private CA, a certificate
per node and one for command-line clients, all EC P-256, valid for loopback only
(SAN 127.0.0.1 and localhost) and for a short time (limits.tls_local_cert_valid_s).

Pure functions make and read the PEM bytes (`make_ca`, `issue`, `serial_of`); `write_cluster_tls`
is the one that touches disk. The layout under the cluster directory:

    DIR/tls/ca.pem  ca.key         the CA (the key signs more certificates later)
    DIR/tls/n{i}.pem  n{i}.key     node i's certificate and key
    DIR/tls/client.pem client.key  a client certificate, for `--tls-client-auth require`

Keys are written with mode 0600, through a temporary name and a rename, so a node that reloads
while a file changes never reads half of one.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from raftlog.base import limits

TLS_DIR_NAME = "tls"
CA_NAME = "ca"
CLIENT_NAME = "client"
LOCAL_HOSTS = ("127.0.0.1", "localhost")


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key, both PEM."""

    cert_pem: bytes
    key_pem: bytes


@dataclass(frozen=True)
class TlsPaths:
    """Where one holder's certificate, key and the CA that signed it are."""

    cert: Path
    key: Path
    ca: Path


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "raftlog local cluster"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_ca(*, common_name: str = "raftlog local CA",
            valid_s: int = limits.tls_local_ca_valid_s) -> Issued:
    """A self-signed CA that may sign end certificates only (path length 0)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name)).issuer_name(_name(common_name))
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(seconds=valid_s))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False,
            encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                       critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue(ca: Issued, *, common_name: str, hosts: Sequence[str] = LOCAL_HOSTS,
          valid_s: int = limits.tls_local_cert_valid_s) -> Issued:
    """An end certificate signed by `ca`, good for both ends of a connection (a node serves
    with it and presents it when it calls another node). `hosts`: its DNS names and IP
    addresses (the subject alternative names a client checks)."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key is not an EC key")
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name)).issuer_name(ca_cert.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(min(now + datetime.timedelta(seconds=valid_s),
                             ca_cert.not_valid_after_utc))
        .add_extension(x509.SubjectAlternativeName([_general_name(h) for h in hosts]),
                       critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                              ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def serial_of(cert_pem: bytes) -> int:
    return int(x509.load_pem_x509_certificate(cert_pem).serial_number)


def write_issued(issued: Issued, *, cert: Path, key: Path) -> None:
    """Writes the key (0600) before the certificate, each through a rename: a reader that sees
    the new certificate finds its key already in place."""
    _write_atomic(key, issued.key_pem, mode=0o600)
    _write_atomic(cert, issued.cert_pem, mode=0o644)


def _write_atomic(path: Path, data: bytes, *, mode: int) -> None:
    partial = path.with_name(path.name + ".tmp")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fchmod(fd, mode)  # an older leftover kept its mode through O_CREAT
    finally:
        os.close(fd)
    partial.replace(path)


def tls_dir(root: Path) -> Path:
    return root / TLS_DIR_NAME


def paths_of(root: Path, holder: str) -> TlsPaths:
    """The files of `holder` (a node id, or CLIENT_NAME) under cluster directory `root`."""
    directory = tls_dir(root)
    return TlsPaths(cert=directory / f"{holder}.pem", key=directory / f"{holder}.key",
                    ca=directory / f"{CA_NAME}.pem")


def load_ca(root: Path) -> Issued:
    directory = tls_dir(root)
    return Issued((directory / f"{CA_NAME}.pem").read_bytes(),
                  (directory / f"{CA_NAME}.key").read_bytes())


def _usable_ca(root: Path) -> Issued | None:
    """The cluster's CA when it has one that outlives a certificate issued now."""
    try:
        ca = load_ca(root)
    except FileNotFoundError:
        return None
    expires = x509.load_pem_x509_certificate(ca.cert_pem).not_valid_after_utc
    if expires < _now() + datetime.timedelta(seconds=limits.tls_local_cert_valid_s):
        return None
    return ca


def write_cluster_tls(root: Path, node_ids: Sequence[str]) -> dict[str, TlsPaths]:
    """The cluster's CA (made once, then reused while it outlives a new certificate) and a
    fresh certificate for every node in `node_ids` and for the client; returns each holder's
    paths."""
    directory = tls_dir(root)
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    ca = _usable_ca(root)
    if ca is None:
        ca = make_ca()
        write_issued(ca, cert=directory / f"{CA_NAME}.pem", key=directory / f"{CA_NAME}.key")
    written = {}
    for holder in dict.fromkeys((*node_ids, CLIENT_NAME)):
        paths = paths_of(root, holder)
        write_issued(issue(ca, common_name=holder), cert=paths.cert, key=paths.key)
        written[holder] = paths
    return written


def ensure_issued(root: Path, holders: Sequence[str]) -> dict[str, TlsPaths]:
    """Like `write_cluster_tls`, but keeps the certificates that are already there: a node
    restarted in place serves the certificate it had."""
    missing = [holder for holder in holders if not paths_of(root, holder).cert.exists()]
    if missing:
        write_cluster_tls(root, [h for h in missing if h != CLIENT_NAME])
    return {holder: paths_of(root, holder) for holder in holders}
