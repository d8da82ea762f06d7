"""KV buckets as streams, the pure part: bucket and key names, the stream and subjects they map
to, the headers a KV message carries, and the rules that read an entry from a stored message
(its operation, its TTL, whether it is live). No I/O and no clock: `now_ms` comes in.

A bucket B is the stream `KV_B` with the one subject pattern `$KV.B.>`; key K is the subject
`$KV.B.K`. A value is a message whose payload is the value; a delete or purge is a message with
the header `KV-Operation: DEL` or `PURGE` and no payload; a value with a TTL carries
`KV-Expires-Ms: <wall-clock ms>`, and is live while `now_ms` is below it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from raftlog.base import limits
from raftlog.base.errors import RaftlogError, Reason
from raftlog.v1 import kv_pb2, types_pb2

STREAM_PREFIX = "KV_"
SUBJECT_PREFIX = "$KV."
OPERATION_HEADER = "KV-Operation"
EXPIRES_HEADER = "KV-Expires-Ms"
_OPERATION_NAMES = {kv_pb2.KV_OPERATION_DELETE: "DEL", kv_pb2.KV_OPERATION_PURGE: "PURGE"}
_OPERATIONS = {name: operation for operation, name in _OPERATION_NAMES.items()}

_BUCKET_RE = re.compile(r"[A-Za-z0-9_-]+")
_KEY_RE = re.compile(r"[-/_=.a-zA-Z0-9]+")
_TOKEN_RE = re.compile(r"[-/_=a-zA-Z0-9]+")


def validate_bucket(bucket: str) -> str:
    """A bucket name, or INVALID_NAME."""
    if not bucket:
        raise RaftlogError(Reason.INVALID_NAME, "bucket name is empty", field="bucket")
    if len(bucket.encode()) > limits.kv_bucket_name_bytes_max:
        raise RaftlogError(Reason.INVALID_NAME, "bucket name is longer than "
                           f"{limits.kv_bucket_name_bytes_max} bytes", field="bucket",
                           limit=limits.kv_bucket_name_bytes_max)
    if not _BUCKET_RE.fullmatch(bucket):
        raise RaftlogError(Reason.INVALID_NAME, f"bucket name {bucket!r} may only contain "
                           "letters, digits, '_' and '-'", field="bucket")
    return bucket


def stream_name(bucket: str) -> str:
    return STREAM_PREFIX + bucket


def bucket_of_stream(stream: str) -> str:
    """The bucket a stream holds ("" when the stream's name is not a bucket's)."""
    return stream[len(STREAM_PREFIX):] if stream.startswith(STREAM_PREFIX) else ""


def subject_prefix(bucket: str) -> str:
    return f"{SUBJECT_PREFIX}{bucket}."


def subject_pattern(bucket: str) -> str:
    """The one subject pattern of a bucket's stream."""
    return subject_prefix(bucket) + ">"


def _key_tokens_max(bucket: str) -> int:
    return limits.subject_tokens_max - 2  # "$KV" and the bucket come first


def _key_bytes_max(bucket: str) -> int:
    return limits.subject_bytes_max - len(subject_prefix(bucket).encode())


def validate_key(key: str, *, bucket: str) -> str:
    """A key of `bucket`, or INVALID_KEY: 1+ tokens of [-/_=a-zA-Z0-9] separated by dots, whose
    subject fits a subject's limits."""
    if not key:
        raise RaftlogError(Reason.INVALID_KEY, "key is empty", key=key)
    if not _KEY_RE.fullmatch(key):
        raise RaftlogError(Reason.INVALID_KEY, f"key {key[:64]!r} may only contain letters, "
                           "digits and '-/_=.'", key=key[:64])
    _check_tokens(key, bucket=bucket, what="key")
    return key


def validate_filter(pattern: str, *, bucket: str) -> str:
    """A key pattern ("" = every key): tokens as in a key, or `*` (one token), or `>` (the
    rest, last only); INVALID_KEY otherwise."""
    if not pattern:
        return pattern
    tokens = _check_tokens(pattern, bucket=bucket, what="key pattern")
    for index, token in enumerate(tokens):
        if token == ">" and index == len(tokens) - 1:
            continue
        if token != "*" and not _TOKEN_RE.fullmatch(token):
            raise RaftlogError(Reason.INVALID_KEY, f"key pattern {pattern[:64]!r}: token "
                               f"{token[:32]!r} is not a key token, '*' or a last '>'",
                               key=pattern[:64])
    return pattern


def _check_tokens(key: str, *, bucket: str, what: str) -> list[str]:
    if len(key.encode()) > _key_bytes_max(bucket):
        raise RaftlogError(Reason.INVALID_KEY, f"{what} is longer than "
                           f"{_key_bytes_max(bucket)} bytes", key=key[:64],
                           limit=_key_bytes_max(bucket))
    tokens = key.split(".")
    if "" in tokens:
        raise RaftlogError(Reason.INVALID_KEY, f"{what} {key[:64]!r} has an empty token "
                           "(a leading, trailing or doubled '.')", key=key[:64])
    if len(tokens) > _key_tokens_max(bucket):
        raise RaftlogError(Reason.INVALID_KEY, f"{what} has more than "
                           f"{_key_tokens_max(bucket)} tokens", key=key[:64],
                           limit=_key_tokens_max(bucket))
    return tokens


def key_subject(bucket: str, key: str) -> str:
    return subject_prefix(bucket) + key


def filter_subject(bucket: str, pattern: str) -> str:
    """The subject pattern of a key pattern ("" = every key)."""
    return subject_prefix(bucket) + (pattern or ">")


def listing_prefix(bucket: str, pattern: str) -> str:
    """The subject text every key matching `pattern` starts with: the literal tokens before its
    first wildcard (a whole key when it has none)."""
    literal: list[str] = []
    for token in pattern.split(".") if pattern else []:
        if token in ("*", ">"):
            return subject_prefix(bucket) + "".join(f"{part}." for part in literal)
        literal.append(token)
    return subject_prefix(bucket) + ".".join(literal)


def is_literal(pattern: str) -> bool:
    return bool(pattern) and not any(t in ("*", ">") for t in pattern.split("."))


# ---------------------------------------------------------------------------------------------
# Messages <-> entries.


def ttl_ms(value: int, *, field: str = "ttl_ms") -> int:
    if value > limits.kv_ttl_ms_max:
        raise RaftlogError(Reason.INVALID_ARGUMENT, f"{field} may be at most "
                           f"{limits.kv_ttl_ms_max}", field=field, limit=limits.kv_ttl_ms_max)
    return value


def expires_ms(*, ttl: int, now_ms: int) -> int:
    """When a value written at `now_ms` with `ttl` ms expires (0: never)."""
    return now_ms + ttl if ttl else 0


def value_headers(*, expires: int) -> list[types_pb2.Header]:
    return [types_pb2.Header(key=EXPIRES_HEADER, value=str(expires))] if expires else []


def marker_headers(operation: kv_pb2.KvOperation.ValueType) -> list[types_pb2.Header]:
    return [types_pb2.Header(key=OPERATION_HEADER, value=_OPERATION_NAMES[operation])]


@dataclass(frozen=True, slots=True)
class Stored:
    """What a stored KV message says: its operation and expiry."""

    operation: kv_pb2.KvOperation.ValueType
    expires_ms: int

    def live(self, now_ms: int) -> bool:
        """A value (not a marker) whose TTL, if any, has not passed."""
        return self.operation == kv_pb2.KV_OPERATION_PUT and not self.expired(now_ms)

    def expired(self, now_ms: int) -> bool:
        return self.operation == kv_pb2.KV_OPERATION_PUT and 0 < self.expires_ms <= now_ms


def read_headers(message: types_pb2.Message) -> Stored:
    """The operation and expiry of a KV message; unknown headers are ignored (a message
    published to the stream directly is a value)."""
    operation: kv_pb2.KvOperation.ValueType = kv_pb2.KV_OPERATION_PUT
    expires = 0
    for header in message.headers:
        if header.key == OPERATION_HEADER:
            operation = _OPERATIONS.get(header.value, operation)
        elif header.key == EXPIRES_HEADER and header.value.isdigit():
            expires = int(header.value)
    return Stored(operation=operation, expires_ms=expires)


def to_entry(bucket: str, message: types_pb2.Message) -> kv_pb2.KvEntry:
    stored = read_headers(message)
    return kv_pb2.KvEntry(
        bucket=bucket, key=message.subject[len(subject_prefix(bucket)):], value=message.payload,
        revision=message.seq, ts_ms=message.ts_ms, operation=stored.operation,
        expires_ms=stored.expires_ms)


def expired_event(entry: kv_pb2.KvEntry) -> kv_pb2.KvEntry:
    """The watch event of a value whose TTL passed: its key and revision, no value."""
    return kv_pb2.KvEntry(bucket=entry.bucket, key=entry.key, revision=entry.revision,
                          ts_ms=entry.ts_ms, operation=kv_pb2.KV_OPERATION_EXPIRED,
                          expires_ms=entry.expires_ms)


# ---------------------------------------------------------------------------------------------
# Bucket config <-> stream config.


def history(value: int) -> int:
    if value > limits.kv_history_max:
        raise RaftlogError(Reason.INVALID_CONFIG, f"history may be at most "
                           f"{limits.kv_history_max}", field="history",
                           limit=limits.kv_history_max)
    return value or 1


def value_size_max(value: int) -> int:
    if value > limits.kv_value_bytes_max:
        raise RaftlogError(Reason.INVALID_CONFIG, "max_value_size may be at most "
                           f"{limits.kv_value_bytes_max}", field="max_value_size",
                           limit=limits.kv_value_bytes_max)
    return value


def stream_config(config: kv_pb2.KvBucketConfig) -> types_pb2.StreamConfig:
    """The config of the stream that holds a bucket (checks what the stream's own checks do
    not: the bucket name, history and value size)."""
    bucket = validate_bucket(config.bucket)
    value_size = value_size_max(config.max_value_size)
    return types_pb2.StreamConfig(
        name=stream_name(bucket), subjects=[subject_pattern(bucket)],
        retention=types_pb2.RETENTION_POLICY_LIMITS, max_age_ms=config.max_age_ms,
        max_bytes=config.max_bytes, max_msgs_per_subject=history(config.history),
        max_msg_bytes=value_size + limits.kv_entry_overhead_bytes if value_size else 0,
        replicas=config.replicas, description=config.description)


def is_bucket_stream(config: types_pb2.StreamConfig) -> bool:
    """A stream made by `stream_config` (a stream named KV_x with other subjects is not)."""
    bucket = bucket_of_stream(config.name)
    return bool(bucket) and list(config.subjects) == [subject_pattern(bucket)]


def bucket_info(info: types_pb2.StreamInfo) -> kv_pb2.KvBucketInfo:
    config = info.config
    max_msg_bytes = config.max_msg_bytes
    return kv_pb2.KvBucketInfo(
        config=kv_pb2.KvBucketConfig(
            bucket=bucket_of_stream(config.name), description=config.description,
            history=int(config.max_msgs_per_subject), max_bytes=config.max_bytes,
            max_value_size=max(max_msg_bytes - limits.kv_entry_overhead_bytes, 0)
            if max_msg_bytes else 0,
            max_age_ms=config.max_age_ms, replicas=config.replicas),
        state=kv_pb2.KvBucketState(entries=info.state.messages, bytes=info.state.bytes,
                                   keys=info.state.num_subjects,
                                   last_revision=info.state.last_seq),
        created_ms=info.created_ms, stream=config.name)
