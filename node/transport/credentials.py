"""The cluster credential: the shared secret every member of a cluster holds, and the call
tokens derived from it.

The secret is what pysyncobj encrypts and authenticates Raft traffic with, what the peer
listener (node-to-node services) requires, and what admin calls that change membership or
placement require. It is never sent: a caller sends a *token* in call metadata,

    v1.<principal>.<ts_ms>.<nonce>.<mac>
    mac = HMAC-SHA256(key, "v1|principal|ts_ms|nonce|method")

where `key` is derived from the secret (so the Raft password and the token key differ), and
`method` is the full gRPC method path: a token for one method is not valid for another. A token
older or newer than `limits.call_token_skew_ms_max` is refused. Within that window a token
could be replayed by someone who can read the traffic; TLS (a later issue) closes that.

Secret strength: at least `limits.secret_entropy_bits_min` bits by a conservative estimate
(length times log2 of the alphabet the secret's characters come from, capped by its deflated
size so that repetition does not pass). `generate_secret()` gives 64 hex digits (256 bits).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import secrets
import string
import zlib
from dataclasses import dataclass
from pathlib import Path

from raftlog.base import limits
from raftlog.base.clock import Clock, SystemClock
from raftlog.base.errors import RaftlogError, Reason

TOKEN_VERSION = "v1"
PEER_TOKEN_HEADER = "raftlog-peer-token"  # on node-to-node calls (the peer listener)
ADMIN_TOKEN_HEADER = "raftlog-admin-token"  # on admin calls that change the cluster
SECRET_FILE_NAME = "cluster.secret"  # inside a local cluster's directory
_KEY_LABEL = b"raftlog call token key v1"
_HEX = set(string.hexdigits.lower())
_DEFLATE_OVERHEAD_BYTES = len(zlib.compress(b"", 9))


class WeakSecret(ValueError):
    """The secret is too short or too regular to protect a cluster."""


def estimate_entropy_bits(secret: str) -> float:
    """A conservative estimate of the bits of entropy in a secret a person or tool chose: the
    smaller of length x log2(alphabet of the characters used) and 8 x its deflated size (which
    catches repetition such as "ab" * 100)."""
    if not secret:
        return 0.0
    chars = set(secret)
    if chars <= set(string.digits):
        alphabet = 10
    elif chars <= _HEX:
        alphabet = 16
    else:
        alphabet = 26 if chars & set(string.ascii_lowercase) else 0
        alphabet += 26 if chars & set(string.ascii_uppercase) else 0
        alphabet += 10 if chars & set(string.digits) else 0
        alphabet += 32 if chars - set(string.ascii_letters + string.digits) else 0
    by_alphabet = len(secret) * math.log2(alphabet)
    deflated = len(zlib.compress(secret.encode(), 9)) - _DEFLATE_OVERHEAD_BYTES
    return min(by_alphabet, 8.0 * max(deflated, 0))


def check_secret(secret: str) -> None:
    """Raises WeakSecret when the secret is too weak; the message says how to make one."""
    if len(secret.encode()) > limits.secret_bytes_max:
        raise WeakSecret(f"the cluster secret is longer than {limits.secret_bytes_max} bytes")
    bits = estimate_entropy_bits(secret)
    if bits < limits.secret_entropy_bits_min:
        raise WeakSecret(
            f"the cluster secret has about {bits:.0f} bits of entropy; at least "
            f"{limits.secret_entropy_bits_min} ({limits.secret_entropy_bits_min // 8} random "
            "bytes) are required. Make one with "
            "`raftlog cluster secret > FILE` (64 random hex digits)")


def generate_secret() -> str:
    return secrets.token_hex(limits.secret_entropy_bits_min // 8)


def read_secret_file(path: Path) -> str:
    """The secret a file holds (surrounding whitespace ignored); raises OSError, WeakSecret."""
    secret = path.read_text().strip()
    if not secret:
        raise WeakSecret(f"{path} is empty")
    check_secret(secret)
    return secret


def write_secret_file(path: Path, secret: str | None = None) -> str:
    """Writes a (new) secret to `path`, readable by its owner only; returns it. The file is
    created with mode 0600 and fsynced, and refused if it exists."""
    secret = secret or generate_secret()
    check_secret(secret)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, (secret + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return secret


def ensure_secret_file(path: Path) -> str:
    """The secret in `path`, created (mode 0600) when the file does not exist yet."""
    if path.exists():
        return read_secret_file(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_secret_file(path)


@dataclass(frozen=True)
class Verified:
    principal: str  # who signed the token: a node id, or "admin"


class Credential:
    """Signs and checks call tokens with the cluster secret."""

    def __init__(self, secret: str, *, clock: Clock | None = None) -> None:
        if not secret:
            raise WeakSecret("a credential needs the cluster secret")
        self._key = hmac.new(secret.encode(), _KEY_LABEL, hashlib.sha256).digest()
        self._clock = clock or SystemClock()

    def _mac(self, principal: str, ts_ms: int, nonce: str, method: str) -> str:
        message = f"{TOKEN_VERSION}|{principal}|{ts_ms}|{nonce}|{method}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def token(self, *, principal: str, method: str) -> str:
        """A token for one call of `method` (the full path, e.g.
        /raftlog.internal.Replication/Ping)."""
        if "." in principal or not principal:
            raise ValueError(f"principal {principal!r} must be non-empty and contain no '.'")
        ts_ms = self._clock.wall_ms()
        nonce = secrets.token_hex(8)
        mac = self._mac(principal, ts_ms, nonce, method)
        return f"{TOKEN_VERSION}.{principal}.{ts_ms}.{nonce}.{mac}"

    def prove(self, nonce: str, *, principal: str) -> str:
        """An answer to a challenge: shows the answering node holds the secret."""
        message = f"{TOKEN_VERSION}|proof|{principal}|{nonce}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def check_proof(self, proof: str, *, nonce: str, principal: str) -> bool:
        return hmac.compare_digest(self.prove(nonce, principal=principal), proof)

    def verify(self, token: str, *, method: str) -> Verified:
        """The token's principal; raises RaftlogError(UNAUTHENTICATED) for anything else."""
        if not token:
            raise _refused("this call needs the cluster credential", method)
        if len(token) > limits.call_token_bytes_max:
            raise _refused("the credential token is too long", method)
        parts = token.split(".")
        if len(parts) != 5 or parts[0] != TOKEN_VERSION or not parts[2].isdigit():
            raise _refused("the credential token is malformed", method)
        _, principal, ts_text, nonce, mac = parts
        expected = self._mac(principal, int(ts_text), nonce, method)
        if not hmac.compare_digest(expected, mac):
            raise _refused("the credential token is not signed with this cluster's secret",
                           method)
        if abs(self._clock.wall_ms() - int(ts_text)) > limits.call_token_skew_ms_max:
            raise _refused(f"the credential token is more than {limits.call_token_skew_ms_max} "
                           "ms away from this node's clock", method)
        return Verified(principal=principal)


def _refused(message: str, method: str) -> RaftlogError:
    return RaftlogError(Reason.UNAUTHENTICATED, message, method=method)
