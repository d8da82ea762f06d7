"""The local cluster's certificate maker (node/cli/certs.py) and the node's reading and
reloading of its TLS files (node/transport/tls.py), without sockets."""

from __future__ import annotations

import datetime
import ipaddress
import os
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason
from raftlog.node.cli import certs
from raftlog.node.transport.tls import CertificateFiles, TlsFiles, is_loopback, read_pem


def test_a_node_certificate_is_p256_for_loopback_and_short_lived() -> None:
    ca = certs.make_ca()
    issued = certs.issue(ca, common_name="n1")
    cert = x509.load_pem_x509_certificate(issued.cert_pem)
    key = cert.public_key()
    assert isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == "secp256r1"
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    lifetime = cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    assert lifetime <= datetime.timedelta(seconds=limits.tls_local_cert_valid_s)
    assert lifetime > datetime.timedelta(seconds=limits.tls_local_cert_valid_s - 60)
    assert cert.issuer == x509.load_pem_x509_certificate(ca.cert_pem).subject
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_the_ca_signs_what_it_issues_and_only_that() -> None:
    ca, other = certs.make_ca(), certs.make_ca()
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    issued = x509.load_pem_x509_certificate(certs.issue(ca, common_name="n1").cert_pem)
    stranger = x509.load_pem_x509_certificate(certs.issue(other, common_name="n1").cert_pem)
    issued.verify_directly_issued_by(ca_cert)
    with pytest.raises((ValueError, Exception)):
        stranger.verify_directly_issued_by(ca_cert)


def test_every_issue_has_a_new_serial() -> None:
    ca = certs.make_ca()
    serials = {certs.serial_of(certs.issue(ca, common_name="n1").cert_pem) for _ in range(5)}
    assert len(serials) == 5


def test_cluster_files_keep_keys_private_and_the_ca_across_runs(tmp_path: Path) -> None:
    written = certs.write_cluster_tls(tmp_path, ["n1", "n2"])
    assert set(written) == {"n1", "n2", certs.CLIENT_NAME}
    for paths in written.values():
        assert stat.S_IMODE(os.stat(paths.key).st_mode) == 0o600
        read_pem(TlsFiles(cert=paths.cert, key=paths.key, ca=paths.ca))  # a usable set
    assert stat.S_IMODE(os.stat(certs.tls_dir(tmp_path) / "ca.key").st_mode) == 0o600
    ca_before = written["n1"].ca.read_bytes()
    serial_before = certs.serial_of(written["n1"].cert.read_bytes())
    again = certs.write_cluster_tls(tmp_path, ["n1"])
    assert again["n1"].ca.read_bytes() == ca_before  # the CA is kept
    assert certs.serial_of(again["n1"].cert.read_bytes()) != serial_before  # the node's renewed
    kept = certs.ensure_issued(tmp_path, ["n2", "n3"])
    assert certs.serial_of(kept["n2"].cert.read_bytes()) == certs.serial_of(
        written["n2"].cert.read_bytes())
    assert kept["n3"].cert.exists()


def _files(tmp_path: Path, issued: certs.Issued, ca: certs.Issued) -> TlsFiles:
    files = TlsFiles(cert=tmp_path / "n.pem", key=tmp_path / "n.key", ca=tmp_path / "ca.pem")
    certs.write_issued(issued, cert=files.cert, key=files.key)
    files.ca.write_bytes(ca.cert_pem)
    return files


def test_read_pem_names_the_file_at_fault(tmp_path: Path) -> None:
    ca = certs.make_ca()
    files = _files(tmp_path, certs.issue(ca, common_name="n1"), ca)
    other_key = certs.issue(ca, common_name="n2").key_pem
    files.key.write_bytes(other_key)
    with pytest.raises(RaftlogError) as mismatch:
        read_pem(files)
    assert mismatch.value.reason is Reason.INVALID_CONFIG
    assert "is not the key of --tls-cert" in mismatch.value.message
    files.ca.write_text("not a certificate")
    with pytest.raises(RaftlogError, match="--tls-ca"):
        read_pem(files)
    with pytest.raises(RaftlogError, match="cannot read --tls-cert"):
        read_pem(TlsFiles(cert=tmp_path / "missing.pem", key=files.key, ca=files.ca))


def test_reload_takes_a_complete_new_pair_and_skips_a_half_written_one(tmp_path: Path) -> None:
    ca = certs.make_ca()
    first = certs.issue(ca, common_name="n1")
    files = _files(tmp_path, first, ca)
    current = CertificateFiles(files)
    assert current.current.serial == certs.serial_of(first.cert_pem)
    assert not current.maybe_reload()  # nothing changed

    second = certs.issue(ca, common_name="n1")
    files.cert.write_bytes(second.cert_pem)  # the certificate first, its key not yet
    _touch_later(files.cert)
    assert not current.maybe_reload()
    assert current.current.serial == certs.serial_of(first.cert_pem)  # still the old pair
    files.key.write_bytes(second.key_pem)
    _touch_later(files.key)
    assert current.maybe_reload()
    assert current.current.serial == certs.serial_of(second.cert_pem)
    assert current.reloads == 1
    assert not current.maybe_reload()


def _touch_later(path: Path) -> None:
    """A modification time a second on: in place, two writes within one tick of a coarse
    file-system clock would look the same."""
    stat_now = path.stat()
    os.utime(path, ns=(stat_now.st_atime_ns, stat_now.st_mtime_ns + 1_000_000_000))


@pytest.mark.parametrize(("address", "loopback"), [
    ("127.0.0.1:7400", True), ("localhost:7400", True), ("[::1]:7400", True),
    ("0.0.0.0:7400", False), ("10.0.0.5:7400", False), ("node1.example:7400", False),
])
def test_which_listen_addresses_count_as_loopback(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback
