"""How the object store lays a bucket out on its stream: pure functions, no I/O.

A bucket `b` is the stream `OBJ_b`, which accepts the subjects `$O.b.>`:

- `$O.b.M.<name>`            one metadata message per revision of an object (JSON, below); the
                             latest one at the subject is the live revision, a tombstone has
                             `deleted: true`. The message's seq is the revision.
- `$O.b.U.<upload>`          the marker of one upload (JSON: the object name and when it
                             started); it lives as long as the upload's chunks and is how the
                             sweep finds chunks no live revision names.
- `$O.b.C.<upload>.<index>`  chunk `index` (from 0) of an upload, the raw bytes.

`<name>` is the object name with every byte outside `[A-Za-z0-9_-/=:@+,~]` written `%XX`
(UTF-8, upper-case hex): a subject-safe token, one-to-one, and a name prefix encodes to a prefix
of the token, so listing by name prefix is listing subjects by prefix. `<upload>` is a random
nonce chosen by the put; chunks are tied to it, never to the name, so the chunks of an aborted,
replaced or deleted revision are found by their upload alone.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from raftlog.base import limits, subjects
from raftlog.base.errors import RaftlogError, Reason

STREAM_PREFIX = "OBJ_"
_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-/=:@+,~")
_UPLOAD_RE = re.compile(r"[0-9a-f]{24}")


# ---------------------------------------------------------------------- names and subjects

def validate_bucket(bucket: str) -> str:
    subjects.validate_name(bucket, what="bucket")
    if len(bucket.encode()) > limits.object_bucket_name_bytes_max:
        raise RaftlogError(Reason.INVALID_NAME, f"bucket name is longer than "
                           f"{limits.object_bucket_name_bytes_max} bytes",
                           limit=limits.object_bucket_name_bytes_max)
    return bucket


def bucket_stream(bucket: str) -> str:
    return STREAM_PREFIX + validate_bucket(bucket)


def bucket_of_stream(stream: str, stream_subjects: Sequence[str]) -> str | None:
    """The bucket a stream holds, or None when the stream is not laid out as a bucket."""
    if not stream.startswith(STREAM_PREFIX):
        return None
    bucket = stream[len(STREAM_PREFIX):]
    return bucket if list(stream_subjects) == [bucket_subjects(bucket)] else None


def bucket_subjects(bucket: str) -> str:
    return f"$O.{bucket}.>"


def encode_name(name: str) -> str:
    """The subject token of an object name (prefix-preserving, one-to-one)."""
    if not name:
        raise RaftlogError(Reason.INVALID_NAME, "object name is empty")
    token = "".join(chr(byte) if byte in _SAFE else f"%{byte:02X}" for byte in name.encode())
    if len(token) > limits.object_name_token_bytes_max:
        raise RaftlogError(Reason.INVALID_NAME, f"object name {name[:40]!r}... takes "
                           f"{len(token)} bytes once encoded into a subject, more than "
                           f"{limits.object_name_token_bytes_max}",
                           limit=limits.object_name_token_bytes_max)
    return token


def encode_prefix(prefix: str) -> str:
    """The token prefix of every name that starts with `prefix` (may be empty)."""
    return "".join(chr(byte) if byte in _SAFE else f"%{byte:02X}" for byte in prefix.encode())


def decode_name(token: str) -> str:
    """The object name of a token; CORRUPT_RECORD for a token encode_name never makes."""
    raw = bytearray()
    index = 0
    try:
        while index < len(token):
            if token[index] == "%":
                raw.append(int(token[index + 1:index + 3], 16))
                index += 3
            else:
                raw.append(ord(token[index]))
                index += 1
        name = raw.decode()
    except (ValueError, UnicodeDecodeError):
        name = ""
    if not name or encode_name(name) != token:
        raise RaftlogError(Reason.CORRUPT_RECORD, f"{token!r} is not an encoded object name")
    return name


def meta_subject(bucket: str, name: str) -> str:
    return f"$O.{bucket}.M.{encode_name(name)}"


def meta_prefix(bucket: str) -> str:
    return f"$O.{bucket}.M."


def name_of_meta_subject(bucket: str, subject: str) -> str:
    return decode_name(subject[len(meta_prefix(bucket)):])


def marker_subject(bucket: str, upload: str) -> str:
    return f"$O.{bucket}.U.{upload}"


def marker_prefix(bucket: str) -> str:
    return f"$O.{bucket}.U."


def chunk_subject(bucket: str, upload: str, index: int) -> str:
    return f"$O.{bucket}.C.{upload}.{index}"


def chunks_pattern(bucket: str, upload: str) -> str:
    """The purge pattern of every chunk of one upload."""
    return f"$O.{bucket}.C.{upload}.>"


def check_upload(upload: str) -> str:
    if not _UPLOAD_RE.fullmatch(upload):
        raise RaftlogError(Reason.CORRUPT_RECORD, f"upload id {upload!r} is not 24 hex digits")
    return upload


# ---------------------------------------------------------------------- chunk size

def chunk_size(requested: int) -> int:
    """The chunk size of a put: the default for 0, refused above one message."""
    if requested > limits.object_chunk_bytes_max:
        raise RaftlogError(Reason.MESSAGE_TOO_LARGE, f"chunk_size {requested} is larger than "
                           f"{limits.object_chunk_bytes_max} bytes (one chunk is one message)",
                           limit=limits.object_chunk_bytes_max)
    return requested or limits.object_chunk_bytes_default


def check_sha256(text: str) -> str:
    """A client's sha256: empty, or 64 hex digits (lower-cased)."""
    if text and not re.fullmatch(r"[0-9a-fA-F]{64}", text):
        raise RaftlogError(Reason.INVALID_ARGUMENT, "sha256 must be 64 hex digits")
    return text.lower()


# ---------------------------------------------------------------------- metadata

@dataclass(frozen=True)
class ObjectMeta:
    """One metadata message: a revision of an object, or its tombstone (`deleted`)."""

    name: str
    deleted: bool = False
    size: int = 0
    chunk_size: int = 0
    chunk_count: int = 0
    sha256: str = ""
    upload: str = ""  # chunk subjects are chunk_subject(bucket, upload, i)
    headers: tuple[tuple[str, str], ...] = field(default=())


def encode_meta(meta: ObjectMeta) -> bytes:
    if meta.deleted:
        return json.dumps({"name": meta.name, "deleted": True}).encode()
    return json.dumps({"name": meta.name, "size": meta.size, "chunk_size": meta.chunk_size,
                       "chunk_count": meta.chunk_count, "sha256": meta.sha256,
                       "upload": meta.upload,
                       "headers": [list(pair) for pair in meta.headers]}).encode()


def decode_meta(payload: bytes) -> ObjectMeta:
    try:
        doc = json.loads(payload)
        if doc.get("deleted"):
            return ObjectMeta(name=str(doc["name"]), deleted=True)
        meta = ObjectMeta(name=str(doc["name"]), size=int(doc["size"]),
                          chunk_size=int(doc["chunk_size"]),
                          chunk_count=int(doc["chunk_count"]), sha256=str(doc["sha256"]),
                          upload=check_upload(str(doc["upload"])),
                          headers=tuple((str(k), str(v)) for k, v in doc["headers"]))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise RaftlogError(Reason.CORRUPT_RECORD,
                           f"object metadata does not parse: {exc}") from None
    if meta.chunk_count != chunk_count(meta.size, meta.chunk_size):
        raise RaftlogError(Reason.CORRUPT_RECORD, f"object metadata of {meta.name!r} names "
                           f"{meta.chunk_count} chunks for {meta.size} bytes")
    return meta


def encode_marker(*, name: str, started_ms: int) -> bytes:
    return json.dumps({"name": name, "started_ms": started_ms}).encode()


def decode_marker(payload: bytes) -> str:
    """The object name an upload marker names ('' when it does not parse)."""
    try:
        return str(json.loads(payload)["name"])
    except (ValueError, KeyError, TypeError):
        return ""


# ---------------------------------------------------------------------- arithmetic

def chunk_count(size: int, chunk_bytes: int) -> int:
    return 0 if size == 0 else -(-size // chunk_bytes)


def chunk_length(meta: ObjectMeta, index: int) -> int:
    """Bytes chunk `index` of a revision must hold (the last one may be short)."""
    if index < meta.chunk_count - 1:
        return meta.chunk_size
    return meta.size - meta.chunk_size * (meta.chunk_count - 1)


@dataclass(frozen=True)
class ByteRange:
    """Bytes [start, end) of an object, and the chunks that hold them."""

    start: int
    end: int
    first_chunk: int
    last_chunk: int  # inclusive; first_chunk > last_chunk when the range is empty

    def slice_of(self, index: int, chunk_bytes: int, data: bytes) -> bytes:
        """The part of chunk `index` (holding `data`) inside the range."""
        base = index * chunk_bytes
        return data[max(self.start - base, 0):max(self.end - base, 0)]


def byte_range(*, offset: int, length: int, size: int, chunk_bytes: int) -> ByteRange:
    """Bytes [offset, offset + length) cut to the object: past the end is dropped, an offset
    past the end or a length of 0 is an empty range at min(offset, size)."""
    start = min(offset, size)
    end = min(offset + length, size) if offset < size else start
    if end <= start or chunk_bytes == 0:
        return ByteRange(start=start, end=start, first_chunk=0, last_chunk=-1)
    return ByteRange(start=start, end=end, first_chunk=start // chunk_bytes,
                     last_chunk=(end - 1) // chunk_bytes)


class Rechunker:
    """Cuts a sequence of byte pieces into chunks of `chunk_bytes` (the last may be short);
    holds at most one chunk's worth beyond the piece being cut."""

    def __init__(self, chunk_bytes: int) -> None:
        self._chunk_bytes = chunk_bytes
        self._pending = bytearray()

    def add(self, piece: bytes) -> list[bytes]:
        full: list[bytes] = []
        view = memoryview(piece)
        if self._pending:
            need = self._chunk_bytes - len(self._pending)
            self._pending += view[:need]
            view = view[need:]
            if len(self._pending) < self._chunk_bytes:
                return full
            full.append(bytes(self._pending))
            self._pending.clear()
        while len(view) >= self._chunk_bytes:
            full.append(bytes(view[:self._chunk_bytes]))
            view = view[self._chunk_bytes:]
        self._pending += view
        return full

    def rest(self) -> bytes:
        rest = bytes(self._pending)
        self._pending.clear()
        return rest


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
