"""TLS for the node's gRPC listeners and for the channels it opens to other nodes.

A node given `--tls-cert/--tls-key/--tls-ca` (`TlsFiles`) serves its client port over TLS
(client certificates as `ClientAuth` says) and its peer listener over mutual TLS: a caller must
present a certificate the CA signed, before any call reaches the peer token check. Every channel
the node opens to another node trusts only that CA and presents the node's own certificate.

`CertificateFiles` holds what the files say now. The listeners' credentials are dynamic: gRPC
asks `CertificateFiles.maybe_reload` before each new handshake, which re-reads the files when
one's modification time or size changed, so a rotated certificate is served to new connections
without a restart. A half-rotated pair (a certificate whose key is not there yet) is not taken:
the previous pair stays in use until both files agree. Channels take the current pair when they
are made; a pooled channel keeps the pair it was made with.

Without the flags nothing here runs and every port is plaintext, as before.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from raftlog.base.errors import RaftlogError, Reason

log = logging.getLogger(__name__)


class ClientAuth(enum.Enum):
    """Whether the client port asks callers for a certificate. grpcio can either not ask or
    require one (verified against the CA); it has no "ask, but accept none" setting."""

    NONE = "none"
    REQUIRE = "require"


@dataclass(frozen=True)
class TlsFiles:
    """The node's certificate chain, its private key and the CA its peers' certificates chain
    to (PEM files)."""

    cert: Path
    key: Path
    ca: Path


@dataclass(frozen=True)
class Pem:
    """One consistent reading of the files."""

    cert: bytes
    key: bytes
    ca: bytes

    @property
    def serial(self) -> int:
        return int(x509.load_pem_x509_certificate(self.cert).serial_number)


def read_pem(files: TlsFiles) -> Pem:
    """The files' contents, checked: the certificate and CA parse and the key belongs to the
    certificate. Raises RaftlogError(INVALID_CONFIG) naming the file at fault."""
    pem = Pem(cert=_read(files.cert, "--tls-cert"), key=_read(files.key, "--tls-key"),
              ca=_read(files.ca, "--tls-ca"))
    try:
        cert = x509.load_pem_x509_certificate(pem.cert)
    except ValueError as exc:
        raise _invalid(f"--tls-cert {files.cert} is not a PEM certificate: {exc}") from None
    try:
        x509.load_pem_x509_certificates(pem.ca)
    except ValueError as exc:
        raise _invalid(f"--tls-ca {files.ca} is not a PEM certificate: {exc}") from None
    try:
        key = serialization.load_pem_private_key(pem.key, password=None)
    except (ValueError, TypeError) as exc:
        raise _invalid(f"--tls-key {files.key} is not an unencrypted PEM private key: {exc}"
                       ) from None
    if _public(key.public_key()) != _public(cert.public_key()):
        raise _invalid(f"--tls-key {files.key} is not the key of --tls-cert {files.cert}")
    return pem


def _public(key: object) -> bytes:
    public_bytes: Callable[..., bytes] = key.public_bytes  # type: ignore[attr-defined]
    return public_bytes(serialization.Encoding.DER,
                        serialization.PublicFormat.SubjectPublicKeyInfo)


def _read(path: Path, flag: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise _invalid(f"cannot read {flag} {path}: {exc.strerror or exc}") from None


def _invalid(message: str) -> RaftlogError:
    return RaftlogError(Reason.INVALID_CONFIG, message)


def _stamp(files: TlsFiles) -> tuple[tuple[int, int, int], ...]:
    """Inode, modification time and size of each file ((0, 0, 0) for one that cannot be read
    now): a file replaced by a rename, or rewritten, changes it."""
    stamps = []
    for path in (files.cert, files.key, files.ca):
        try:
            stat = path.stat()
            stamps.append((stat.st_ino, stat.st_mtime_ns, stat.st_size))
        except OSError:
            stamps.append((0, 0, 0))
    return tuple(stamps)


class CertificateFiles:
    """The current contents of a node's TLS files, re-read when they change. Thread-safe:
    gRPC calls `maybe_reload` from its own threads."""

    def __init__(self, files: TlsFiles) -> None:
        """Raises RaftlogError(INVALID_CONFIG) when the files cannot be used."""
        self.files = files
        self._lock = threading.Lock()
        self._stamp = _stamp(files)
        self.current = read_pem(files)
        self.reloads = 0

    def maybe_reload(self) -> bool:
        """True when the files changed and now hold a usable pair, which is then current."""
        stamp = _stamp(self.files)
        with self._lock:
            if stamp == self._stamp:
                return False
            try:
                pem = read_pem(self.files)
            except RaftlogError as err:  # mid-rotation, or broken: keep serving the old pair
                log.warning("TLS files changed but cannot be used yet (%s); keeping "
                            "certificate serial %x", err.message, self.current.serial)
                return False
            self._stamp, self.current = stamp, pem
            self.reloads += 1
        log.info("TLS certificate reloaded from %s: serial %x", self.files.cert, pem.serial)
        return True

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """For a channel to another node: trusts the CA, presents this node's certificate."""
        self.maybe_reload()
        pem = self.current
        return grpc.ssl_channel_credentials(root_certificates=pem.ca, private_key=pem.key,
                                            certificate_chain=pem.cert)

    def server_credentials(self, *, require_client_cert: bool) -> grpc.ServerCredentials:
        """A listener's credentials, re-read from the files before each new handshake."""

        def configuration(pem: Pem) -> grpc.ServerCertificateConfiguration:
            return grpc.ssl_server_certificate_configuration(
                [(pem.key, pem.cert)], root_certificates=pem.ca)

        def fetch() -> grpc.ServerCertificateConfiguration | None:
            return configuration(self.current) if self.maybe_reload() else None

        # grpc's type stub leaves out the None its documentation allows ("no change").
        return grpc.dynamic_ssl_server_credentials(
            configuration(self.current), fetch,  # type: ignore[arg-type]
            require_client_authentication=require_client_cert)


def secure_channel(target: str, credentials: grpc.ChannelCredentials | None, *,
                   options: Sequence[tuple[str, Any]]) -> grpc.aio.Channel:
    """An aio channel: TLS with `credentials`, plaintext when they are None."""
    if credentials is None:
        return grpc.aio.insecure_channel(target, options=options)
    return grpc.aio.secure_channel(target, credentials, options=options)


def is_loopback(address: str) -> bool:
    """Whether a listen address (HOST:PORT) is reachable from this machine only."""
    host = address.rpartition(":")[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.") or address.startswith("unix:")


def add_port(server: grpc.aio.Server, address: str, tls: CertificateFiles | None, *,
             require_client_cert: bool, what: str) -> int:
    """Listens on `address` with TLS (plaintext when `tls` is None, with one warning line
    when the address is reachable from other machines); returns the port, 0 on failure.
    `what` names the listener in the warning."""
    credentials = (None if tls is None
                   else tls.server_credentials(require_client_cert=require_client_cert))
    if credentials is None and not is_loopback(address):
        log.warning("the %s on %s is plaintext: anyone on the network can read and send "
                    "its calls; give the node --tls-cert, --tls-key and --tls-ca "
                    "(docs/tls.md)", what, address)
    try:
        if credentials is None:
            return int(server.add_insecure_port(address))
        return int(server.add_secure_port(address, credentials))
    except RuntimeError:  # grpcio raises where older versions returned 0: nothing was bound
        return 0
